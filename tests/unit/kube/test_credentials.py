"""Kubeconfigs and the in-cluster service account read into credentials (``credentials``):
dicts in, credentials out, no file opened. Several files merge as kubectl merges them; every
mistake is named by its field and its file."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from dra_gpu.kube import auth
from dra_gpu.kube.auth import Invalid, Material, NoCurrentContext

A = Path("/home/me/.kube/config")
B = Path("/etc/team/kubeconfig")


def kubeconfig(
    *,
    server: str = "https://10.0.0.1:6443",
    cluster: dict[str, Any] | None = None,
    user: dict[str, Any] | None = None,
    current: str | None = "ctx",
) -> dict[str, Any]:
    """One cluster ``c``, one user ``u`` (a token unless ``user`` says otherwise), one
    context ``ctx`` joining them."""
    config: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server, **(cluster or {})}}],
        "users": [{"name": "u", "user": user if user is not None else {"token": "t0k3n"}}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
    }
    if current is not None:
        config["current-context"] = current
    return config


def problem(*files: tuple[Path, Any]) -> str:
    with pytest.raises(Invalid) as raised:
        auth.from_kubeconfig(list(files))
    return str(raised.value)


def test_a_token_user_and_a_ca_file_relative_to_the_kubeconfig() -> None:
    found = auth.from_kubeconfig([(A, kubeconfig(cluster={"certificate-authority": "pki/ca.crt"}))])
    assert found.server == "https://10.0.0.1:6443"
    assert found.origin == f"kubeconfig {A}, context ctx"
    assert found.token == "t0k3n"
    assert found.certificate_authority == Material(
        f"clusters[name=c].cluster.certificate-authority in {A}", path=A.parent / "pki/ca.crt"
    )
    assert not found.insecure_skip_tls_verify
    assert found.delegated is None


def test_inline_data_is_decoded_and_preferred_to_a_file() -> None:
    pem = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    data = base64.b64encode(pem).decode()
    found = auth.from_kubeconfig(
        [
            (
                A,
                kubeconfig(
                    cluster={"certificate-authority-data": data, "certificate-authority": "x"},
                    user={"client-certificate-data": data, "client-key": "/keys/me.key"},
                ),
            )
        ]
    )
    assert found.certificate_authority is not None
    assert found.certificate_authority.data == pem
    assert found.client_certificate is not None
    assert found.client_certificate.data == pem
    assert found.client_key == Material(
        f"users[name=u].user.client-key in {A}", path=Path("/keys/me.key")
    )
    assert found.token is None


def test_several_files_merge_first_wins_and_paths_stay_relative_to_their_own_file() -> None:
    first = kubeconfig(server="https://first:6443", current=None)
    first["contexts"] = []
    first["users"] = []
    second = kubeconfig(server="https://second:6443", current="ctx")
    second["users"] = [{"name": "u", "user": {"tokenFile": "token"}}]
    second["current-context"] = "ctx"
    third = kubeconfig(current="other")
    found = auth.from_kubeconfig([(A, first), (B, second), (A, third)], paths="a:b:a")
    assert found.server == "https://first:6443"  # the first file that names cluster c
    assert found.context == "ctx"  # the first file that sets current-context
    assert found.origin == "kubeconfig a:b:a, context ctx"
    assert found.token_file == Material(
        f"users[name=u].user.tokenFile in {B}", path=B.parent / "token"
    )


def test_basic_auth_needs_both_username_and_password() -> None:
    found = auth.from_kubeconfig([(A, kubeconfig(user={"username": "a", "password": "b"}))])
    assert found.basic_auth == ("a", "b")
    assert problem((A, kubeconfig(user={"username": "a"}))) == (
        f"users[name=u].user in {A} has no password: basic auth needs both"
    )


@pytest.mark.parametrize(
    ("user", "delegated"),
    [
        ({"exec": {"command": "aws", "apiVersion": "client.authentication.k8s.io/v1"}}, "exec"),
        ({"auth-provider": {"name": "gcp", "config": {}}}, "auth-provider gcp"),
    ],
    ids=["exec", "auth-provider"],
)
def test_a_user_whose_token_comes_from_a_program_or_provider_is_delegated(
    user: dict[str, Any], delegated: str
) -> None:
    found = auth.from_kubeconfig([(A, kubeconfig(user=user))])
    assert found.delegated == delegated
    assert found.server == "https://10.0.0.1:6443"


def test_tls_settings_of_the_cluster() -> None:
    found = auth.from_kubeconfig(
        [(A, kubeconfig(cluster={"insecure-skip-tls-verify": 1, "tls-server-name": "api.x"}))]
    )
    assert found.insecure_skip_tls_verify
    assert found.tls_server_name == "api.x"
    assert "expected true or false" in problem(
        (A, kubeconfig(cluster={"insecure-skip-tls-verify": "maybe"}))
    )


def test_a_user_without_credentials_is_anonymous() -> None:
    config = kubeconfig()
    config["users"] = [{"name": "u"}]
    found = auth.from_kubeconfig([(A, config)])
    assert (found.token, found.token_file, found.basic_auth, found.client_certificate) == (
        None,
        None,
        None,
        None,
    )


def test_the_clusters_proxy_url_is_kept_with_its_field() -> None:
    found = auth.from_kubeconfig([(A, kubeconfig(cluster={"proxy-url": "http://p:3128"}))])
    assert found.proxy_url == "http://p:3128"
    assert found.proxy_field == f"clusters[name=c].cluster.proxy-url in {A}"
    assert auth.from_kubeconfig([(A, kubeconfig())]).proxy_url is None


def two_contexts() -> dict[str, Any]:
    """``ctx`` (current, no namespace) and ``other`` (its own cluster, namespace ``team-a``)."""
    config = kubeconfig()
    config["clusters"].append({"name": "c2", "cluster": {"server": "https://10.0.0.2:6443"}})
    config["contexts"].append(
        {"name": "other", "context": {"cluster": "c2", "user": "u", "namespace": "team-a"}}
    )
    return config


def test_a_context_asked_for_instead_of_the_current_one_and_its_namespace() -> None:
    found = auth.from_kubeconfig([(A, two_contexts())], context="other")
    assert (found.server, found.context, found.namespace) == (
        "https://10.0.0.2:6443",
        "other",
        "team-a",
    )
    assert found.origin == f"kubeconfig {A}, context other"
    current = auth.from_kubeconfig([(A, two_contexts())])
    assert (current.context, current.namespace) == ("ctx", None)


def test_a_context_asked_for_needs_no_current_context_but_must_exist() -> None:
    config = two_contexts()
    del config["current-context"]
    assert auth.from_kubeconfig([(A, config)], context="other").context == "other"
    with pytest.raises(auth.NoSuchContext) as raised:
        auth.from_kubeconfig([(A, config)], context="gone")
    assert (raised.value.name, raised.value.known) == ("gone", ["ctx", "other"])


def test_a_namespace_that_is_not_a_name() -> None:
    config = kubeconfig()
    config["contexts"][0]["context"]["namespace"] = ["a"]
    assert problem((A, config)) == (
        f"contexts[name=ctx].context.namespace in {A} is ['a']: expected a namespace"
    )


# ---- mistakes, each named by its field and file ---------------------------------------------


def test_no_current_context_in_any_file() -> None:
    with pytest.raises(NoCurrentContext):
        auth.from_kubeconfig([(A, kubeconfig(current=None)), (B, kubeconfig(current=""))])


def test_a_current_context_that_no_file_has() -> None:
    assert problem((A, kubeconfig(current="gone"))) == (
        f"Expected object with name gone in contexts: current-context in {A} names it"
    )


def test_a_context_naming_a_missing_cluster_or_user() -> None:
    config = kubeconfig()
    config["users"] = []
    assert problem((A, config)) == (
        f"Expected object with name u in users: contexts[name=ctx].context.user in {A} names it"
    )
    config = kubeconfig()
    config["clusters"] = [{"name": "other", "cluster": {"server": "https://x"}}]
    assert problem((A, config)) == (
        f"Expected object with name c in clusters: contexts[name=ctx].context.cluster in {A} "
        "names it"
    )


def test_data_that_is_not_base64() -> None:
    assert problem(
        (A, kubeconfig(user={"client-key-data": "not*base64", "client-certificate": "c"}))
    ) == (
        f"users[name=u].user.client-key-data in {A} is not valid base64: Only base64 data is "
        "allowed"
    )


def test_a_certificate_without_its_key() -> None:
    assert problem((A, kubeconfig(user={"client-certificate": "me.crt"}))) == (
        f"users[name=u].user in {A} has a client-certificate but no client-key: give both, "
        "or neither"
    )


@pytest.mark.parametrize(
    ("cluster", "says"),
    [
        ({"server": ""}, "clusters[name=c].cluster.server in {A} is missing"),
        ({"server": "10.0.0.1:6443"}, "is '10.0.0.1:6443': expected an https:// URL"),
        ({"proxy-url": 3128}, "clusters[name=c].cluster.proxy-url in {A} is 3128: expected a URL"),
    ],
    ids=["no-server", "not-a-url", "proxy-not-a-string"],
)
def test_a_cluster_without_a_usable_server(cluster: dict[str, Any], says: str) -> None:
    config = kubeconfig()
    config["clusters"][0]["cluster"].update(cluster)
    assert says.format(A=A) in problem((A, config))


def test_entries_without_a_name_or_twice_the_same_name() -> None:
    config = kubeconfig()
    config["users"].append({"user": {}})
    assert problem((A, config)) == f"users[1] in {A} has no name"
    config = kubeconfig()
    config["contexts"].append(config["contexts"][0])
    assert problem((A, config)) == f"contexts in {A} has two entries named ctx"
    config = kubeconfig()
    config["clusters"] = {"c": {}}
    assert problem((A, config)) == f"clusters in {A} is not a list"


# ---- the in-cluster service account -----------------------------------------------------------


def test_in_cluster_from_the_environment_and_the_mounted_files() -> None:
    found = auth.in_cluster(
        {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}, Path("/sa")
    )
    assert found.server == "https://[fd00::1]:443"
    assert found.origin == auth.IN_CLUSTER
    assert found.token_file == Material("the service account's token", path=Path("/sa/token"))
    assert found.certificate_authority is not None
    assert found.certificate_authority.path == Path("/sa/ca.crt")


def test_in_cluster_without_a_port() -> None:
    with pytest.raises(Invalid, match=r"^KUBERNETES_SERVICE_PORT is not set$"):
        auth.in_cluster({"KUBERNETES_SERVICE_HOST": "10.0.0.1"})
    with pytest.raises(Invalid, match=r"^KUBERNETES_SERVICE_PORT is empty$"):
        auth.in_cluster({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": ""})
