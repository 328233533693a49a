"""Kubernetes quantities exactly as k8s.io/apimachinery ``resource.Quantity`` holds them.

Upstream keeps a quantity either as a scaled int64 (``int64Amount``: value * 10**scale) or, when
that cannot hold it, as an arbitrary-precision decimal (``inf.Dec``: unscaled * 10**-scale).
Which one it is shows through CEL: ``isInteger()``/``asInteger()`` say no for any decimal, even
``1.5Gi`` (1610612736 exactly), and ``asApproximateFloat()`` multiplies differently. Comparing
with a decimal turns the receiver into a decimal in place (``Quantity.Cmp`` calls ``AsDec``), and
that too is visible. So this module ports the representation, not just the value:
``ParseQuantity``, ``Cmp``, ``Add``/``Sub``, ``AsInt64``, ``AsApproximateFloat64``, ``Sign`` and the
canonical text (``String``) that the API server stores and the scheduler parses back.

The one quantity parser of the package: CEL's ``quantity()`` (``dra_gpu.cel._port``), the device
model's capacity check (``devices.model``) and the controller's byte counts all use it, so a
capacity the agent publishes is exactly the value selectors compare and metrics add up.
CEL's own equality rule for quantities lives with CEL (``_cel.values.cel_equal``).

Pure functions and one small mutable class; no I/O, no imports from the rest of the package.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction
from typing import Final

__all__ = ["Quantity", "QuantityError", "exact_value", "parse_quantity"]

_INT64_MAX: Final = 2**63 - 1
_INT64_MIN: Final = -(2**63)
_NANO: Final = -9

DECIMAL_EXPONENT: Final = "DecimalExponent"
BINARY_SI: Final = "BinarySI"
DECIMAL_SI: Final = "DecimalSI"

FORMAT_ERROR: Final = (
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)
SUFFIX_ERROR: Final = "unable to parse quantity's suffix"
NUMERIC_ERROR: Final = "unable to parse numeric part of quantity"

_DECIMAL_SUFFIXES: Final = {
    "": 0, "n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18,
}  # fmt: skip
_BINARY_SUFFIXES: Final = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL_NAMES: Final = {e: s for s, e in _DECIMAL_SUFFIXES.items()}
_BINARY_NAMES: Final = {e: s for s, e in _BINARY_SUFFIXES.items()} | {0: ""}
_SUFFIX_LETTERS: Final = frozenset("eEinumkKMGTP")
_DIGITS: Final = frozenset("0123456789")
# Bounds the digits a decimal may carry, so "1e999999999" cannot make Python compute 10**1e9.
_MAX_DIGITS: Final = 10_000


class QuantityError(ValueError):
    """ParseQuantity's error, worded as apimachinery words it."""


def _fits(value: int) -> bool:
    return _INT64_MIN <= value <= _INT64_MAX


def _trunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _positive_scale(base: int, scale: int) -> int | None:
    """positiveScaleInt64: base * 10**scale, or None past int64 (and for MinInt64 * 10)."""
    if scale == 0:
        return base
    if base in (0, 1):
        result = base * 10**scale
        return result if _fits(result) else None
    if base == _INT64_MIN:
        return None
    if scale > 19:
        return None
    result = base * 10**scale
    return result if _fits(result) else None


def _negative_scale(base: int, scale: int) -> tuple[int, bool]:
    """negativeScaleInt64: base / 10**scale rounded away from zero, and whether it was exact."""
    if scale == 0:
        return base, True
    value = base
    fraction = False
    for _ in range(scale):
        if not fraction and abs(value) % 10 != 0:
            fraction = True
        value = _trunc_div(value, 10)
        if value == 0:
            if fraction:
                return (1 if base > 0 else -1), False
            return 0, True
    if fraction:
        value += 1 if base > 0 else -1
    return value, not fraction


def _remove_factors(value: int, base: int) -> tuple[int, int]:
    times = 0
    negative = value < 0
    result = -value if negative else value
    while result >= base and result % base == 0:
        times += 1
        result //= base
    return (-result if negative else result), times


def _remove_big_factors(value: int, factor: int) -> tuple[int, int]:
    times = 0
    while value != 0:
        q, m = divmod(abs(value), factor)
        if m != 0:
            break
        times += 1
        value = q if value > 0 else -q
    return value, times


def _round_up(unscaled: int, scale: int, new_scale: int) -> int:
    """inf.Dec Round(x, new_scale, RoundUp): the unscaled value at ``new_scale``."""
    if new_scale >= scale:
        factor: int = 10 ** (
            new_scale - scale
        )  # int ** int is typed Any: a negative power is a float
        return unscaled * factor
    divisor: int = 10 ** (scale - new_scale)
    q, r = divmod(abs(unscaled), divisor)
    if r:
        q += 1
    return q if unscaled >= 0 else -q


def _dec_cmp(a: tuple[int, int], b: tuple[int, int]) -> int:
    (ua, sa), (ub, sb) = a, b
    if sa < sb:
        ua *= 10 ** (sb - sa)
    elif sb < sa:
        ub *= 10 ** (sa - sb)
    return (ua > ub) - (ua < ub)


def _dec_add(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    (ua, sa), (ub, sb) = a, b
    scale = max(sa, sb)
    return ua * 10 ** (scale - sa) + ub * 10 ** (scale - sb), scale


class Quantity:
    """A ``resource.Quantity``: int mode (``dec is None``: value * 10**scale) or decimal mode
    (``dec = (unscaled, inf_scale)``: unscaled * 10**-inf_scale). ``text`` is the cached String().

    Mutable on purpose: ``cmp`` converts the receiver to decimal mode as upstream does.
    """

    __slots__ = ("boxed", "dec", "format", "scale", "text", "value")

    def __init__(
        self,
        value: int = 0,
        scale: int = 0,
        dec: tuple[int, int] | None = None,
        format: str = DECIMAL_SI,
        text: str | None = None,
    ) -> None:
        self.value = value
        self.scale = scale
        self.dec = dec
        self.format = format
        self.text = text
        self.boxed = False
        """Held by pointer in CEL (the result of add()/sub()): then ``==`` with it as the right
        operand is "no such overload" upstream (``other.(Quantity)`` fails on a pointer)."""

    def copy(self) -> Quantity:
        return Quantity(self.value, self.scale, self.dec, self.format, self.text)

    @classmethod
    def of_int(cls, value: int) -> Quantity:
        """NewQuantity(value, DecimalExponent)."""
        return cls(value, 0, None, DECIMAL_EXPONENT)

    # --- representation ----------------------------------------------------------------------

    def as_dec(self) -> tuple[int, int]:
        """AsDec: converts this quantity to decimal mode in place, and returns the decimal."""
        if self.dec is None:
            self.dec = (self.value, -self.scale)
            self.value, self.scale = 0, 0
        return self.dec

    def _dec_view(self) -> tuple[int, int]:
        return self.dec if self.dec is not None else (self.value, -self.scale)

    def exact(self) -> Fraction:
        """The exact value, whichever representation holds it (the receiver is unchanged)."""
        unscaled, scale = self._dec_view()
        return Fraction(unscaled) / Fraction(10) ** scale

    def is_zero(self) -> bool:
        return (self.dec[0] if self.dec is not None else self.value) == 0

    def sign(self) -> int:
        v = self.dec[0] if self.dec is not None else self.value
        return (v > 0) - (v < 0)

    def as_int64(self) -> int | None:
        if self.dec is not None:
            return None
        if self.scale == 0:
            return self.value
        if self.scale < 0:
            return None
        return _positive_scale(self.value, self.scale)

    def as_approximate_float(self) -> float:
        if self.dec is not None:
            unscaled, inf_scale = self.dec
            try:
                base = float(unscaled)
            except OverflowError:
                base = math.copysign(math.inf, unscaled)
            exponent = -inf_scale
        else:
            base, exponent = float(self.value), self.scale
        if exponent == 0:
            return base
        return base * _pow10(exponent)

    # --- arithmetic --------------------------------------------------------------------------

    def cmp(self, other: Quantity) -> int:
        """Quantity.Cmp: the receiver becomes a decimal when either side is one."""
        if self.dec is None and other.dec is None:
            return _int_cmp(self.value, self.scale, other.value, other.scale)
        return _dec_cmp(self.as_dec(), other._dec_view())

    def equal(self, other: Quantity) -> bool:
        """Quantity.Equal: value receivers, so neither side changes."""
        return self.copy().cmp(other) == 0

    def added(self, other: Quantity, *, negate: bool = False) -> Quantity:
        """DeepCopy, then Add (or Sub) ``other``: upstream's quantity add()/sub()."""
        result = self.copy()
        result.text = None
        if negate:
            if result.is_zero():
                result.format = other.format
            if result.dec is None and other.dec is None:
                total = _int_add(result.value, result.scale, -other.value, other.scale)
                if total is not None:
                    result.value, result.scale = total
                    return result
            o_unscaled, o_scale = other._dec_view()
            result.dec = _dec_add(result.as_dec(), (-o_unscaled, o_scale))
            return result
        if result.dec is None and other.dec is None:
            if result.value == 0:
                result.format = other.format
            total = _int_add(result.value, result.scale, other.value, other.scale)
            if total is not None:
                result.value, result.scale = total
                return result
        elif result.is_zero():
            result.format = other.format
        result.dec = _dec_add(result.as_dec(), other._dec_view())
        return result

    # --- text --------------------------------------------------------------------------------

    def string(self) -> str:
        """String(): the canonical text the API server stores (cached, as upstream caches it)."""
        if self.text is None:
            number, suffix = self._canonicalize()
            self.text = number + suffix
        return self.text

    def _canonicalize(self) -> tuple[str, str]:
        if self.is_zero():
            return "0", ""
        fmt = self.format
        rounded: tuple[int, int] | None = None  # as (value, scale) or ("dec", ...) below
        rounded_dec: tuple[int, int] | None = None
        if fmt == BINARY_SI:
            if self._cmp_int(-1024) > 0 and self._cmp_int(1024) < 0:
                fmt = DECIMAL_SI
            else:
                exact: bool
                if self.dec is not None:
                    unscaled, inf_scale = self.dec
                    new = _round_up(unscaled, inf_scale, 0)
                    rounded_dec = (new, 0)
                    exact = _dec_cmp(rounded_dec, self.dec) == 0
                elif self.scale >= 0:
                    rounded, exact = (self.value, self.scale), True
                else:
                    v, exact = _negative_scale(self.value, -self.scale)
                    rounded = (v, 0)
                if not exact:
                    fmt = DECIMAL_SI
        elif fmt not in (DECIMAL_SI, DECIMAL_EXPONENT):
            fmt = DECIMAL_EXPONENT
        if fmt in (DECIMAL_SI, DECIMAL_EXPONENT):
            number, exponent = self._canonical_bytes()
            return number, _suffix(10, exponent, fmt)
        if rounded_dec is not None:
            number, exponent = _dec_base1024(rounded_dec)
        else:
            assert rounded is not None
            number, exponent = _int_base1024(*rounded)
        return number, _suffix(2, exponent * 10, fmt)

    def _cmp_int(self, other: int) -> int:
        if self.dec is not None:
            return _dec_cmp(self.dec, (other, 0))
        return _int_cmp(self.value, self.scale, other, 0)

    def _canonical_bytes(self) -> tuple[str, int]:
        if self.dec is not None:
            return _dec_canonical(self.dec)
        amount, times = _remove_factors(self.value, 10)
        exponent = self.scale + times
        rem = _go_rem(exponent, 3)
        if rem in (1, -2):
            scaled = amount * 10
            if amount not in (0, 1) and (amount == _INT64_MIN or not _fits(scaled)):
                return _dec_canonical((self.value, -self.scale))
            return str(scaled), exponent - 1
        if rem in (2, -1):
            scaled = amount * 100
            if amount not in (0, 1) and (amount == _INT64_MIN or not _fits(scaled)):
                return _dec_canonical((self.value, -self.scale))
            return str(scaled), exponent - 2
        return str(amount), exponent

    def __repr__(self) -> str:
        mode = f"dec={self.dec}" if self.dec is not None else f"{self.value}e{self.scale}"
        return f"Quantity({mode}, {self.format})"


def _go_rem(a: int, b: int) -> int:
    r = abs(a) % b
    return r if a >= 0 else -r


_POW10: Final = tuple(float(f"1e{i}") for i in range(32))
_POW10_POS32: Final = tuple(float(f"1e{32 * i}") for i in range(10))
_POW10_NEG32: Final = tuple(float(f"1e-{32 * i}") for i in range(11))


def _pow10(n: int) -> float:
    """Go's math.Pow10, table by table (its products are not always the nearest double)."""
    if 0 <= n <= 308:
        return _POW10_POS32[n // 32] * _POW10[n % 32]
    if -323 <= n <= 0:
        return _POW10_NEG32[-n // 32] / _POW10[-n % 32]
    return 0.0 if n < 0 else math.inf


def _int_cmp(av: int, ascale: int, bv: int, bscale: int) -> int:
    """int64Amount.Cmp (exact, whatever the path upstream takes)."""
    return _dec_cmp((av, -ascale), (bv, -bscale))


def _int_add(av: int, ascale: int, bv: int, bscale: int) -> tuple[int, int] | None:
    """int64Amount.Add: the sum as (value, scale), or None when it needs a decimal."""
    if bv == 0:
        return av, ascale
    if av == 0:
        return bv, bscale
    if ascale == bscale:
        total = av + bv
        if not _fits(total) or (av == _INT64_MIN and bv == _INT64_MIN):
            return None
        return total, ascale
    if ascale > bscale:
        c = _positive_scale(av, ascale - bscale)
        if c is None:
            return None
        total = c + bv
        return (total, bscale) if _fits(total) else None
    c = _positive_scale(bv, bscale - ascale)
    if c is None:
        return None
    total = av + c
    return (total, ascale) if _fits(total) else None


def _dec_canonical(dec: tuple[int, int]) -> tuple[str, int]:
    unscaled, inf_scale = dec
    exponent = -inf_scale
    amount, times = _remove_big_factors(unscaled, 10)
    exponent += times
    while _go_rem(exponent, 3) != 0:
        amount *= 10
        exponent -= 1
    return str(amount), exponent


def _int_base1024(value: int, scale: int) -> tuple[str, int]:
    # AsScaledInt64(0) then removeInt64Factors(1024); a scale >= 0 here (see _canonicalize).
    scaled = _positive_scale(value, scale)
    if scaled is None:
        return _dec_base1024((value * 10**scale, 0))
    amount, exponent = _remove_factors(scaled, 1024)
    return str(amount), exponent


def _dec_base1024(dec: tuple[int, int]) -> tuple[str, int]:
    unscaled, inf_scale = dec
    value = _round_up(unscaled, inf_scale, 0)
    amount, exponent = _remove_big_factors(value, 1024)
    return str(amount), exponent


def _suffix(base: int, exponent: int, fmt: str) -> str:
    # constructBytes; upstream ignores "not found" and prints no suffix at all.
    if fmt == DECIMAL_SI:
        return _DECIMAL_NAMES.get(exponent, "") if base == 10 else ""
    if fmt == BINARY_SI:
        return _BINARY_NAMES.get(exponent, "") if base == 2 else ""
    if base != 10 or exponent == 0:
        return ""
    return f"e{exponent}"


def _scan(text: str) -> tuple[bool, str, str, str, str]:
    """parseQuantityString: (positive, value, num, denom, suffix); QuantityError if malformed."""
    positive = True
    pos = 0
    end = len(text)
    if pos < end and text[0] in "+-":
        positive = text[0] == "+"
        pos = 1
    i = pos
    while True:
        if i >= end:
            return positive, "0", "0", "", ""
        if text[i] == "0":
            pos += 1
            i += 1
            continue
        break
    i = pos
    while True:
        if i >= end:
            return positive, text, text[pos:end], "", ""
        if text[i] not in _DIGITS:
            num = text[pos:i]
            pos = i
            break
        i += 1
    if not num:
        num = "0"
    denom = ""
    if pos < end and text[pos] == ".":
        pos += 1
        i = pos
        while True:
            if i >= end:
                return positive, text, num, text[pos:end], ""
            if text[i] not in _DIGITS:
                denom = text[pos:i]
                pos = i
                break
            i += 1
    value = text[:pos]
    suffix_start = pos
    i = pos
    while True:
        if i >= end:
            return positive, value, num, denom, text[suffix_start:end]
        if text[i] not in _SUFFIX_LETTERS:
            pos = i
            break
        i += 1
    if pos < end and text[pos] in "+-":
        pos += 1
    i = pos
    while True:
        if i >= end:
            return positive, value, num, denom, text[suffix_start:end]
        if text[i] not in _DIGITS:
            break
        i += 1
    raise QuantityError(FORMAT_ERROR)


def _go_parse_int(text: str) -> int | None:
    """strconv.ParseInt(text, 10, 64), None on any error."""
    body = text[1:] if text[:1] in ("+", "-") else text
    if not body or any(c not in _DIGITS for c in body):
        return None
    value = int(text)
    return value if _fits(value) else None


def _interpret(suffix: str) -> tuple[int, int, str]:
    if suffix in _DECIMAL_SUFFIXES:
        return 10, _DECIMAL_SUFFIXES[suffix], DECIMAL_SI
    if suffix in _BINARY_SUFFIXES:
        return 2, _BINARY_SUFFIXES[suffix], BINARY_SI
    if len(suffix) > 1 and suffix[0] in "eE":
        parsed = _go_parse_int(suffix[1:])
        if parsed is None:
            raise QuantityError(SUFFIX_ERROR)
        return 10, (parsed + 2**31) % 2**32 - 2**31, DECIMAL_EXPONENT  # int32(parsed)
    raise QuantityError(SUFFIX_ERROR)


def _dec_from_string(text: str) -> tuple[int, int] | None:
    """inf.Dec SetString: sign, digits and one '.'; None when it fails."""
    digits: list[str] = []
    dp = -1
    seen_digit = False
    for ch in text:
        if ch in "+-":
            if digits or dp >= 0:
                return None  # stops the scan; SetString then sees trailing input
            digits.append(ch)
        elif ch == ".":
            if dp >= 0:
                return None
            dp = len(digits)
        elif ch in _DIGITS:
            seen_digit = True
            digits.append(ch)
        else:
            return None
    if not seen_digit:
        return None
    joined = "".join(digits)
    scale = len(digits) - dp if dp >= 0 else 0
    return int(joined), scale


@functools.lru_cache(maxsize=8192)
def _parse_cached(text: str) -> Quantity:
    return _parse(text)


def parse_quantity(text: str) -> Quantity:
    """ParseQuantity: a new Quantity (the caller may mutate it); QuantityError if invalid."""
    return _parse_cached(text).copy()


def exact_value(text: str) -> Fraction:
    """The exact value of a quantity string ("24Gi" -> 25769803776); QuantityError if invalid."""
    return _parse_cached(text).exact()


def _parse(text: str) -> Quantity:
    if not text:
        raise QuantityError(FORMAT_ERROR)
    if text == "0":
        return Quantity(0, 0, None, DECIMAL_SI, text)
    positive, value, num, denom, suffix = _scan(text)
    base, exponent, fmt = _interpret(suffix)
    if len(num) + len(denom) > _MAX_DIGITS or abs(exponent) > _MAX_DIGITS * 10:
        raise QuantityError(f"more than {_MAX_DIGITS} digits")
    precision = 0
    scale = 0
    mantissa = 1
    if fmt in (DECIMAL_EXPONENT, DECIMAL_SI):
        scale = exponent
        precision = 18 - (len(num) + len(denom))
    else:  # BinarySI
        if exponent >= 0 and not denom:
            mantissa = 1 << exponent
            # int32(float32(exponent)*3/10): float32 math, then truncation toward zero
            precision = 15 - len(num) - int(exponent * 3 / 10) - 1
        else:
            precision = -1
    if precision >= 0:
        scale -= len(denom)
        if scale >= _NANO:
            shifted = num + denom
            parsed = _go_parse_int(shifted)
            if parsed is None:
                raise QuantityError(NUMERIC_ERROR)
            result = parsed * mantissa
            if parsed in (0, 1) or mantissa in (0, 1) or _fits(result):
                if not positive:
                    result = -result
                canonical = False
                if fmt == BINARY_SI:
                    canonical = exponent % 10 == 0 and (parsed & 0x07) != 0
                else:
                    canonical = scale % 3 == 0 and not shifted.endswith("000") and shifted[0] != "0"
                return Quantity(result, scale, None, fmt, text if canonical else None)
    amount = _dec_from_string(value)
    if amount is None:
        raise QuantityError(NUMERIC_ERROR)
    unscaled, inf_scale = amount
    if base == 10:
        inf_scale -= exponent
    elif base == 2:
        unscaled <<= exponent
    sign = (unscaled > 0) - (unscaled < 0)
    if sign == -1:
        unscaled = -unscaled
    # "if v, ok := amount.Unscaled(); v != 0 || !ok": round unless the value is zero.
    if unscaled != 0:
        unscaled = _round_up(unscaled, inf_scale, 9)
        inf_scale = 9
    if fmt == BINARY_SI and _dec_cmp((unscaled, inf_scale), (_INT64_MAX, 0)) > 0:
        unscaled, inf_scale = _INT64_MAX, 0
    if (
        fmt == BINARY_SI
        and _dec_cmp((unscaled, inf_scale), (1, 0)) < 0
        and _dec_cmp((unscaled, inf_scale), (0, 0)) > 0
    ):
        fmt = DECIMAL_SI
    if sign == -1:
        unscaled = -unscaled
    return Quantity(0, 0, (unscaled, inf_scale), fmt, None)
