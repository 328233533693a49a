"""Hypothesis strategies for the differential CEL test: devices and selector expressions.

Devices carry attributes of every type (int at the int64 limits, bool, strings with non-ASCII
text and regex-relevant characters, versions with prereleases and build metadata, and the list
values of the DRAListTypeAttributes gate), under bare and domain-qualified names, and capacities
in every quantity format (binary and decimal suffixes, exponents, fractions, values held as
decimals upstream). Expressions are built by type, so most of them type-check, from the device
paths (present and missing domains and names) and every family of the environment: operators
with int64/uint64 overflow, conversions, strings (sizes in code points, ASCII case, Go split and
trim), RE2 classes, comprehensions (one and two variables, error absorption over maps with
mixed-type values), cel.bind, optionals, lists, sets, quantities (isInteger, asInteger, add,
sub, compareTo, equality with add/sub results), semver, has(), in.
"""

from __future__ import annotations

import functools
from typing import Any

from hypothesis import strategies as st

DRIVER = "gpu.example.com"
DOMAINS = ["gpu.example.com", "example.org", "resource.kubernetes.io", "other.example.com"]
NAMES = ["index", "model", "cc", "flag", "uuid", "n", "tags", "memory"]

INTS = [0, 1, -1, 2, 7, 42, 1000, 2**31, 2**53 + 1, 2**63 - 1, -(2**63), 9007199254740993]
STRINGS = [
    "", "a", "A", "NVIDIA L4", "ü", "日本", "a b", "abc123", "x_y", "é1", "0000:3b:00.0",
    "1.5Gi", "1.2.3", "true", "12", " 1", "\t", "a,b,,c", "Ab", "straße", "K", "a.b", "$",
    "https://example.com:8080/a?b=1&b=2", "10.0.0.1", "::1", "2001:DB8::1", "10.0.0.0/8",
    "my-name", "123e4567-e89b-12d3-a456-426614174000", "2023-02-28", "1h30m", "-1.5s",
    "2023-01-01T10:00:00+02:00", "%s-%d", "aGk=", "/a/b", "ftp://u@h/x y",
]  # fmt: skip
VERSIONS = [
    "1.0.0", "1.2.3-rc.1", "1.2.3+build.5", "0.0.1", "10.2.0", "1.2.3-alpha.1", "550.54.15",
    "1.2.3-1", "2.0.0-rc.1+b", "8.9.0", "1.10.0",
]  # fmt: skip
QUANTITIES = [
    "24Gi", "8Gi", "1Gi", "1.5Gi", "1500m", "1000m", "1", "0", "1e3", "1E3", "100M", "1.5",
    "0.5Ki", "1Ki", "123456789", "1e30", "12e-3", "-1", "1u", "0.1n", "9Ei", "1000E", "2k",
    "999999999999999999", "1.25", "250m", "64", "3Mi", "1024",
]  # fmt: skip
REGEXES = [
    r"^\\w+$", r"\\d", r"\\bL4\\b", r"^[a-z]+$", r"(?i)nvidia", r"L[0-9]$", r"^\\s*$",
    r"[[:alpha:]]",
    r"\\pL", r"^.*$", r"a{,2}", r"é", r"^$", r"x|y", r"[^a-z]", r"\\S+", r"\\W",
]  # fmt: skip


def _quote(text: str) -> str:
    out = []
    for c in text:
        if c in '"\\':
            out.append("\\" + c)
        elif c == "\n":
            out.append("\\n")
        elif c == "\t":
            out.append("\\t")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


# --- devices --------------------------------------------------------------------------------------

_attribute_values = st.one_of(
    st.builds(lambda v: {"int": v}, st.sampled_from(INTS) | st.integers(-100, 100)),
    st.builds(lambda v: {"bool": v}, st.booleans()),
    st.builds(lambda v: {"string": v}, st.sampled_from(STRINGS)),
    st.builds(lambda v: {"version": v}, st.sampled_from(VERSIONS)),
    st.builds(lambda v: {"ints": v}, st.lists(st.sampled_from(INTS[:6]), min_size=1, max_size=3)),
    st.builds(
        lambda v: {"strings": v}, st.lists(st.sampled_from(STRINGS[:8]), min_size=1, max_size=3)
    ),
)
_attribute_names = st.one_of(
    st.sampled_from(NAMES),
    st.builds(lambda d, n: f"{d}/{n}", st.sampled_from(DOMAINS), st.sampled_from(NAMES)),
)


@st.composite
def devices(draw: st.DrawFn) -> dict[str, Any]:
    device: dict[str, Any] = {"name": "gpu-0"}
    device["attributes"] = draw(st.dictionaries(_attribute_names, _attribute_values, max_size=6))
    device["capacity"] = draw(
        st.dictionaries(
            _attribute_names, st.builds(lambda q: {"value": q}, st.sampled_from(QUANTITIES)),
            max_size=3,
        )
    )  # fmt: skip
    multiple = draw(st.sampled_from([None, True, False]))
    if multiple is not None:
        device["allowMultipleAllocations"] = multiple
    return device


# --- expressions ----------------------------------------------------------------------------------


def _domain_literal() -> st.SearchStrategy[str]:
    return st.sampled_from([*DOMAINS, "no.such.domain"]).map(_quote)


def _attribute(field: str = "attributes") -> st.SearchStrategy[str]:
    name = st.sampled_from([*NAMES, "missing"])
    return st.one_of(
        st.builds(lambda d, n: f"device.{field}[{d}].{n}", _domain_literal(), name),
        st.builds(lambda d, n: f"device.{field}[{d}][{_quote(n)}]", _domain_literal(), name),
    )


def _capacity() -> st.SearchStrategy[str]:
    return _attribute("capacity")


def _literal(kind: str) -> st.SearchStrategy[str]:
    if kind == "int":
        return st.sampled_from([*INTS[:-1], 3, -7, 9223372036854775807]).map(str) | st.just(
            "-9223372036854775808"
        )
    if kind == "uint":
        return st.sampled_from(["0u", "1u", "7u", "18446744073709551615u", "42u"])
    if kind == "double":
        return st.sampled_from(["0.0", "1.5", "-2.5", "1e6", "1e-5", "9007199254740992.0", "0.1"])
    if kind == "string":
        return st.sampled_from(STRINGS).map(_quote)
    if kind == "bool":
        return st.sampled_from(["true", "false"])
    if kind == "bytes":
        return st.sampled_from(['b"abc"', 'b""', 'b"\\xff"', 'b"ü"'])
    if kind == "quantity":
        return st.sampled_from(QUANTITIES).map(lambda q: f'quantity("{q}")')
    if kind == "semver":
        return st.sampled_from(VERSIONS).map(lambda v: f'semver("{v}")')
    if kind == "list":
        return st.sampled_from(["[1, 2, 3]", "[]", "[3, 1, 2]", "[1, 1]", "[-1, 0]"])
    if kind == "list_string":
        return st.sampled_from(['["a", "b"]', "[]", '["b", "a", "b"]', '["ü"]'])
    if kind == "map":
        return st.sampled_from(['{"a": 1, "b": 2}', "{}", '{"x": -1}'])
    raise ValueError(kind)


@functools.cache
def exprs(kind: str, depth: int) -> st.SearchStrategy[str]:
    """Expressions of CEL type ``kind`` (loosely: a dyn device path stands for any type)."""
    leaves = [_literal(kind)] if kind not in ("dyn", "optional") else []
    if kind in ("int", "string", "bool", "dyn"):
        leaves.append(_attribute())
    if kind == "quantity":
        leaves.append(_capacity())
    if kind == "semver":
        leaves.append(_attribute())
    if kind == "dyn":
        leaves += [_capacity(), _literal("int"), _literal("string")]
    if depth <= 0 and kind != "optional":
        return st.one_of(*leaves)
    d = max(depth - 1, 0)
    s = lambda k: exprs(k, d)  # noqa: E731
    b = st.builds
    rules: list[st.SearchStrategy[str]] = []
    if kind == "bool":
        rules += [
            b(
                lambda x, y, op: f"{x} {op} {y}",
                s("int"),
                s("int"),
                st.sampled_from(["==", "!=", "<", "<=", ">", ">="]),
            ),
            b(
                lambda x, y, op: f"{x} {op} {y}",
                s("string"),
                s("string"),
                st.sampled_from(["==", "<", "!="]),
            ),
            b(
                lambda x, y, op: f"{x} {op} {y}",
                s("double"),
                s("int"),
                st.sampled_from(["<", ">=", "=="]),
            ),
            b(
                lambda x, y, op: f"dyn({x}) {op} {y}",
                s("uint"),
                s("int"),
                st.sampled_from(["==", "<"]),
            ),
            b(
                lambda x, y, op: f"({x} {op} {y})",
                s("bool"),
                s("bool"),
                st.sampled_from(["&&", "||"]),
            ),
            b(lambda x: f"!{x}", s("bool")),
            b(lambda c, x, y: f"({c} ? {x} : {y})", s("bool"), s("bool"), s("bool")),
            b(lambda x, y: f"{x}.contains({y})", s("string"), s("string")),
            b(lambda x, y: f"{x}.startsWith({y})", s("string"), s("string")),
            b(lambda x, r: f'{x}.matches("{r}")', s("string"), st.sampled_from(REGEXES)),
            b(
                lambda x, y, m: f"{x}.{m}({y})",
                s("quantity"),
                s("quantity"),
                st.sampled_from(["isGreaterThan", "isLessThan"]),
            ),
            b(lambda x: f"{x}.isInteger()", s("quantity")),
            b(lambda x, y: f"{x} == {y}", s("quantity"), s("quantity")),
            b(
                lambda x, y, m: f"{x}.{m}({y})",
                s("semver"),
                s("semver"),
                st.sampled_from(["isGreaterThan", "isLessThan"]),
            ),
            b(lambda x, y: f"{x} == {y}", s("semver"), s("semver")),
            b(
                lambda d1, n: f"has(device.attributes[{d1}].{n})",
                _domain_literal(),
                st.sampled_from(NAMES),
            ),
            b(lambda n: f"has(device.attributes.{n})", st.sampled_from(["foo", "example", "x"])),
            b(lambda d1: f"{d1} in device.attributes", _domain_literal()),
            b(
                lambda d1, n: f'"{n}" in device.attributes[{d1}]',
                _domain_literal(),
                st.sampled_from(NAMES),
            ),
            b(
                lambda d1, m, p: f"device.attributes[{d1}].{m}(k, {p})",
                _domain_literal(),
                st.sampled_from(["exists", "all", "exists_one"]),
                st.sampled_from(
                    [
                        'device.attributes["gpu.example.com"][k] > 5',
                        "k.size() > 3",
                        'device.attributes["gpu.example.com"][k] == "a"',
                        'k.startsWith("m")',
                        'int(device.attributes["gpu.example.com"][k]) > 0',
                    ]
                ),
            ),
            b(
                lambda d1, m: f'device.attributes[{d1}].{m}(k, v, v == 0 || k == "flag")',
                _domain_literal(),
                st.sampled_from(["exists", "all", "existsOne"]),
            ),
            b(
                lambda xs, m, p: f"{xs}.{m}(x, {p})",
                s("list"),
                st.sampled_from(["exists", "all", "exists_one"]),
                st.sampled_from(["x > 1", "10 / x > 2", "x % 2 == 0", "x == 1 || 1 / 0 == 1"]),
            ),
            b(lambda x, xs: f"{x} in {xs}", s("int"), s("list")),
            b(lambda x: f"dyn({x}) in [1, 2.0, 3u]", s("dyn")),
            b(
                lambda xs, y: f"sets.{y}({xs}, [1, 2])",
                s("list"),
                st.sampled_from(["contains", "intersects", "equivalent"]),
            ),
            b(lambda xs: f"{xs}.isSorted()", s("list")),
            b(
                lambda v, e: f"cel.bind(v, {v}, {e})",
                s("int"),
                st.sampled_from(["v > 0", "v == v", "true"]),
            ),
            b(lambda x: f"{x}.hasValue()", s("optional")),
            b(lambda x: f"device.allowMultipleAllocations == {x}", s("bool")),
            b(lambda x: f'device.driver == "{x}"', st.sampled_from([DRIVER, "other.example.com"])),
            b(lambda x: f"isQuantity({x})", s("string")),
            b(lambda x: f"isSemver({x})", s("string")),
            b(lambda x: f"bool({x})", s("string")),
            b(lambda x, y: f"{x} == {y}", s("dyn"), s("dyn")),
            b(lambda x, y: f"{x} != {y}", s("dyn"), s("int")),
            b(
                lambda x, m: f'isURL({x}) || url({x}).{m}() != ""',
                s("string"),
                st.sampled_from(
                    ["getScheme", "getHost", "getHostname", "getPort", "getEscapedPath"]
                ),
            ),
            b(lambda x: f"url({x}).getQuery().size() > 0", s("string")),
            b(
                lambda x, m: f"isIP({x}) && ip({x}).{m}()",
                s("string"),
                st.sampled_from(
                    ["isLoopback", "isGlobalUnicast", "isUnspecified", "isLinkLocalUnicast"]
                ),
            ),
            b(lambda x: f"ip.isCanonical({x})", s("string")),
            b(lambda x, y: f"cidr({x}).containsIP({y})", s("string"), s("string")),
            b(lambda x: f"isCIDR({x}) && cidr({x}).masked() == cidr({x})", s("string")),
            b(
                lambda f, x: f"format.{f}().validate({x}).hasValue()",
                st.sampled_from(
                    [
                        "dns1123Label",
                        "dns1123Subdomain",
                        "dns1035Label",
                        "qualifiedName",
                        "labelValue",
                        "uuid",
                        "byte",
                        "date",
                        "datetime",
                        "uri",
                        "dns1123LabelPrefix",
                    ]
                ),
                s("string"),
            ),
            b(
                lambda x, y: f'"%s|%d".format([{x}, {y}]) == {x} + "|" + string({y})',
                s("string"),
                s("int"),
            ),
            b(
                lambda x, p: f'"%.{p}f".format([{x}]).size() > 3',
                s("double"),
                st.sampled_from(["0", "2", ""]),
            ),
            b(lambda x: f'"%x %o %b".format([{x}, {x}, {x}]).size() > 4', s("int")),
            b(lambda x, y: f"timestamp({x}) < timestamp({y})", s("string"), s("string")),
            b(lambda x: f"duration({x}).getSeconds() > 0", s("string")),
            b(lambda x: f'string(timestamp({x}) + duration("90m")) > "2"', s("string")),
            b(lambda x: f"double({x}) > 0.5", s("string")),
            b(lambda x: f'string({x}) == "1e+06"', s("double")),
            b(
                lambda d1: (
                    f"cel.bind(a, device.attributes[{d1}], a.exists(k, v, v == 0) || a.size() == 1)"
                ),
                _domain_literal(),
            ),
            b(
                lambda d1, n: f"device.attributes[{d1}].?{n}.orValue(0) == 0",
                _domain_literal(),
                st.sampled_from(NAMES),
            ),
            b(lambda d1: f"device.capacity[{d1}].all(k, v, v.isInteger())", _domain_literal()),
            b(
                lambda d1: (
                    f"device.capacity[{d1}].exists(k, device.capacity[{d1}][k].asInteger() > 1000)"
                ),
                _domain_literal(),
            ),
            s("dyn"),
        ]
    elif kind == "int":
        rules += [
            b(
                lambda x, y, op: f"({x} {op} {y})",
                s("int"),
                s("int"),
                st.sampled_from(["+", "-", "*", "/", "%"]),
            ),
            b(lambda x: f"-({x})", s("int")),
            b(lambda x: f"size({x})", s("string") | s("list") | s("bytes")),
            b(lambda x: f"{x}.size()", s("string")),
            b(lambda x: f"int({x})", s("double") | s("uint") | s("string")),
            b(lambda x, y: f"{x}.compareTo({y})", s("quantity"), s("quantity")),
            b(lambda x: f"{x}.asInteger()", s("quantity")),
            b(lambda x: f"sign({x})", s("quantity")),
            b(lambda x, m: f"{x}.{m}()", s("semver"), st.sampled_from(["major", "minor", "patch"])),
            b(lambda x, y: f"{x}.indexOf({y})", s("string"), s("string")),
            b(lambda x, y: f"{x}.lastIndexOf({y})", s("string"), s("string")),
            b(lambda xs, m: f"{xs}.{m}()", s("list"), st.sampled_from(["sum", "min", "max"])),
            b(lambda xs, x: f"{xs}.indexOf({x})", s("list"), s("int")),
            b(lambda x: f"{x}.orValue(0)", s("optional")),
            b(lambda xs: f"{xs}.map(x, x * 2).size()", s("list")),
        ]
    elif kind == "uint":
        rules += [
            b(
                lambda x, y, op: f"({x} {op} {y})",
                s("uint"),
                s("uint"),
                st.sampled_from(["+", "-", "*", "/", "%"]),
            ),
            b(lambda x: f"uint({x})", s("int") | s("double") | s("string")),
        ]
    elif kind == "double":
        rules += [
            b(
                lambda x, y, op: f"({x} {op} {y})",
                s("double"),
                s("double"),
                st.sampled_from(["+", "-", "*", "/"]),
            ),
            b(lambda x: f"double({x})", s("int") | s("uint") | s("string")),
            b(lambda x: f"{x}.asApproximateFloat()", s("quantity")),
        ]
    elif kind == "string":
        rules += [
            b(lambda x, y: f"{x} + {y}", s("string"), s("string")),
            b(
                lambda x: f"string({x})",
                s("int") | s("uint") | s("double") | s("bool") | s("bytes"),
            ),
            b(
                lambda x, m: f"{x}.{m}()",
                s("string"),
                st.sampled_from(["lowerAscii", "upperAscii", "trim"]),
            ),
            b(lambda x, i: f"{x}.charAt({i})", s("string"), st.sampled_from(["0", "1", "3", "-1"])),
            b(lambda x, i: f"{x}.substring({i})", s("string"), st.sampled_from(["0", "1", "2"])),
            b(lambda x, y, z: f"{x}.replace({y}, {z})", s("string"), s("string"), s("string")),
            b(lambda x, y: f'{x}.split({y}).join("|")', s("string"), s("string")),
            b(lambda x, r: f'{x}.find("{r}")', s("string"), st.sampled_from(REGEXES)),
            b(lambda x, r: f'{x}.findAll("{r}").join(",")', s("string"), st.sampled_from(REGEXES)),
            b(lambda x: f"strings.quote({x})", s("string")),
            b(lambda xs: f'{xs}.join(",")', s("list_string")),
        ]
    elif kind == "quantity":
        rules += [
            b(
                lambda x, y, m: f"{x}.{m}({y})",
                s("quantity"),
                s("quantity") | s("int"),
                st.sampled_from(["add", "sub"]),
            ),
            b(lambda x: f"quantity({x})", s("string")),
        ]
    elif kind == "semver":
        rules += [b(lambda x, n: f"semver({x}, {n})", s("string"), s("bool"))]
    elif kind == "list":
        rules += [
            b(lambda x, y: f"{x} + {y}", s("list"), s("list")),
            b(lambda x: f"{x}.sort()", s("list")),
            b(lambda x: f"{x}.reverse()", s("list")),
            b(lambda x: f"{x}.distinct()", s("list")),
            b(
                lambda x, p: f"{x}.filter(x, {p})",
                s("list"),
                st.sampled_from(["x > 1", "x % 2 == 0"]),
            ),
            b(lambda n: f"lists.range({n})", st.sampled_from(["0", "3", "-1"])),
            b(lambda x: f"{x}.slice(0, 1)", s("list")),
            b(lambda x: f"{x}.sortBy(e, -e)", s("list")),
            b(lambda x: f"{x}.transformList(i, v, v + i)", s("list")),
            b(lambda x: f"[{x}].flatten()", s("list")),
        ]
    elif kind == "list_string":
        rules += [b(lambda x, y: f"{x}.split({y})", s("string"), s("string"))]
    elif kind == "optional":
        rules += [
            b(
                lambda d1, n: f"device.attributes[{d1}].?{n}",
                _domain_literal(),
                st.sampled_from(NAMES),
            ),
            b(lambda x: f"optional.of({x})", s("int")),
            b(lambda x: f"optional.ofNonZeroValue({x})", s("int")),
            b(lambda xs: f"{xs}.first()", s("list")),
            b(lambda m: f'{m}[?"a"]', s("map")),
        ]
    elif kind == "dyn":
        rules += [
            b(
                lambda x: f"dyn({x})",
                s("int") | s("uint") | s("double") | s("string") | s("quantity"),
            ),
            b(lambda m: f'{m}["a"]', s("map")),
        ]
    elif kind == "map":
        rules += [b(lambda m: f"{m}.transformMap(k, v, v * 2)", s("map"))]
    if kind == "optional":
        return st.one_of(*rules)
    return st.one_of(*leaves, *rules)


def _unambiguous(driver: str, device: dict[str, Any]) -> bool:
    """Whether no two names of the device resolve to one (domain, name): "memory" and
    "<driver>/memory" together make the scheduler pick one of them at random (Go map order)."""
    for field in ("attributes", "capacity"):
        names = [n if "/" in n else f"{driver}/{n}" for n in device.get(field, {})]
        if len(names) != len(set(names)):
            return False
    return True


@st.composite
def cases(draw: st.DrawFn) -> tuple[str, str, dict[str, Any]]:
    """(expression, driver, device)."""
    expression = draw(exprs("bool", draw(st.integers(1, 3))))
    driver = draw(st.sampled_from([DRIVER, DRIVER, DRIVER, "other.example.com"]))
    device = draw(devices().filter(lambda d: _unambiguous(driver, d)))
    return expression, driver, device
