"""Leader failover with renewals blocked, on the real control plane: two controller replicas
(``ControllerProcess``, as the chart runs them) share a Lease of 3 s; each reaches the API
server through a TCP forwarder of this test's (``Forwarder``), which it can pause: the bytes
stop both ways, the connections stay open, every request of that replica hangs, as on a
network partition or a stalled node. The leader's is paused; it must stop leading within its
renew deadline (2 s of the last renewal), before the standby may take over (3 s after it saw
that renewal). Twenty failovers, alternating which replica is paused: each one's times are
printed (from the replicas' ``dra_gpu_controller_leader``, sampled every 50 ms, and from the
electors' own log lines), and no sample may find both leading.

Measured and printed, not asserted as times; asserted: 0 overlaps.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import json
import re
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

from dra_gpu import kube
from dra_gpu.testing import ControllerProcess, ControlPlane, eventually

LEASES = "/apis/coordination.k8s.io/v1/namespaces/default/leases"
LEASE_SECONDS = 3
ROUNDS = 20
SAMPLE_SECONDS = 0.05
LOG_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO dra_gpu\.controller\.leader: "
    r"(\S+) (acquired|lost) the lease ([^\s:]+)"
)


class Forwarder:
    """127.0.0.1:``port`` spliced to ``host:target``, byte for byte (TLS passes through, so
    the API server's certificate must name 127.0.0.1: it does). ``pause`` holds every byte,
    both ways, without closing anything; ``resume`` lets them go on."""

    def __init__(self, host: str, target: int) -> None:
        self.host = host
        self.target = target
        self.port = 0
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server: asyncio.Server | None = None
        self._pumps: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> Forwarder:
        self._server = await asyncio.start_server(self._connected, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for pump in self._pumps:
            pump.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)
        await self._server.wait_closed()

    def pause(self) -> None:
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.target)
        except OSError:
            writer.close()
            return
        pumps = [
            asyncio.create_task(self._pump(reader, up_writer)),
            asyncio.create_task(self._pump(up_reader, writer)),
        ]
        self._pumps.update(pumps)
        try:
            await asyncio.gather(*pumps, return_exceptions=True)
        finally:
            self._pumps.difference_update(pumps)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                await self._flowing.wait()  # paused: held here, the connection left open
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()


def kubeconfig_through(control_plane: ControlPlane, forwarder: Forwarder, path: Path) -> Path:
    """The control plane's kubeconfig (its CA, its admin token), its server the forwarder."""
    config = json.loads(control_plane.kubeconfig.read_text())
    for cluster in config["clusters"]:
        cluster["cluster"]["server"] = f"https://127.0.0.1:{forwarder.port}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config, indent=2))
    path.chmod(0o600)
    return path


async def leads(replica: ControllerProcess) -> bool:
    """Off the event loop: the forwarders run on it."""
    return await asyncio.to_thread(replica.leads)


def lease_reads(replica: ControllerProcess) -> float:
    """The replica's GETs answered 200 so far (its elector reads the Lease every second)."""
    wanted = ("dra_gpu_api_requests_total{", 'verb="GET"', 'code="200"')
    for line in replica.metrics("dra_gpu_api_requests_total").splitlines():
        labels = line.partition("}")[0]
        if labels.startswith(wanted[0]) and all(part in labels for part in wanted[1:]):
            return float(line.split()[-1])
    return 0.0


def elector_log(replica: ControllerProcess, lease: str, since: float) -> list[tuple[float, str]]:
    """``(epoch seconds, "acquired" | "lost")`` of the elector's lines after ``since``."""
    found = []
    for line in replica.log_file.read_text(errors="replace").splitlines():
        match = LOG_LINE.match(line)
        if match is None or match[2] != replica.identity or match[4] != lease:
            continue
        moment = datetime.datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if moment >= since:
            found.append((moment, match[3]))
    return found


@dataclasses.dataclass
class Failover:
    stopped: float
    """Seconds after the pause: the first sample with the old leader's metric at 0."""
    taken: float
    """Seconds after the pause: the first sample with the new leader's metric at 1."""
    overlaps: int
    """Samples in which both said they lead."""
    logged_gap: float | None
    """The new leader's "acquired" minus the old one's "lost" (their log lines), seconds."""


@contextlib.asynccontextmanager
async def replicas(
    control_plane: ControlPlane, tmp_path: Path, lease: str
) -> AsyncIterator[dict[str, tuple[ControllerProcess, Forwarder]]]:
    apiserver = urlsplit(control_plane.server)
    assert apiserver.hostname is not None
    assert apiserver.port is not None
    async with (
        Forwarder(apiserver.hostname, apiserver.port) as to_a,
        Forwarder(apiserver.hostname, apiserver.port) as to_b,
    ):
        started: dict[str, tuple[ControllerProcess, Forwarder]] = {}
        try:
            for name, forwarder in (("failover-a", to_a), ("failover-b", to_b)):
                state = tmp_path / name
                replica = ControllerProcess(
                    name,
                    kubeconfig_through(control_plane, forwarder, state / "kubeconfig"),
                    state,
                    lease_seconds=LEASE_SECONDS,
                    resync_seconds=30,
                    extra_args=(f"--lease-name={lease}",),
                )
                started[name] = (replica, forwarder)
                await replica.astart()
            yield started
        finally:
            to_a.resume()
            to_b.resume()
            for replica, _forwarder in started.values():
                await asyncio.to_thread(replica.stop)


async def failover(
    old: ControllerProcess, new: ControllerProcess, pause: Forwarder, lease: str
) -> Failover:
    """Pause ``old``'s traffic; sample both until ``new`` leads."""
    loop = asyncio.get_running_loop()
    paused_at, paused_wall = loop.time(), time.time()
    pause.pause()
    stopped: float | None = None
    taken: float | None = None
    overlaps = 0
    async with asyncio.timeout(6 * LEASE_SECONDS):
        while taken is None:
            old_leads, new_leads = await asyncio.gather(leads(old), leads(new))
            now = loop.time() - paused_at
            if old_leads and new_leads:
                overlaps += 1
            if stopped is None and not old_leads:
                stopped = now
            if new_leads:
                taken = now
            await asyncio.sleep(SAMPLE_SECONDS)
    assert stopped is not None
    lost = [t for t, what in elector_log(old, lease, paused_wall) if what == "lost"]
    acquired = [t for t, what in elector_log(new, lease, paused_wall) if what == "acquired"]
    gap = acquired[0] - lost[0] if lost and acquired else None
    return Failover(stopped, taken, overlaps, gap)


async def healthy_standby(replica: ControllerProcess, api: kube.Kube, lease: str) -> None:
    """Its requests answered again (it read the Lease since), and it does not lead."""
    before = await asyncio.to_thread(lease_reads, replica)

    async def standing_by() -> bool:
        reads = await asyncio.to_thread(lease_reads, replica)
        return reads > before + 1 and not await leads(replica)

    await eventually(standing_by, timeout=30, interval=0.2, what=f"{replica.identity} stands by")
    holder = (await api.get(f"{LEASES}/{lease}"))["spec"]["holderIdentity"]
    assert holder != replica.identity


async def test_twenty_failovers_with_the_leaders_requests_hanging_never_two_leaders(
    control_plane: ControlPlane, api: kube.Kube, tmp_path: Path
) -> None:
    lease = f"failover-{secrets.token_hex(3)}"
    results: list[Failover] = []
    try:
        async with replicas(control_plane, tmp_path, lease) as by_name:

            async def current_leader() -> str | None:
                for name, (replica, _forwarder) in by_name.items():
                    if await leads(replica):
                        return name
                return None

            first = await eventually(current_leader, timeout=30, interval=0.2, what="a leader")
            names = [first, *(n for n in by_name if n != first)]
            await healthy_standby(by_name[names[1]][0], api, lease)
            for index in range(ROUNDS):
                old, new = by_name[names[index % 2]], by_name[names[(index + 1) % 2]]
                result = await failover(old[0], new[0], old[1], lease)
                results.append(result)
                gap = "?" if result.logged_gap is None else f"{result.logged_gap:+.3f} s"
                print(
                    f"FAILOVER {index + 1}: {old[0].identity} paused; stopped at "
                    f"+{result.stopped:.2f} s, {new[0].identity} took over at "
                    f"+{result.taken:.2f} s; overlapping samples {result.overlaps}; "
                    f"logged lost -> acquired {gap}"
                )
                old[1].resume()
                await healthy_standby(old[0], api, lease)
    finally:
        with contextlib.suppress(kube.ApiError):
            await api.delete(f"{LEASES}/{lease}")
    overlaps = sum(r.overlaps for r in results)
    gaps = [r.taken - r.stopped for r in results]
    logged = [r.logged_gap for r in results if r.logged_gap is not None]
    print(
        f"FAILOVERS: {len(results)}, overlapping samples {overlaps}; old leader stopped "
        f"+{min(r.stopped for r in results):.2f}..+{max(r.stopped for r in results):.2f} s "
        f"after the pause (renew deadline {LEASE_SECONDS * 2 / 3:g} s of its last renewal), "
        f"new one {min(gaps):.2f}..{max(gaps):.2f} s after that (metrics, 50 ms samples); "
        f"logged lost -> acquired {min(logged, default=0):+.3f}..{max(logged, default=0):+.3f} s "
        f"({len(logged)} of {len(results)} rounds logged)"
    )
    assert overlaps == 0
    assert all(gap > 0 for gap in logged), logged
