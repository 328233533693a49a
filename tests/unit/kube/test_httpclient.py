"""The HTTP/1.1 client under ``kube`` (``httpclient``), against servers on loopback that send
exactly what each test scripts: bodies of both framings, streams read line by line, the pool
of keep-alive connections and its bound, the one retry on a reused connection, time limits,
TLS, and the errors a caller sees when no answer comes."""

from __future__ import annotations

import asyncio
import ssl

import pytest

from dra_gpu.kube import transport
from dra_gpu.kube.transport import Client, Timeout
from dra_gpu.testing import eventually
from tests.support.api_servers import (
    LAST_CHUNK,
    Pki,
    answer,
    chunk,
    chunked_head,
    read_request,
    serving,
)


async def test_keep_alive_serves_requests_one_after_the_other_on_one_connection() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        while True:
            await read_request(reader, server)
            writer.write(answer(b'{"n": %d}' % len(server.requests)))

    async with serving(handler) as server, Client(server.url()) as client:
        for n in (1, 2, 3):
            response = await client.request("GET", "/api")
            assert response.status == 200
            assert response.header("content-type") == "application/json"
            assert await response.read() == b'{"n": %d}' % n
        assert server.connections == 1
    assert server.requests[0].startswith(b"GET /api HTTP/1.1\r\nHost: 127.0.0.1:")


async def test_a_chunked_stream_comes_line_by_line_as_it_arrives() -> None:
    sent = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await read_request(reader)
        writer.write(chunked_head() + chunk(b'{"a": 1}\n{"b"') + chunk(b": 2}\n"))
        await sent.wait()  # the first lines arrive before the stream ends
        writer.write(chunk(b"\n") + chunk(b"tail") + LAST_CHUNK)

    async with serving(handler) as server, Client(server.url()) as client:
        response = await client.request("GET", "/watch", timeouts=Timeout(total=None, read=5))
        lines = []
        async for line in response.lines():
            lines.append(line)
            if len(lines) == 2:
                sent.set()
        assert lines == [b'{"a": 1}', b'{"b": 2}', b"", b"tail"]


async def test_the_pool_keeps_to_its_bound_and_requests_wait_their_turn() -> None:
    release = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        while True:
            await read_request(reader)
            await release.wait()
            writer.write(answer(b"{}"))

    async with serving(handler) as server, Client(server.url(), limit=2) as client:

        async def get() -> bytes:
            response = await client.request("GET", "/")
            return await response.read()

        calls = [asyncio.create_task(get()) for _ in range(5)]
        await eventually(lambda: server.open == 2, timeout=10, what="two connections open")
        release.set()
        assert await asyncio.gather(*calls) == [b"{}"] * 5
        assert server.most_open == 2
        assert server.connections == 2  # the waiting requests reused the two connections


async def test_an_idempotent_request_is_sent_again_when_the_reused_connection_was_closed() -> None:
    async def handler(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int
    ) -> None:
        await read_request(reader, server)
        if index == 0:
            writer.write(answer(b"first"))
            await writer.drain()
            await read_request(reader, server)  # the second request: closed unanswered
            return
        writer.write(answer(b"second"))

    async with serving(handler) as server, Client(server.url()) as client:
        assert await (await client.request("GET", "/")).read() == b"first"
        assert await (await client.request("DELETE", "/x")).read() == b"second"
        assert server.connections == 2
        assert len(server.requests) == 3


async def test_a_post_is_never_sent_twice() -> None:
    async def handler(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int
    ) -> None:
        await read_request(reader, server)
        writer.write(answer(b"first"))
        await writer.drain()
        await read_request(reader, server)  # then closed unanswered

    async with serving(handler) as server, Client(server.url()) as client:
        await (await client.request("GET", "/")).read()
        with pytest.raises(transport.ConnectionClosed, match="before answering"):
            await client.request("POST", "/create", body=b"{}")
        assert len(server.requests) == 2
        assert server.requests[1].endswith(b"Content-Length: 2\r\n\r\n{}")


async def test_an_answer_cut_short_is_an_error_and_its_connection_is_not_reused() -> None:
    async def handler(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int
    ) -> None:
        await read_request(reader)
        if index == 0:
            writer.write(answer(b"0123456789")[:-4])
            return
        writer.write(answer(b"ok"))

    async with serving(handler) as server, Client(server.url()) as client:
        response = await client.request("GET", "/")
        with pytest.raises(transport.ConnectionClosed, match="in the middle of its answer"):
            await response.read()
        assert await (await client.request("GET", "/")).read() == b"ok"
        assert server.connections == 2


async def test_a_body_left_unread_closes_its_connection() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        while True:
            await read_request(reader)
            writer.write(answer(b"x" * 100_000))

    async with serving(handler) as server, Client(server.url()) as client:
        (await client.request("GET", "/")).release()
        assert await (await client.request("GET", "/")).read() == b"x" * 100_000
        assert server.connections == 2


async def test_a_server_that_says_close_gets_a_new_connection_next_time() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await read_request(reader)
        writer.write(answer(b"{}", "200 OK", "Connection: close"))

    async with serving(handler) as server, Client(server.url()) as client:
        for _ in range(2):
            assert await (await client.request("GET", "/")).read() == b"{}"
        assert server.connections == 2


async def test_no_answer_within_the_time_allowed() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await read_request(reader)
        writer.write(chunked_head() + chunk(b"{}\n"))
        await reader.read()  # silent until the client gives up

    async with serving(handler) as server, Client(server.url()) as client:
        response = await client.request("GET", "/", timeouts=Timeout(total=0.2))
        with pytest.raises(TimeoutError):  # the whole request, its body included
            await response.read()
        response = await client.request("GET", "/", timeouts=Timeout(total=None, read=0.2))
        lines = response.lines()
        assert await anext(lines) == b"{}"
        with pytest.raises(TimeoutError):  # silence between two chunks
            await anext(lines)
        assert server.connections == 2  # a timed-out connection is not reused


async def test_what_is_not_http_is_a_protocol_error() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await read_request(reader)
        writer.write(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")

    async with serving(handler) as server, Client(server.url()) as client:
        with pytest.raises(transport.ProtocolError, match=r"not valid HTTP/1\.1") as raised:
            await client.request("GET", "/")
    assert isinstance(raised.value, OSError)


async def test_a_refused_connection_keeps_its_errno() -> None:
    async with serving(lambda r, w, i: asyncio.sleep(0)) as server:
        url = server.url()
    async with Client(url) as client:
        with pytest.raises(ConnectionRefusedError):
            await client.request("GET", "/")


async def test_a_path_prefix_of_the_url_comes_before_every_target() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await read_request(reader, server)
        writer.write(answer(b"{}"))

    async with serving(handler) as server, Client(server.url() + "/k8s/c1/") as client:
        await (await client.request("GET", "/api?x=1")).read()
    assert server.requests[0].startswith(b"GET /k8s/c1/api?x=1 HTTP/1.1")


# ---- TLS -------------------------------------------------------------------------------------


async def tls_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
    await read_request(reader)
    writer.write(answer(b"{}"))


def trusting(pki: Pki) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(pki.ca))


async def test_tls_with_the_cluster_ca(pki: Pki) -> None:
    async with (
        serving(tls_answer, tls=pki.server_context(pki.server)) as server,
        Client(server.url("https"), ssl_context=trusting(pki)) as client,
    ):
        assert await (await client.request("GET", "/")).read() == b"{}"


async def test_tls_with_a_certificate_for_another_name_needs_that_name(pki: Pki) -> None:
    async with serving(tls_answer, tls=pki.server_context(pki.named)) as server:
        async with Client(server.url("https"), ssl_context=trusting(pki)) as client:
            with pytest.raises(ssl.SSLCertVerificationError, match="IP address mismatch"):
                await client.request("GET", "/")
        async with Client(
            server.url("https"), ssl_context=trusting(pki), server_hostname="api.example.test"
        ) as client:
            assert await (await client.request("GET", "/")).read() == b"{}"


async def test_tls_with_a_client_certificate(pki: Pki) -> None:
    context = trusting(pki)
    context.load_cert_chain(*pki.client)
    async with (
        serving(tls_answer, tls=pki.server_context(pki.server, client_ca=True)) as server,
        Client(server.url("https"), ssl_context=context) as client,
    ):
        assert await (await client.request("GET", "/")).read() == b"{}"


async def test_tls_without_the_cluster_ca_is_not_trusted(pki: Pki) -> None:
    async with (
        serving(tls_answer, tls=pki.server_context(pki.server)) as server,
        Client(server.url("https")) as client,
    ):
        with pytest.raises(ssl.SSLCertVerificationError):
            await client.request("GET", "/")


def test_timeouts_are_positive_or_none() -> None:
    with pytest.raises(ValueError, match="a positive number of seconds, or None"):
        Timeout(read=0)


def test_a_url_must_be_http_or_https_with_a_host() -> None:
    with pytest.raises(ValueError, match="is not an http:// or https:// URL"):
        Client("10.0.0.1:6443")
    assert transport.Origin.parse("https://[fd00::1]:6443").host_header == "[fd00::1]:6443"
    assert transport.Origin.parse("https://api.example.test").host_header == "api.example.test"
    assert transport.Origin.parse("http://h").port == 80
    assert transport.Origin.parse("https://h/").prefix == ""
