"""DRA's CEL environment, as kube-scheduler evaluates device selectors.

The public face: ``environment`` compiles and evaluates, ``comparing`` reads what a selector
compares from its syntax tree; ``_port`` beneath them is a port of cel-go and Kubernetes' CEL
libraries, private to this package.
"""

from dra_gpu.cel.comparing import Comparison, comparison, comparisons
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
    "Comparison",
    "Compiled",
    "DeviceValues",
    "Evaluation",
    "comparison",
    "comparisons",
    "compile_selector",
    "device_view",
    "evaluate",
    "evaluate_all",
    "evaluate_device",
]
