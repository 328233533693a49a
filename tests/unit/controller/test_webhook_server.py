"""The webhook's HTTPS listener (Kopf's server): it waits for its files, serves the pair in the
directory to a client that trusts the CA under the Service's name, and serves the new pair
once the files are replaced, also when the key and the certificate are replaced one at a time."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
import os
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kopf
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from dra_gpu.config import ControllerSettings
from dra_gpu.controller.admission import certificates, server
from dra_gpu.testing import eventually
from tests.support.ports import free_port

NOW = datetime.datetime.now(datetime.UTC)
NAMES = certificates.service_names("webhook", "dra-gpu")
HOST = "webhook.dra-gpu.svc"


def write(path: Path, data: bytes) -> None:
    """As the keeper and a Secret volume do: the new file replaces the old one whole."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)


def write_pair(cert_dir: Path, pair: certificates.KeyPair) -> None:
    write(cert_dir / "tls.key", pair.key)
    write(cert_dir / "tls.crt", pair.cert)


async def fn(
    request: Any,
    *,
    webhook: str | None = None,
    headers: dict[str, str] | None = None,
    sslpeer: dict[str, Any] | None = None,
) -> Any:
    uid = request["request"]["uid"]
    return {"response": {"uid": uid, "allowed": True}, "webhook": webhook}


async def handshake(port: int, ca: bytes) -> bytes:
    """The serving certificate (DER) of a TLS connection that verified it for ``HOST``."""
    context = ssl.create_default_context(cadata=ca.decode())
    _reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=context, server_hostname=HOST
    )
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        assert isinstance(der, bytes)
        return der
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def review(port: int, ca: bytes) -> dict[str, Any]:
    context = ssl.create_default_context(cadata=ca.decode())
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=context, server_hostname=HOST
    )
    try:
        body = json.dumps({"request": {"uid": "u-1"}}).encode()
        writer.write(
            b"POST /resourceclaims HTTP/1.1\r\nHost: " + HOST.encode() + b"\r\n"
            b"Content-Type: application/json\r\nConnection: close\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        answer = await reader.read()
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    result: dict[str, Any] = json.loads(payload)
    return result


def der(pem: bytes) -> bytes:
    return x509.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.DER)


@contextlib.asynccontextmanager
async def running(
    listener: kopf.WebhookServer,
) -> AsyncIterator[list[kopf.WebhookClientConfig]]:
    """Consumes the server's client configs as Kopf would, until the end of the block."""
    configs: list[kopf.WebhookClientConfig] = []

    async def consume() -> None:
        async for config in listener(fn):
            configs.append(config)

    async with listener:
        task = asyncio.create_task(consume())
        try:
            yield configs
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_the_server_waits_for_its_files_then_serves_and_reloads_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()
    settings = ControllerSettings(
        namespace="dra-gpu", webhook_service="webhook", webhook_port=port, bind_address="127.0.0.1"
    )
    ca = certificates.issue_ca(NOW)
    first = certificates.issue_serving(ca, NAMES, NOW)
    listener = server.webhook_server(settings, tmp_path, file_check_interval=0.05)
    async with running(listener) as configs:
        await asyncio.sleep(0.3)
        assert configs == []  # no files yet: not listening
        with pytest.raises(ConnectionRefusedError):
            await handshake(port, ca.cert)

        write(tmp_path / "ca.crt", ca.cert)
        write_pair(tmp_path, first)
        await eventually(lambda: configs, timeout=10, interval=0.05, what="listening")
        assert configs[0]["url"] == f"https://{HOST}:{port}/"
        assert "caBundle" in configs[0]  # from ca.crt
        assert await handshake(port, ca.cert) == der(first.cert)
        answered = await review(port, ca.cert)
        assert answered["response"] == {"uid": "u-1", "allowed": True}
        assert answered["webhook"] == "resourceclaims"

        # A renewal: the new pair is served within a few file checks.
        second = certificates.issue_serving(ca, NAMES, NOW)
        write_pair(tmp_path, second)

        async def serves(pem: bytes) -> bool:
            with contextlib.suppress(OSError):
                return await handshake(port, ca.cert) == der(pem)
            return False

        await eventually(lambda: serves(second.cert), timeout=10, interval=0.05)

        # The key replaced alone: the restart cannot load the pair and tries again; once the
        # certificate follows, the new pair is served.
        third = certificates.issue_serving(ca, NAMES, NOW)
        with caplog.at_level(logging.WARNING, logger=server.__name__):
            write(tmp_path / "tls.key", third.key)
            await eventually(
                lambda: any("cannot serve" in r.message for r in caplog.records),
                timeout=10,
                interval=0.05,
                what="a failed start",
            )
            write(tmp_path / "tls.crt", third.cert)
            await eventually(lambda: serves(third.cert), timeout=10, interval=0.05)
