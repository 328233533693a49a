"""What tests of every folder share: fakes, builders and the rules of the test lanes.

``lanes``: the markers that say what a test needs (``binaries``, ``cluster``) and the refusal
of a built tool to a test that does not carry them. ``binaries``: where each built tool comes
from (helm, promtool, the Go oracles). ``fake_pynvml``: the stand-in for pynvml that the NVML
backend, the agent and ``hack/gpu-check`` tests run against. ``ports``: a free local port.

Must not: import from ``tests.unit``, ``tests.e2e`` or ``tests.chart`` (those import this).
"""
