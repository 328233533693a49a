"""Upstream's own ``TestCEL`` table (k8s.io/dynamic-resource-allocation/cel compile_test.go at
v0.37.2), ported case by case: expression, device and what upstream expects.

``scope`` says where upstream runs a case: "both" (stored and new expressions, which is every
feature combination for the stored environment the scheduler compiles in) or "new" (only the
API server's new-expressions environment, with the case's ``features``). ``expect`` is
("match", bool), ("match_error", substring) or ("compile_error", substring). Attributes and
capacities are written as resource.k8s.io/v1 JSON.
"""

from __future__ import annotations

from typing import Any

D = "dra.example.com"
BOTH, NEW = "both", "new"
LIST_ON = {"EnableListTypeAttributes": True}
LIST_OFF = {"EnableListTypeAttributes": False}
CC_ON = {"EnableConsumableCapacity": True}
CC_OFF = {"EnableConsumableCapacity": False}


def case(
    expression: str,
    expect: tuple[str, Any],
    *,
    driver: str = "",
    attributes: dict[str, Any] | None = None,
    capacity: dict[str, str] | None = None,
    multiple: bool | None = None,
    scope: str = BOTH,
    features: dict[str, bool] | None = None,
) -> dict[str, Any]:
    device: dict[str, Any] = {"name": "device"}
    if attributes:
        device["attributes"] = attributes
    if capacity:
        device["capacity"] = {name: {"value": value} for name, value in capacity.items()}
    if multiple is not None:
        device["allowMultipleAllocations"] = multiple
    return {
        "expression": expression,
        "expect": expect,
        "driver": driver,
        "device": device,
        "scope": scope,
        "features": features or {},
    }


def _expensive() -> dict[str, Any]:
    attributes = {}
    for i in range(32):  # ResourceSliceMaxAttributesAndCapacitiesPerDevice
        suffix = f"-{i}"
        attributes[f"{D}/" + "x" * (32 - len(suffix)) + suffix] = {"string": "abc"}
    return attributes


_TEN = "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]"
_EXPENSIVE = (
    f"{_TEN}.all(x, {_TEN}.all(y, {_TEN}.all(z, {_TEN}.all(z2, {_TEN}.all(z3, {_TEN}.all(z4, "
    f"{_TEN}.all(z5, int('1'.find('[0-9]*')) < 100)))))))"
)

CASES: dict[str, dict[str, Any]] = {
    "true": case("true", ("match", True)),
    "false": case("false", ("match", False)),
    "syntax-error": case("?!", ("compile_error", "Syntax error")),
    "type-error": case(
        "1", ("compile_error", "must evaluate to bool or the unknown type, not int")
    ),
    "runtime-error-lookup-identifier": case(
        'device.attributes["no-such-domain"].noSuchAttr.isGreaterThan(quantity("0"))',
        ("match_error", "no such key: noSuchAttr"),
    ),
    "runtime-error-lookup-map": case(
        'device.attributes["no-such-domain"]["noSuchAttr"].isGreaterThan(quantity("0"))',
        ("match_error", "no such key: noSuchAttr"),
    ),
    "domain-check-negative": case('"no-such-domain" in device.attributes', ("match", False)),
    "domain-check-positive": case(
        '"dra.example.com" in device.attributes',
        ("match", True),
        attributes={"dra.example.com/something": {"bool": True}},
    ),
    "empty-driver-name": case('device.driver == ""', ("match", True)),
    "real-driver-name": case('device.driver == "dra.example.com"', ("match", True), driver=D),
    "driver-name-qualifier": case(
        'device.attributes["dra.example.com"].name',
        ("match", True),
        driver=D,
        attributes={"name": {"bool": True}},
    ),
    "driver-name-qualifier-map-lookup": case(
        'device.attributes["dra.example.com"]["name"]',
        ("match", True),
        driver=D,
        attributes={"name": {"bool": True}},
    ),
    "bind": case(
        'cel.bind(dra, device.attributes["dra.example.com"], dra.name)',
        ("match", True),
        driver=D,
        attributes={"name": {"bool": True}},
    ),
    "qualified-attribute-name": case(
        'device.attributes["other.example.com"].name',
        ("match", True),
        driver=D,
        attributes={"other.example.com/name": {"bool": True}},
    ),
    "bool": case(
        'device.attributes["dra.example.com"].name',
        ("match", True),
        driver=D,
        attributes={"name": {"bool": True}},
    ),
    "int": case(
        'device.attributes["dra.example.com"].name > 0',
        ("match", True),
        driver=D,
        attributes={"name": {"int": 1}},
    ),
    "string": case(
        'device.attributes["dra.example.com"].name == "fish"',
        ("match", True),
        driver=D,
        attributes={"name": {"string": "fish"}},
    ),
    "macro-compilation-error-new-expressions": case(
        'device.attributes["dra.example.com"].ids.exists(id, id == 1)',
        ("compile_error", "compilation failed"),
        driver=D,
        scope=NEW,
        features=LIST_OFF,
    ),
    "macro-exists-on-int": case(
        'device.attributes["dra.example.com"].name.exists(x, x > 0)',
        ("match_error", "got 'types.Int', expected iterable type"),
        driver=D,
        attributes={"name": {"int": 1}},
        features=LIST_ON,
    ),
    "macro-exists-on-bool": case(
        'device.attributes["dra.example.com"].name.exists(x, x == true)',
        ("match_error", "got 'types.Bool', expected iterable type"),
        driver=D,
        attributes={"name": {"bool": True}},
        features=LIST_ON,
    ),
    "macro-exists-on-string": case(
        'device.attributes["dra.example.com"].name.exists(x, x == "fish")',
        ("match_error", "got 'types.String', expected iterable type"),
        driver=D,
        attributes={"name": {"string": "fish"}},
        features=LIST_ON,
    ),
    "list-result-type-causes-match-error": case(
        'device.attributes["dra.example.com"].names',
        ("match_error", "CEL result of type list could not be converted to bool"),
        driver=D,
        attributes={"names": {"strings": ["fish", "bird"]}},
    ),
    "includes-function-can-evaluate": case(
        'device.attributes["dra.example.com"].name.includes("fish")',
        ("match", True),
        driver=D,
        attributes={"name": {"strings": ["fish", "bird"]}},
        features=LIST_ON,
    ),
    "list-of-bool": case(
        'device.attributes["dra.example.com"].names.size() == 2',
        ("match", True),
        driver=D,
        attributes={"names": {"bools": [True, False]}},
    ),
    "list-of-int": case(
        'device.attributes["dra.example.com"].names.size() == 2',
        ("match", True),
        driver=D,
        attributes={"names": {"ints": [1, 2]}},
    ),
    "list-of-string": case(
        'device.attributes["dra.example.com"].names.size() == 2',
        ("match", True),
        driver=D,
        attributes={"names": {"strings": ["fish", "bird"]}},
    ),
    "list-of-semver": case(
        'device.attributes["dra.example.com"].names.size() == 2',
        ("match", True),
        driver=D,
        attributes={"names": {"versions": ["1.0.0", "2.0.0"]}},
    ),
    "macro-on-list-of-int": case(
        'device.attributes["dra.example.com"].names.exists(x, x > 0)',
        ("match", True),
        driver=D,
        attributes={"names": {"ints": [1, 2]}},
        features=LIST_ON,
    ),
    "macro-on-list-of-string": case(
        'device.attributes["dra.example.com"].names.all(x, x != "")',
        ("match", True),
        driver=D,
        attributes={"names": {"strings": ["fish", "bird"]}},
        features=LIST_ON,
    ),
    "macro-on-list-of-semver": case(
        'device.attributes["dra.example.com"].names.all(x, x.isGreaterThan(semver("0.0.1")))',
        ("match", True),
        driver=D,
        attributes={"names": {"versions": ["1.0.0", "2.0.0"]}},
        features=LIST_ON,
    ),
    "includes-function-compilation-error": case(
        'device.attributes["dra.example.com"].attr.includes("fish")',
        ("compile_error", "undeclared reference to 'includes'"),
        driver=D,
        scope=NEW,
        features=LIST_OFF,
    ),
    "includes-function-compilation-and-eval-success": case(
        'device.attributes["dra.example.com"].attr.includes("fish")',
        ("match", True),
        driver=D,
        attributes={"attr": {"string": "fish"}},
        features=LIST_ON,
    ),
}


def _includes(name: str, value: str, attribute: dict[str, Any], matched: bool, **kw: Any) -> None:
    CASES[f"includes-function-on-{name}"] = case(
        f'device.attributes["dra.example.com"].name.includes({value})',
        ("match", matched),
        driver=D,
        attributes={"name": attribute},
        features=LIST_ON,
        **kw,
    )


_includes("bool-scalar-positive", "true", {"bool": True}, True)
_includes("bool-scalar-negative", "true", {"bool": False}, False, scope=NEW)
_includes("bool-list-positive", "true", {"bools": [True, False]}, True)
_includes("bool-list-negative", "false", {"bools": [True, True]}, False)
_includes("int-scalar-positive", "1", {"int": 1}, True)
_includes("int-scalar-negative", "1", {"int": 2}, False)
_includes("int-list-positive", "1", {"ints": [1, 2]}, True)
_includes("int-list-negative", "3", {"ints": [1, 2]}, False)
_includes("string-scalar-positive", '"fish"', {"string": "fish"}, True)
_includes("string-scalar-negative", '"bird"', {"string": "fish"}, False)
_includes("string-list-positive", '"fish"', {"strings": ["fish", "bird"]}, True)
_includes("string-list-negative", '"cat"', {"strings": ["fish", "bird"]}, False)
_includes("semver-scalar-positive", 'semver("1.0.0")', {"version": "1.0.0"}, True)
_includes("semver-scalar-negative", 'semver("2.0.0")', {"version": "1.0.0"}, False)
_includes("semver-list-positive", 'semver("1.0.0")', {"versions": ["1.0.0", "2.0.0"]}, True)
_includes("semver-list-negative", 'semver("3.0.0")', {"versions": ["1.0.0", "2.0.0"]}, False)
_includes(
    "very-long-list-positive",
    '"value-48"',  # ResourceSliceMaxAttributeValuesPerDevice
    {"strings": [f"value-{i}" for i in range(48)]},
    False,
)

CASES.update(
    {
        "in-operator-on-list": case(
            '1 in device.attributes["dra.example.com"].names',
            ("match", True),
            driver=D,
            attributes={"names": {"ints": [1, 2, 3]}},
        ),
        "version": case(
            'device.attributes["dra.example.com"].name.isGreaterThan(semver("0.0.1"))',
            ("match", True),
            driver=D,
            attributes={"name": {"version": "1.0.0"}},
        ),
        "version_v": case(
            'device.attributes["dra.example.com"].name.isGreaterThan(semver("v0.0.1", true)) '
            '&& isSemver("v1.0.0", true)',
            ("match", True),
            driver=D,
            attributes={"name": {"version": "1.0.0"}},
        ),
        "macro-exists-on-version": case(
            'device.attributes["dra.example.com"].name.exists(x, x.isGreaterThan(semver("0.0.1")))',
            ("match_error", "got 'cel.Semver', expected iterable type"),
            driver=D,
            attributes={"name": {"version": "1.0.0"}},
            features=LIST_ON,
        ),
        "quantity": case(
            'device.capacity["dra.example.com"].name.isGreaterThan(quantity("1Ki"))',
            ("match", True),
            driver=D,
            capacity={"name": "1Mi"},
        ),
        "check-positive": case(
            '"name" in device.capacity["dra.example.com"] && '
            'device.capacity["dra.example.com"].name.isGreaterThan(quantity("1Ki"))',
            ("match", True),
            driver=D,
            capacity={"name": "1Mi"},
        ),
        "check-negative": case(
            '!("name" in device.capacity["dra.example.com"]) || '
            'device.capacity["dra.example.com"].name.isGreaterThan(quantity("1Ki"))',
            ("match", True),
        ),
        "all": case(
            """
device.capacity["dra.example.com"].quantity.isGreaterThan(quantity("1Ki")) &&
device.attributes["dra.example.com"].bool &&
device.attributes["dra.example.com"].int > 0 &&
device.attributes["dra.example.com"].string == "fish" &&
device.attributes["dra.example.com"].version.isGreaterThan(semver("0.0.1")) &&
device.capacity["dra.example.com"]["quantity"].isGreaterThan(quantity("1Ki")) &&
device.attributes["dra.example.com"]["bool"] &&
device.attributes["dra.example.com"]["int"] > 0 &&
device.attributes["dra.example.com"]["string"] == "fish" &&
device.attributes["dra.example.com"]["version"].isGreaterThan(semver("0.0.1"))
""",
            ("match", True),
            driver=D,
            attributes={
                "bool": {"bool": True},
                "int": {"int": 1},
                "string": {"string": "fish"},
                "version": {"version": "1.0.0"},
            },
            capacity={"quantity": "1Mi"},
        ),
        "many": case(
            'device.attributes["dra.example.com"].a && device.attributes["dra.example.com"].b '
            '&& device.attributes["dra.example.com"].c',
            ("match", True),
            driver=D,
            attributes={"a": {"bool": True}, "b": {"bool": True}, "c": {"bool": True}},
        ),
        "check_attribute_domains": case(
            'device.attributes.exists_one(x, x == "dra.example.com")',
            ("match", True),
            driver=D,
            attributes={"services": {"string": "some_example_value"}},
        ),
        "check_attribute_ids": case(
            'device.attributes["dra.example.com"].exists_one(x, x == "services")',
            ("match", True),
            driver=D,
            attributes={"services": {"string": "some_example_value"}},
        ),
        "split_attribute": case(
            'device.attributes["dra.example.com"].services.split("example").size() >= 2',
            ("match", True),
            driver=D,
            attributes={"services": {"string": "some_example_value"}},
        ),
        "regexp_attribute": case(
            'device.attributes["dra.example.com"].services.matches("[^a]?sym")',
            ("match", True),
            driver=D,
            attributes={"services": {"string": "asymetric"}},
        ),
        "check_capacity_domains": case(
            'device.capacity.exists_one(x, x == "dra.example.com")',
            ("match", True),
            driver=D,
            capacity={"memory": "1Mi"},
        ),
        "check_capacity_ids": case(
            'device.capacity["dra.example.com"].exists_one(x, x == "memory")',
            ("match", True),
            driver=D,
            capacity={"memory": "1Mi"},
        ),
        "expensive": case(
            _EXPENSIVE,
            ("match_error", "actual cost limit exceeded"),
            driver=D,
            attributes=_expensive(),
        ),
        "allow_multiple_allocations": case(
            "device.allowMultipleAllocations == true",
            ("match", True),
            driver=D,
            multiple=True,
            features=CC_ON,
        ),
        "allow_multiple_allocations_default": case(
            "device.allowMultipleAllocations == false", ("match", True), driver=D, features=CC_ON
        ),
        "allow_multiple_allocations_false": case(
            "device.allowMultipleAllocations == false",
            ("match", True),
            driver=D,
            multiple=False,
            features=CC_ON,
        ),
        "allow_multiple_allocations_new": case(
            "device.allowMultipleAllocations == false",
            ("match", True),
            driver=D,
            multiple=False,
            features=CC_ON,
        ),
        "allow_multiple_allocations_enabled": case(
            "device.allowMultipleAllocations == false",
            ("match", True),
            driver=D,
            multiple=False,
            features=CC_ON,
        ),
        "allow_multiple_allocations_disabled": case(
            "device.allowMultipleAllocations == false",
            ("compile_error", "undefined field 'allowMultipleAllocations'"),
            driver=D,
            scope=NEW,
            features=CC_OFF,
        ),
    }
)
