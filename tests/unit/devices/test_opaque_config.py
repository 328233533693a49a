"""Opaque GpuConfig parameters: strict decoding, class-then-claim precedence, per request."""

import pytest

from dra_gpu.devices import opaque

DRIVER = "gpu.example.com"


def entry(
    params: object,
    source: str = "FromClaim",
    requests: list[str] | None = None,
    driver: str = DRIVER,
) -> dict[str, object]:
    return {
        "source": source,
        "requests": requests or [],
        "opaque": {"driver": driver, "parameters": params},
    }


def gpu_config(**fields: object) -> dict[str, object]:
    return {"apiVersion": opaque.API_VERSION, "kind": opaque.KIND, **fields}


def test_no_config_means_exclusive_and_no_extra_env() -> None:
    configs = opaque.effective_configs([], DRIVER, ["gpu"])
    assert configs["gpu"].container_env() == {"DRA_GPU_SHARING_STRATEGY": "Exclusive"}


def test_claim_config_overrides_class_config_and_env_merges() -> None:
    configs = opaque.effective_configs(
        [
            entry(
                gpu_config(sharing={"strategy": "TimeSlicing"}, env={"A": "class", "B": "b"}),
                source="FromClass",
            ),
            entry(gpu_config(env={"A": "claim"})),
        ],
        DRIVER,
        ["gpu"],
    )
    assert configs["gpu"].sharing == "TimeSlicing"  # the claim did not set sharing
    assert configs["gpu"].env == {"A": "claim", "B": "b"}


def test_config_applies_only_to_the_requests_it_names() -> None:
    configs = opaque.effective_configs(
        [entry(gpu_config(env={"X": "1"}), requests=["big"])], DRIVER, ["big/large", "small"]
    )
    assert configs["big/large"].env == {"X": "1"}
    assert configs["small"].env == {}


def test_other_drivers_configs_are_ignored_even_when_malformed() -> None:
    configs = opaque.effective_configs([entry("garbage", driver="other.io")], DRIVER, ["gpu"])
    assert configs["gpu"].env == {}


MALFORMED = [
    (
        gpu_config(sharng={}),
        r"ResourceClaim config\[0\]\.opaque\.parameters\.sharng: unknown field",
    ),
    (
        gpu_config(sharing={"strategy": "MPS"}),
        r"parameters\.sharing\.strategy: 'MPS' is not one of Exclusive, TimeSlicing",
    ),
    (gpu_config(env={"1BAD": "x"}), r"parameters\.env: '1BAD' is not an environment variable"),
    (gpu_config(env={"A": 1}), r"parameters\.env\.A: expected a string, found int"),
    ({"kind": "GpuConfig"}, r"parameters\.apiVersion: None is not supported"),
    (gpu_config(kind="Other"), r"parameters\.kind: 'Other' is not supported"),
    ([1, 2], r"parameters: expected an object, found list"),
    (
        gpu_config(migProfile="3g"),
        r"parameters\.migProfile: '3g' is not a MIG profile name \(<compute slices>g\."
        r"<memory>gb, e\.g\. 3g\.20gb or 1g\.5gb\+me\)",
    ),
    (gpu_config(migProfile=3), r"parameters\.migProfile: 3 is not a MIG profile name"),
    (gpu_config(migProfile="3G.20GB"), r"migProfile: '3G.20GB' is not a MIG profile"),
    (gpu_config(migprofile="3g.20gb"), r"parameters\.migprofile: unknown field"),
]
"""Parameters prepare refuses, each with (a pattern of) the message naming the field; the
admission webhook's tests refuse the same at apply."""


@pytest.mark.parametrize(("params", "message"), MALFORMED)
def test_malformed_parameters_name_the_field(params: object, message: str) -> None:
    with pytest.raises(opaque.InvalidConfig, match=message):
        opaque.effective_configs([entry(params)], DRIVER, ["gpu"])


def test_class_config_errors_name_the_device_class() -> None:
    with pytest.raises(opaque.InvalidConfig, match=r"^DeviceClass config\[1\]"):
        opaque.effective_configs(
            [entry(gpu_config(), source="FromClass"), entry({}, source="FromClass")],
            DRIVER,
            ["gpu"],
        )


def test_mig_profile_is_kept_with_the_entry_that_set_it_and_a_claim_overrides_a_class() -> None:
    configs = opaque.effective_configs(
        [
            entry(gpu_config(migProfile="1g.5gb+me"), source="FromClass"),
            entry(gpu_config(env={"A": "1"})),
            entry(gpu_config(migProfile="3g.20gb"), requests=["big"]),
        ],
        DRIVER,
        ["big", "small"],
    )
    assert configs["small"].mig_profile == "1g.5gb+me"
    assert (
        configs["small"].mig_profile_field == "DeviceClass config[0].opaque.parameters.migProfile"
    )
    assert configs["big"].mig_profile == "3g.20gb"
    assert (
        configs["big"].mig_profile_field == "ResourceClaim config[1].opaque.parameters.migProfile"
    )
    assert configs["big"].check_mig_profile("gpu-0-mig-3g-20gb-4", "3g.20gb") is None
    assert configs["big"].check_mig_profile("gpu-0-mig-2g-10gb-0", "2g.10gb") == (
        "ResourceClaim config[1].opaque.parameters.migProfile asks for a MIG partition of "
        "profile 3g.20gb, but the device allocated, gpu-0-mig-2g-10gb-0, is a 2g.10gb partition"
    )
    assert opaque.GpuConfig().check_mig_profile("gpu-0", None) is None  # none asked for
