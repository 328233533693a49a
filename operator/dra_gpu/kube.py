"""A thin JSON client for the Kubernetes API on top of kubernetes-asyncio's transport.

kubernetes-asyncio loads kubeconfigs and in-cluster credentials and owns the HTTP session; this
module speaks plain dicts over it, because the DRA objects we read and write are easier to
follow as the API's own JSON than as generated model classes. ``watch_forever`` is the one list-
then-watch loop that every long-running component uses: it relists after ``410 Gone``, reconnects
after network errors and API server restarts, and never returns.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any, Literal

import aiohttp
from kubernetes_asyncio import client, config

log = logging.getLogger(__name__)

Body = dict[str, Any]
PatchType = Literal["merge", "strategic", "json", "apply"]
_PATCH_CONTENT_TYPES: dict[str, str] = {
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "json": "application/json-patch+json",
    "apply": "application/apply-patch+yaml",
}


class ApiError(Exception):
    """The API server answered with a non-2xx status."""

    def __init__(self, method: str, path: str, status: int, body: Body | str) -> None:
        self.method, self.path, self.status, self.body = method, path, status, body
        self.reason = body.get("reason", "") if isinstance(body, dict) else ""
        message = body.get("message", body) if isinstance(body, dict) else body
        super().__init__(f"{method} {path}: {status} {self.reason}: {message}")

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409


class Kube:
    """JSON requests against one API server. Use as ``async with await Kube.connect(...)``."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self.api_client = api_client

    @classmethod
    async def connect(cls, kubeconfig: Path | str | None = None) -> Kube:
        """From a kubeconfig file, else ``$KUBECONFIG``, else the in-cluster service account."""
        cfg = client.Configuration()
        path = kubeconfig or os.environ.get("KUBECONFIG")
        if path:
            await config.load_kube_config(config_file=str(path), client_configuration=cfg)
        else:
            config.load_incluster_config(client_configuration=cfg)
        return cls(client.ApiClient(cfg))

    async def close(self) -> None:
        await self.api_client.close()

    async def __aenter__(self) -> Kube:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- plain requests ------------------------------------------------------------------

    async def _send(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
        request_timeout: float | aiohttp.ClientTimeout | None = 30.0,
    ) -> aiohttp.ClientResponse:
        headers = {"Content-Type": content_type, "Accept": "application/json"}
        params = [(k, _query_value(v)) for k, v in (query or {}).items() if v is not None]
        response: aiohttp.ClientResponse = await self.api_client.call_api(
            path,
            method,
            query_params=params,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=request_timeout,
        )
        if not 200 <= response.status <= 299:
            text = await response.text()
            response.release()
            try:
                decoded: Body | str = json.loads(text)
            except ValueError:
                decoded = text
            raise ApiError(method, path, response.status, decoded)
        return response

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> Body:
        response = await self._send(method, path, body=body, query=query, content_type=content_type)
        try:
            result: Body = await response.json(content_type=None)
        finally:
            response.release()
        return result

    async def get(self, path: str, **query: Any) -> Body:
        return await self.request("GET", path, query=query)

    async def create(self, path: str, body: Body, **query: Any) -> Body:
        return await self.request("POST", path, body=body, query=query)

    async def replace(self, path: str, body: Body) -> Body:
        return await self.request("PUT", path, body=body)

    async def patch(
        self, path: str, body: Any, patch_type: PatchType = "merge", **query: Any
    ) -> Body:
        return await self.request(
            "PATCH", path, body=body, query=query, content_type=_PATCH_CONTENT_TYPES[patch_type]
        )

    async def delete(
        self,
        path: str,
        *,
        grace_period_seconds: int | None = None,
        missing_ok: bool = True,
        uid: str | None = None,
    ) -> Body | None:
        body: Body = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if grace_period_seconds is not None:
            body["gracePeriodSeconds"] = grace_period_seconds
        if uid is not None:
            body["preconditions"] = {"uid": uid}
        try:
            return await self.request("DELETE", path, body=body)
        except ApiError as exc:
            if missing_ok and exc.not_found:
                return None
            raise

    # ---- watching ------------------------------------------------------------------------

    async def watch_once(
        self, path: str, resource_version: str, *, timeout_seconds: int = 300, **query: Any
    ) -> AsyncIterator[Body]:
        """One watch request from ``resource_version``; yields raw watch events."""
        response = await self._send(
            "GET",
            path,
            query={
                **query,
                "watch": "true",
                "resourceVersion": resource_version,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": timeout_seconds,
            },
            request_timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=10, sock_read=timeout_seconds + 30
            ),
        )
        try:
            while line := await response.content.readline():
                if line.strip():
                    yield json.loads(line)
        finally:
            response.release()

    async def watch_forever(
        self, path: str, *, retry_delay: float = 1.0, **query: Any
    ) -> AsyncIterator[tuple[str, Body]]:
        """List, then watch, forever. Yields ``("SYNC", list_body)`` after every (re)list,
        then ``(event_type, object)`` for ADDED/MODIFIED/DELETED. Survives API restarts."""
        while True:
            try:
                listing = await self.get(path, **query)
            except (TimeoutError, ApiError, aiohttp.ClientError, OSError) as exc:
                log.warning("list %s failed, retrying: %s", path, exc)
                await asyncio.sleep(retry_delay)
                continue
            yield "SYNC", listing
            rv = listing.get("metadata", {}).get("resourceVersion", "")
            while True:
                try:
                    async for event in self.watch_once(path, rv, **query):
                        kind = event.get("type")
                        obj = event.get("object", {})
                        if kind == "ERROR":
                            raise ApiError("WATCH", path, int(obj.get("code", 500)), obj)
                        rv = obj.get("metadata", {}).get("resourceVersion", rv)
                        if kind != "BOOKMARK":
                            yield kind, obj
                except ApiError as exc:
                    if exc.status == 410:
                        log.debug("watch %s expired, relisting", path)
                    else:
                        log.warning("watch %s failed, relisting: %s", path, exc)
                        await asyncio.sleep(retry_delay)
                    break
                except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as exc:
                    log.warning("watch %s interrupted, relisting: %s", path, exc)
                    await asyncio.sleep(retry_delay)
                    break


def _query_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
