"""Kubeconfig files and the in-cluster service account, read into ``Credentials``: pure logic.

Parsed YAML in (each file's mapping, with its path), ``Credentials`` out: where the API server
is, how to trust it, who we are, the context's namespace and the cluster's ``proxy-url``, for
the current context or the one asked for (``--context``). Nothing here opens a file, a socket or
a process: ``kubeconfig`` reads the files, checks that the files named in them exist and turns
``Invalid`` into a ``kube.ConfigError`` that also says where the kubeconfig's name came from;
``tls`` builds the TLS context, ``tokens`` re-reads a token file as the kubelet rotates it.

Several files (``KUBECONFIG=a:b``) merge as kubectl merges them: the first file that names a
cluster, user or context, or sets ``current-context``, wins. A relative path is relative to the
file that holds it. Every ``Invalid`` names the field and the file (``users[name=me].user.token
in /home/me/.kube/config``).

A user whose token comes from a program or a provider (``exec``, ``auth-provider``: EKS, GKE,
OIDC) comes out ``delegated``: ``kubeconfig`` leaves that user to kubernetes-asyncio's loader,
imported only then. The node agent, with its service account, never is.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

IN_CLUSTER = "in-cluster service account"
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
"""Where Kubernetes mounts a pod's service account: ``token`` and ``ca.crt``."""


class Invalid(ValueError):
    """The kubeconfig (or the pod's environment) cannot give credentials; the message names the
    field and the file."""


class NoCurrentContext(Invalid):
    """No file sets ``current-context``."""


class NoSuchContext(Invalid):
    """The context asked for (``--context``) is in no file."""

    def __init__(self, name: str, known: Sequence[str]) -> None:
        self.name, self.known = name, list(known)
        super().__init__(f"no context {name}")


@dataclasses.dataclass(frozen=True)
class Material:
    """A CA bundle, client certificate, key or token file: given inline (``data``, decoded from
    base64) or as a file (``path``, absolute)."""

    what: str
    """The field it came from, for messages: ``users[name=me].user.client-key in FILE``."""
    data: bytes | None = None
    path: Path | None = None


@dataclasses.dataclass(frozen=True)
class Credentials:
    """How to reach one API server and who to be there."""

    server: str
    """``https://host:port``, perhaps with a path prefix; no trailing slash."""
    origin: str
    """Where all this came from, for messages: ``kubeconfig FILE, context NAME``."""
    certificate_authority: Material | None = None
    """The CAs that sign the server's certificate; None: the system's."""
    client_certificate: Material | None = None
    client_key: Material | None = None
    insecure_skip_tls_verify: bool = False
    tls_server_name: str | None = None
    """The name the server's certificate must have, when it is not the server URL's host."""
    token: str | None = None
    token_file: Material | None = None
    """A bearer token read from this file, again as it changes (the kubelet rotates it)."""
    basic_auth: tuple[str, str] | None = None
    delegated: str | None = None
    """``exec`` or ``auth-provider NAME``: the token comes from kubernetes-asyncio's loader."""
    context: str = ""
    namespace: str | None = None
    """The context's namespace (kubectl's ``-n`` by default); None: not set."""
    proxy_url: str | None = None
    """The cluster's ``proxy-url``, checked by ``proxies.check``."""
    proxy_field: str = ""
    """Where ``proxy_url`` came from, for messages: ``clusters[name=c].cluster.proxy-url in
    FILE``."""


@dataclasses.dataclass(frozen=True)
class _Entry:
    """A named cluster, user or context, and the file that defines it (the first one)."""

    name: str
    body: Mapping[str, Any]
    file: Path
    field: str
    """``users[name=me].user``"""


def from_kubeconfig(
    files: Sequence[tuple[Path, Any]], *, paths: str = "", context: str | None = None
) -> Credentials:
    """The credentials of ``context`` (by default, the current context) of ``files`` (each:
    its path, its parsed YAML), merged as kubectl merges them. ``paths`` names the files in
    ``origin`` (``KUBECONFIG`` as given); by default, the files joined by ``:``."""
    paths = paths or ":".join(str(path) for path, _ in files)
    sections: dict[str, dict[str, _Entry]] = {"clusters": {}, "users": {}, "contexts": {}}
    current: tuple[str, Path] | None = None
    for path, data in files:
        if not isinstance(data, Mapping):
            raise Invalid(f"{path} is not a kubeconfig: expected a mapping")
        for section, entries in sections.items():
            for entry in _entries(data, section, path):
                entries.setdefault(entry.name, entry)
        name = data.get("current-context")
        if current is None and name:
            if not isinstance(name, str):
                raise Invalid(f"current-context in {path} is {name!r}: expected a name")
            current = (name, path)
    if context is not None:
        if context not in sections["contexts"]:
            raise NoSuchContext(context, sorted(sections["contexts"]))
        name = context
        chosen = sections["contexts"][name]
    elif current is None:
        raise NoCurrentContext("no current-context")
    else:
        name, where = current
        chosen = _named(sections, "contexts", name, f"current-context in {where}")
    body, field, file = chosen.body, chosen.field, chosen.file
    cluster_name = body.get("cluster")
    if not cluster_name or not isinstance(cluster_name, str):
        raise Invalid(f"{field}.cluster in {file} is missing: name a cluster")
    cluster = _named(sections, "clusters", cluster_name, f"{field}.cluster in {file}")
    user_name = body.get("user")
    user: _Entry | None = None
    if user_name:
        if not isinstance(user_name, str):
            raise Invalid(f"{field}.user in {file} is {user_name!r}: a name")
        user = _named(sections, "users", user_name, f"{field}.user in {file}")
    namespace = body.get("namespace")
    if namespace is not None and (not isinstance(namespace, str)):
        raise Invalid(f"{field}.namespace in {file} is {namespace!r}: expected a namespace")
    return Credentials(
        origin=f"kubeconfig {paths}, context {name}",
        context=name,
        namespace=namespace or None,
        **_cluster(cluster),
        **(_user(user) if user is not None else {}),
    )


def in_cluster(environ: Mapping[str, str], directory: Path | None = None) -> Credentials:
    """A pod's own service account: the API server from ``KUBERNETES_SERVICE_HOST`` and
    ``_PORT``, the token and CA from ``directory`` (``SERVICE_ACCOUNT_DIR``; ``kube`` checks
    the files)."""
    directory = directory or SERVICE_ACCOUNT_DIR
    host = environ.get("KUBERNETES_SERVICE_HOST", "")
    port = environ.get("KUBERNETES_SERVICE_PORT", "")
    for variable, value in (("KUBERNETES_SERVICE_HOST", host), ("KUBERNETES_SERVICE_PORT", port)):
        if not value:
            raise Invalid(f"{variable} is {'empty' if variable in environ else 'not set'}")
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    return Credentials(
        server=f"https://{host}:{port}",
        origin=IN_CLUSTER,
        certificate_authority=Material(
            "the service account's CA certificate", path=directory / "ca.crt"
        ),
        token_file=Material("the service account's token", path=directory / "token"),
    )


# ---- the parts of a kubeconfig -------------------------------------------------------------


def _entries(data: Mapping[str, Any], section: str, file: Path) -> list[_Entry]:
    items = data.get(section) or []
    if not isinstance(items, list):
        raise Invalid(f"{section} in {file} is not a list")
    key = section[:-1]  # clusters[].cluster, users[].user, contexts[].context
    seen: dict[str, _Entry] = {}
    for i, item in enumerate(items):
        name = item.get("name") if isinstance(item, Mapping) else None
        if not name or not isinstance(name, str):
            raise Invalid(f"{section}[{i}] in {file} has no name")
        if name in seen:
            raise Invalid(f"{section} in {file} has two entries named {name}")
        body = item.get(key)
        field = f"{section}[name={name}].{key}"
        if body is None and key == "user":
            body = {}  # a user without credentials: anonymous
        if not isinstance(body, Mapping):
            raise Invalid(f"{field} in {file} is missing: expected a mapping")
        seen[name] = _Entry(name, body, file, field)
    return list(seen.values())


def _named(
    sections: Mapping[str, Mapping[str, _Entry]], section: str, name: str, named_by: str
) -> _Entry:
    """The entry ``name`` of ``section``, which ``named_by`` (a field and its file) names."""
    if name not in sections[section]:
        raise Invalid(f"Expected object with name {name} in {section}: {named_by} names it")
    return sections[section][name]


def _cluster(cluster: _Entry) -> dict[str, Any]:
    body, field, file = cluster.body, cluster.field, cluster.file
    server = body.get("server")
    if not server:
        raise Invalid(f"{field}.server in {file} is missing: the API server's URL")
    if not isinstance(server, str) or not server.startswith(("https://", "http://")):
        raise Invalid(f"{field}.server in {file} is {server!r}: expected an https:// URL")
    proxy = body.get("proxy-url")
    if proxy is not None and not isinstance(proxy, str):
        raise Invalid(f"{field}.proxy-url in {file} is {proxy!r}: expected a URL")
    name = body.get("tls-server-name")
    if name is not None and not isinstance(name, str):
        raise Invalid(f"{field}.tls-server-name in {file} is {name!r}: expected a host name")
    return {
        "server": server.rstrip("/"),
        "certificate_authority": _material(cluster, "certificate-authority"),
        "insecure_skip_tls_verify": _flag(cluster, "insecure-skip-tls-verify"),
        "tls_server_name": name or None,
        "proxy_url": proxy or None,
        "proxy_field": f"{field}.proxy-url in {file}" if proxy else "",
    }


def _user(user: _Entry) -> dict[str, Any]:
    body, field, file = user.body, user.field, user.file
    found: dict[str, Any] = {
        "client_certificate": _material(user, "client-certificate"),
        "client_key": _material(user, "client-key"),
    }
    if (found["client_certificate"] is None) != (found["client_key"] is None):
        has, lacks = (
            ("client-certificate", "client-key")
            if found["client_certificate"]
            else ("client-key", "client-certificate")
        )
        raise Invalid(f"{field} in {file} has a {has} but no {lacks}: give both, or neither")
    if "exec" in body:
        found["delegated"] = "exec"
    elif "auth-provider" in body:
        provider = body["auth-provider"]
        name = provider.get("name", "") if isinstance(provider, Mapping) else ""
        found["delegated"] = f"auth-provider {name}".strip()
    token = body.get("token")
    if token:
        if not isinstance(token, str):
            raise Invalid(f"{field}.token in {file} is not a string")
        found["token"] = token.strip()
    elif body.get("tokenFile"):
        found["token_file"] = Material(
            f"{field}.tokenFile in {file}", path=_path(user, "tokenFile")
        )
    username, password = body.get("username"), body.get("password")
    if username is not None or password is not None:
        if not isinstance(username, str) or not isinstance(password, str):
            lacks = "password" if isinstance(username, str) else "username"
            raise Invalid(f"{field} in {file} has no {lacks}: basic auth needs both")
        found["basic_auth"] = (username, password)
    return found


def _material(entry: _Entry, key: str) -> Material | None:
    """``key-data`` (base64, preferred, as kubectl does) or ``key`` (a file)."""
    data = entry.body.get(f"{key}-data")
    if data:
        what = f"{entry.field}.{key}-data in {entry.file}"
        if not isinstance(data, str):
            raise Invalid(f"{what} is not a base64 string")
        try:
            decoded = base64.b64decode("".join(data.split()), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise Invalid(f"{what} is not valid base64: {exc}") from None
        return Material(what, data=decoded)
    if entry.body.get(key):
        return Material(f"{entry.field}.{key} in {entry.file}", path=_path(entry, key))
    return None


def _path(entry: _Entry, key: str) -> Path:
    value = entry.body[key]
    if not isinstance(value, str):
        raise Invalid(f"{entry.field}.{key} in {entry.file} is {value!r}: expected a path")
    return entry.file.parent / value  # an absolute value stays as it is


def _flag(entry: _Entry, key: str) -> bool:
    value = entry.body.get(key, False)
    if isinstance(value, bool | int):
        return bool(value)
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise Invalid(f"{entry.field}.{key} in {entry.file} is {value!r}: expected true or false")
