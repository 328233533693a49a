"""The slice publisher's reads: what the API holds comes from its watch of the node's slices, so
that a check whose inventory did not change sends nothing; the Node and the slices are read by
request only where the watch cannot say (before its first state, after a publication that
failed) and the Node again after someone else deleted one of our slices. Against a scripted API
that keeps a Node and ResourceSlices as the API server does (resourceVersions, 409 on a stale
one); the watch's items are handed to ``SlicePublisher.seen`` as the watch yields them."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dra_gpu.agent.publisher import SLICES, SlicePublisher
from dra_gpu.devices import simulated
from dra_gpu.serving import metrics
from tests.support.api_servers import scripted_api, status

DRIVER = "gpu.example.com"
NODE = "node-01"
NODE_PATH = f"/api/v1/nodes/{NODE}"
SLICE_KIND = "resourceslices"
PROFILE = simulated.parse_profile(f"nodes: {{{NODE}: {{devices: [{{memory: 24Gi}}]}}}}")


class NodeAndSlices:
    """A Node and the ResourceSlices of an API server: every write gets a new resourceVersion,
    a replace of an old one is refused 409, as the API server refuses it."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, Any]] = []
        self.node: dict[str, Any] = {"metadata": {"name": NODE, "uid": "node-uid-1"}}
        self.slices: dict[str, dict[str, Any]] = {}
        self.rv = 100
        self.unavailable = 0
        """The next this many requests are answered 503, as an API server that is starting."""

    def answer(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        if self.unavailable:
            self.unavailable -= 1
            return 503, status(503, "ServiceUnavailable", "the server is starting")
        if path == NODE_PATH:
            return 200, self.node
        if path == SLICES and method == "GET":
            return 200, {"metadata": {"resourceVersion": str(self.rv)}, "items": self.listed()}
        if path == SLICES and method == "POST":
            return 201, self.store(body)
        name = path.rsplit("/", 1)[1]
        held = self.slices.get(name)
        if held is None:
            return 404, status(404, "NotFound", f'resourceslices "{name}" not found')
        if method == "DELETE":
            return 200, self.slices.pop(name)
        if body["metadata"]["resourceVersion"] != held["metadata"]["resourceVersion"]:
            message = f'Operation cannot be fulfilled on resourceslices "{name}"'
            return 409, status(409, "Conflict", message)
        return 200, self.store(body)

    def store(self, body: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        stored = copy.deepcopy(body)
        stored["metadata"]["resourceVersion"] = str(self.rv)
        stored["metadata"].setdefault("uid", f"uid-{stored['metadata']['name']}")
        self.slices[stored["metadata"]["name"]] = stored
        return copy.deepcopy(stored)

    def emptied(self, name: str) -> dict[str, Any]:
        """Someone else's edit of slice ``name``: its devices gone; the slice as stored."""
        self.slices[name]["spec"]["devices"] = []
        return self.store(self.slices[name])

    def listed(self) -> list[dict[str, Any]]:
        return [copy.deepcopy(s) for s in self.slices.values()]

    def sent(self) -> list[tuple[str, str]]:
        """The requests since the last ``forget``, as (method, path)."""
        return [(method, path) for method, path, _ in self.requests]

    def forget(self) -> None:
        self.requests.clear()


def publisher(api: Any) -> SlicePublisher:
    return SlicePublisher(api, simulated.SimulatedBackend(PROFILE, NODE), driver=DRIVER, node=NODE)


async def published(api: Any, fake: NodeAndSlices) -> SlicePublisher:
    """A publisher that has published the pool once, and whose watch has said so since."""
    pub = publisher(api)
    await pub.publish_once()
    pub.seen("SYNC", {"items": fake.listed()})
    return pub


async def test_a_check_that_finds_nothing_changed_sends_nothing_once_the_watch_has_the_pool() -> (
    None
):
    fake = NodeAndSlices()
    async with scripted_api(fake) as api:
        pub = publisher(api)
        assert await pub.publish_once()
        assert fake.sent() == [("GET", NODE_PATH), ("GET", SLICES), ("POST", SLICES)]
        fake.forget()
        assert not await pub.publish_once()  # the watch has said nothing yet: listed
        assert fake.sent() == [("GET", SLICES)]
        pub.seen("SYNC", {"items": fake.listed()})
        assert metrics.AGENT.get_sample_value("dra_gpu_watch_live", {"resource": SLICE_KIND}) == 1
        fake.forget()
        for _ in range(3):
            assert not await pub.publish_once()
        assert fake.sent() == []


async def test_a_slice_deleted_by_someone_else_is_published_again_under_the_nodes_new_uid() -> None:
    fake = NodeAndSlices()
    async with scripted_api(fake) as api:
        pub = await published(api, fake)
        # The Node deleted and made again under its name: the garbage collector takes the slices.
        fake.node = {"metadata": {"name": NODE, "uid": "node-uid-2"}}
        for gone in fake.listed():
            del fake.slices[gone["metadata"]["name"]]
            pub.seen("DELETED", gone)
        fake.forget()
        assert await pub.publish_once()
        assert fake.sent() == [("GET", NODE_PATH), ("POST", SLICES)]  # no list: watched
    owners = {o["uid"] for s in fake.listed() for o in s["metadata"]["ownerReferences"]}
    assert owners == {"node-uid-2"}


async def test_after_a_publication_that_failed_the_next_check_reads_everything_again() -> None:
    fake = NodeAndSlices()
    async with scripted_api(fake) as api:
        pub = await published(api, fake)
        (name,) = fake.slices
        # Someone edits our slice twice; the watch has brought only the first edit so far.
        pub.seen("MODIFIED", fake.emptied(name))
        fake.emptied(name)
        with pytest.raises(Exception, match="409"):
            await pub.publish_once()  # replaced at the resourceVersion the watch said: refused
        fake.forget()
        assert await pub.publish_once()
        replaced = ("PUT", f"{SLICES}/{name}")
        assert fake.sent() == [("GET", NODE_PATH), ("GET", SLICES), replaced]
        assert fake.slices[name]["spec"]["devices"]  # put right


async def test_an_older_event_does_not_undo_what_a_write_of_ours_answered() -> None:
    fake = NodeAndSlices()
    async with scripted_api(fake) as api:
        pub = await published(api, fake)
        (name,) = fake.slices
        stale = fake.listed()[0]
        pub.seen("MODIFIED", fake.emptied(name))
        assert await pub.publish_once()  # put right: the answer's resourceVersion is kept
        pub.seen("MODIFIED", stale)  # the watch, late, with a version older than our write
        fake.forget()
        assert not await pub.publish_once()
        assert fake.sent() == []


async def test_a_publication_the_api_server_did_not_carry_out_keeps_what_the_watch_said() -> None:
    fake = NodeAndSlices()
    async with scripted_api(fake) as api:
        pub = await published(api, fake)
        (name,) = fake.slices
        pub.seen("MODIFIED", fake.emptied(name))
        fake.unavailable = 1
        with pytest.raises(Exception, match="503"):
            await pub.publish_once()  # 503: not done, nothing learnt of the pool
        fake.forget()
        assert await pub.publish_once()
        assert fake.sent() == [("PUT", f"{SLICES}/{name}")]  # no GET, no list
