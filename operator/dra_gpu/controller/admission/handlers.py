"""The webhook's handlers: one Kopf ``on.validate`` per kind, on every replica.

Owns: registering the three validators (ids ``resourceclaims``, ``resourceclaimtemplates``,
``deviceclasses``: Kopf serves each at ``/<id>``, the paths of the chart's
ValidatingWebhookConfiguration), answering each review from ``review`` — a refusal as a
``kopf.AdmissionError`` (HTTP 422 in the response's status, which ``kubectl apply`` prints
after "denied the request:"), a warning from the replica's own view — and the admission
metrics. A dry run (``--dry-run=server``) is answered the same way: the handlers have no side
effects. Before a claim is explained, ``warm`` works out its selectors on every device with
breaks for the event loop (a selector nobody used before would otherwise hold the loop for as
long as a CEL evaluation per distinct device takes): if that does not finish within its
budget, the object is admitted without a warning.
Must not: refuse for anything but a config, or because the warning could not be worked out
(that failure is logged and the object admitted); write anything.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import kopf

from dra_gpu.controller.admission import review
from dra_gpu.controller.explain import Explanation
from dra_gpu.serving import metrics

log = logging.getLogger(__name__)
REFUSED_CODE = 422
"""Invalid: what the API server answers for an object its own validation refuses."""

Explain = Callable[[Mapping[str, Any]], Explanation | None]
"""A claim (as ``review.claim_of`` gives it) explained against the replica's view now; None
when the view has not been filled yet (nothing to warn about)."""


Warm = Callable[[Mapping[str, Any]], Awaitable[bool]]
"""Make explaining a claim cheap (its selectors' outcomes worked out, with breaks); False when
that did not finish within its budget."""


def register(
    handlers: kopf.OperatorRegistry, driver: str, explain_now: Explain, warm: Warm
) -> None:
    """Add the validators of every kind in ``review.KINDS`` to ``handlers``."""
    for kind in review.KINDS.values():
        _register(handlers, kind, driver, explain_now, warm)
        metrics.ADMISSION_WARNINGS.labels(kind.plural)
        metrics.ADMISSION_UNEXPLAINED.labels(kind.plural)
        for result in metrics.ADMISSION_RESULTS:
            metrics.ADMISSION_REQUESTS.labels(kind.plural, result)


def answer(
    kind: review.Kind, body: Mapping[str, Any], driver: str, explain_now: Explain
) -> tuple[str | None, str | None]:
    """The refusal, or else the warning (each None when there is none) for one object."""
    refused = review.refusal(kind, body, driver)
    if refused is not None:
        return refused, None
    claim = review.claim_of(kind, body)
    if claim is None:
        return None, None
    try:
        explanation = explain_now(claim)
    except Exception:  # a warning is advice: never a reason to refuse
        log.exception("admission: could not explain %s %s", kind.name, review.object_name(body))
        return None, None
    return None, review.warning(kind, body, explanation) if explanation else None


def _unexplained(claim: Mapping[str, Any]) -> Explanation | None:
    return None


def _register(
    handlers: kopf.OperatorRegistry,
    kind: review.Kind,
    driver: str,
    explain_now: Explain,
    warm: Warm,
) -> None:
    @kopf.on.validate(
        "resource.k8s.io",
        "v1",
        kind.plural,
        id=kind.plural,
        operations=["CREATE", "UPDATE"],
        registry=handlers,
    )
    async def validate(body: kopf.Body, warnings: list[str], **_: Any) -> None:
        started = time.perf_counter()
        result = "error"
        try:
            explaining = explain_now
            claim = review.claim_of(kind, body)
            explained = claim is None or review.refusal(kind, body, driver) is not None
            if not explained and not await warm(claim or {}):
                explaining = _unexplained
                metrics.ADMISSION_UNEXPLAINED.labels(kind.plural).inc()
            refused, warned = answer(kind, body, driver, explaining)
            if refused is not None:
                result = "refused"
                raise kopf.AdmissionError(refused, code=REFUSED_CODE)
            if warned is not None:
                warnings.append(warned)
                metrics.ADMISSION_WARNINGS.labels(kind.plural).inc()
            result = "allowed"
        finally:
            metrics.ADMISSION_REQUESTS.labels(kind.plural, result).inc()
            metrics.ADMISSION_SECONDS.labels(kind.plural).observe(time.perf_counter() - started)
