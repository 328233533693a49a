"""Shared GPUs with memory shares: the request policy's arithmetic (as the scheduler rounds a
request), the API server's rules for it, the profile's ``sharing`` block for each mode with
strict errors, and the published device (``allowMultipleAllocations``, ``requestPolicy``)."""

from __future__ import annotations

import pytest

from dra_gpu.agent import slices
from dra_gpu.devices import model, simulated

GI = 2**30
POLICY = model.MemoryPolicy(default="8Gi", min="4Gi", max="40Gi", step="2Gi")


@pytest.mark.parametrize(
    ("requested", "share"),
    [
        (None, 8 * GI),  # nothing named: the default
        (1 * GI, 4 * GI),  # below min: min
        (4 * GI, 4 * GI),
        (5 * GI, 6 * GI),  # between steps: rounded up to min + n * step
        (6 * GI, 6 * GI),
        (40 * GI, 40 * GI),
        (39 * GI + 1, 40 * GI),
        (40 * GI + 1, None),  # above max: refused
    ],
)
def test_a_share_is_rounded_as_the_scheduler_rounds_it(requested: int | None, share: int) -> None:
    assert POLICY.share(requested) == share


def test_without_a_step_a_request_above_min_is_taken_as_it_is() -> None:
    policy = model.MemoryPolicy(default="8Gi", min="1Gi")
    assert policy.share(3 * GI + 5) == 3 * GI + 5
    assert policy.share(10**15) == 10**15  # no max: the device's memory is the scheduler's bound


@pytest.mark.parametrize(
    ("policy", "error"),
    [
        (model.MemoryPolicy("8Gi", "50Gi"), "min: 50Gi is more than the memory (40Gi)"),
        (model.MemoryPolicy("2Gi", "4Gi"), "default: 2Gi is less than min 4Gi"),
        (model.MemoryPolicy("8Gi", "4Gi", max="48Gi"), "max: 48Gi is more than the memory (40Gi)"),
        (model.MemoryPolicy("8Gi", "4Gi", max="2Gi"), "max: 2Gi is less than min 4Gi"),
        (model.MemoryPolicy("16Gi", "4Gi", max="8Gi"), "default: 16Gi is more than max 8Gi"),
        (model.MemoryPolicy("8Gi", "4Gi", step="0"), "step: 0 must be more than zero"),
        (
            model.MemoryPolicy("8Gi", "4Gi", step="40Gi"),
            "step: min + step (4Gi + 40Gi) is more than the memory (40Gi)",
        ),
        (
            model.MemoryPolicy("7Gi", "4Gi", step="2Gi"),
            "default: 7Gi is not min 4Gi plus a whole number of steps of 2Gi",
        ),
        (
            model.MemoryPolicy("8Gi", "4Gi", max="39Gi", step="2Gi"),
            "max: 39Gi is not min 4Gi plus a whole number of steps of 2Gi",
        ),
        (model.MemoryPolicy("8Gi", "1500m"), "min: 1500m is not a whole number of bytes"),
    ],
)
def test_a_policy_the_api_server_would_refuse_is_refused_naming_the_field(
    policy: model.MemoryPolicy, error: str
) -> None:
    with pytest.raises(model.InventoryError) as raised:
        policy.check(40 * GI)
    assert str(raised.value) == error


def profile(sharing: str, extra: str = "") -> str:
    return f"nodes:\n  node-01:\n    devices:\n    - {{memory: 40Gi, sharing: {sharing}{extra}}}\n"


@pytest.mark.parametrize("mode", ["TimeSlicing", "MPS"])
def test_a_shared_gpu_is_published_for_several_claims_with_its_memory_policy(mode: str) -> None:
    parsed = simulated.parse_profile(
        profile(f"{{mode: {mode}, memory: {{default: 8192Mi, min: 4Gi, step: 2Gi}}}}")
    )
    (gpu,) = parsed.inventory("node-01").devices
    assert gpu.sharing == model.Sharing(mode, model.MemoryPolicy("8Gi", "4Gi", step="2Gi"))
    body = slices.device_body(gpu)
    assert body["allowMultipleAllocations"] is True
    assert body["capacity"] == {
        "memory": {
            "value": "40Gi",
            # Quantities written as the API server prints them: nothing differs on read-back.
            "requestPolicy": {"default": "8Gi", "validRange": {"min": "4Gi", "step": "2Gi"}},
        }
    }
    assert body["attributes"]["sharing"] == {"string": mode}  # what classes select by
    exclusive = slices.device_body(parsed.inventory("node-01").without_sharing().devices[0])
    assert "allowMultipleAllocations" not in exclusive
    assert "sharing" not in exclusive["attributes"]


def test_time_slicing_is_the_default_mode() -> None:
    parsed = simulated.parse_profile(profile("{memory: {default: 8Gi, min: 8Gi}}"))
    (gpu,) = parsed.inventory("node-01").devices
    assert gpu.sharing is not None
    assert gpu.sharing.mode == "TimeSlicing"


@pytest.mark.parametrize(
    ("sharing", "extra", "error"),
    [
        (
            "{mode: Exclusive, memory: {default: 8Gi, min: 4Gi}}",
            "",
            "sharing.mode: 'Exclusive' is not one of TimeSlicing, MPS",
        ),
        ("{mode: MPS}", "", "sharing.memory: required (default and min at least)"),
        ("{memory: {min: 4Gi}}", "", "sharing.memory.default: required"),
        ("{memory: {default: 8Gi}}", "", "sharing.memory.min: required"),
        (
            "{memory: {default: 8Gi, min: 4Gi, stepp: 1Gi}}",
            "",
            "sharing.memory.stepp: unknown field (known: default, max, min, step)",
        ),
        ("{memory: {default: lots, min: 4Gi}}", "", "sharing.memory.default: 'lots' is not a"),
        (
            "{memory: {default: 9Gi, min: 4Gi, step: 2Gi}}",
            "",
            "sharing.memory.default: 9Gi is not min 4Gi plus a whole number of steps of 2Gi",
        ),
        (
            "{memory: {default: 8Gi, min: 4Gi, max: 64Gi}}",
            "",
            "sharing.memory.max: 64Gi is more than the memory (40Gi)",
        ),
        (
            "{mem: 1}",
            "",
            "sharing.mem: unknown field (known: activeThreadPercentage, memory, mode, timeSlice)",
        ),
        (
            "{memory: {default: 8Gi, min: 4Gi}}",
            ", migCapable: true, mig: A100-40GB",
            "sharing: a GPU with mig cannot also be shared",
        ),
    ],
)
def test_a_bad_sharing_block_names_the_field(sharing: str, extra: str, error: str) -> None:
    with pytest.raises(model.ProfileError) as raised:
        simulated.parse_profile(profile(sharing, extra))
    assert str(raised.value).startswith(f"profile <string>: nodes.node-01.devices[0].{error}")
