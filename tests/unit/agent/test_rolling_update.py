"""Two agents of one driver on one node, as a rolling update runs them: per-pod socket names,
the serialize lock that keeps their prepares apart, the checkpoint read again by whoever takes
it after the other wrote, and the pool handed over to the newer agent. Real files and real
processes under tmp_path; the pool's handover in simulated time."""

from __future__ import annotations

import asyncio
import datetime
import fcntl
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_gpu import config
from dra_gpu.agent import checkpoint, commits, server
from dra_gpu.agent.claims import ClaimRef
from dra_gpu.agent.contention import Contention
from dra_gpu.agent.slices import Publisher
from dra_gpu.agent.state import DeviceState, Prepared
from dra_gpu.devices import simulated
from tests.unit.agent import rig
from tests.unit.agent.rig import ClaimsApi

DRIVER = "gpu.example.com"
NODE = "node-01"
POD_A = "0a1b2c3d-0000-4000-8000-00000000000a"
POD_B = "0a1b2c3d-0000-4000-8000-00000000000b"
T0 = datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC)
PROFILE = f"nodes:\n  {NODE}:\n    devices:\n    - count: 4\n      memory: 8Gi\n"


# ---- sockets -----------------------------------------------------------------------------------


def test_a_pod_uid_gives_the_pod_sockets_of_its_own_beside_the_fixed_ones() -> None:
    fixed = config.AgentSettings(node_name=NODE, profile=Path("p"), kubelet_dir=Path("/k"))
    a = config.AgentSettings(
        node_name=NODE, profile=Path("p"), kubelet_dir=Path("/k"), pod_uid=POD_A
    )
    assert fixed.registration_socket == Path(f"/k/plugins_registry/{DRIVER}-reg.sock")
    assert fixed.dra_socket == Path(f"/k/plugins/{DRIVER}/dra.sock")
    # As upstream's kubeletplugin.RollingUpdate(podUID) names them.
    assert a.registration_socket == Path(f"/k/plugins_registry/{DRIVER}-{POD_A}-reg.sock")
    assert a.dra_socket == Path(f"/k/plugins/{DRIVER}/dra-{POD_A}.sock")
    assert a.serialize_lock == a.checkpoint_dir / "serialize.lock"


def test_a_pod_uid_that_is_not_a_uid_is_refused_naming_the_flag() -> None:
    with pytest.raises(ValueError, match="--pod-uid / DRA_GPU_POD_UID: 'pod-1' is not a pod UID"):
        config.AgentSettings(node_name=NODE, profile=Path("p"), pod_uid="pod-1")


def servers(tmp_path: Path, pod: str) -> server.PluginServers:
    settings = config.AgentSettings(
        node_name=NODE, profile=Path("p"), kubelet_dir=tmp_path / "kubelet", pod_uid=pod
    )
    return server.serve(
        DeviceState(
            api=None,  # type: ignore[arg-type]  # no call reaches the API here
            driver=DRIVER,
            node=NODE,
            container_edits=simulated.SimulatedBackend(
                simulated.parse_profile(PROFILE), NODE
            ).container_edits,
            cdi_dir=tmp_path / pod / "cdi",
            checkpoint_file=tmp_path / pod / "checkpoint.json",
            inventory=None,  # type: ignore[arg-type]
            status=rig.NoStatus(),
        ),
        driver=DRIVER,
        dra_socket=settings.dra_socket,
        registration_socket=settings.registration_socket,
        status=server.RegistrationStatus(),
    )


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory short enough for per-pod socket names (a unix socket path has 107 bytes)."""
    with tempfile.TemporaryDirectory(prefix="ru-", dir="/tmp") as name:
        yield Path(name)


async def test_two_pods_register_side_by_side_and_each_sees_the_other(short_dir: Path) -> None:
    tmp_path = short_dir
    old, new = servers(tmp_path, POD_A), servers(tmp_path, POD_B)
    async with old:
        assert await old.other_registrations() == []
        async with new:
            # Nobody's sockets replaced: both answer, each finds the other's registration.
            assert await old.check() is None
            assert await server.answers(old.registration_socket, old.dra_socket)
            assert await server.answers(new.registration_socket, new.dra_socket)
            assert await old.other_registrations() == [new.registration_socket]
            assert await new.other_registrations() == [old.registration_socket]
            assert not old.taken
        assert await old.other_registrations() == []
        # A crashed pod's socket that nobody answers on is no registration.
        stale = tmp_path / "kubelet" / "plugins_registry" / f"{DRIVER}-{POD_B}-reg.sock"
        stale.touch()
        assert await old.other_registrations() == []
        # Nor another driver's socket, whose name merely starts with ours.
        with socket.socket(socket.AF_UNIX) as other_driver:
            other_driver.bind(str(stale.with_name(f"{DRIVER}-gpu-reg.sock")))
            other_driver.listen()
            assert await old.other_registrations() == []


# ---- the serialize lock ------------------------------------------------------------------------


async def test_two_agents_are_never_inside_the_lock_at_once_while_each_shares_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "checkpoint" / "serialize.lock"
    locks = {"a": commits.SerializeLock(path), "b": commits.SerializeLock(path)}
    inside: dict[str, int] = {"a": 0, "b": 0}
    overlaps: list[str] = []
    together = {"a": 0, "b": 0}

    async def call(agent: str, n: int) -> None:
        async with locks[agent].held():
            inside[agent] += 1
            together[agent] = max(together[agent], inside[agent])
            other = "b" if agent == "a" else "a"
            if inside[other]:
                overlaps.append(f"{agent}#{n} beside {other}")
            await asyncio.sleep(0.001 * (n % 3))
            inside[agent] -= 1

    await asyncio.gather(*(call("ab"[n % 2], n) for n in range(60)))
    assert overlaps == []
    assert together["a"] > 1
    assert together["b"] > 1
    for lock in locks.values():
        assert not lock.locked
        lock.close()


async def test_the_lock_waits_for_another_process_and_a_cancelled_wait_leaves_it_free(
    tmp_path: Path,
) -> None:
    path = tmp_path / "serialize.lock"
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "import fcntl, os, sys\n"
        f"fd = os.open({str(path)!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "print('held', flush=True)\n"
        "sys.stdin.readline()\n",
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert child.stdout is not None
    assert child.stdin is not None
    assert await child.stdout.readline() == b"held\n"
    lock = commits.SerializeLock(path)
    try:
        waiting = asyncio.create_task(_enter(lock))
        await asyncio.sleep(0.2)
        assert not waiting.done(), "entered while another process holds the lock"
        waiting.cancel()  # a call the kubelet gave up on: nothing stays locked
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert not lock.locked
        entered = asyncio.create_task(_enter(lock))
        await asyncio.sleep(0.1)
        assert not entered.done()
        child.stdin.write(b"\n")  # the other process lets go
        await child.stdin.drain()
        await asyncio.wait_for(entered, 10)
        assert lock.waited_seconds > 0.1
    finally:
        if child.returncode is None:
            child.kill()
        await child.wait()
        lock.close()
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free: not left taken by us
    finally:
        os.close(fd)


async def _enter(lock: commits.SerializeLock) -> None:
    async with lock.held():
        pass


# ---- the checkpoint, read again under the lock -------------------------------------------------


def two_agents(tmp_path: Path, api: ClaimsApi) -> tuple[DeviceState, DeviceState]:
    """The old and the new pod's state over the same host directories and lock."""
    states = []
    for _ in "ab":
        backend = simulated.SimulatedBackend(simulated.parse_profile(PROFILE), NODE)
        states.append(
            rig.device_state(tmp_path, backend, api, serialize_lock=tmp_path / "serialize.lock")
        )
    for state in states:
        state.load(checkpoint.read_checkpoint(tmp_path / "checkpoint.json"))
    return states[0], states[1]


def gpu(api: ClaimsApi, name: str, device: str) -> ClaimRef:
    result = {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}
    return api.allocate(name, [result])


async def test_each_agent_reads_the_checkpoint_again_after_the_other_wrote_it(
    tmp_path: Path,
) -> None:
    api = ClaimsApi()
    old, new = two_agents(tmp_path, api)
    one, two = gpu(api, "one", "gpu-0"), gpu(api, "two", "gpu-1")

    # The old pod answers a call it had before the new one registered.
    first = (await old.prepare_all([one]))[one.uid]
    assert isinstance(first, Prepared)
    # The kubelet's retry of the same claim reaches the new pod: answered from the record the
    # old one wrote, not prepared a second time.
    again = (await new.prepare_all([one]))[one.uid]
    assert again == first
    assert new.reloads == 1
    # The new pod prepares and unprepares; the old one's release of a claim it thinks it
    # holds finds the record gone.
    assert isinstance((await new.prepare_all([two]))[two.uid], Prepared)
    assert (await new.unprepare_all([one]))[one.uid] is None
    async with old.serialized():
        assert set(old.prepared.claims) == {two.uid}
    assert old.reloads == 1
    assert (await old.unprepare_all([one]))[one.uid] is None  # unknown: a success

    # Stops: the old one first, folding in what the new one wrote; then the new one.
    await old.aclose()
    assert set(checkpoint.read_checkpoint(tmp_path / "checkpoint.json").claims) == {two.uid}
    assert (await new.unprepare_all([two]))[two.uid] is None
    await new.aclose()
    assert checkpoint.read_checkpoint(tmp_path / "checkpoint.json").claims == {}
    assert not checkpoint.journal_path(tmp_path / "checkpoint.json").exists() or (
        checkpoint.load((tmp_path / "checkpoint.json").read_bytes()).claims == {}
    )


async def test_the_old_pods_fold_at_stop_keeps_what_the_new_pod_prepared(tmp_path: Path) -> None:
    api = ClaimsApi()
    old, new = two_agents(tmp_path, api)
    mine, theirs = gpu(api, "mine", "gpu-0"), gpu(api, "theirs", "gpu-1")
    assert isinstance((await old.prepare_all([mine]))[mine.uid], Prepared)
    assert isinstance((await new.prepare_all([theirs]))[theirs.uid], Prepared)

    await old.aclose()  # its memory lacks "theirs": it reads the checkpoint before folding

    snapshot_only = checkpoint.load((tmp_path / "checkpoint.json").read_bytes())
    assert set(snapshot_only.claims) == {mine.uid, theirs.uid}
    # The new pod goes on appending after the old one replaced the files: nothing is lost.
    assert (await new.unprepare_all([mine]))[mine.uid] is None
    assert set(checkpoint.read_checkpoint(tmp_path / "checkpoint.json").claims) == {theirs.uid}
    await new.aclose()
    snapshot_only = checkpoint.load((tmp_path / "checkpoint.json").read_bytes())
    assert set(snapshot_only.claims) == {theirs.uid}


async def test_calls_of_the_two_agents_at_once_lose_no_record(tmp_path: Path) -> None:
    api = ClaimsApi()
    old, new = two_agents(tmp_path, api)
    refs = [gpu(api, f"c{i}", f"gpu-{i % 4}") for i in range(24)]

    async def cycle(state: DeviceState, ref: ClaimRef, keep: bool) -> None:
        assert isinstance((await state.prepare_all([ref]))[ref.uid], Prepared)
        if not keep:
            assert (await state.unprepare_all([ref]))[ref.uid] is None

    await asyncio.gather(
        *(cycle((old, new)[i % 2], ref, keep=i % 3 == 0) for i, ref in enumerate(refs))
    )
    kept = {ref.uid for i, ref in enumerate(refs) if i % 3 == 0}
    for state in (old, new):
        async with state.serialized():
            assert set(state.prepared.claims) == kept
    await old.aclose()
    await new.aclose()
    assert set(checkpoint.read_checkpoint(tmp_path / "checkpoint.json").claims) == kept


# ---- beside an agent of a release before the lock -------------------------------------------


def test_a_merge_applies_what_the_other_writer_changed_since_what_it_last_knew() -> None:
    def claim(uid: str, name: str) -> checkpoint.PreparedClaim:
        return checkpoint.PreparedClaim(uid, "ns", name, ())

    a, b, c, d = (claim(uid, uid) for uid in "abcd")
    base = checkpoint.Checkpoint({"a": a, "b": b})
    ours = checkpoint.Checkpoint({"a": a, "b": b, "c": c})  # we prepared c
    theirs = checkpoint.Checkpoint({"b": claim("b", "b2"), "d": d})  # a gone, b changed, d
    merged = checkpoint.merged(ours, base, theirs)
    assert merged.claims == {"b": claim("b", "b2"), "c": c, "d": d}
    assert checkpoint.merged(ours, theirs, theirs) == ours  # it changed nothing since


async def test_beside_an_agent_that_takes_no_lock_its_fold_keeps_what_we_prepared(
    tmp_path: Path,
) -> None:
    """The first rollout from a release before the serialize lock: the old pod never reads the
    checkpoint again and, as it stops, folds its memory over the files."""
    api = ClaimsApi()
    file = tmp_path / "checkpoint.json"
    backend = simulated.SimulatedBackend(simulated.parse_profile(PROFILE), NODE)
    legacy = rig.device_state(tmp_path, backend, api)  # no lock: as those agents were
    legacy.load(checkpoint.read_checkpoint(file))
    kept, released = gpu(api, "kept", "gpu-0"), gpu(api, "released", "gpu-1")
    assert isinstance((await legacy.prepare_all([kept, released]))[kept.uid], Prepared)

    new = rig.device_state(tmp_path, backend, api, serialize_lock=tmp_path / "serialize.lock")
    new.load(checkpoint.read_checkpoint(file))
    new.beside_legacy(True)
    ours, late = gpu(api, "ours", "gpu-2"), gpu(api, "late", "gpu-3")
    assert isinstance((await new.prepare_all([ours]))[ours.uid], Prepared)
    assert (await new.unprepare_all([released]))[released.uid] is None  # the kubelet's, to us
    # A call the old pod was answering as the new one registered; then it stops.
    assert isinstance((await legacy.prepare_all([late]))[late.uid], Prepared)
    await legacy.aclose()
    assert set(checkpoint.read_checkpoint(file).claims) == {kept.uid, released.uid, late.uid}

    async with new.serialized():  # the new pod's next call, or its check every few seconds
        assert set(new.prepared.claims) == {kept.uid, ours.uid, late.uid}
    # Written back at once, for a reader of the snapshot alone too.
    assert set(checkpoint.load(file.read_bytes()).claims) == {kept.uid, ours.uid, late.uid}
    new.beside_legacy(False)
    await new.aclose()
    assert set(checkpoint.read_checkpoint(file).claims) == {kept.uid, ours.uid, late.uid}


async def test_without_the_merge_the_old_fold_would_lose_our_claims(tmp_path: Path) -> None:
    """The same stop, with the new pod not told: what the merge is for."""
    api = ClaimsApi()
    file = tmp_path / "checkpoint.json"
    backend = simulated.SimulatedBackend(simulated.parse_profile(PROFILE), NODE)
    legacy = rig.device_state(tmp_path, backend, api)
    legacy.load(checkpoint.read_checkpoint(file))
    new = rig.device_state(tmp_path, backend, api, serialize_lock=tmp_path / "serialize.lock")
    new.load(checkpoint.read_checkpoint(file))
    ours, theirs = gpu(api, "ours", "gpu-2"), gpu(api, "theirs", "gpu-3")
    assert isinstance((await new.prepare_all([ours]))[ours.uid], Prepared)
    assert isinstance((await legacy.prepare_all([theirs]))[theirs.uid], Prepared)
    await legacy.aclose()
    async with new.serialized():
        assert set(new.prepared.claims) == {theirs.uid}


# ---- the pool, handed over ---------------------------------------------------------------------


def test_the_old_pod_hands_the_pool_over_while_the_new_one_is_registered() -> None:
    old = Contention(pool=NODE, driver=DRIVER)
    me = Publisher.at(T0, "agent-old")
    new = Publisher.at(T0 + datetime.timedelta(seconds=10), "agent-new")
    old.wrote(0.0)

    first = old.foreign(new, me, generation=4, now=12.0, newer_registered=True)
    later = old.foreign(new, me, generation=4, now=400.0, newer_registered=True)

    # No try to take it back, ever, while it is registered; not a conflict; said once.
    assert (first.wait > 0, first.conflict, first.report) == (True, False, None)
    assert first.notice is not None
    assert "hands it over to agent-new" in first.notice
    assert (later.wait > 0, later.conflict, later.notice) == (True, False, None)
    assert old.yielding
    assert old.handed_over
    assert old.settled(500.0) is None  # the pool showing our devices does not end it
    assert old.yielding

    # The new pod went (a rollout rolled back): the pool is ours again at once.
    back = old.foreign(new, me, generation=4, now=600.0, newer_registered=False)
    assert (back.wait, back.conflict) == (0.0, False)
    assert back.notice is not None
    assert "takes it back from agent-new" in back.notice
    assert (old.yielding, old.handed_over) == (False, False)


def test_in_a_rollout_the_pool_is_written_once_by_the_new_pod_and_never_by_the_old() -> None:
    """The two pods publish different devices (the rollout changed the profile); each checks
    the pool on the other's write and every resync, as the publisher does."""
    old_me = Publisher.at(T0, "agent-old")
    new_me = Publisher.at(T0 + datetime.timedelta(seconds=10), "agent-new")
    old, new = Contention(pool=NODE, driver=DRIVER), Contention(pool=NODE, driver=DRIVER)
    writes: list[tuple[float, str]] = [(0.0, "agent-old")]
    old.wrote(0.0)
    writer, generation = old_me, 1
    for now in [10.0 + 0.5 * step for step in range(1200)]:  # ten minutes, both alive
        for agent, me in ((new, new_me), (old, old_me)):
            if writer == me:
                agent.settled(now)
                continue
            decision = agent.foreign(writer, me, generation, now, newer_registered=True)
            assert not decision.conflict
            assert decision.report is None
            if decision.wait == 0:
                writer, generation = me, generation + 1
                writes.append((now, me.instance))
                agent.wrote(now)
    assert writes == [(0.0, "agent-old"), (10.0, "agent-new")]
    assert old.handed_over
    assert not new.yielding


async def test_the_lock_file_is_private(tmp_path: Path) -> None:
    lock = commits.SerializeLock(tmp_path / "dir" / "serialize.lock")
    await _enter(lock)
    lock.close()
    assert (tmp_path / "dir" / "serialize.lock").stat().st_mode & 0o077 == 0


async def test_a_prepare_that_cannot_take_the_lock_fails_its_claims_with_the_reason(
    tmp_path: Path,
) -> None:
    api = ClaimsApi()
    backend = simulated.SimulatedBackend(simulated.parse_profile(PROFILE), NODE)
    (tmp_path / "not-a-dir").write_text("")
    state = rig.device_state(
        tmp_path, backend, api, serialize_lock=tmp_path / "not-a-dir" / "serialize.lock"
    )
    ref = gpu(api, "one", "gpu-0")
    failed = (await state.prepare_all([ref]))[ref.uid]
    assert not isinstance(failed, Prepared)
    assert "could not take the serialize lock" in failed.message
