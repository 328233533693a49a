"""Where the client connects and as whom: a kubeconfig, else the in-cluster service account.

Owns: ``load_config`` (which kubeconfig: the one given, ``$KUBECONFIG``, the pod's service
account, ``~/.kube/config``; which context: ``--context``, else ``current-context``; reading and
checking the files it names, choosing the token source of ``tokens``, building the TLS context of
``tls``) and ``Loaded``, what it gives ``Kube.connect`` (with the context's namespace).
Every failure is a ``ConfigError`` that names the file, where its name came from and the fix.
A user whose token comes from a program or a provider (``exec``, ``auth-provider``) is the one
case left to kubernetes-asyncio's loader, imported only then (``dra-gpu explain`` on EKS or
GKE; never in the node agent, which uses its service account).

Must not: parse a kubeconfig's fields (``auth`` does, as pure logic) or send anything.
"""

from __future__ import annotations

import base64
import dataclasses
import os
import ssl
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from dra_gpu.kube import auth, errors, tls, tokens


@dataclasses.dataclass(frozen=True)
class Loaded:
    """The credentials, the source of their ``Authorization`` header and their TLS context."""

    credentials: auth.Credentials
    authorization: tokens.Authorization
    ssl_context: ssl.SSLContext | None
    namespace: str | None = None
    """The context's ``namespace`` (kubectl's default for ``-n``); None when it names none."""


async def load_config(
    kubeconfig: Path | str | None, *, source: str, flag: str, context: str | None = None
) -> Loaded:
    """The credentials, their ``Authorization`` and TLS context, of ``context`` (kubectl's
    ``--context``) or else the ``current-context``. Every failure is a ``ConfigError`` in
    words."""
    found = _kubeconfig_files(kubeconfig, source=source, flag=flag)
    if found is None and context:
        raise errors.ConfigError(
            f"--context {context} needs a kubeconfig, and there is none here (in a pod, the "
            f"service account is used): pass one with {flag} or KUBECONFIG"
        )
    if found is None:
        try:
            return _loaded(auth.in_cluster(os.environ))
        except auth.Invalid as exc:
            raise errors.ConfigError(
                f"in a pod (KUBERNETES_SERVICE_HOST is set) but its {auth.IN_CLUSTER} is not "
                f"usable: {exc}: mount the service account token (automountServiceAccountToken), "
                f"or pass a kubeconfig with {flag}"
            ) from None
    paths, source, files = found
    try:
        documents = [(path, _check_kubeconfig_file(path, source)) for path in files]
        if context:
            documents = _choose_context(documents, context, f"kubeconfig {paths} (from {source})")
        loaded = auth.from_kubeconfig(documents, paths=paths)
        namespace = _namespace_of(documents, loaded.context)
        if loaded.delegated:
            return dataclasses.replace(await _delegated(loaded, files), namespace=namespace)
        return dataclasses.replace(_loaded(loaded), namespace=namespace)
    except auth.NoCurrentContext:
        raise errors.ConfigError(
            f"kubeconfig {paths} (from {source}) has no current-context: choose one with "
            f"`kubectl config use-context NAME --kubeconfig {files[0]}`"
        ) from None
    except auth.Invalid as exc:
        raise errors.ConfigError(
            f"kubeconfig {paths} (from {source}) is not usable: {exc}"
        ) from None


def _choose_context(
    documents: list[tuple[Path, dict[str, Any]]], context: str, what: str
) -> list[tuple[Path, dict[str, Any]]]:
    """The documents with ``context`` as their current-context, as kubectl's ``--context``
    reads them; ``ConfigError`` naming it when no file defines it."""
    defined = sorted(
        {
            str(entry.get("name"))
            for _, data in documents
            for entry in data.get("contexts") or ()
            if isinstance(entry, dict) and entry.get("name")
        }
    )
    if context not in defined:
        known = ", ".join(defined) or "none"
        raise errors.ConfigError(
            f"context {context} (from --context) is not in {what}: its contexts are {known} "
            "(`kubectl config get-contexts`)"
        )
    (first, data), *rest = documents
    return [(first, {**data, "current-context": context}), *rest]


def _namespace_of(documents: list[tuple[Path, dict[str, Any]]], context: str) -> str | None:
    """``contexts[name=context].context.namespace`` of the first file that defines the context
    (kubectl's merge rule); None when it names no namespace."""
    for _, data in documents:
        for entry in data.get("contexts") or ():
            if isinstance(entry, dict) and entry.get("name") == context:
                body = entry.get("context")
                namespace = body.get("namespace") if isinstance(body, dict) else None
                return namespace if isinstance(namespace, str) and namespace else None
    return None


def _loaded(found: auth.Credentials) -> Loaded:
    """Check the files ``found`` names, read its token file, build its TLS context."""
    for material in (found.certificate_authority, found.client_certificate, found.client_key):
        if material is not None and material.path is not None and not material.path.is_file():
            raise auth.Invalid(f"{material.what}: {material.path} does not exist")
    authorization: tokens.Authorization
    if found.token_file is not None:
        if found.token_file.path is None or not found.token_file.path.is_file():
            raise auth.Invalid(f"{found.token_file.what}: {found.token_file.path} does not exist")
        authorization = tokens.TokenFile(found.token_file)
    elif found.token is not None:
        authorization = tokens.Static(f"Bearer {found.token}")
    elif found.basic_auth is not None:
        pair = ":".join(found.basic_auth).encode()
        authorization = tokens.Static(f"Basic {base64.b64encode(pair).decode()}")
    else:
        authorization = tokens.Static(None)
    return Loaded(found, authorization, tls.context(found))


async def _delegated(found: auth.Credentials, files: Sequence[Path]) -> Loaded:
    """An ``exec`` or ``auth-provider`` user, loaded by kubernetes-asyncio (its aiohttp and
    generated classes come with it: never in the node agent, which uses its service account);
    its configuration becomes our credentials, its token renewed as the loader renews it."""
    from kubernetes_asyncio import client, config

    configuration = client.Configuration()
    try:
        loader = await config.load_kube_config(
            config_file=os.pathsep.join(map(str, files)),
            context=found.context,
            client_configuration=configuration,
        )
    except Exception as exc:  # local parsing and the plugin: "this user is not usable"
        raise auth.Invalid(f"{found.delegated}: {errors.words(exc)}") from None

    def material(value: Any, what: str) -> auth.Material | None:
        return auth.Material(what, path=Path(value)) if value else None

    of = f"the {found.delegated} user of context {found.context}"
    converted = dataclasses.replace(
        found,
        server=str(configuration.host).rstrip("/"),
        certificate_authority=material(configuration.ssl_ca_cert, f"the CA of {of}"),
        client_certificate=material(configuration.cert_file, f"the certificate of {of}"),
        client_key=material(configuration.key_file, f"the key of {of}"),
        insecure_skip_tls_verify=not configuration.verify_ssl,
        tls_server_name=configuration.tls_server_name or None,
        token=None,
        token_file=None,
        basic_auth=None,
    )
    return Loaded(converted, tokens.Delegated(loader, configuration), tls.context(converted))


def _kubeconfig_files(
    kubeconfig: Path | str | None, *, source: str, flag: str
) -> tuple[str, str, list[Path]] | None:
    """``(paths as given, where from, existing files)``, or None for the in-cluster account."""
    if kubeconfig:
        paths = str(kubeconfig)
    elif os.environ.get("KUBECONFIG"):
        paths, source = os.environ["KUBECONFIG"], "KUBECONFIG"
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        return None
    elif (default := Path("~/.kube/config").expanduser()).is_file():
        paths, source = str(default), "the default location"
    else:
        raise errors.ConfigError(
            f"no kubeconfig: pass one with {flag} or KUBECONFIG (in a pod, the service account "
            "is used, but KUBERNETES_SERVICE_HOST is not set here, and ~/.kube/config does "
            "not exist)"
        )
    files = [Path(p).expanduser() for p in paths.split(os.pathsep) if p]
    existing = [f for f in files if f.exists()]
    if not existing:
        raise errors.ConfigError(
            f"kubeconfig {paths} (from {source}) does not exist: point {source} at your "
            "cluster's kubeconfig file"
        )
    for path in existing:
        _check_kubeconfig_file(path, source)
    return paths, source, existing


def _check_kubeconfig_file(path: Path, source: str) -> dict[str, Any]:
    """The file's YAML mapping; ``ConfigError`` if it is unreadable, not YAML, or empty."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise errors.ConfigError(
            f"kubeconfig {path} (from {source}) cannot be read: {exc.strerror or exc}"
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or errors.words(exc)
        raise errors.ConfigError(
            f"kubeconfig {path} (from {source}) is not valid YAML{where}: {problem}"
        ) from None
    if not isinstance(data, dict):
        raise errors.ConfigError(
            f"kubeconfig {path} (from {source}) is not a kubeconfig: expected a YAML mapping "
            "with clusters, users, contexts and current-context"
        )
    return data
