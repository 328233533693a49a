"""CEL device selectors evaluate as kube-scheduler evaluates them: variables, Quantity, Semver."""

import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_gpu import cel

EXAMPLES = Path(__file__).resolve().parents[2] / "crds-examples"
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
    device = _gpu(**{"example.org/rack": {"string": "r1"}})
    device["allowMultipleAllocations"] = True

    view = cel.device_view(DRIVER, device)

    assert view["driver"] == DRIVER
    assert view["allowMultipleAllocations"] is True
    assert set(view["attributes"]) == {DRIVER, "resource.kubernetes.io", "example.org"}
    assert view["attributes"][DRIVER]["index"] == 0
    assert view["attributes"]["example.org"] == {"rack": "r1"}
    assert view["capacity"] == {DRIVER: {"memory": {cel.QUANTITY_TYPE: "25769803776"}}}


def test_driver_and_attributes_by_bare_and_qualified_names() -> None:
    device = _gpu(**{"example.org/rack": {"string": "r1"}})
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
    assert 'semver("v1.2.3")' in evaluation.error


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
    # sign is a global function upstream: `sign(q)`, not `q.sign()`
    assert _true('sign(quantity("-3")) == -1 && sign(quantity("0")) == 0')
    assert _true('sign(quantity("2")) == 1')
    assert _true('quantity("1.5Gi").isInteger() && !quantity("1.5").isInteger()')
    assert not _true('quantity("99999999999999999999").isInteger()')
    overflow = _run('quantity("99999999999999999999").asInteger() == 0')
    assert overflow.error == "asInteger: cannot convert value 99999999999999999999 to integer"
    assert _true('isQuantity("1.3Gi") && !isQuantity("1,3G") && !isQuantity("200K")')


@pytest.mark.parametrize(  # "Pi": ... but an error on the arbitrary-precision one
    "bad", ["24GB", "200K", "10Mo", "10Mm", "Pi", "Three", "1e", "1.2.3", " 1", "1 ", ""]
)
def test_bad_quantity_is_a_runtime_error_naming_it(bad: str) -> None:
    evaluation = _run(f'quantity("{bad}").compareTo(quantity("1")) == 0')
    assert evaluation.matched is False
    assert evaluation.error is not None
    assert evaluation.error.startswith(f'quantity("{bad}"): ')


def test_bad_capacity_value_fails_the_evaluation_naming_it() -> None:
    evaluation = _run(TUTORIAL_SELECTOR, _gpu(memory="24GB"))
    assert evaluation.matched is False
    assert evaluation.error is not None
    assert evaluation.error.startswith("capacity memory: quantities must match")


def test_quantities_have_no_comparison_operators() -> None:
    # Upstream rejects `>=` on Quantity; comparing the representation as text would be wrong.
    evaluation = _run('quantity("9") >= quantity("10")')
    assert evaluation.matched is False
    assert evaluation.error is not None
    assert "no such overload" in evaluation.error.lower()


def test_compare_to_across_kinds_is_an_error() -> None:
    evaluation = _run('quantity("1").compareTo(semver("1.0.0")) == 0')
    assert evaluation.error is not None
    assert evaluation.error.startswith("compareTo: no such overload")
    assert _run('device.attributes["gpu.example.com"].index.major() == 0').error == (
        "major: expected a semver, got int"
    )


# --- results and errors --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "kind"),
    [
        ('device.attributes["gpu.example.com"].productName', "string"),
        ('device.attributes["gpu.example.com"].index', "int"),
        ('device.capacity["gpu.example.com"].memory', "kubernetes.Quantity"),
        ('device.attributes["gpu.example.com"].driverVersion', "kubernetes.Semver"),
        ('device.attributes["gpu.example.com"]', "map"),
    ],
)
def test_non_boolean_result_is_an_error(expression: str, kind: str) -> None:
    assert _run(expression) == cel.Evaluation(False, f"expression returned {kind}, not bool")


def test_boolean_attribute_is_a_valid_result() -> None:
    assert _run('device.attributes["gpu.example.com"].migCapable') == cel.Evaluation(False, None)


def test_syntax_error_is_a_compile_error_not_an_exception() -> None:
    compiled = cel.compile_selector('device.driver == "gpu.example.com" &&')
    assert compiled.error is not None
    assert "Syntax error" in compiled.error
    assert cel.evaluate(compiled, DRIVER, _gpu()) == cel.Evaluation(False, compiled.error)


def test_constructs_the_library_lacks_are_compile_errors_that_say_so() -> None:
    bind = cel.compile_selector('cel.bind(a, device.attributes["gpu.example.com"], a.index == 0)')
    assert bind.error is not None
    assert "cel.bind() is not supported" in bind.error
    two = cel.compile_selector('device.attributes["gpu.example.com"].all(k, v, k != "")')
    assert two.error is not None
    assert "two-variable comprehension all()" in two.error


def test_overlong_expression_is_a_compile_error() -> None:
    expression = "true || " * 1300 + "true"
    compiled = cel.compile_selector(expression)
    assert compiled.error is not None
    assert "more than 10240" in compiled.error


def test_undefined_names_are_runtime_errors() -> None:
    assert _run("gpu.memory > 1") == cel.Evaluation(False, "Undefined variable or function: 'gpu'")


def test_standard_and_string_functions_are_available() -> None:
    name = 'device.attributes["gpu.example.com"].productName'
    assert _true(f'{name}.startsWith("NVIDIA") && {name}.matches("L[0-9]$")')
    assert _true(f'{name}.lowerAscii() == "nvidia l4" && {name}.split(" ").size() == 2')
    assert _true('device.attributes.exists(d, d.endsWith("kubernetes.io"))')


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


def test_failing_functions_do_not_log_library_warnings(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert _run('quantity("24GB").isGreaterThan(quantity("1"))').error is not None
    assert [r for r in caplog.records if r.name == "cel"] == []


# --- compilation cache and scale -----------------------------------------------------------------


def test_compile_cache_returns_the_same_object() -> None:
    first = cel.compile_selector(TUTORIAL_SELECTOR)
    assert cel.compile_selector(TUTORIAL_SELECTOR) is first
    assert cel.compile_selector("1 +") is cel.compile_selector("1 +")


def test_evaluate_all_equals_evaluating_one_by_one() -> None:
    selectors = [
        cel.compile_selector(e)
        for e in (
            'device.attributes["example.org"].size() == 0',  # defaults a domain on the way
            TUTORIAL_SELECTOR,
            "1 +",
            'device.attributes["gpu.example.com"].uuid == ""',
            '"example.org" in device.attributes',
            'device.attributes["gpu.example.com"].index == 0',
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
