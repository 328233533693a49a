"""Bad input, fuzzed (hypothesis): whatever users or nodes hand us, the pure parsers answer with
a result or their own error type naming the object and the field — never another exception."""

from __future__ import annotations

import json
import os
import string

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dra_gpu import cel
from dra_gpu.agent import checkpoint
from dra_gpu.devices import model, opaque, simulated

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)
EXAMPLES = 3000 if os.environ.get("DRA_GPU_LOAD") == "full" else 300  # make reliability: full
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(JSON)
def test_opaque_parameters_are_decoded_or_refused_with_the_field(params: object) -> None:
    entry = {
        "source": "FromClaim",
        "requests": [],
        "opaque": {"driver": "gpu.example.com", "parameters": params},
    }
    try:
        configs = opaque.effective_configs([entry], "gpu.example.com", ["gpu"])
    except opaque.InvalidConfig as exc:
        message = str(exc)
    else:
        assert set(configs) == {"gpu"}
        return
    assert message.startswith("ResourceClaim config[0].opaque.parameters")


@FUZZ
@given(st.dictionaries(st.sampled_from(["apiVersion", "kind", "sharing", "env"]), JSON, max_size=4))
def test_gpu_config_shaped_input_never_escapes_as_another_error(params: dict[str, object]) -> None:
    params = {"apiVersion": opaque.API_VERSION, "kind": opaque.KIND, **params}
    try:
        opaque.decode(params, "x")
    except opaque.InvalidConfig as exc:
        message = str(exc)
    else:
        return
    assert message.startswith("x.")


@FUZZ
@given(st.text(alphabet=string.printable, max_size=80))
def test_any_selector_text_compiles_or_reports_an_error(expression: str) -> None:
    compiled = cel.compile_selector(expression)
    device = {
        "name": "gpu-0",
        "attributes": {"index": {"int": 0}},
        "capacity": {"memory": {"value": "24Gi"}},
    }
    result = cel.evaluate(compiled, "gpu.example.com", device)
    assert isinstance(result.matched, bool)
    assert (result.error is None) or isinstance(result.error, str)
    if compiled.error:
        assert not result.matched


@FUZZ
@given(JSON)
def test_any_profile_yaml_loads_or_is_refused_with_a_profile_error(data: object) -> None:
    text = json.dumps(data)  # JSON is YAML
    try:
        profile = simulated.parse_profile(text, source="fuzz.yaml")
    except model.ProfileError as exc:
        message = str(exc)
    else:
        for node in profile.nodes:
            assert profile.inventory(node).node == node
        return
    assert message.startswith("profile fuzz.yaml")


@FUZZ
@given(st.binary(max_size=300) | JSON.map(lambda v: json.dumps(v).encode()))
def test_any_checkpoint_bytes_load_or_are_corrupt_with_a_reason(data: bytes) -> None:
    try:
        loaded = checkpoint.load(data)
    except checkpoint.CorruptCheckpoint as exc:
        reason = exc.reason
    else:
        assert checkpoint.load(checkpoint.dump(loaded)) == loaded
        return
    assert reason


def test_a_checkpoint_with_any_byte_flipped_is_never_trusted_with_other_content() -> None:
    device = checkpoint.RecordedDevice(("gpu",), "node-01", "gpu-0", ("k8s.x/gpu=u1-gpu-0",))
    record = checkpoint.Checkpoint({"u1": checkpoint.PreparedClaim("u1", "ns", "c", (device,))})
    data = checkpoint.dump(record)
    for index in range(len(data)):
        flipped = bytearray(data)
        flipped[index] ^= 0x01
        try:
            loaded = checkpoint.load(bytes(flipped))
        except checkpoint.CorruptCheckpoint:
            continue
        assert loaded == record, f"byte {index} flipped yet accepted with other content"
