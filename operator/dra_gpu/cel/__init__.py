"""DRA's CEL environment, as kube-scheduler evaluates device selectors.

The public face: ``environment`` compiles and evaluates; ``_port`` beneath it is a port of
cel-go and Kubernetes' CEL libraries, private to this package.
"""

from dra_gpu.cel.environment import (
    Compiled,
    DeviceValues,
    Evaluation,
    compile_selector,
    device_view,
    evaluate,
    evaluate_all,
    evaluate_device,
)

__all__ = [
    "Compiled",
    "DeviceValues",
    "Evaluation",
    "compile_selector",
    "device_view",
    "evaluate",
    "evaluate_all",
    "evaluate_device",
]
