"""Admission: what prepare would refuse is refused at apply, naming the same field; a claim
nothing can satisfy now is admitted with a warning; nothing else is refused."""

from __future__ import annotations

import asyncio
import copy
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dra_gpu import kube
from dra_gpu.config import ControllerSettings
from dra_gpu.controller import explain, main
from dra_gpu.controller.admission import handlers, review
from dra_gpu.controller.main import Controller
from dra_gpu.devices import opaque
from dra_gpu.kube import transport
from tests.unit.controller.test_explain import (
    device_class,
    gpu_slice,
    memory_selector,
    ready_node,
    set_request,
    template_claim,
    tutorial_slice,
)
from tests.unit.devices.test_opaque_config import MALFORMED, gpu_config

DRIVER = "gpu.example.com"
CLAIMS, TEMPLATES, CLASSES = (
    review.KINDS[k] for k in ("resourceclaims", "resourceclaimtemplates", "deviceclasses")
)
Body = dict[str, Any]


def config_entry(parameters: object, driver: str = DRIVER) -> Body:
    return {"opaque": {"driver": driver, "parameters": parameters}}


def claim_with(*entries: Body, name: str = "c") -> Body:
    return {
        "metadata": {"namespace": "ns", "name": name},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu-inferencia"}}],
                "config": list(entries),
            }
        },
    }


def template_with(*entries: Body) -> Body:
    claim = claim_with(*entries)
    return {"metadata": {"namespace": "ns", "name": "t"}, "spec": {"spec": claim["spec"]}}


def class_with(*entries: Body) -> Body:
    return {"metadata": {"name": "gpu-inferencia"}, "spec": {"config": list(entries)}}


def agent_refusal(class_entries: list[Body], claim_entries: list[Body]) -> str | None:
    """What prepare says of the allocation the scheduler writes from these configs (class
    entries first, then the claim's: every driver's, in order)."""
    allocated = [{"source": "FromClass", **e} for e in class_entries] + [
        {"source": "FromClaim", **e} for e in claim_entries
    ]
    try:
        opaque.effective_configs(allocated, DRIVER, ["gpu"])
    except opaque.InvalidConfig as exc:
        return str(exc)
    return None


def field_and_reason(message: str) -> str:
    """``config[0].opaque.parameters.env: ...``: the part both messages share."""
    return message[message.index("config[") :]


# --- refusals ----------------------------------------------------------------------------


@pytest.mark.parametrize(("params", "pattern"), MALFORMED)
def test_every_config_prepare_refuses_is_refused_at_apply_naming_the_same_field(
    params: object, pattern: str
) -> None:
    agent = agent_refusal([], [config_entry(params)])
    refused = review.refusal(CLAIMS, claim_with(config_entry(params)), DRIVER)
    assert agent is not None
    assert refused is not None
    assert refused.startswith("ResourceClaim ns/c: spec.devices.config[0].opaque.parameters")
    assert field_and_reason(refused) == field_and_reason(agent)
    assert re.search(pattern.removeprefix(r"ResourceClaim "), refused)


def test_the_refusal_names_the_entry_in_templates_and_classes() -> None:
    bad = config_entry(gpu_config(sharing={"strategy": "MPS"}))
    good = config_entry(gpu_config())
    template = review.refusal(TEMPLATES, template_with(good, bad), DRIVER)
    assert template is not None
    assert template.startswith(
        "ResourceClaimTemplate ns/t: spec.spec.devices.config[1].opaque.parameters"
        ".sharing.strategy: 'MPS' is not one of Exclusive, TimeSlicing"
    )
    klass = review.refusal(CLASSES, class_with(bad), DRIVER)
    assert klass is not None
    assert klass.startswith("DeviceClass gpu-inferencia: spec.config[0].opaque.parameters.")
    agent = agent_refusal([bad], [])
    assert agent is not None
    assert field_and_reason(klass) == field_and_reason(agent)


def test_good_configs_other_drivers_and_objects_without_config_are_admitted() -> None:
    good = config_entry(gpu_config(sharing={"strategy": "TimeSlicing"}, env={"A": "b"}))
    other = config_entry({"anything": ["goes"]}, driver="other.example.com")
    for kind, body in [
        (CLAIMS, claim_with(good, other)),
        (TEMPLATES, template_with(other)),
        (CLASSES, class_with(good)),
        (CLASSES, {"metadata": {"name": "empty"}, "spec": {}}),
        (CLAIMS, {"metadata": {"namespace": "ns", "name": "bare"}}),
    ]:
        assert review.refusal(kind, body, DRIVER) is None


# --- the property: admission and prepare agree on every config --------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3)
    ),
    max_leaves=12,
)
NAMES = st.sampled_from(["A", "CUDA_X", "_b", "1BAD", "", "a-b", "A" * 3])
PARAMETERS = st.one_of(
    JSON,
    st.fixed_dictionaries(
        {"apiVersion": st.sampled_from([opaque.API_VERSION, "v1"]), "kind": st.just(opaque.KIND)},
        optional={
            "sharing": st.one_of(
                JSON,
                st.fixed_dictionaries(
                    {}, optional={"strategy": st.sampled_from([*opaque.SHARING_STRATEGIES, "MPS"])}
                ),
            ),
            "env": st.one_of(JSON, st.dictionaries(NAMES, st.one_of(st.text(max_size=5), JSON))),
            "migProfile": st.one_of(
                st.sampled_from(["3g.20gb", "1g.5gb+me", "1g.10gb-x", "3g", "7G.80GB", ""]), JSON
            ),
            "extra": JSON,
        },
    ),
)
ENTRIES = st.lists(
    st.builds(config_entry, PARAMETERS, st.sampled_from([DRIVER, DRIVER, "other.example.com"])),
    max_size=3,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(class_entries=ENTRIES, claim_entries=ENTRIES)
def test_admission_refuses_exactly_the_configs_prepare_refuses(
    class_entries: list[Body], claim_entries: list[Body]
) -> None:
    admitted = (
        review.refusal(CLASSES, class_with(*class_entries), DRIVER) is None
        and review.refusal(CLAIMS, claim_with(*claim_entries), DRIVER) is None
        and review.refusal(TEMPLATES, template_with(*claim_entries), DRIVER) is None
    )
    assert admitted == (agent_refusal(class_entries, claim_entries) is None)


# --- warnings ----------------------------------------------------------------------------


def explain_against_tutorial(claim: Any) -> explain.Explanation:
    return explain.explain_claim(
        claim,
        classes={"gpu-inferencia": device_class()},
        slices=[tutorial_slice()],
        claims=[],
        nodes={"node-01": ready_node()},
    )


def tutorial_claim(quantity: str) -> Body:
    return set_request(template_claim("c"), selectors=memory_selector(quantity))


def test_a_claim_no_device_can_satisfy_is_admitted_with_a_warning_naming_the_devices() -> None:
    refused, warned = handlers.answer(
        CLAIMS, tutorial_claim("200Gi"), DRIVER, explain_against_tutorial
    )
    assert refused is None
    assert warned is not None
    assert warned.startswith("ResourceClaim default/c: request gpu: no device fits: ")
    assert "node-01/gpu-0 has memory 24Gi, needs >= 200Gi" in warned


def test_a_claim_that_fits_or_waits_for_a_device_held_by_another_gets_no_warning() -> None:
    for reason in (explain.Reason.SATISFIABLE, explain.Reason.DEVICES_ALLOCATED):
        result = explain.Explanation("default/c", reason, "whatever", ())
        assert review.warning(CLAIMS, tutorial_claim("1Gi"), result) is None
    _, warned = handlers.answer(CLAIMS, tutorial_claim("16Gi"), DRIVER, explain_against_tutorial)
    assert warned is None


def test_a_template_is_warned_about_as_the_claims_it_stamps_out() -> None:
    claim = tutorial_claim("200Gi")
    template = {"metadata": {"namespace": "default", "name": "t"}, "spec": {"spec": claim["spec"]}}
    _, warned = handlers.answer(TEMPLATES, template, DRIVER, explain_against_tutorial)
    assert warned is not None
    assert warned.startswith("ResourceClaimTemplate default/t: request gpu: no device fits")


def test_a_missing_class_is_a_warning_never_a_refusal() -> None:
    claim = copy.deepcopy(tutorial_claim("1Gi"))
    claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "gpu-nope"
    refused, warned = handlers.answer(CLAIMS, claim, DRIVER, explain_against_tutorial)
    assert refused is None
    assert warned == "ResourceClaim default/c: request gpu: device class gpu-nope does not exist"


def test_warnings_are_one_line_and_bounded() -> None:
    long = explain.Explanation("d/c", explain.Reason.NO_DEVICE_FITS, "x\ny " * 400, ())
    warned = review.warning(CLAIMS, claim_with(), long)
    assert warned is not None
    assert len(warned) == review.WARNING_LIMIT
    assert "\n" not in warned
    assert warned.endswith("…")


def test_an_explanation_that_fails_admits_without_a_warning() -> None:
    def broken(claim: Any) -> explain.Explanation:
        raise RuntimeError("a bug in explain")

    assert handlers.answer(CLAIMS, tutorial_claim("200Gi"), DRIVER, broken) == (None, None)
    assert handlers.answer(CLAIMS, tutorial_claim("200Gi"), DRIVER, lambda c: None) == (None, None)


def test_generated_names_are_named_as_such() -> None:
    body = {"metadata": {"namespace": "ns", "generateName": "job-"}}
    assert review.object_name(body) == "ns/job-<generated>"


# --- a new selector never holds the event loop ------------------------------------------


def warm_controller() -> Controller:
    """A standby's Controller whose view holds 40 nodes of 8 GPUs (webhook off: only its
    ``warm`` and ``explain_now`` are used)."""
    api = kube.Kube(transport.Client("http://127.0.0.1:1"))  # never called
    controller = Controller(ControllerSettings(identity="replica-a"), api)
    controller.view.apply("DeviceClass", "ADDED", device_class())
    for n in range(40):
        node = f"node-{n:02d}"
        memories = {f"gpu-{g}": f"{8 * (1 + (n + g) % 10)}Gi" for g in range(8)}
        controller.view.apply("ResourceSlice", "ADDED", gpu_slice(node, dict(memories)))
        controller.view.apply("Node", "ADDED", ready_node(node))
    controller.leader.is_leader = False
    return controller


async def test_warming_works_out_a_new_selector_with_breaks_then_explaining_reads_the_cache(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    controller = warm_controller()
    claim = tutorial_claim("200Gi")
    assert await controller.warm(claim) is False  # before the first pass: nothing to warn
    await controller.reconcile_once()
    monkeypatch.setattr(main, "WARM_BREAK", 0.0)  # a break after every pool
    breaks = 0

    async def count_breaks() -> None:
        nonlocal breaks
        while True:
            await asyncio.sleep(0)
            breaks += 1

    counting = asyncio.create_task(count_breaks())
    try:
        assert await controller.warm(claim) is True
    finally:
        counting.cancel()
    assert breaks >= 39  # the loop ran between the 40 pools
    explanation = controller.explain_now(claim)
    assert explanation is not None
    assert explanation.reason == explain.Reason.NO_DEVICE_FITS
    # Out of budget: admitted without a warning, never a refusal.
    monkeypatch.setattr(main, "WARM_BUDGET", -1.0)
    assert await controller.warm(tutorial_claim("100Gi")) is False
    assert await controller.warm(tutorial_claim("200Gi")) is True  # worked out before: cached
