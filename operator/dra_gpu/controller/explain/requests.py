"""One request of a claim: its class, its selectors compiled, then its check; ``firstAvailable``.

Owns: ``explain_request`` for one entry of ``spec.devices.requests``: an exactly-request (or
each subrequest of a ``firstAvailable`` one, which fits if any alternative does) checked for
its class (the scheduler's own words when it is missing), for selectors that do not compile,
then against the devices (``matching``). Requests alike (same request, same pod constraints,
same classes) share one check within a World, and across Worlds while ``Checks`` versions hold.
Also ``class_names``: the DeviceClasses a claim's requests name; ``selector_lists``: the
request selectors a claim's check evaluates on every device.
Must not: do any I/O; it reads the World's Scope and the classes it is given.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from dra_gpu import cel
from dra_gpu.controller.explain import matching, mismatches, results, wording
from dra_gpu.controller.explain.results import Piece, Reason, RequestExplanation
from dra_gpu.controller.explain.world import Scope

Body = Mapping[str, Any]


def class_names(claim: Body) -> list[str]:
    """The DeviceClasses a claim's requests name, sorted."""
    requests = ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []
    names = {str((r.get("exactly") or {}).get("deviceClassName", "")) for r in requests}
    names |= {
        str(s.get("deviceClassName", "")) for r in requests for s in r.get("firstAvailable") or []
    }
    return sorted(n for n in names if n)


def selector_lists(claim: Body) -> list[tuple[cel.Compiled, ...]]:
    """The compiled selectors of each request and subrequest of ``claim`` whose selectors all
    compile: the lists its check evaluates on every device (besides the classes' own)."""
    lists = []
    for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        if request.get("firstAvailable") and request.get("exactly") is None:
            specs = list(request["firstAvailable"])
        else:
            specs = [request.get("exactly") or {}]
        for spec in specs:
            found = mismatches.selectors(spec.get("selectors"), None)
            if found and mismatches.compile_problem(found) is None:
                lists.append(tuple(s.compiled for s in found))
    return lists


def explain_request(request: Body, scope: Scope, classes: Mapping[str, Body]) -> RequestExplanation:
    """One entry of the claim's ``spec.devices.requests``, as its Scope sees the World."""
    memo = None
    if scope.shared is not None:
        names = class_names({"spec": {"devices": {"requests": [request]}}})
        versions = scope.world.versions
        memo = (
            json.dumps(request, sort_keys=True, default=str),
            tuple(id(classes.get(n)) for n in names),
            tuple(versions(n) for n in names) if versions is not None else (),
            *scope.shared,
        )
        found = scope.world.request_checks.get(memo)
        if found is not None:
            return found
    name = str(request.get("name", ""))
    if request.get("firstAvailable") and request.get("exactly") is None:
        alternatives = tuple(
            _exact(f"{name}/{sub.get('name', '')}", sub, scope, classes)
            for sub in request["firstAvailable"]
        )
        result = _first_available(name, alternatives)
    else:
        result = _exact(name, request.get("exactly") or {}, scope, classes)
    if memo is not None:
        scope.world.request_checks[memo] = result
    return result


def _first_available(name: str, alternatives: tuple[RequestExplanation, ...]) -> RequestExplanation:
    """The request fits if any alternative does; but a missing class or a selector that does
    not compile in any alternative stops the scheduler before it tries one (PreFilter)."""
    blocked = [
        a
        for a in alternatives
        if a.reason in (Reason.DEVICE_CLASS_MISSING, Reason.SELECTOR_INVALID)
    ]
    if blocked:
        return dataclasses.replace(blocked[0], request=name, nodes=(), subrequests=alternatives)
    fitting = [a for a in alternatives if a.satisfied]
    if fitting:
        nodes = tuple(sorted({n for a in fitting for n in a.nodes}))
        return dataclasses.replace(fitting[0], request=name, nodes=nodes, subrequests=alternatives)
    ranked = sorted(alternatives, key=lambda a: results.SEVERITY[a.reason])
    return RequestExplanation(
        request=name,
        device_class=", ".join(a.device_class for a in alternatives),
        reason=ranked[0].reason,
        message=wording.join_messages([a.message for a in ranked]),
        pieces=results.combine_pieces([a.pieces for a in alternatives], any_of=True),
        subrequests=alternatives,
    )


def _exact(name: str, spec: Body, scope: Scope, classes: Mapping[str, Body]) -> RequestExplanation:
    """An exactly-request or a subrequest (``spec``): class, selectors, then devices."""
    class_name = str(spec.get("deviceClassName", ""))
    device_class = classes.get(class_name)
    if device_class is None:
        # The scheduler's own words (PreFilter), so the two messages can be matched up.
        message = f"request {name}: device class {class_name} does not exist"
        pieces = (Piece("class", False, message), *results.unchecked()[1:])
        return RequestExplanation(name, class_name, Reason.DEVICE_CLASS_MISSING, message, pieces)
    class_selectors = mismatches.selectors(
        (device_class.get("spec") or {}).get("selectors"), class_name
    )
    request_selectors = mismatches.selectors(spec.get("selectors"), None)
    class_ok = Piece("class", True, f"device class {class_name} exists")
    for selectors, piece in ((class_selectors, "class"), (request_selectors, "devices")):
        problem = mismatches.compile_problem(selectors)
        if problem is not None:
            message = f"request {name}: {problem}"
            pieces = results.with_piece(
                (class_ok, *results.unchecked()[1:]), Piece(piece, False, message)
            )
            return RequestExplanation(name, class_name, Reason.SELECTOR_INVALID, message, pieces)
    check = matching.RequestCheck(name, class_name, spec, scope, class_selectors, request_selectors)
    return check.explain()
