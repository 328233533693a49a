"""Fixtures of the transport tests: a throwaway PKI made with openssl (a CA, server
certificates for 127.0.0.1 and for another name, a client certificate), once per session; no
proxy variables from the environment that runs the tests (a test sets its own)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.api_servers import Pki


def _openssl(cwd: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _issue(directory: Path, name: str, subject: str, extensions: str) -> tuple[Path, Path]:
    (directory / f"{name}.ext").write_text(extensions)
    _openssl(
        directory,
        *("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"),
        *("-nodes", "-keyout", f"{name}.key", "-subj", subject, "-out", f"{name}.csr"),
    )
    _openssl(
        directory,
        *("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key"),
        *("-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.crt"),
    )
    return directory / f"{name}.crt", directory / f"{name}.key"


PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "REQUEST_METHOD")


@pytest.fixture(autouse=True)
def no_proxy_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    _openssl(
        directory,
        *("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"),
        *("-nodes", "-keyout", "ca.key", "-subj", "/CN=test-ca", "-days", "2"),
        *("-out", "ca.crt"),
    )
    server = "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"
    named = "subjectAltName=DNS:api.example.test\nextendedKeyUsage=serverAuth\n"
    return Pki(
        directory,
        directory / "ca.crt",
        _issue(directory, "server", "/CN=server", server),
        _issue(directory, "named", "/CN=named", named),
        _issue(directory, "client", "/CN=me/O=team", "extendedKeyUsage=clientAuth\n"),
    )
