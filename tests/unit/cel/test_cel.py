"""CEL device selectors evaluate as kube-scheduler evaluates them: the device variable, the
classes of expressions where a generic CEL library answers differently (each shown here on its
own; tests/unit/cel/test_upstream.py compares thousands of cases with upstream itself), the
Kubernetes libraries, compile errors and the cost bound."""

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_gpu import cel

EXAMPLES = Path(__file__).resolve().parents[3] / "crds-examples"
DRIVER = "gpu.example.com"
TUTORIAL_SELECTOR = 'device.capacity["gpu.example.com"].memory\n  .compareTo(quantity("24Gi")) >= 0'


def _gpu(memory: str = "24Gi", **extra_attributes: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": "gpu-0",
        "attributes": {
            "index": {"int": 0},
            "productName": {"string": "NVIDIA L4"},
            "driverVersion": {"version": "550.54.15"},
            "cudaComputeCapability": {"version": "8.9.0"},
            "migCapable": {"bool": False},
            "resource.kubernetes.io/pciBusID": {"string": "0000:3b:00.0"},
            **extra_attributes,
        },
        "capacity": {"memory": {"value": memory}},
    }


def _run(expression: str, device: dict[str, Any] | None = None) -> cel.Evaluation:
    compiled = cel.compile_selector(expression)
    assert compiled.error is None, compiled.error
    return cel.evaluate(compiled, DRIVER, _gpu() if device is None else device)


def _true(expression: str, device: dict[str, Any] | None = None) -> bool:
    evaluation = _run(expression, device)
    assert evaluation.error is None, evaluation.error
    return evaluation.matched


# --- the tutorial ------------------------------------------------------------------------------


@pytest.mark.parametrize(("memory", "matched"), [("24Gi", True), ("8Gi", False), ("80Gi", True)])
def test_tutorial_selector_matches_24gi_and_more(memory: str, matched: bool) -> None:
    assert cel.evaluate(
        cel.compile_selector(TUTORIAL_SELECTOR), DRIVER, _gpu(memory)
    ) == cel.Evaluation(matched, None)


def test_tutorial_manifests_select_gpu_0_and_not_gpu_1() -> None:
    (template,) = [
        d
        for d in yaml.safe_load_all((EXAMPLES / "recomendador.yaml").read_text())
        if d["kind"] == "ResourceClaimTemplate"
    ]
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    device_class = yaml.safe_load((EXAMPLES / "deviceclass.yaml").read_text())
    expressions = [s["cel"]["expression"] for s in device_class["spec"]["selectors"]]
    expressions += [s["cel"]["expression"] for s in request["exactly"]["selectors"]]
    selectors = [cel.compile_selector(e) for e in expressions]
    slice_spec = yaml.safe_load((EXAMPLES / "resourceslice.yaml").read_text())["spec"]

    verdicts = {
        device["name"]: cel.evaluate_all(selectors, slice_spec["driver"], device)
        for device in slice_spec["devices"]
    }

    assert verdicts == {
        "gpu-0": [cel.Evaluation(True, None), cel.Evaluation(True, None)],
        "gpu-1": [cel.Evaluation(True, None), cel.Evaluation(False, None)],
    }


# --- the device variable -------------------------------------------------------------------------


def test_device_view_files_bare_names_under_the_driver_domain() -> None:
    device = _gpu("24Gi", **{"example.org/rack": {"string": "r1"}})
    device["allowMultipleAllocations"] = True

    view = cel.device_view(DRIVER, device)

    assert view["driver"] == DRIVER
    assert view["allowMultipleAllocations"] is True
    assert set(view["attributes"]) == {DRIVER, "resource.kubernetes.io", "example.org"}
    assert view["attributes"][DRIVER]["index"] == 0
    assert view["attributes"]["example.org"] == {"rack": "r1"}
    assert set(view["capacity"]) == {DRIVER}
    assert view["capacity"][DRIVER]["memory"].string() == "24Gi"


def test_driver_and_attributes_by_bare_and_qualified_names() -> None:
    device = _gpu("24Gi", **{"example.org/rack": {"string": "r1"}})
    assert _true('device.driver == "gpu.example.com"', device)
    assert _true('device.attributes["gpu.example.com"].productName == "NVIDIA L4"', device)
    assert _true('device.attributes["gpu.example.com"].index == 0', device)
    assert _true('device.attributes["gpu.example.com"].migCapable == false', device)
    assert _true('device.attributes["example.org"].rack == "r1"', device)
    assert not _true('device.driver == "other.example.com"', device)


def test_a_name_qualified_with_the_driver_domain_is_the_same_as_a_bare_one() -> None:
    device = {"name": "g", "attributes": {"gpu.example.com/model": {"string": "L4"}}}
    assert _true('device.attributes["gpu.example.com"].model == "L4"', device)


def test_pci_bus_id_is_a_standard_attribute_under_resource_kubernetes_io() -> None:
    assert _true('device.attributes["resource.kubernetes.io"].pciBusID == "0000:3b:00.0"')
    assert not _true('"pciBusID" in device.attributes["gpu.example.com"]')


def test_allow_multiple_allocations_defaults_to_false() -> None:
    assert _true("device.allowMultipleAllocations == false")


def test_guarded_lookups_and_multi_line_expressions() -> None:
    expression = """
        "gpu.example.com" in device.attributes &&
        "cudaComputeCapability" in device.attributes["gpu.example.com"] &&
        device.attributes["gpu.example.com"].cudaComputeCapability
            .isGreaterThan(semver("8.0.0"))
    """
    assert _true(expression)
    assert not _true(expression, {"name": "g", "attributes": {}})


def test_unknown_domain_is_an_empty_map_but_not_a_member() -> None:
    assert _true('device.attributes["example.org"].size() == 0')
    assert _true('device.attributes["Not A Domain"].size() == 0')
    assert _true('device.capacity["example.org"].size() == 0')
    assert not _true('"example.org" in device.attributes')
    assert not _true('has(device.attributes["example.org"].rack)')


def test_capacity_domain_without_capacity_is_an_empty_map() -> None:
    device = {"name": "g", "attributes": {"model": {"string": "L4"}}}
    assert _true('device.capacity["gpu.example.com"].size() == 0', device)


def test_missing_attribute_is_an_error_not_an_exception() -> None:
    evaluation = _run('device.attributes["gpu.example.com"].uuid == "GPU-1"')
    assert evaluation == cel.Evaluation(False, "no such key: uuid")
    assert _run('device.attributes["example.org"].rack == "r1"').error == "no such key: rack"
    missing = _run('device.attributes["gpu.example.com"].architecture == "Ada"')
    assert missing == cel.Evaluation(False, "no such key: architecture")


def test_semver_attributes_compare_as_versions() -> None:
    cc = 'device.attributes["gpu.example.com"].cudaComputeCapability'
    assert _true(f'{cc}.isGreaterThan(semver("8.0.0"))')
    assert not _true(f'{cc}.isGreaterThan(semver("9.0.0"))')
    assert _true(f'{cc}.isLessThan(semver("10.0.0"))')  # numeric, not text, order
    assert _true(f'{cc}.compareTo(semver("8.9.0")) == 0')
    assert _true(f'{cc} == semver("8.9.0")')
    assert _true(f"{cc}.major() == 8 && {cc}.minor() == 9 && {cc}.patch() == 0")
    driver_version = 'device.attributes["gpu.example.com"].driverVersion'
    assert _true(f'{driver_version}.compareTo(semver("535.104.5")) == 1')


@pytest.mark.parametrize(
    ("left", "right", "order"),
    [
        ("1.2.3-rc.1", "1.2.3", -1),  # a prerelease sorts before its release
        ("1.2.3-alpha", "1.2.3-beta", -1),
        ("1.2.3-2", "1.2.3-10", -1),  # numeric identifiers compare as numbers
        ("1.2.3-alpha", "1.2.3-1", 1),  # ... and before alphanumeric ones
        ("1.2.3-rc", "1.2.3-rc.1", -1),
        ("1.2.3+build.5", "1.2.3", 0),  # build metadata is ignored
        ("1.10.0", "1.9.9", 1),
    ],
)
def test_semver_order_follows_semver_2(left: str, right: str, order: int) -> None:
    assert _true(f'semver("{left}").compareTo(semver("{right}")) == {order}')


def test_semver_normalizes_only_when_asked() -> None:
    assert _true('semver("v1.2", true) == semver("1.2.0")')
    assert _true('semver("01.02.03", true).minor() == 2')
    assert _true('isSemver("1.2.3") && !isSemver("1.2") && isSemver("v1.2", true)')
    evaluation = _run('semver("v1.2.3") == semver("1.2.3")')
    assert evaluation.error is not None
    assert "Invalid character(s) found in major number" in evaluation.error


def test_unparseable_version_attribute_fails_the_evaluation_naming_it() -> None:
    device = _gpu(firmware={"version": "1.02.3"})
    evaluation = _run("device.driver == 'gpu.example.com'", device)
    assert evaluation.matched is False
    assert evaluation.error is not None
    assert evaluation.error.startswith("attribute firmware: parse semantic version:")


# --- quantities ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("left", "right", "order"),
    [
        ("1G", "1Gi", -1),  # 10^9 < 2^30
        ("1Gi", "1G", 1),
        ("1500m", "1.5", 0),
        ("24Gi", "25769803776", 0),
        ("24Gi", "24G", 1),
        ("1e3", "1k", 0),
        ("1E3", "1k", 0),
        ("1E", "1e18", 0),  # a lone E is exa
        ("0.5Ki", "512", 0),
        ("100m", "0.1", 0),
        ("1u", "1000n", 0),
        ("0.1n", "1n", 0),  # rounded up to the smallest unit, as ParseQuantity does
        ("-0.1n", "-1n", 0),  # ... away from zero
        ("-1", "1m", -1),
        ("+5", "5", 0),
        ("1.", "1", 0),
        (".5", "500m", 0),
        ("9Ei", "8Ei", 0),  # binary-suffixed values are capped at 2^63-1
        ("9E", "8E", 1),  # decimal ones are not
        ("0", "0Gi", 0),
        ("Mi", "0", 0),  # no digits: zero on ParseQuantity's int64 path ...
        ("1e400", "1e399", 1),  # no exponent is too large to compare exactly
        ("1e-400", "1n", 0),
        ("12345678901234567890123", "1.2345678901234567890123e22", 0),
    ],
)
def test_quantities_compare_exactly(left: str, right: str, order: int) -> None:
    assert _true(f'quantity("{left}").compareTo(quantity("{right}")) == {order}')


def test_quantity_equality_and_comparison_helpers() -> None:
    assert _true('quantity("24Gi") == quantity("25769803776")')
    assert _true('quantity("1500m") == quantity("1.5")')
    assert not _true('quantity("1G") == quantity("1Gi")')
    memory = 'device.capacity["gpu.example.com"].memory'
    assert _true(f'{memory}.isGreaterThan(quantity("16Gi"))')
    assert _true(f'{memory}.isLessThan(quantity("26G"))')  # 24Gi is 25.77G
    assert not _true(f'{memory}.isLessThan(quantity("24Gi"))')
    assert _true(f'{memory} == quantity("24Gi")')


def test_quantity_arithmetic_and_conversions() -> None:
    assert _true('quantity("50k").add(quantity("20k")) == quantity("70k")')
    assert _true('quantity("50k").add(20) == quantity("50020")')
    assert _true('quantity("50k").sub(20000) == quantity("30k")')
    assert _true('quantity("50k").add(20).sub(quantity("100k")).sub(-50000) == quantity("20")')
    assert _true('quantity("1Gi").asInteger() == 1073741824')
    assert _true('quantity("50k").sub(20000).asApproximateFloat() == 30000.0')
    assert _true('sign(quantity("-3")) == -1 && sign(quantity("0")) == 0')
    assert _true('isQuantity("1.3Gi") && !isQuantity("1,3G") && !isQuantity("200K")')


def test_is_integer_judges_how_upstream_stores_the_quantity() -> None:
    # apimachinery keeps "1.5Gi" (a fraction with a binary suffix) and anything past int64 as
    # an arbitrary-precision decimal; isInteger() and asInteger() say no to every decimal.
    assert not _true('quantity("1.5Gi").isInteger()')
    assert _true('quantity("1536Mi").isInteger()')  # the same value, as the API stores it
    assert not _true('quantity("99999999999999999999").isInteger()')
    assert not _true('quantity("1000m").isInteger()')  # held as 1000 * 10^-3
    assert _true('quantity("1k").isInteger() && quantity("1k").asInteger() == 1000')
    overflow = _run('quantity("99999999999999999999").asInteger() == 0')
    assert overflow == cel.Evaluation(False, "cannot convert value to integer")
    # A capacity is read back in its canonical form: "1.5Gi" is stored as "1536Mi".
    assert _true('device.capacity["gpu.example.com"].memory.isInteger()', _gpu("1.5Gi"))
    # Comparing with a decimal turns the receiver into one, in place, as Quantity.Cmp does.
    assert _true('cel.bind(q, quantity("1"), q.isLessThan(quantity("1e400")) && q.isInteger())')
    assert not _true('cel.bind(q, quantity("1"), q.isLessThan(quantity("1.5Gi")) && q.isInteger())')


def test_equality_with_an_add_result_on_the_right_is_no_such_overload() -> None:
    # add()/sub() return a pointer upstream, and Quantity.Equal type-asserts a value.
    assert _true('quantity("1").add(1) == quantity("2")')
    assert _run('quantity("2") == quantity("1").add(1)') == cel.Evaluation(
        False, "no such overload"
    )


@pytest.mark.parametrize(
    "bad", ["24GB", "200K", "10Mo", "10Mm", "Pi", "Three", "1e", "1.2.3", " 1", "1 ", ""]
)
def test_bad_quantity_is_a_runtime_error_with_upstreams_message(bad: str) -> None:
    evaluation = _run(f'quantity("{bad}").compareTo(quantity("1")) == 0')
    assert evaluation.matched is False
    assert evaluation.error in (
        "quantities must match the regular expression "
        "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
        "unable to parse quantity's suffix",
        "unable to parse numeric part of quantity",
    )


def test_bad_capacity_value_fails_the_evaluation_naming_it() -> None:
    evaluation = _run(TUTORIAL_SELECTOR, _gpu(memory="24GB"))
    assert evaluation.matched is False
    assert evaluation.error is not None
    assert evaluation.error.startswith("capacity memory: quantities must match")


def test_quantities_have_no_comparison_operators() -> None:
    compiled = cel.compile_selector('quantity("9") >= quantity("10")')
    assert compiled.error is not None
    assert "found no matching overload for '_>=_'" in compiled.error


# --- where a generic CEL evaluator answers differently ------------------------------------------


def test_string_size_counts_code_points() -> None:
    assert _true('"ü".size() == 1 && size("日本") == 2')
    assert _true('"héllo".indexOf("l") == 2 && "héllo".charAt(1) == "é"')
    assert _true('"HéLLO".lowerAscii() == "héllo"')  # ASCII only, as in Go


def test_exists_and_all_absorb_errors_per_element_as_cel_specifies() -> None:
    attributes = 'device.attributes["gpu.example.com"]'
    # the map mixes ints, strings, bools and versions: "> 5" fails on most of them
    assert not _true(f"{attributes}.exists(k, {attributes}[k] == 0) == false")
    assert _true(f"{attributes}.exists(k, {attributes}[k] == 0)")
    assert _run(f"{attributes}.exists(k, {attributes}[k] > 5)").error == "no such overload"
    assert not _true(f"{attributes}.all(k, {attributes}[k] > 5 && false)")
    assert _true("[0, 1].exists(x, 10 / x > 5)")
    assert _run("[0, 1].exists_one(x, 10 / x > 5)").error == "division by zero"


def test_logical_operators_absorb_errors_on_either_side() -> None:
    assert _true("1 / 0 == 1 || true")
    assert not _true("1 / 0 == 1 && false")
    assert _run("1 / 0 == 1 || false").error == "division by zero"


def test_conversions_follow_go() -> None:
    assert _true('string(true) == "true" && string(1.5) == "1.5" && string(1e6) == "1e+06"')
    assert _true('string(b"abc") == "abc" && string(3u) == "3"')
    assert _true('double("1_000.5") == 1000.5 && double("0x1p-2") == 0.25')
    assert _true('int("+12") == 12 && bool("T") && uint(1.9) == 1u')
    # conversions of constants are computed when the program is built, as cel-go does
    assert cel.compile_selector('int(" 12") == 12').error == (
        "program instantiation failed: type conversion error from 'string' to 'int'"
    )
    name = 'device.attributes["gpu.example.com"].productName'
    assert _run(f"int({name}) == 12").error == "type conversion error from 'string' to 'int'"
    assert _run(f"int(double({name}.size()) * -1e19) < 0").error == "integer overflow"


def test_integer_overflow_is_an_error_not_a_wrap() -> None:
    for expression in (
        "-(-9223372036854775807 - 1) > 0",
        "9223372036854775807 + 1 > 0",
        "9223372036854775807 * 2 > 0",
        "-9223372036854775808 / -1 < 0",
        "18446744073709551615u + 1u > 0u",
        "0u - 1u > 0u",
    ):
        assert _run(expression).error in ("integer overflow", "unsigned integer overflow")
    assert _true("-7 / 2 == -3 && -7 % 2 == -1")  # truncated, as Go divides


def test_has_on_attributes_finds_every_domain_but_only_present_names() -> None:
    assert _true("has(device.attributes.example)")  # upstream's defaulting map
    assert not _true('"example" in device.attributes')
    assert _true('has(device.attributes["gpu.example.com"].index)')
    assert not _true('has(device.attributes["gpu.example.com"].uuid)')
    assert _true("has(device.capacity.example)")


def test_regular_expressions_are_re2_with_ascii_classes() -> None:
    assert _true('"1é".matches("^\\\\d\\\\W$")')  # é is no word character in RE2
    assert not _true('"é".matches("\\\\w")')
    assert not _true('"a\\n".matches("a$")')  # $ is the end of the text
    assert _true('"a{,2}".matches("^a{,2}$")')  # a literal in Go
    assert _true('"NVIDIA L4".find("[0-9]+") == "4"')
    assert _true('"a1b22".findAll("[0-9]+") == ["1", "22"]')
    assert "invalid or unsupported Perl syntax" in str(
        cel.compile_selector('"a".matches("(?=a)")').error
    )


def test_library_functions_of_the_kubernetes_environment() -> None:
    assert _true("[3, 1, 2].sort() == [1, 2, 3] && [1, 2].isSorted() && [1, 2, 3].sum() == 6")
    assert _true("[1, 2, 3].indexOf(2) == 1 && lists.range(3) == [0, 1, 2]")
    assert _true("[1, 1, 2].distinct() == [1, 2] && [[1], [2]].flatten() == [1, 2]")
    assert _true("sets.contains([1, 2], [1]) && sets.intersects([1], [1, 3])")
    assert _true("[3, 1, 2].sortBy(x, -x) == [3, 2, 1] && [1, 2].slice(1, 2) == [2]")
    assert _true('ip("10.0.0.1").family() == 4 && cidr("10.0.0.0/8").containsIP("10.1.2.3")')
    assert _true('"a,b".split(",") == ["a", "b"] && ["a", "b"].join("-") == "a-b"')
    assert _true('strings.quote("a\\"b") == "\\"a\\\\\\"b\\""')


def test_bind_two_variable_comprehensions_and_optionals() -> None:
    assert _true('cel.bind(gpu, device.attributes["gpu.example.com"], gpu.index == 0)')
    assert _true('device.attributes["gpu.example.com"].exists(k, v, k == "index" && v == 0)')
    assert _true('{"a": 1}.transformMap(k, v, v + 1) == {"a": 2}')
    assert _true('device.attributes["gpu.example.com"].?uuid.orValue("none") == "none"')
    assert _true('device.attributes["gpu.example.com"].?index.hasValue()')
    assert _true("[?optional.of(1), ?optional.none()] == [1]")


# --- results and errors --------------------------------------------------------------------------


def test_non_boolean_results() -> None:
    # An attribute (dyn) compiles and fails when it is not a bool; other types do not compile.
    assert _run('device.attributes["gpu.example.com"].index') == cel.Evaluation(
        False, "CEL result of type int could not be converted to bool"
    )
    assert _run('device.attributes["gpu.example.com"].productName').error == (
        "CEL result of type string could not be converted to bool"
    )
    for expression in (
        'device.capacity["gpu.example.com"].memory',
        'device.attributes["gpu.example.com"]',
        "1",
    ):
        compiled = cel.compile_selector(expression)
        assert compiled.error is not None
        assert "must evaluate to bool or the unknown type" in compiled.error


def test_boolean_attribute_is_a_valid_result() -> None:
    assert _run('device.attributes["gpu.example.com"].migCapable') == cel.Evaluation(False, None)


def test_syntax_error_is_a_compile_error_not_an_exception() -> None:
    compiled = cel.compile_selector('device.driver == "gpu.example.com" &&')
    assert compiled.error is not None
    assert "Syntax error" in compiled.error
    assert cel.evaluate(compiled, DRIVER, _gpu()) == cel.Evaluation(False, compiled.error)


def test_type_errors_are_compile_errors() -> None:
    for expression, message in (
        ("gpu.memory > 1", "undeclared reference to 'gpu'"),
        ('device.attributes["gpu.example.com"].index + "a" == 1', "no matching overload"),
        ('[1, "a"].exists(x, x == 1)', "expected type 'int' but found 'string'"),
        ("device.foo", "undefined field 'foo'"),
    ):
        compiled = cel.compile_selector(expression)
        assert compiled.error is not None, expression
        assert message in compiled.error, (expression, compiled)


def test_unsupported_features_are_compile_errors_naming_expression_and_feature() -> None:
    expression = r'"a".matches("\\p{Greek}")'
    compiled = cel.compile_selector(expression)
    assert compiled.error is not None
    assert compiled.error.startswith(f"CEL expression {expression!r}: ")
    assert r"\p{Greek}" in compiled.error
    assert "not supported" in compiled.error


def test_cost_limit_stops_an_unbounded_selector() -> None:
    ten = "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]"
    expression = (
        f"{ten}.all(a, {ten}.all(b, {ten}.all(c, {ten}.all(d, {ten}.all(e, {ten}.all(f, true))))))"
    )
    evaluation = _run(expression)
    assert evaluation == cel.Evaluation(False, "operation cancelled: actual cost limit exceeded")
    assert _run("lists.range(2000000).size() > 0").error == (
        "operation cancelled: actual cost limit exceeded"
    )


def test_overlong_expression_is_a_compile_error() -> None:
    expression = "true || " * 1300 + "true"
    compiled = cel.compile_selector(expression)
    assert compiled.error is not None
    assert "more than 10240" in compiled.error


def test_malformed_devices_are_errors_not_exceptions() -> None:
    compiled = cel.compile_selector(TUTORIAL_SELECTOR)
    for device in (
        {"name": "g", "attributes": {"index": "0"}},
        {"name": "g", "attributes": {"index": {}}},
        {"name": "g", "attributes": {"index": {"int": "0"}}},
        {"name": "g", "capacity": {"memory": "24Gi"}},
        {"name": "g", "capacity": {"memory": {"value": None}}},
        {"name": "g", "allowMultipleAllocations": "yes"},
        {"name": "g", "attributes": []},
    ):
        evaluation = cel.evaluate(compiled, DRIVER, device)
        assert evaluation.matched is False
        assert evaluation.error, device


# --- compilation cache and scale -----------------------------------------------------------------


def test_compile_cache_returns_the_same_object() -> None:
    first = cel.compile_selector(TUTORIAL_SELECTOR)
    assert cel.compile_selector(TUTORIAL_SELECTOR) is first
    assert cel.compile_selector("1 +") is cel.compile_selector("1 +")


def test_evaluate_all_equals_evaluating_one_by_one() -> None:
    selectors = [
        cel.compile_selector(e)
        for e in (
            'device.attributes["example.org"].size() == 0',
            TUTORIAL_SELECTOR,
            "1 +",
            'device.attributes["gpu.example.com"].uuid == ""',
            '"example.org" in device.attributes',
            'device.attributes["gpu.example.com"].index == 0',
            'device.capacity["gpu.example.com"].memory.isLessThan(quantity("1e400"))',
            'device.capacity["gpu.example.com"].memory.isInteger()',
        )
    ]
    for device in (_gpu("24Gi"), _gpu("8Gi"), _gpu("bad")):
        expected = [cel.evaluate(s, DRIVER, device) for s in selectors]
        assert cel.evaluate_all(selectors, DRIVER, device) == expected


def test_ten_thousand_devices_evaluate() -> None:
    compiled = cel.compile_selector(TUTORIAL_SELECTOR)
    devices = [_gpu("24Gi" if i % 2 else "8Gi") for i in range(10_000)]
    results = [cel.evaluate(compiled, DRIVER, d) for d in devices]
    assert sum(r.matched for r in results) == 5_000
    assert all(r.error is None for r in results)


def test_threads_evaluate_independently() -> None:
    compiled = cel.compile_selector(TUTORIAL_SELECTOR)
    devices = [_gpu("24Gi" if i % 3 else "8Gi") for i in range(3_000)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda d: cel.evaluate(compiled, DRIVER, d).matched, devices))
    assert results == [bool(i % 3) for i in range(3_000)]
