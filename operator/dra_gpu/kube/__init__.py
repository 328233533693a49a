"""The Kubernetes API client: one HTTP/1.1 transport, credentials, kubeconfig, verbs and watches.

Components import the package and qualify (``kube.Kube``, ``kube.ApiError``); the modules
beneath are its parts: ``transport`` (h11 connections), ``auth`` (credentials and tokens),
``client`` (the verbs), ``events`` (Event posting).
"""

from dra_gpu.kube.client import (
    CONNECTION_ERRORS,
    IN_CLUSTER,
    ApiError,
    Body,
    ConfigError,
    Kube,
    Refused,
    Unreachable,
)

__all__ = [
    "CONNECTION_ERRORS",
    "IN_CLUSTER",
    "ApiError",
    "Body",
    "ConfigError",
    "Kube",
    "Refused",
    "Unreachable",
]
