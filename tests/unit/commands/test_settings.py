"""Agent settings: flags beat env beats defaults; bad values name the flag or variable."""

import argparse
from pathlib import Path

import pytest

from dra_gpu import config
from dra_gpu.config import AgentSettings
from dra_gpu.devices.model import MemoryPolicy


def parse(argv: list[str], env: dict[str, str]) -> AgentSettings:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser, AgentSettings)
    settings: AgentSettings = config.settings_from(AgentSettings, parser.parse_args(argv), env)
    return settings


def test_flags_override_env_and_env_overrides_defaults() -> None:
    settings = parse(
        ["--node-name", "node-01", "--cdi-dir", "/flag/cdi"],
        {
            "DRA_GPU_CDI_DIR": "/env/cdi",
            "DRA_GPU_PROFILE": "/p.yaml",
            "DRA_GPU_METRICS_PORT": "9999",
        },
    )
    assert settings.cdi_dir == Path("/flag/cdi")
    assert settings.profile == Path("/p.yaml")
    assert settings.metrics_port == 9999
    assert settings.driver_name == "gpu.example.com"


def test_socket_paths_follow_the_kubelet_layout() -> None:
    settings = AgentSettings(node_name="n", profile=Path("/p"), kubelet_dir=Path("/k"))
    assert settings.registration_socket == Path("/k/plugins_registry/gpu.example.com-reg.sock")
    assert settings.dra_socket == Path("/k/plugins/gpu.example.com/dra.sock")


def test_wrong_type_names_the_variable() -> None:
    with pytest.raises(ValueError, match=r"DRA_GPU_HEALTH_PORT: 'abc' is not a valid int"):
        parse(["--node-name", "n", "--profile", "/p"], {"DRA_GPU_HEALTH_PORT": "abc"})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"node_name": ""}, "node name is required"),
        ({"node_name": "n", "backend": "cuda"}, "backend 'cuda' is not one of"),
        ({"node_name": "n"}, "simulated backend needs a profile"),
    ],
)
def test_invalid_settings_are_refused_with_the_fix(kwargs: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AgentSettings(**kwargs)  # type: ignore[arg-type]


def test_every_flag_is_documented_with_its_env_twin() -> None:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser, AgentSettings)
    helps = {a.dest: a.help or "" for a in parser._actions if a.dest != "help"}
    assert helps["cdi_dir"].startswith("Per-claim CDI specs.")
    assert all(f"env DRA_GPU_{dest.upper()}" in text for dest, text in helps.items())


def test_a_kubelet_dir_too_long_for_unix_sockets_is_refused_naming_the_flag() -> None:
    with pytest.raises(ValueError, match=r"unix sockets allow 107: use a shorter --kubelet-dir"):
        AgentSettings(node_name="n", profile=Path("/p"), kubelet_dir=Path("/k" * 60))


def test_shared_gpus_come_from_the_flag_or_its_env_twin() -> None:
    setting = "[{gpus: [0, GPU-abc], mode: MPS, memory: {default: 8Gi, min: 4Gi, step: 4Gi}}]"
    for argv, env in (
        (["--shared-gpus", setting], {}),
        ([], {"DRA_GPU_SHARED_GPUS": setting}),
    ):
        settings = parse(["--node-name", "n", "--backend", "nvml", *argv], env)
        (entry,) = settings.shared_gpu_policy.entries
        assert (entry.indexes, entry.uuids, entry.sharing.mode) == (
            frozenset({0}),
            frozenset({"GPU-abc"}),
            "MPS",
        )
        assert entry.sharing.memory == MemoryPolicy("8Gi", "4Gi", step="4Gi")
    assert parse(["--node-name", "n", "--backend", "nvml"], {}).shared_gpu_policy.entries == ()


@pytest.mark.parametrize(
    ("backend", "setting", "message"),
    [
        (
            "nvml",
            "{gpus: all, memory: {default: 8Gi}}",
            "--shared-gpus / DRA_GPU_SHARED_GPUS: memory.min: required",
        ),
        (
            "nvml",
            "[{gpus: all, memory: {default: 8Gi, min: 4Gi, max: 6Gi}}]",
            "--shared-gpus / DRA_GPU_SHARED_GPUS: [0].memory.default: 8Gi is more than max 6Gi",
        ),
        (
            "simulated",
            "{gpus: all, memory: {default: 8Gi, min: 4Gi}}",
            "--shared-gpus / DRA_GPU_SHARED_GPUS: only the nvml backend reads it; the "
            "simulated backend's profile says which GPUs are shared (devices[].sharing)",
        ),
    ],
)
def test_a_bad_shared_gpus_setting_stops_the_agent_naming_the_flag_and_field(
    backend: str, setting: str, message: str
) -> None:
    argv = ["--node-name", "n", "--backend", backend, "--profile", "/p"]
    with pytest.raises(ValueError, match=r"^--shared-gpus") as raised:
        parse(argv, {"DRA_GPU_SHARED_GPUS": setting})
    assert str(raised.value) == message
