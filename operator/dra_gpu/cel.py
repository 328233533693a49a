"""CEL device selectors, evaluated the way kube-scheduler evaluates them.

Owns the CEL side of DRA: compiling the ``cel.expression`` of DeviceClass and request
selectors once (cached per expression), building the ``device`` variable from one device of a
ResourceSlice, and evaluating one against the other. Pure logic: no I/O, no Kubernetes client,
no clock; callers pass plain dicts as the API returns them and get plain results back.

What it reproduces (k8s.io/dynamic-resource-allocation ``cel/compile.go`` and the Kubernetes
base CEL environment of k8s.io/apiserver ``pkg/cel``):

- ``device.driver`` (string), ``device.allowMultipleAllocations`` (bool, false when unset),
  ``device.attributes`` and ``device.capacity``: maps from domain to maps from identifier to
  value. A bare name in the slice (``memory``) belongs to the driver's domain, a qualified one
  (``resource.kubernetes.io/pciBusID``) to its own. Indexing an unknown *domain* gives an empty
  map, as upstream's defaulting map does; an unknown *identifier* is a runtime error
  (``no such key: <name>``).
- Attribute values: int, bool, string, and ``version`` as a Semver; capacity values as
  Quantities. ``quantity()``, ``isQuantity()``, ``compareTo``, ``isGreaterThan``,
  ``isLessThan``, ``sign``, ``isInteger``, ``asInteger``, ``asApproximateFloat``, ``add``,
  ``sub``; ``semver()`` (with the optional ``normalize`` flag), ``isSemver()``, ``major``,
  ``minor``, ``patch``. Quantities are parsed exactly like apimachinery's ``ParseQuantity``
  (rounded up to nano units, binary-suffixed values capped at 2^63-1) and compared exactly;
  versions like blang/semver v4 ``Parse``/``Compare``.
- The result must be a bool; anything else is an error, as is any runtime error. Errors never
  raise out of this module: they come back in ``Compiled.error`` / ``Evaluation.error``.

How: the library (PyPI ``common-expression-language``, module ``cel``, Rust core) has no
custom types, only Python functions over its own values. A Quantity is therefore the one-entry
map ``{"kubernetes.Quantity": "<exact value>"}`` (plain decimal: "25769803776" for 24Gi, "1.5";
"1e400" past 30 zeros) and a Semver the map ``{"kubernetes.Semver": "<version>"}`` (build
metadata dropped). The text is canonical, so CEL's
``==`` on two of them means the same as upstream's ``Equal`` (same value; build metadata
ignored), and being maps, ``<``, ``+`` and friends fail with "no such overload" instead of
comparing text. The registered functions dispatch on that single key.

Known differences, all for expressions that are rare or that the API server would reject:
``cel.bind``, two-variable comprehensions and ``.?`` optional field selection are not
implemented by the library (reported as ``Compiled.error``); the cost limit is not enforced;
expressions are not type-checked, so type errors that upstream reports at compile time surface
at evaluation; ``isInteger``/``asInteger`` judge the value (integral and within int64), where
upstream also says no for a value it happens to hold in scaled form, e.g. ``quantity("1000m")``;
``==`` between a Quantity or Semver and another type is false, where upstream errors;
``asApproximateFloat`` rounds the exact value, where upstream multiplies in floating point;
the IP, CIDR, URL, regex ``find``, ``format`` and ``image`` libraries are absent; once an
evaluation has looked up an unknown domain, ``in`` and ``size()`` on that map count it.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import logging
import math
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from typing import Any, Final, NamedTuple

import cel
from cel import stdlib as cel_stdlib

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
"""The one key of the map that stands for a Quantity in CEL: ``{QUANTITY_TYPE: "1.5"}``."""
SEMVER_TYPE: Final = "kubernetes.Semver"
"""The one key of the map that stands for a Semver in CEL: ``{SEMVER_TYPE: "1.2.3-rc.1"}``."""

_COMPILE_CACHE_SIZE: Final = 1024
# Verdicts cached by (expression, what the expression reads of the device); see evaluate_device.
_VERDICT_CACHE_SIZE: Final = 200_000
_PROFILE_TABLE_SIZE: Final = 1_000_000
# Bounds how many unknown domains one evaluation may default to an empty map (see _execute).
_MAX_DEFAULTED_DOMAINS: Final = 4

_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1
_UINT64_MAX: Final = 2**64 - 1


# --- public interface ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Compiled:
    """One selector expression, compiled once; ``error`` is set when it did not compile."""

    expression: str
    error: str | None
    _program: cel.Program | None = dataclasses.field(default=None, repr=False, compare=False)
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

    Syntax errors come back as ``Compiled.error`` with the library's message.
    """
    size = len(expression.encode())
    if size > MAX_EXPRESSION_BYTES:
        return Compiled(
            expression, f"expression is {size} bytes long, more than {MAX_EXPRESSION_BYTES}"
        )
    try:
        program = cel.compile(expression)
        unsupported = _unsupported_constructs(program)
    except Exception as error:  # the library raises ValueError, and more on parser panics
        return Compiled(expression, _message(error))
    if unsupported:
        return Compiled(expression, unsupported)
    return Compiled(expression, None, program, _device_reads(expression))


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

    Same results as ``evaluate`` for each, but the device is converted into CEL values once,
    which is most of the cost of an evaluation. Never raises.
    """
    results: list[Evaluation] = []
    view: dict[str, Any] | None = None
    view_error: str | None = None
    context = _thread_context()
    loaded = False  # whether ``context`` holds ``view`` as "device" right now
    for compiled in selectors:
        if compiled._program is None:
            results.append(Evaluation(False, compiled.error or "expression was not compiled"))
            continue
        if view is None and view_error is None:
            try:
                view = device_view(driver, device)
            except Exception as error:  # a device upstream could not represent either
                view_error = _message(error)
        if view is None:
            results.append(Evaluation(False, view_error))
            continue
        if not loaded:
            context.add_variable("device", view)
        evaluation, loaded = _execute(compiled._program, context, view)
        results.append(evaluation)
    return results


class DeviceValues:
    """One ResourceSlice device, ready to be judged by many selectors.

    Keep one per device for as long as its slice is unchanged: the device is checked once
    (upstream rejects some values whatever the selector), and ``evaluate_device`` caches
    verdicts by what each expression reads of it, so thousands of devices that differ only in
    names, indexes and UUIDs cost one CEL evaluation per selector and kind of device.
    """

    __slots__ = ("_domains", "_profiles", "device", "driver", "error")

    def __init__(self, driver: str, device: Mapping[str, Any]) -> None:
        self.driver = driver
        self.device = device
        self.error: str | None = None
        """Why the device cannot be a CEL ``device`` at all (every selector fails with it)."""
        try:
            device_view(driver, device)
        except Exception as error:  # as evaluate_all: a device upstream cannot represent either
            self.error = _message(error)
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
    the values under those keys (and on which domains the device has, which decides what an
    unknown domain does); it is cached by them, so devices alike in those values share one
    evaluation. Any other expression is evaluated every time.
    """
    if compiled._program is None:
        return Evaluation(False, compiled.error or "expression was not compiled")
    if values.error is not None:
        return Evaluation(False, values.error)
    reads = compiled._reads
    if reads is None:
        return evaluate(compiled, values.driver, values.device)
    key = (compiled.expression, values._profile(reads))
    verdict = _verdicts.get(key)
    if verdict is None:
        verdict = evaluate(compiled, values.driver, values.device)
        if len(_verdicts) >= _VERDICT_CACHE_SIZE:
            _verdicts.clear()
        _verdicts[key] = verdict
    return verdict


def device_view(driver: str, device: Mapping[str, Any]) -> dict[str, Any]:
    """The CEL ``device`` variable for one ResourceSlice device.

    Raises ValueError, naming the attribute or capacity, for values upstream rejects too (a
    version that is not semver, an attribute with no value, a capacity that is no quantity).
    """
    attributes: dict[str, dict[str, Any]] = {}
    for name, attribute in (device.get("attributes") or {}).items():
        domain, ident = _split_qualified_name(name, driver)
        attributes.setdefault(domain, {})[ident] = _attribute_value(name, attribute)
    capacity: dict[str, dict[str, Any]] = {}
    for name, entry in (device.get("capacity") or {}).items():
        domain, ident = _split_qualified_name(name, driver)
        capacity.setdefault(domain, {})[ident] = _capacity_value(name, entry)
    multiple = device.get("allowMultipleAllocations")
    if multiple is not None and type(multiple) is not bool:
        raise ValueError(f"allowMultipleAllocations: expected a bool, got {multiple!r}")
    return {
        "driver": driver,
        "allowMultipleAllocations": bool(multiple),
        "attributes": attributes,
        "capacity": capacity,
    }


# --- the device variable -------------------------------------------------------------------------


def _split_qualified_name(name: str, driver: str) -> tuple[str, str]:
    # Upstream's parseQualifiedName: everything before the first "/" is the domain.
    domain, sep, ident = name.partition("/")
    return (domain, ident) if sep else (driver, name)


def _attribute_value(name: str, attribute: Any) -> Any:
    if not isinstance(attribute, Mapping):
        raise ValueError(f"attribute {name}: expected an object such as {{'int': 1}}")
    # Upstream's getAttributeValue checks the fields in this order.
    if (number := attribute.get("int")) is not None:
        if type(number) is not int or not _INT64_MIN <= number <= _INT64_MAX:
            raise ValueError(f"attribute {name}: int value {number!r} is not a 64-bit integer")
        return number
    if (flag := attribute.get("bool")) is not None:
        if type(flag) is not bool:
            raise ValueError(f"attribute {name}: bool value {flag!r} is not a bool")
        return flag
    if (text := attribute.get("string")) is not None:
        if not isinstance(text, str):
            raise ValueError(f"attribute {name}: string value {text!r} is not a string")
        return text
    if (version := attribute.get("version")) is not None:
        return _version_attribute(name, version)
    # List values only exist with the DRAListTypeAttributes gate; if the API server kept them,
    # the gate is on, and upstream then offers them as lists.
    for field in ("ints", "bools", "strings"):
        if (values := attribute.get(field)) is not None:
            return list(values)
    if (versions := attribute.get("versions")) is not None:
        return [_version_attribute(name, v) for v in versions]
    raise ValueError(f"attribute {name}: unsupported attribute value")


def _version_attribute(name: str, version: Any) -> dict[str, str]:
    if not isinstance(version, str):
        raise ValueError(f"attribute {name}: version value {version!r} is not a string")
    try:
        return {SEMVER_TYPE: _semver_text(version, normalize=False)}
    except ValueError as error:
        raise ValueError(f"attribute {name}: parse semantic version: {error}") from None


def _capacity_value(name: str, entry: Any) -> dict[str, str]:
    value = entry.get("value") if isinstance(entry, Mapping) else None
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)  # a YAML author's bare number; the API would have sent a string
    if not isinstance(value, str):
        raise ValueError(f"capacity {name}: expected {{'value': <quantity>}}, got {entry!r}")
    try:
        return {QUANTITY_TYPE: _quantity_text(value)}
    except ValueError as error:
        raise ValueError(f"capacity {name}: {error}") from None


# --- cached verdicts ------------------------------------------------------------------------------

_Read = tuple[str, ...]
"""``("driver",)``, ``("allowMultipleAllocations",)`` or ``(field, domain, identifier)`` with
field ``attributes`` or ``capacity``."""

# Strings without escapes, identifiers, numbers, then any single character. A string with an
# escape or a prefix (r"", b"") leaves a lone quote or a letter before it: see _device_reads.
_LEXEME = re.compile(r"""\s+|//[^\n]*|"[^"\\\n]*"|'[^'\\\n]*'|[A-Za-z_]\w*|\d[\w.]*|.""", re.DOTALL)
_OPERAND_END = re.compile(r"""[A-Za-z_\d"')\]}].*""", re.DOTALL)
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")


def _device_reads(expression: str) -> tuple[_Read, ...] | None:
    """The fixed keys ``expression`` reads of ``device``; None when it may read more.

    Recognised: ``device.driver``, ``device.allowMultipleAllocations``, and
    ``device.attributes[<string>]`` or ``device.capacity[<string>]`` followed by ``.name`` or
    ``[<string>]``. Anything else that touches ``device`` (the whole map, ``in``, ``size()``,
    a computed key, a comprehension variable of that name, ``.device``) means None, and the
    caller does not cache.
    """
    if '"""' in expression or "'''" in expression:
        return None
    tokens: list[str] = []
    for match in _LEXEME.finditer(expression):
        token = match[0]
        if token.isspace() or token.startswith("//"):
            continue
        if token in ('"', "'", "`", "\\"):
            return None  # a string with escapes, or not CEL at all
        if token[0] in "\"'" and match.start() > 0 and expression[match.start() - 1].isalnum():
            return None  # a prefixed string: r"...", b"..."
        tokens.append(token)
    reads: set[_Read] = set()
    for i, token in enumerate(tokens):
        if token != "device":
            continue
        if i > 0 and tokens[i - 1] == ".":
            if i > 1 and _OPERAND_END.fullmatch(tokens[i - 2]):
                continue  # a field named "device" of something else
            return None  # ".device": the variable, named from the root
        ahead = [*tokens[i + 1 : i + 9], "", "", "", "", "", "", "", ""]
        if ahead[0] != ".":
            return None
        if ahead[1] in ("driver", "allowMultipleAllocations") and ahead[2] != "(":
            reads.add((ahead[1],))
            continue
        if ahead[1] not in ("attributes", "capacity") or ahead[2] != "[":
            return None
        domain = _string_content(ahead[3])
        if domain is None or ahead[4] != "]":
            return None
        if ahead[5] == "." and _IDENTIFIER.fullmatch(ahead[6]) and ahead[7] != "(":
            name: str | None = ahead[6]
        elif ahead[5] == "[" and ahead[7] == "]":
            name = _string_content(ahead[6])
        else:
            name = None
        if name is None:
            return None
        reads.add((ahead[1], domain, name))
    return tuple(sorted(reads))


def _string_content(token: str) -> str | None:
    if len(token) >= 2 and token[0] == token[-1] and token[0] in "\"'":
        return token[1:-1]
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


# --- evaluation ----------------------------------------------------------------------------------


def _execute(
    program: cel.Program, context: cel.Context, view: dict[str, Any]
) -> tuple[Evaluation, bool]:
    """Run ``program`` on ``context``, which holds ``view``; also says if it still does."""
    current = view
    defaulted = 0
    while True:
        try:
            result = program.execute(context)
        except KeyError as error:
            key = error.args[0] if error.args else ""
            # Upstream's device.attributes and device.capacity answer an unknown domain with
            # an empty map. The library's maps cannot default, so on "no such key" for a name
            # missing from either map, retry with it present (and empty) in both. A missing
            # identifier then fails the same way again, and is reported.
            if (
                defaulted < _MAX_DEFAULTED_DOMAINS
                and isinstance(key, str)
                and (key not in current["attributes"] or key not in current["capacity"])
            ):
                current = _with_empty_domain(current, key)
                context.add_variable("device", current)
                defaulted += 1
                continue
            return Evaluation(False, f"no such key: {key}"), current is view
        except Exception as error:  # every runtime error is an outcome, not an exception
            return Evaluation(False, _message(error)), current is view
        if type(result) is not bool:
            message = f"expression returned {_type_name(result)}, not bool"
            return Evaluation(False, message), current is view
        return Evaluation(result, None), current is view


def _with_empty_domain(view: dict[str, Any], domain: str) -> dict[str, Any]:
    # A copy: the caller's view stays as device_view built it, for the next selector.
    return {
        **view,
        "attributes": {domain: {}, **view["attributes"]},
        "capacity": {domain: {}, **view["capacity"]},
    }


_FUNCTION_FAILURE = re.compile(
    r"Function '(?P<function>[^']*)' error: Python function call failed: "
    r"(?P<kind>\w+): (?P<message>.*)\. Check function arguments and their types\.",
    re.DOTALL,
)


_LIBRARY_ADVICE: Final = (
    ". Check that the variable",
    ". CEL does not coerce",
    ", so common causes are",
    ". Convert explicitly",
)


def _message(error: BaseException) -> str:
    text = str(error)
    # The library wraps what a registered function raised in advice meant for its own users;
    # keep only what the function said (ours already name the function and the argument).
    match = _FUNCTION_FAILURE.fullmatch(text)
    if match is not None:
        if match["kind"] == _CallError.__name__:
            return match["message"]
        return f"{match['function']}: {match['message']}"
    # Runtime errors end in advice on CEL typing for the library's users ("Check that the
    # variable is defined...", "Convert explicitly with int(x)..."): keep the diagnosis only.
    for advice in _LIBRARY_ADVICE:
        text = text.split(advice, 1)[0]
    return text or type(error).__name__


def _unsupported_constructs(program: cel.Program) -> str | None:
    # Kubernetes offers these, the library parses them as ordinary calls that would only fail
    # at evaluation with "undefined variable"; say what is missing at compile time instead.
    references = program.references()
    functions, variables = set(references["functions"]), set(references["variables"])
    if "bind" in functions and "cel" in variables:
        return "cel.bind() is not supported by this evaluator (common-expression-language)"
    two_variable = functions & {
        "all",
        "exists",
        "existsOne",
        "exists_one",
        "transformList",
        "transformMap",
        "transformMapEntry",
    }
    if two_variable:
        name = sorted(two_variable)[0]
        return (
            f"two-variable comprehension {name}() is not supported by this evaluator "
            "(common-expression-language)"
        )
    return None


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bytes):
        return "bytes"
    if value is None:
        return "null_type"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        if len(value) == 1 and QUANTITY_TYPE in value:
            return QUANTITY_TYPE
        if len(value) == 1 and SEMVER_TYPE in value:
            return SEMVER_TYPE
        return "map"
    if isinstance(value, datetime.datetime):
        return "google.protobuf.Timestamp"
    if isinstance(value, datetime.timedelta):
        return "google.protobuf.Duration"
    if isinstance(value, cel.OptionalValue):
        return "optional_type"
    return type(value).__name__


# --- quantities (k8s.io/apimachinery/pkg/api/resource) -------------------------------------------

_QUANTITY_FORMAT_ERROR: Final = (
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)
_QUANTITY_SUFFIX_ERROR: Final = "unable to parse quantity's suffix"
_QUANTITY_NUMERIC_ERROR: Final = "unable to parse numeric part of quantity"
_DECIMAL_SUFFIXES: Final = {
    "": 0,
    "n": -9,
    "u": -6,
    "m": -3,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
_BINARY_SUFFIXES: Final = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_SUFFIX_CHARACTERS: Final = frozenset("eEinumkKMGTP")
_DIGITS: Final = frozenset("0123456789")
_GO_INT: Final = re.compile(r"[+-]?[0-9]+")
_LOG10_2: Final = math.log10(2)
# Canonical text writes larger exponents as "<digits>e<exponent>" rather than spelling out
# the zeros; longer mantissas than this are refused (Python will not print them either).
_PLAIN_EXPONENT_LIMIT: Final = 30
_MAX_DIGITS: Final = 4000


class _Decimal(NamedTuple):
    """An exact quantity value, ``mantissa * 10**exponent``; normalized, so equal values are equal.

    Every quantity is a finite decimal (binary suffixes multiply by integers), and keeping the
    exponent apart means "1e400" or "1e-400" cost nothing: the mantissa only ever has about
    as many digits as the text it came from.
    """

    mantissa: int
    exponent: int

    @classmethod
    def of(cls, mantissa: int, exponent: int = 0) -> _Decimal:
        if mantissa == 0:
            return cls(0, 0)
        while mantissa % 10 == 0:
            mantissa //= 10
            exponent += 1
        return cls(mantissa, exponent)


_INT64_MAX_DECIMAL: Final = _Decimal.of(_INT64_MAX)


def _digit_count(number: int) -> int:
    number = abs(number)
    count = max(1, int(number.bit_length() * _LOG10_2))
    while number >= 10**count:
        count += 1
    while count > 1 and number < 10 ** (count - 1):
        count -= 1
    return count


def _compare_decimals(a: _Decimal, b: _Decimal) -> int:
    if (a.mantissa > 0) != (b.mantissa > 0) or a.mantissa == 0 or b.mantissa == 0:
        return (a.mantissa > b.mantissa) - (a.mantissa < b.mantissa)
    sign = 1 if a.mantissa > 0 else -1
    magnitude_a = _digit_count(a.mantissa) + a.exponent
    magnitude_b = _digit_count(b.mantissa) + b.exponent
    if magnitude_a != magnitude_b:
        return sign if magnitude_a > magnitude_b else -sign
    # Same order of magnitude: the exponents differ by at most the mantissas' lengths.
    x, y = a.mantissa, b.mantissa
    if a.exponent > b.exponent:
        x *= 10 ** (a.exponent - b.exponent)
    else:
        y *= 10 ** (b.exponent - a.exponent)
    return (x > y) - (x < y)


def _add_decimals(a: _Decimal, b: _Decimal) -> _Decimal:
    if not a.mantissa or not b.mantissa:
        return b if not a.mantissa else a
    if abs(a.exponent - b.exponent) > _MAX_DIGITS:
        raise ValueError(f"more than {_MAX_DIGITS} digits")  # before computing 10**gap
    exponent = min(a.exponent, b.exponent)
    mantissa = a.mantissa * 10 ** (a.exponent - exponent) + b.mantissa * 10 ** (
        b.exponent - exponent
    )
    return _Decimal.of(mantissa, exponent)


@functools.lru_cache(maxsize=4096)
def _parse_quantity(text: str) -> _Decimal:
    """The value of ``text`` exactly as ParseQuantity computes it; ValueError if it rejects it."""
    if not text:
        raise ValueError(_QUANTITY_FORMAT_ERROR)
    negative, num, denom, suffix, has_digits = _scan_quantity(text)
    if len(num) + len(denom) > _MAX_DIGITS:
        raise ValueError(f"more than {_MAX_DIGITS} digits")
    binary = suffix in _BINARY_SUFFIXES
    if binary:
        power = _BINARY_SUFFIXES[suffix]
        mantissa, exponent = int(num + denom) << power, -len(denom)
        # ParseQuantity's int64 fast path; "Mi" is zero there, while "Pi" takes the
        # arbitrary-precision path, which wants a digit.
        fast = not denom and 15 - len(num) - power * 3 // 10 - 1 >= 0
    else:
        suffix_exponent = _decimal_exponent(suffix)
        mantissa, exponent = int(num + denom), suffix_exponent - len(denom)
        fast = 18 - len(num) - len(denom) >= 0 and exponent >= -9
    if not has_digits and not fast:
        raise ValueError(_QUANTITY_NUMERIC_ERROR)
    # "rounds non-zero values up to the minimum representable value": nano units, away from 0.
    if mantissa and exponent < -9:
        shift = -9 - exponent
        if shift > _digit_count(mantissa):
            mantissa = 1
        else:
            whole, rest = divmod(mantissa, 10**shift)
            mantissa = whole + (1 if rest else 0)
        exponent = -9
    value = _Decimal.of(mantissa, exponent)
    if binary and _compare_decimals(value, _INT64_MAX_DECIMAL) > 0:
        value = _INT64_MAX_DECIMAL  # upstream caps binary-suffixed values ("simple cap")
    return _Decimal(-value.mantissa, value.exponent) if negative else value


def _scan_quantity(text: str) -> tuple[bool, str, str, str, bool]:
    """(negative, integer digits, fraction digits, suffix, whether the number had any digit).

    A transcription of apimachinery's parseQuantityString, quirks included: "+", "-", "."
    and "5." are zero or five, and a suffix is any run of suffix letters, a sign and digits.
    """
    end = len(text)
    pos = 0
    negative = False
    if text[0] in "+-":
        negative = text[0] == "-"
        pos = 1
    while pos < end and text[pos] == "0":
        pos += 1
    if pos >= end:
        return negative, "0", "", "", True
    start = pos
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    num = text[start:pos] or "0"
    denom = ""
    if pos < end and text[pos] == ".":
        pos += 1
        start = pos
        while pos < end and text[pos] in _DIGITS:
            pos += 1
        denom = text[start:pos]
    suffix_start = pos
    while pos < end and text[pos] in _SUFFIX_CHARACTERS:
        pos += 1
    if pos < end and text[pos] in "+-":
        pos += 1
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    if pos < end:
        raise ValueError(_QUANTITY_FORMAT_ERROR)
    has_digits = any(c in _DIGITS for c in text[:suffix_start])
    return negative, num, denom, text[suffix_start:], has_digits


def _decimal_exponent(suffix: str) -> int:
    exponent = _DECIMAL_SUFFIXES.get(suffix)
    if exponent is not None:
        return exponent
    # "e<n>"/"E<n>": Go's strconv.ParseInt(n, 10, 64), then int32(n), which wraps.
    if suffix[:1] in ("e", "E") and _GO_INT.fullmatch(suffix[1:]):
        parsed = int(suffix[1:])
        if _INT64_MIN <= parsed <= _INT64_MAX:
            return (parsed + 2**31) % 2**32 - 2**31
    raise ValueError(_QUANTITY_SUFFIX_ERROR)


def _format_decimal(value: _Decimal) -> str:
    """Canonical text of a quantity: "25769803776", "1.5", "-3", "1e400"; unique per value."""
    mantissa, exponent = value
    if _digit_count(mantissa) > _MAX_DIGITS:
        raise ValueError(f"more than {_MAX_DIGITS} digits")
    if exponent > _PLAIN_EXPONENT_LIMIT:
        return f"{mantissa}e{exponent}"
    if exponent >= 0:
        return str(mantissa * 10**exponent)
    sign = "-" if mantissa < 0 else ""
    digits = str(abs(mantissa)).rjust(1 - exponent, "0")
    return f"{sign}{digits[:exponent]}.{digits[exponent:]}"


def _read_decimal(canonical: str) -> _Decimal:
    number, _, exponent = canonical.partition("e")
    whole, _, fraction = number.partition(".")
    return _Decimal.of(int(whole + fraction), int(exponent or 0) - len(fraction))


@functools.lru_cache(maxsize=4096)
def _quantity_text(text: str) -> str:
    return _format_decimal(_parse_quantity(text))


@functools.lru_cache(maxsize=4096)
def _exact(canonical: str) -> _Decimal:
    return _read_decimal(canonical)


def _quantity(function: str, compute: Callable[[], _Decimal]) -> dict[str, str]:
    try:
        return {QUANTITY_TYPE: _format_decimal(compute())}
    except ValueError as error:
        raise _CallError(f"{function}: the result has {error}") from None


# --- semantic versions (github.com/blang/semver/v4) ----------------------------------------------

_ALPHANUMERIC: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-")

_SemverKey = tuple[int, int, int, int, tuple[tuple[int, int, str], ...]]


def _quoted(text: str) -> str:
    return json.dumps(text)  # Go's %q, near enough for messages


def _parse_number(part: str, what: str) -> int:
    # Messages as blang/semver and strconv word them, so they read like the scheduler's.
    if not all(c in _DIGITS for c in part):
        raise ValueError(f"Invalid character(s) found in {what.lower()} number {_quoted(part)}")
    if len(part) > 1 and part[0] == "0":
        raise ValueError(f"{what} number must not contain leading zeroes {_quoted(part)}")
    if not part or int(part) > _UINT64_MAX:
        problem = "invalid syntax" if not part else "value out of range"
        raise ValueError(f"strconv.ParseUint: parsing {_quoted(part)}: {problem}")
    return int(part)


def _parse_semver(text: str) -> tuple[int, int, int, tuple[str, ...]]:
    """blang/semver v4 ``Parse``: (major, minor, patch, prerelease identifiers)."""
    if not text:
        raise ValueError("Version string empty")
    parts = text.split(".", 2)
    if len(parts) != 3:
        raise ValueError("No Major.Minor.Patch elements found")
    major = _parse_number(parts[0], "Major")
    minor = _parse_number(parts[1], "Minor")
    patch_text, _, build = parts[2].partition("+")
    patch_text, dash, pre = patch_text.partition("-")
    prerelease = tuple(pre.split(".")) if dash else ()
    patch = _parse_number(patch_text, "Patch")
    for identifier in prerelease:
        if not identifier:
            raise ValueError("Prerelease is empty")
        if all(c in _DIGITS for c in identifier):
            if len(identifier) > 1 and identifier[0] == "0":
                raise ValueError(
                    "Numeric PreRelease version must not contain leading zeroes "
                    + _quoted(identifier)
                )
            _parse_number(identifier, "PreRelease")  # in uint64
        elif not all(c in _ALPHANUMERIC for c in identifier):
            raise ValueError(f"Invalid character(s) found in prerelease {_quoted(identifier)}")
    if "+" in parts[2]:
        for identifier in build.split("."):
            if not identifier:
                raise ValueError("Build meta data is empty")
            if not all(c in _ALPHANUMERIC for c in identifier):
                message = f"Invalid character(s) found in build meta data {_quoted(identifier)}"
                raise ValueError(message)
    return major, minor, patch, prerelease


def _normalize_semver(text: str) -> str:
    # apiserver's normalizeAndParse: drop a "v", strip leading zeros, fill in minor and patch.
    parts = text.removeprefix("v").split(".", 2)
    for i, part in enumerate(parts):
        if len(part) > 1:
            part = part.lstrip("0")
            if not part or part[0] not in _DIGITS:
                part = "0" + part
            parts[i] = part
    if len(parts) < 3:
        if any(c in parts[-1] for c in "+-"):
            raise ValueError("short version cannot contain PreRelease/Build meta data")
        parts += ["0"] * (3 - len(parts))
    return ".".join(parts)


@functools.lru_cache(maxsize=4096)
def _semver_text(text: str, *, normalize: bool) -> str:
    """Canonical text of a version: build metadata dropped, as equality ignores it."""
    major, minor, patch, prerelease = _parse_semver(_normalize_semver(text) if normalize else text)
    core = f"{major}.{minor}.{patch}"
    return f"{core}-{'.'.join(prerelease)}" if prerelease else core


@functools.lru_cache(maxsize=4096)
def _semver_key(canonical: str) -> _SemverKey:
    # Orders like blang's Compare: a release sorts after its prereleases; numeric identifiers
    # sort numerically and before alphanumeric ones; a longer equal-prefixed list sorts later.
    major, minor, patch, prerelease = _parse_semver(canonical)
    identifiers = tuple(
        (0, int(p), "") if all(c in _DIGITS for c in p) else (1, 0, p) for p in prerelease
    )
    return major, minor, patch, 0 if prerelease else 1, identifiers


# --- functions registered with the library -------------------------------------------------------


class _CallError(Exception):
    """A registered function rejected its arguments; the message is shown to the user as is."""


def _kind(value: Any) -> str | None:
    if type(value) is dict and len(value) == 1:
        if QUANTITY_TYPE in value:
            return QUANTITY_TYPE
        if SEMVER_TYPE in value:
            return SEMVER_TYPE
    return None


def _expect_quantity(function: str, value: Any) -> _Decimal:
    if _kind(value) != QUANTITY_TYPE:
        raise _CallError(f"{function}: expected a quantity, got {_type_name(value)}")
    return _exact(value[QUANTITY_TYPE])


def _expect_semver(function: str, value: Any) -> _SemverKey:
    if _kind(value) != SEMVER_TYPE:
        raise _CallError(f"{function}: expected a semver, got {_type_name(value)}")
    return _semver_key(value[SEMVER_TYPE])


def _expect_string(function: str, value: Any) -> str:
    if not isinstance(value, str):
        raise _CallError(f"{function}: expected a string, got {_type_name(value)}")
    return value


def _compare(function: str, left: Any, right: Any) -> int:
    kind = _kind(left)
    if kind is not None and kind == _kind(right):
        return _compare_texts(kind, left[kind], right[kind])
    raise _CallError(
        f"{function}: no such overload for {_type_name(left)}.{function}({_type_name(right)}); "
        "both sides must be quantities or both semvers"
    )


@functools.lru_cache(maxsize=4096)
def _compare_texts(kind: str, left: str, right: str) -> int:
    # Selectors compare a few distinct values (each device's memory with one literal) over
    # and over; the canonical texts make a cheap cache key.
    if kind == QUANTITY_TYPE:
        return _compare_decimals(_exact(left), _exact(right))
    a, b = _semver_key(left), _semver_key(right)
    return (a > b) - (a < b)


def _cel_quantity(text: Any) -> dict[str, str]:
    text = _expect_string("quantity", text)
    try:
        return {QUANTITY_TYPE: _quantity_text(text)}
    except ValueError as error:
        raise _CallError(f'quantity("{text}"): {error}') from None


def _cel_is_quantity(text: Any) -> bool:
    try:
        _quantity_text(_expect_string("isQuantity", text))
    except ValueError:
        return False
    return True


def _cel_semver(text: Any, normalize: Any = False) -> dict[str, str]:
    text = _expect_string("semver", text)
    if type(normalize) is not bool:
        raise _CallError(f"semver: expected a bool to normalize, got {_type_name(normalize)}")
    try:
        return {SEMVER_TYPE: _semver_text(text, normalize=normalize)}
    except ValueError as error:
        raise _CallError(f'semver("{text}"): {error}') from None


def _cel_is_semver(text: Any, normalize: Any = False) -> bool:
    text = _expect_string("isSemver", text)
    if type(normalize) is not bool:
        raise _CallError(f"isSemver: expected a bool to normalize, got {_type_name(normalize)}")
    try:
        _semver_text(text, normalize=normalize)
    except ValueError:
        return False
    return True


def _cel_compare_to(left: Any, right: Any) -> int:
    return _compare("compareTo", left, right)


def _cel_is_greater_than(left: Any, right: Any) -> bool:
    return _compare("isGreaterThan", left, right) == 1


def _cel_is_less_than(left: Any, right: Any) -> bool:
    return _compare("isLessThan", left, right) == -1


def _as_int64(number: int) -> int:
    # Version numbers are uint64; upstream hands them to CEL as types.Int(n), which wraps.
    return (number + 2**63) % 2**64 - 2**63


def _cel_major(version: Any) -> int:
    return _as_int64(_expect_semver("major", version)[0])


def _cel_minor(version: Any) -> int:
    return _as_int64(_expect_semver("minor", version)[1])


def _cel_patch(version: Any) -> int:
    return _as_int64(_expect_semver("patch", version)[2])


def _cel_sign(value: Any) -> int:
    mantissa = _expect_quantity("sign", value).mantissa
    return (mantissa > 0) - (mantissa < 0)


def _int64_value(value: _Decimal) -> int | None:
    # Normalized, so a negative exponent means a fraction; the digit count bounds 10**exponent.
    if value.exponent < 0 or _digit_count(value.mantissa) + value.exponent > 19:
        return None
    number = value.mantissa * 10**value.exponent
    return number if _INT64_MIN <= number <= _INT64_MAX else None


def _cel_is_integer(value: Any) -> bool:
    return _int64_value(_expect_quantity("isInteger", value)) is not None


def _cel_as_integer(value: Any) -> int:
    number = _int64_value(_expect_quantity("asInteger", value))
    if number is None:
        raise _CallError(f"asInteger: cannot convert value {value[QUANTITY_TYPE]} to integer")
    return number


def _cel_as_approximate_float(value: Any) -> float:
    mantissa, exponent = _expect_quantity("asApproximateFloat", value)
    # Bounded before 10**exponent is computed: beyond about 1e±330 a double is 0 or infinite.
    magnitude = _digit_count(mantissa) + exponent
    if mantissa == 0 or magnitude < -330:
        return math.copysign(0.0, mantissa)
    if magnitude > 330:
        return math.copysign(math.inf, mantissa)  # upstream: "+Inf/-Inf will be returned"
    try:
        return float(Fraction(mantissa) * Fraction(10) ** exponent)
    except OverflowError:
        return math.copysign(math.inf, mantissa)


def _operand(function: str, value: Any) -> _Decimal:
    # add/sub take a quantity or an int (not a bool, which Python counts as an int).
    if type(value) is int:
        return _Decimal.of(value)
    return _expect_quantity(function, value)


def _cel_add(left: Any, right: Any) -> dict[str, str]:
    augend, addend = _expect_quantity("add", left), _operand("add", right)
    return _quantity("add", lambda: _add_decimals(augend, addend))


def _cel_sub(left: Any, right: Any) -> dict[str, str]:
    minuend, subtrahend = _expect_quantity("sub", left), _operand("sub", right)
    negated = _Decimal(-subtrahend.mantissa, subtrahend.exponent)
    return _quantity("sub", lambda: _add_decimals(minuend, negated))


_KUBERNETES_FUNCTIONS: Final[dict[str, Callable[..., Any]]] = {
    "quantity": _cel_quantity,
    "isQuantity": _cel_is_quantity,
    "semver": _cel_semver,
    "isSemver": _cel_is_semver,
    "compareTo": _cel_compare_to,
    "isGreaterThan": _cel_is_greater_than,
    "isLessThan": _cel_is_less_than,
    "major": _cel_major,
    "minor": _cel_minor,
    "patch": _cel_patch,
    "sign": _cel_sign,
    "isInteger": _cel_is_integer,
    "asInteger": _cel_as_integer,
    "asApproximateFloat": _cel_as_approximate_float,
    "add": _cel_add,
    "sub": _cel_sub,
}

# The library's extras that match the Kubernetes base environment (strings, sets, the list
# min/max/sum, bool()). Only these: the library copies every registered function on each execution.
_FUNCTIONS: Final[dict[str, Callable[..., Any]]] = {
    name: function
    for library in ("core", "strings", "sets")
    for name, function in cel_stdlib.EXTENSIONS[library].items()
} | _KUBERNETES_FUNCTIONS


class _OwnFunctionFailures(logging.Filter):
    """Drops the library's warning for a registered function that raised.

    That failure is already the Evaluation's error; one selector explained over thousands of
    devices would otherwise log thousands of identical warnings.
    """

    _PATTERN = re.compile(r"Python function '(?P<name>[^']*)' failed")

    def filter(self, record: logging.LogRecord) -> bool:
        match = self._PATTERN.match(record.getMessage())
        return match is None or match["name"] not in _FUNCTIONS


_local = threading.local()
_filter_lock = threading.Lock()
_filter_installed = False


def _thread_context() -> cel.Context:
    # One Context per thread, its functions registered once: add_variable() then replaces
    # only "device", and no two threads ever share a Context.
    context: cel.Context | None = getattr(_local, "context", None)
    if context is None:
        _install_log_filter()
        context = cel.Context(functions=_FUNCTIONS)
        _local.context = context
    return context


def _install_log_filter() -> None:
    global _filter_installed
    with _filter_lock:
        if not _filter_installed:
            logging.getLogger("cel").addFilter(_OwnFunctionFailures())
            _filter_installed = True
