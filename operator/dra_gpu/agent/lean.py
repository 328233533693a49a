"""kubernetes-asyncio for the agent without its generated API classes: imported for its effect.

``dra_gpu.kube`` speaks plain JSON over kubernetes-asyncio's transport (``ApiClient.call_api``
with ``_preload_content=False``) and its kubeconfig and service-account loaders. It never uses
the ~700 generated model classes and ~60 API classes, but ``import kubernetes_asyncio`` loads all
of them (its package ``__init__`` files import everything): about 34 MiB of the agent's resident
memory, on every node. Importing this module first puts stand-ins for the three package modules
(``kubernetes_asyncio``, ``.client``, ``.client.models``) into ``sys.modules``, so that importing
what ``kube`` uses loads only that: the configuration, the REST client and ``ApiClient``, the
``config`` package. Anything else asked of a stand-in, an attribute that is no submodule (say
``kubernetes_asyncio.client.V1Pod``), loads the real packages at that moment, whole: code that
needs them still works, only without the saving.

It must be imported before anything imports kubernetes_asyncio (``agent.runner`` imports it
first; ``dra-gpu agent`` imports nothing of the client before the runner); afterwards it does
nothing. It changes no module once loaded, and nothing outside the agent's process.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import Any

STAND_INS = ("kubernetes_asyncio", "kubernetes_asyncio.client", "kubernetes_asyncio.client.models")


class _StandIn(types.ModuleType):
    """A package module whose ``__init__`` did not run: submodules import as usual; any other
    attribute loads the real packages."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        submodule = f"{self.__name__}.{name}"
        if importlib.util.find_spec(submodule) is not None:
            return importlib.import_module(submodule)
        return getattr(load_whole(self.__name__), name)


def load_whole(name: str) -> types.ModuleType:
    """The real module ``name``, its package ``__init__`` run (and the stand-ins gone)."""
    for stand_in in STAND_INS:
        if isinstance(sys.modules.get(stand_in), _StandIn):
            del sys.modules[stand_in]
    return importlib.import_module(name)


def install() -> bool:
    """Put the stand-ins in place; False if kubernetes_asyncio was imported already."""
    if any(name in sys.modules for name in STAND_INS):
        return False
    for name in STAND_INS:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.submodule_search_locations is None:
            return False  # not installed as we know it: leave the import to fail as usual
        module = _StandIn(name)
        module.__spec__ = spec
        module.__path__ = list(spec.submodule_search_locations)
        module.__file__ = spec.origin
        module.__package__ = name
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, module)
    # What kubernetes-asyncio's own modules import from the client package by name.
    from kubernetes_asyncio.client.api_client import ApiClient
    from kubernetes_asyncio.client.configuration import Configuration

    client = sys.modules["kubernetes_asyncio.client"]
    client.ApiClient = ApiClient  # type: ignore[attr-defined]
    client.Configuration = Configuration  # type: ignore[attr-defined]
    return True


install()
