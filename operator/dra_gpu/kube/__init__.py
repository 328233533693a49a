"""The Kubernetes API client: one HTTP/1.1 transport, credentials, kubeconfig, verbs and watches.

Components import the package and qualify (``kube.Kube``, ``kube.ApiError``); the modules
beneath are its parts, from the top: ``events`` (Event posting), ``client`` (``Kube``: the
verbs, reaching the server), ``watch`` (list, then watch) and ``kubeconfig`` (where to connect
and as whom), ``tokens`` (the ``Authorization`` header's three sources) and ``tls`` (the TLS
context), ``retries`` (which failed requests are sent again, as client-go decides, pure) and
``throttling`` (the client-side rate limit), ``errors`` (how it fails, in words), ``auth``
(kubeconfig fields read into credentials, pure), ``transport`` (h11 connections, through an
HTTP proxy if need be), ``proxies`` (which proxy, as Go's ``ProxyFromEnvironment`` decides,
pure) and ``backoff`` (exponential back-off with jitter, which every retry loop of the package
waits with, components' loops too: ``from dra_gpu.kube import backoff``).
"""

from dra_gpu.kube.auth import IN_CLUSTER
from dra_gpu.kube.client import NO_ANSWER, Kube, RequestObserver
from dra_gpu.kube.errors import (
    CONNECTION_ERRORS,
    ApiError,
    Body,
    ConfigError,
    Refused,
    Unreachable,
)

__all__ = [
    "CONNECTION_ERRORS",
    "IN_CLUSTER",
    "NO_ANSWER",
    "ApiError",
    "Body",
    "ConfigError",
    "Kube",
    "Refused",
    "RequestObserver",
    "Unreachable",
]
