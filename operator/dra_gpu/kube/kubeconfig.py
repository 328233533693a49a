"""Where the client connects, through which proxy and as whom: a kubeconfig, else the
in-cluster service account.

Owns: ``load_config`` (which kubeconfig: the one given, ``$KUBECONFIG``, the pod's service
account, ``~/.kube/config``; which context: the one asked for, else the current one; reading
and checking the files it names, choosing the token source of ``tokens``, building the TLS
context of ``tls``, choosing the proxy as client-go does: the cluster's ``proxy-url``, else
``HTTPS_PROXY``/``NO_PROXY`` by ``proxies``) and ``Loaded``, what it gives ``Kube.connect``,
with the namespace kubectl's ``-n`` defaults to. Every failure is a ``ConfigError`` that names
the file, where its name came from and the fix. A user whose token comes from a program or a
provider (``exec``, ``auth-provider``) is the one case left to kubernetes-asyncio's loader,
imported only then (``dra-gpu explain`` on EKS or GKE; never in the node agent, which uses its
service account).

Must not: parse a kubeconfig's fields (``auth`` does, as pure logic) or send anything.
"""

from __future__ import annotations

import base64
import dataclasses
import os
import ssl
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from dra_gpu.kube import auth, errors, proxies, tls, tokens

NAMESPACE_FILE = "namespace"
"""Beside the service account's token: the pod's namespace."""


@dataclasses.dataclass(frozen=True)
class Loaded:
    """The credentials, the source of their ``Authorization`` header, their TLS context, the
    proxy and the default namespace."""

    credentials: auth.Credentials
    authorization: tokens.Authorization
    ssl_context: ssl.SSLContext | None
    proxy: proxies.Choice | None = None
    """None: straight to the server."""
    namespace: str = "default"
    """The context's namespace; in a pod, its own (``POD_NAMESPACE``, else the service
    account's ``namespace`` file), as client-go says; else ``default``."""


async def load_config(
    kubeconfig: Path | str | None,
    *,
    source: str,
    flag: str,
    context: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> Loaded:
    """The credentials of ``context`` (default: the current one), their ``Authorization``,
    TLS context and proxy (from ``environ``, default ``os.environ``, when the cluster has no
    ``proxy-url``). Every failure is a ``ConfigError`` in words."""
    environ = os.environ if environ is None else environ
    found = _kubeconfig_files(kubeconfig, source=source, flag=flag)
    if found is None:
        if context is not None:
            raise errors.ConfigError(
                f"context {context} was asked for, but there is no kubeconfig: in a pod (as "
                f"here: KUBERNETES_SERVICE_HOST is set) the {auth.IN_CLUSTER} is used, which has "
                f"no contexts; pass a kubeconfig with {flag}, or leave the context out"
            )
        try:
            credentials = auth.in_cluster(environ)
            return _loaded(credentials, environ, _pod_namespace(environ))
        except (auth.Invalid, proxies.Unsupported, proxies.CgiRefused) as exc:
            raise errors.ConfigError(
                f"in a pod (KUBERNETES_SERVICE_HOST is set) but its {auth.IN_CLUSTER} is not "
                f"usable: {exc}: mount the service account token (automountServiceAccountToken), "
                f"or pass a kubeconfig with {flag}"
            ) from None
    paths, source, files = found
    try:
        documents = [(path, _check_kubeconfig_file(path, source)) for path in files]
        loaded = auth.from_kubeconfig(documents, paths=paths, context=context)
        if loaded.delegated:
            return await _delegated(loaded, files, environ)
        return _loaded(loaded, environ)
    except auth.NoCurrentContext:
        raise errors.ConfigError(
            f"kubeconfig {paths} (from {source}) has no current-context: choose one with "
            f"`kubectl config use-context NAME --kubeconfig {files[0]}`"
        ) from None
    except auth.NoSuchContext as exc:
        known = ", ".join(exc.known) or "none"
        raise errors.ConfigError(
            f"kubeconfig {paths} (from {source}) has no context {exc.name}: its contexts are "
            f"{known} (`kubectl config get-contexts --kubeconfig {paths}`)"
        ) from None
    except (auth.Invalid, proxies.Unsupported, proxies.CgiRefused) as exc:
        raise errors.ConfigError(
            f"kubeconfig {paths} (from {source}) is not usable: {exc}"
        ) from None


def _proxy(found: auth.Credentials, environ: Mapping[str, str]) -> proxies.Choice | None:
    """The cluster's ``proxy-url`` for every request (client-go's ``http.ProxyURL``), else
    the environment's proxy for this server, as Go's ``ProxyFromEnvironment`` says."""
    if found.proxy_url:
        return proxies.Choice(proxies.check(found.proxy_url, found.proxy_field), found.proxy_field)
    choice = proxies.Environment.read(environ).proxy_for(found.server)
    if choice is not None:
        proxies.check(choice.url, choice.source)
    return choice


def _pod_namespace(environ: Mapping[str, str]) -> str:
    """client-go's in-cluster namespace: ``POD_NAMESPACE``, else the service account's
    ``namespace`` file, else ``default``."""
    if namespace := environ.get("POD_NAMESPACE", ""):
        return namespace
    try:
        return (auth.SERVICE_ACCOUNT_DIR / NAMESPACE_FILE).read_text().strip() or "default"
    except OSError:
        return "default"


def _loaded(
    found: auth.Credentials, environ: Mapping[str, str], namespace: str | None = None
) -> Loaded:
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
    return Loaded(
        found,
        authorization,
        tls.context(found),
        _proxy(found, environ),
        namespace or found.namespace or "default",
    )


async def _delegated(
    found: auth.Credentials, files: Sequence[Path], environ: Mapping[str, str]
) -> Loaded:
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
    return Loaded(
        converted,
        tokens.Delegated(loader, configuration, exec_plugin=found.delegated == "exec"),
        tls.context(converted),
        _proxy(converted, environ),
        found.namespace or "default",
    )


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
