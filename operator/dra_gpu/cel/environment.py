"""CEL device selectors, evaluated exactly as kube-scheduler evaluates them.

Owns the CEL side of DRA: compiling the ``cel.expression`` of DeviceClass and request
selectors once (cached per expression), building the ``device`` variable from one device of a
ResourceSlice, and evaluating one against the other. Pure logic: no I/O, no Kubernetes client,
no clock; callers pass plain dicts as the API returns them and get plain results back.

The reference is kube-scheduler 1.37 (k8s.io/dynamic-resource-allocation/cel v0.37.2 on cel-go
v0.29.2 and the Kubernetes CEL libraries of k8s.io/apiserver): ``cel.NewCache(...).GetOrCompile``
then ``DeviceMatches``, in the "stored expressions" environment the scheduler compiles in. The
private package ``dra_gpu.cel._port`` reimplements that stack in Python, piece by piece:

- ``syntax``: cel-go's parser (grammar, literals and escapes, reserved words, recursion limits) and
  every macro of the environment (``has``, ``all``/``exists``/``exists_one`` with one or two
  variables, ``map``/``filter``, ``transformList``/``transformMap``/``transformMapEntry``,
  ``cel.bind``, ``optMap``/``optFlatMap``, ``sortBy``), expanded as cel-go expands them;
- ``checker``: cel-go's type checker with the environment's declarations (``declarations``,
  written from upstream's own environment), homogeneous literals, and the selector's result
  type (bool, or dyn for an attribute); what does not compile upstream does not compile here;
- ``runtime``: cel-go's evaluation rules (error absorption in ``&&``/``||`` and comprehensions,
  lazy accumulators, attribute qualifiers, optional chains, constant folding of conversions and
  regular expressions) and a cost bound (``runtime.COST_LIMIT``, DRA's 1,000,000);
- ``library`` and friends: the functions, by overload: the standard library with checked int64/
  uint64 arithmetic, Go's number and time parsing and formatting (``golang``), strings
  (code points, ASCII case, Go's split/trim), lists, sets, optionals, RE2 regular expressions
  with Go's ASCII classes (``regex``), quantities as apimachinery stores them
  (``dra_gpu.resource.quantities``, shared with the device model and the controller:
  ``isInteger`` is false for ``1.5Gi``), semantic versions (``dra_gpu.resource.semvers``),
  IP/CIDR/URL and named formats.

The ``device`` variable: ``device.driver``, ``device.allowMultipleAllocations`` (false when unset),
``device.attributes`` and ``device.capacity``: maps from domain to maps from identifier to value. A
bare name in the slice (``memory``) belongs to the driver's domain, a qualified one
(``resource.kubernetes.io/pciBusID``) to its own. An unknown *domain* reads as an empty map (also
for ``has()``), as upstream's defaulting map does; ``in`` and ``size()`` see only real domains. An
unknown *identifier* is a runtime error (``no such key: <name>``). Capacities are read back in
their canonical form, as the scheduler reads them from the API server.

What is refused at compile time, with a message naming the expression and the feature, instead of
being evaluated differently, is listed in docs/development.md ("CEL selectors"). Errors never
raise out of this module: they come back in ``Compiled.error`` / ``Evaluation.error``.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Final

from dra_gpu.cel import comparing
from dra_gpu.cel._port import checker, runtime, syntax
from dra_gpu.cel._port.library import DefaultMap, type_name
from dra_gpu.cel._port.values import CelError
from dra_gpu.resource.quantities import QuantityError, parse_quantity
from dra_gpu.resource.semvers import SemverError, parse_semver

__all__ = [
    "MAX_EXPRESSION_BYTES",
    "QUANTITY_TYPE",
    "SEMVER_TYPE",
    "Compiled",
    "DeviceValues",
    "Evaluation",
    "compile_selector",
    "device_view",
    "evaluate",
    "evaluate_all",
    "evaluate_device",
]

MAX_EXPRESSION_BYTES: Final = 10 * 1024
"""resource.k8s.io/v1 ``CELSelectorExpressionMaxLength``: the API server rejects longer ones."""

QUANTITY_TYPE: Final = "kubernetes.Quantity"
"""The CEL type name of a capacity value (``type(device.capacity[d].memory)``)."""
SEMVER_TYPE: Final = "kubernetes.Semver"
"""The CEL type name of a ``version`` attribute."""

_COMPILE_CACHE_SIZE: Final = 1024
# Verdicts cached by (expression, what the expression reads of the device); see evaluate_device.
_VERDICT_CACHE_SIZE: Final = 200_000
_PROFILE_TABLE_SIZE: Final = 1_000_000

_RECURSION_LIMIT: Final = 6000
# cel-go parses 249 levels of nesting, and the recursive descent here needs about ten Python
# frames a level: raised once, when this module is loaded, so that it never changes under a
# running caller (Python 3.11 keeps Python-to-Python calls off the C stack).
if sys.getrecursionlimit() < _RECURSION_LIMIT:
    sys.setrecursionlimit(_RECURSION_LIMIT)
_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1


# --- public interface ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Compiled:
    """One selector expression, compiled once; ``error`` is set when it did not compile."""

    expression: str
    error: str | None
    _program: runtime.Program | None = dataclasses.field(default=None, repr=False, compare=False)
    _reads: tuple[_Read, ...] | None = dataclasses.field(default=None, repr=False, compare=False)
    """What the expression reads of ``device``, when only fixed keys (see ``_device_reads``)."""


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """The outcome of one selector on one device. ``matched`` is False whenever ``error`` is set."""

    matched: bool
    error: str | None


@functools.lru_cache(maxsize=_COMPILE_CACHE_SIZE)
def compile_selector(expression: str) -> Compiled:
    """Compile ``expression``; the same string returns the same object. Never raises.

    What does not parse or type-check in the scheduler's environment comes back as
    ``Compiled.error`` with cel-go's message; so does a feature this evaluator does not
    implement, named, with the expression.
    """
    size = len(expression.encode())
    if size > MAX_EXPRESSION_BYTES:
        return Compiled(
            expression, f"expression is {size} bytes long, more than {MAX_EXPRESSION_BYTES}"
        )
    try:
        tree = syntax.parse(expression)
        checker.check(tree, expression)
        program = runtime.plan(tree)
    except (syntax.SyntaxError_, checker.CheckError) as error:
        return Compiled(expression, f"compilation failed: {error}")
    except checker.Unsupported as error:
        return Compiled(expression, f"CEL expression {expression!r}: {error}")
    except runtime.PlanError as error:
        if error.unsupported:
            return Compiled(expression, f"CEL expression {expression!r}: {error}")
        return Compiled(expression, f"program instantiation failed: {error}")
    except RecursionError:
        return Compiled(expression, "compilation failed: expression nests too deeply")
    except Exception as error:  # a bug here must not crash the caller (cel-go recovers too)
        return Compiled(expression, f"internal error compiling {expression!r}: {error!r}")
    return Compiled(expression, None, program, _device_reads(tree))


def evaluate(compiled: Compiled, driver: str, device: Mapping[str, Any]) -> Evaluation:
    """Evaluate one compiled selector against one ResourceSlice device. Never raises.

    ``driver`` is the slice's ``spec.driver``; ``device`` one entry of its ``spec.devices``.
    A selector that did not compile evaluates to its compile error.
    """
    return evaluate_all((compiled,), driver, device)[0]


def evaluate_all(
    selectors: Sequence[Compiled], driver: str, device: Mapping[str, Any]
) -> list[Evaluation]:
    """Evaluate several selectors (a class's, then a request's) against one device, in order.

    Same results as ``evaluate`` for each, but the device is checked and converted once.
    Never raises.
    """
    results: list[Evaluation] = []
    view: _View | None = None
    view_error: str | None = None
    for compiled in selectors:
        program = compiled._program
        if program is None:
            results.append(Evaluation(False, compiled.error or "expression was not compiled"))
            continue
        if view is None and view_error is None:
            try:
                view = _View(driver, device)
            except (ValueError, TypeError, AttributeError) as error:
                view_error = str(error) or type(error).__name__
        if view is None:
            results.append(Evaluation(False, view_error))
            continue
        results.append(_run(program, view))
    return results


class DeviceValues:
    """One ResourceSlice device, ready to be judged by many selectors.

    Keep one per device for as long as its slice is unchanged: the device is checked once
    (upstream rejects some values whatever the selector), and ``evaluate_device`` caches
    verdicts by what each expression reads of it, so thousands of devices that differ only in
    names, indexes and UUIDs cost one CEL evaluation per selector and kind of device.
    """

    __slots__ = ("_domains", "_profiles", "_view", "device", "driver", "error")

    def __init__(self, driver: str, device: Mapping[str, Any]) -> None:
        self.driver = driver
        self.device = device
        self.error: str | None = None
        """Why the device cannot be a CEL ``device`` at all (every selector fails with it)."""
        self._view: _View | None = None
        try:
            self._view = _View(driver, device)
        except (ValueError, TypeError, AttributeError) as error:
            self.error = str(error) or type(error).__name__
        self._domains: tuple[tuple[str, ...], tuple[str, ...]] | None = None
        self._profiles: dict[tuple[_Read, ...], tuple[int, int]] = {}

    def _profile(self, reads: tuple[_Read, ...]) -> int:
        known = self._profiles.get(reads)
        if known is not None and known[0] == _profile_table.generation:
            return known[1]
        profile = _profile_table.intern(_projection(self, reads))
        self._profiles[reads] = (_profile_table.generation, profile)
        return profile


def evaluate_device(compiled: Compiled, values: DeviceValues) -> Evaluation:
    """``evaluate(compiled, values.driver, values.device)``, remembered. Never raises.

    The verdict of an expression that reads only fixed keys of ``device`` (``device.driver``,
    ``device.attributes["d"].name``, ``device.capacity["d"]["name"]``, ...) depends only on
    the values under those keys; it is cached by them, so devices alike in those values share
    one evaluation. Any other expression is evaluated every time.
    """
    if compiled._program is None:
        return Evaluation(False, compiled.error or "expression was not compiled")
    if values.error is not None or values._view is None:
        return Evaluation(False, values.error)
    reads = compiled._reads
    if reads is None:
        return _run(compiled._program, values._view)
    key = (compiled.expression, values._profile(reads))
    verdict = _verdicts.get(key)
    if verdict is None:
        verdict = _run(compiled._program, values._view)
        if len(_verdicts) >= _VERDICT_CACHE_SIZE:
            _verdicts.clear()
        _verdicts[key] = verdict
    return verdict


def device_view(driver: str, device: Mapping[str, Any]) -> dict[str, Any]:
    """The CEL ``device`` variable for one ResourceSlice device, as the scheduler builds it.

    Raises ValueError, naming the attribute or capacity, for values upstream rejects too (a
    version that is not semver, an attribute with no value, a capacity that is no quantity).
    """
    return _View(driver, device).variable()


# --- the device variable -------------------------------------------------------------------------


class _View:
    """A device checked and converted once. Capacities are kept as canonical text: every
    evaluation gets fresh Quantity values (upstream's are fresh per DeviceMatches, and a
    comparison may change one in place)."""

    __slots__ = ("attributes", "capacity", "driver", "multiple")

    def __init__(self, driver: str, device: Mapping[str, Any]) -> None:
        attributes: dict[str, dict[str, Any]] = {}
        raw_attributes = device.get("attributes") or {}
        if not isinstance(raw_attributes, Mapping):
            raise ValueError(f"attributes: expected an object, got {raw_attributes!r}")
        for name, attribute in raw_attributes.items():
            domain, ident = _split_qualified_name(name, driver)
            attributes.setdefault(domain, {})[ident] = _attribute_value(name, attribute)
        capacity: dict[str, dict[str, str]] = {}
        raw_capacity = device.get("capacity") or {}
        if not isinstance(raw_capacity, Mapping):
            raise ValueError(f"capacity: expected an object, got {raw_capacity!r}")
        for name, entry in raw_capacity.items():
            domain, ident = _split_qualified_name(name, driver)
            capacity.setdefault(domain, {})[ident] = _capacity_text(name, entry)
        multiple = device.get("allowMultipleAllocations")
        if multiple is not None and type(multiple) is not bool:
            raise ValueError(f"allowMultipleAllocations: expected a bool, got {multiple!r}")
        self.driver = driver
        self.multiple = bool(multiple)
        self.attributes = DefaultMap(attributes)
        self.capacity = capacity

    def variable(self) -> dict[str, Any]:
        capacity = DefaultMap()
        for domain, entries in self.capacity.items():
            capacity[domain] = {ident: parse_quantity(text) for ident, text in entries.items()}
        return {
            "driver": self.driver,
            "allowMultipleAllocations": self.multiple,
            "attributes": self.attributes,
            "capacity": capacity,
        }


def _run(program: runtime.Program, view: _View) -> Evaluation:
    try:
        result = program.run(view.variable())
    except CelError as error:
        return Evaluation(False, str(error) or "evaluation failed")
    except RecursionError:
        return Evaluation(False, "evaluation nests too deeply")
    except Exception as error:  # a bug here must not crash the caller (cel-go recovers too)
        return Evaluation(False, f"internal error: {error!r}")
    if type(result) is not bool:
        return Evaluation(
            False,
            f"CEL result of type {type_name(result)} could not be converted to bool",
        )
    return Evaluation(result, None)


def _split_qualified_name(name: str, driver: str) -> tuple[str, str]:
    # Upstream's parseQualifiedName: everything before the first "/" is the domain.
    domain, sep, ident = name.partition("/")
    return (domain, ident) if sep else (driver, name)


def _attribute_value(name: str, attribute: Any) -> Any:
    if not isinstance(attribute, Mapping):
        raise ValueError(f"attribute {name}: expected an object such as {{'int': 1}}")
    # Upstream's getAttributeValue checks the fields in this order: the list values (which
    # exist only with the DRAListTypeAttributes gate), then the scalars.
    if (values := attribute.get("ints")) is not None:
        return [_int_value(name, v) for v in values]
    if (values := attribute.get("bools")) is not None:
        return [_bool_value(name, v) for v in values]
    if (values := attribute.get("strings")) is not None:
        return [_string_value(name, v) for v in values]
    if (versions := attribute.get("versions")) is not None:
        return [_version_value(name, v) for v in versions]
    if (number := attribute.get("int")) is not None:
        return _int_value(name, number)
    if (flag := attribute.get("bool")) is not None:
        return _bool_value(name, flag)
    if (text := attribute.get("string")) is not None:
        return _string_value(name, text)
    if (version := attribute.get("version")) is not None:
        return _version_value(name, version)
    raise ValueError(f"attribute {name}: unsupported attribute value")


def _int_value(name: str, number: Any) -> int:
    if type(number) is not int or not _INT64_MIN <= number <= _INT64_MAX:
        raise ValueError(f"attribute {name}: int value {number!r} is not a 64-bit integer")
    return number


def _bool_value(name: str, flag: Any) -> bool:
    if type(flag) is not bool:
        raise ValueError(f"attribute {name}: bool value {flag!r} is not a bool")
    return flag


def _string_value(name: str, text: Any) -> str:
    if not isinstance(text, str):
        raise ValueError(f"attribute {name}: string value {text!r} is not a string")
    return text


def _version_value(name: str, version: Any) -> Any:
    if not isinstance(version, str):
        raise ValueError(f"attribute {name}: version value {version!r} is not a string")
    try:
        return parse_semver(version)
    except SemverError as error:
        raise ValueError(f"attribute {name}: parse semantic version: {error}") from None


@functools.lru_cache(maxsize=4096)
def _canonical_quantity(text: str) -> str:
    # What the scheduler parses: the text the API server stored (Quantity.String()).
    return parse_quantity(text).string()


def _capacity_text(name: str, entry: Any) -> str:
    value = entry.get("value") if isinstance(entry, Mapping) else None
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)  # a YAML author's bare number; the API would have sent a string
    if not isinstance(value, str):
        raise ValueError(f"capacity {name}: expected {{'value': <quantity>}}, got {entry!r}")
    try:
        return _canonical_quantity(value)
    except QuantityError as error:
        raise ValueError(f"capacity {name}: {error}") from None


# --- cached verdicts ------------------------------------------------------------------------------

_Read = tuple[str, ...]
"""``("driver",)``, ``("allowMultipleAllocations",)`` or ``(field, domain, identifier)`` with
field ``attributes`` or ``capacity``."""

_KEYED_ACCESS: Final = ("_[_]", "_[?_]", "_?._")


def _device_reads(tree: syntax.Expr) -> tuple[_Read, ...] | None:
    """The fixed keys the expression reads of ``device``; None when it may read more.

    Recognised: ``device.driver``, ``device.allowMultipleAllocations``, and
    ``device.attributes`` or ``device.capacity`` followed by two constant keys (``.name``,
    ``["name"]``, ``.?name``, ``[?"name"]``, or inside ``has()``). Anything else that touches
    ``device`` (the whole map, ``in``, ``size()``, a computed key, a comprehension variable of
    that name) means None, and the caller does not cache.
    """
    reads: set[_Read] = set()
    stack = [tree]
    while stack:
        expr = stack.pop()
        if isinstance(expr, syntax.Comprehension):
            if "device" in (expr.iter_var, expr.iter_var2, expr.accu_var):
                return None
            stack += [expr.iter_range, expr.accu_init, expr.loop_condition, expr.loop_step]
            stack.append(expr.result)
            continue
        path = _device_path(expr)
        if path is not None:
            reads.add(path)
            continue
        if isinstance(expr, syntax.Ident):
            if expr.name.removeprefix(".") == "device":
                return None
        elif isinstance(expr, syntax.Select):
            stack.append(expr.operand)
        elif isinstance(expr, syntax.Call):
            if expr.target is not None:
                stack.append(expr.target)
            stack += expr.args
        elif isinstance(expr, syntax.CreateList):
            stack += expr.elements
        elif isinstance(expr, syntax.CreateMap):
            for key, value, _ in expr.entries:
                stack += [key, value]
    return tuple(sorted(reads))


def _key_access(expr: syntax.Expr) -> tuple[syntax.Expr, str] | None:
    """(operand, constant key) of ``x.k``, ``x["k"]``, ``x.?k``, ``x[?"k"]`` or ``has(x.k)``."""
    if isinstance(expr, syntax.Select) and expr.resolved is None:
        return expr.operand, expr.field
    if isinstance(expr, syntax.Call) and expr.function in _KEYED_ACCESS and expr.target is None:
        key = expr.args[1]
        if isinstance(key, syntax.Literal) and type(key.value) is str:
            return expr.args[0], key.value
    return None


def _device_path(expr: syntax.Expr) -> _Read | None:
    outer = _key_access(expr)
    if outer is None:
        return None
    operand, key = outer
    if comparing.is_device(operand) and key in ("driver", "allowMultipleAllocations"):
        return (key,)
    middle = _key_access(operand)
    if middle is None or (isinstance(operand, syntax.Select) and operand.test_only):
        return None
    inner_operand, domain = middle
    inner = _key_access(inner_operand)
    if inner is None or (isinstance(inner_operand, syntax.Select) and inner_operand.test_only):
        return None
    device, field = inner
    if (
        comparing.is_device(device)
        and field in ("attributes", "capacity")
        and isinstance(inner_operand, syntax.Select)
    ):
        return (field, domain, key)
    return None


_ABSENT: Final = ("absent",)


def _frozen(value: Any) -> Any:
    """A hashable copy of a JSON value that keeps types apart (1, 1.0 and True differ)."""
    if isinstance(value, Mapping):
        return ("map", tuple(sorted((str(k), _frozen(v)) for k, v in value.items())))
    if isinstance(value, list | tuple):
        return ("list", tuple(_frozen(v) for v in value))
    return (type(value).__name__, value)


def _projection(values: DeviceValues, reads: tuple[_Read, ...]) -> tuple[Any, ...]:
    """What decides the verdict of an expression with these ``reads`` on this device."""
    device = values.device
    if values._domains is None:
        values._domains = (
            _domains_of(device.get("attributes"), values.driver),
            _domains_of(device.get("capacity"), values.driver),
        )
    found: list[Any] = [
        values.driver,
        _frozen(device.get("allowMultipleAllocations")),
        values._domains,
    ]
    for read in reads:
        if len(read) == 3:
            found.append(_entry(device.get(read[0]), values.driver, read[1], read[2]))
    return tuple(found)


@functools.lru_cache(maxsize=4096)
def _intern_domains(domains: tuple[str, ...]) -> tuple[str, ...]:
    return domains


def _domains_of(entries: Any, driver: str) -> tuple[str, ...]:
    if not isinstance(entries, Mapping):
        return ()
    return _intern_domains(tuple(sorted({_split_qualified_name(n, driver)[0] for n in entries})))


def _entry(entries: Any, driver: str, domain: str, name: str) -> Any:
    """The raw entry device_view would read for (domain, name): the last one whose qualified
    name splits into it (a bare name is the driver's domain)."""
    if not isinstance(entries, Mapping):
        return _ABSENT
    qualified = f"{domain}/{name}"
    if domain != driver or "/" in name:
        # Only "<domain>/<name>" splits into it (a name with "/" never comes from a bare one).
        if "/" in name:
            last = _ABSENT
            for key, entry in entries.items():
                if _split_qualified_name(key, driver) == (domain, name):
                    last = _frozen(entry)
            return last
        return _frozen(entries[qualified]) if qualified in entries else _ABSENT
    if name in entries and qualified in entries:
        last = _ABSENT
        for key, entry in entries.items():
            if key in (name, qualified):
                last = _frozen(entry)
        return last
    if name in entries:
        return _frozen(entries[name])
    return _frozen(entries[qualified]) if qualified in entries else _ABSENT


class _ProfileTable:
    """Interns projections as small numbers, so a cached verdict's key hashes cheaply.
    Emptied (and its generation bumped) when full; DeviceValues then recompute theirs."""

    def __init__(self) -> None:
        self.generation = 0
        self._ids: dict[tuple[Any, ...], int] = {}
        self._lock = threading.Lock()

    def intern(self, projection: tuple[Any, ...]) -> int:
        with self._lock:
            if len(self._ids) >= _PROFILE_TABLE_SIZE:
                self._ids.clear()
                _verdicts.clear()
                self.generation += 1
            return self._ids.setdefault(projection, len(self._ids))


_profile_table = _ProfileTable()
_verdicts: dict[tuple[str, int], Evaluation] = {}
