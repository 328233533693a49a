"""One writer per pool (``agent.contention``), in simulated time: two agents of one driver on one
node, each checking the pool when the other writes it (its watch) and every resync, as the
publisher does. No clock, no API: the pool is a generation and the publisher of its slices."""

from __future__ import annotations

import dataclasses
import datetime
import heapq

import pytest

from dra_gpu.agent.contention import Contention
from dra_gpu.agent.slices import Publisher, publisher_of

NODE = "node-01"
DRIVER = "gpu.example.com"
T0 = datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC)
WATCH_DELAY = 0.02
RESYNC = 30.0


@dataclasses.dataclass
class Pool:
    generation: int = 0
    publisher: Publisher | None = None
    writes: list[tuple[float, str]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Agent:
    name: str
    registered_after: float
    """Seconds after T0 at which the kubelet registered it."""
    signs: bool = True
    """False: an agent that neither signs its slices nor backs off (an old dra-gpu)."""
    stopped_at: float = float("inf")

    def __post_init__(self) -> None:
        registered = T0 + datetime.timedelta(seconds=self.registered_after)
        self.me = Publisher.at(registered, self.name)
        self.contention = Contention(pool=NODE, driver=DRIVER)
        self.reports: list[str] = []
        self.log: list[str] = []

    def check(self, pool: Pool, now: float) -> float | None:
        """One publish_once (the two agents publish different devices, so the pool always
        needs a write unless it is ours). Returns when to check again, if sooner than a
        resync."""
        if pool.publisher == self.me or (not self.signs and pool.publisher is None and pool.writes):
            if (line := self.contention.settled(now)) is not None:
                self.log.append(line)
            return None
        if self.signs and pool.writes:
            decision = self.contention.foreign(pool.publisher, self.me, pool.generation, now)
            if decision.report is not None:
                self.reports.append(decision.report)
            if decision.wait > 0:
                return now + decision.wait
        pool.generation += 1
        pool.publisher = self.me if self.signs else None
        pool.writes.append((now, self.name))
        self.contention.wrote(now)
        return None


def simulate(agents: list[Agent], until: float) -> Pool:
    pool = Pool()
    queue: list[tuple[float, int, str]] = []
    sequence = 0

    def at(when: float, name: str) -> None:
        nonlocal sequence
        sequence += 1
        heapq.heappush(queue, (when, sequence, name))

    by_name = {a.name: a for a in agents}
    for agent in agents:
        at(agent.registered_after, agent.name)
    while queue:
        now, _, name = heapq.heappop(queue)
        agent = by_name[name]
        if now > until or now >= agent.stopped_at or now < agent.registered_after:
            continue
        before = pool.generation
        again = agent.check(pool, now)
        if pool.generation != before:  # every agent's watch sees the write, the writer's too
            for other in agents:
                at(now + WATCH_DELAY, other.name)
        at(min(again or now + RESYNC, now + RESYNC), name)
    return pool


def writes_between(pool: Pool, start: float, end: float) -> int:
    return sum(1 for when, _ in pool.writes if start <= when < end)


def test_the_agent_registered_last_keeps_the_pool_and_the_other_backs_off() -> None:
    old, new = Agent("agent-old", 0.0), Agent("agent-new", 10.0)
    pool = simulate([old, new], until=1800.0)

    assert pool.publisher == new.me
    assert old.contention.yielding
    assert not new.contention.yielding
    # Not a hot loop: a handful of generations in the first minute, then ever fewer.
    assert writes_between(pool, 10.0, 70.0) <= 8
    assert writes_between(pool, 1200.0, 1800.0) <= 6
    assert pool.generation < 40
    # Both say why, once.
    assert len(old.reports) == 1
    assert "backs off" in old.reports[0]
    assert "agent-new" in old.reports[0]
    assert "agent-old" in old.reports[0]
    assert len(new.reports) == 1
    assert "keeps publishing" in new.reports[0]


def test_the_yielding_agent_takes_over_once_the_other_stops() -> None:
    old, new = Agent("agent-old", 0.0), Agent("agent-new", 10.0, stopped_at=120.0)
    pool = simulate([old, new], until=1000.0)

    assert pool.publisher == old.me
    assert not old.contention.yielding
    assert any("took it over from agent-new" in line for line in old.log)
    # Within the back-off it had reached by then, not at once.
    (last_write,) = [when for when, name in pool.writes if name == "agent-old"][-1:]
    assert 120.0 < last_write <= 120.0 + 320.0


def test_an_agent_that_never_backs_off_gets_answers_ever_more_slowly() -> None:
    fighter = Agent("old-dra-gpu", 0.0, signs=False)
    ours = Agent("agent-new", 10.0)
    pool = simulate([fighter, ours], until=1800.0)

    # The fighter answers every write of ours at once; ours come ever more slowly.
    assert writes_between(pool, 10.0, 70.0) <= 12
    assert writes_between(pool, 1200.0, 1800.0) <= 6
    assert len(ours.reports) == 1
    assert "does not say which" in ours.reports[0]


def test_a_predecessors_pool_is_replaced_at_once_without_a_conflict() -> None:
    contention = Contention(pool=NODE, driver=DRIVER)
    me = Publisher.at(T0, "agent-b")
    predecessor = Publisher.at(T0 - datetime.timedelta(hours=1), "agent-a")

    decision = contention.foreign(predecessor, me, generation=7, now=0.0)

    assert (decision.wait, decision.conflict, decision.report) == (0.0, False, None)


def test_a_pool_signed_by_a_later_registration_is_left_alone_even_before_our_first_write() -> None:
    contention = Contention(pool=NODE, driver=DRIVER, initial_seconds=5.0)
    me = Publisher.at(T0, "agent-a")
    later = Publisher.at(T0 + datetime.timedelta(seconds=1), "agent-b")

    first = contention.foreign(later, me, generation=3, now=100.0)
    again = contention.foreign(later, me, generation=3, now=102.0)
    attempt = contention.foreign(later, me, generation=3, now=105.0)

    assert (first.wait, first.conflict) == (5.0, True)
    assert first.report is not None
    assert again.report is None
    assert again.wait == 3.0
    assert attempt.wait == 0.0  # the try: if it still writes, the next wait is 10 s
    assert contention.foreign(later, me, generation=5, now=105.1).wait == pytest.approx(9.9)


def test_publishers_order_by_registration_then_instance_and_survive_the_annotation() -> None:
    a = Publisher.at(T0, "pod-a.1234")
    b = Publisher.at(T0 + datetime.timedelta(microseconds=1), "pod-a.0000")
    assert a < b
    assert Publisher.at(T0, "x") < Publisher.at(T0, "y")
    assert Publisher.parse(b.annotation()) == b
    for text in ("", "yesterday pod", "2025-01-01T00:00:00Z pod", b.registered):
        assert Publisher.parse(text) is None
    body = {"metadata": {"annotations": {"resource.dra-gpu.io/publisher": a.annotation()}}}
    assert publisher_of(body) == a
    assert publisher_of({"metadata": {}}) is None


def test_a_yielding_agent_registered_again_after_the_other_writes_at_once() -> None:
    contention = Contention(pool=NODE, driver=DRIVER, initial_seconds=5.0)
    before = Publisher.at(T0, "agent-a")
    other = Publisher.at(T0 + datetime.timedelta(seconds=1), "agent-b")
    contention.wrote(0.0)
    assert contention.foreign(other, before, generation=2, now=1.0).wait == 5.0

    again = Publisher.at(T0 + datetime.timedelta(seconds=3), "agent-a")  # its sockets are back

    assert contention.foreign(other, again, generation=2, now=3.0).wait == 0.0
    contention.wrote(3.0)
    assert contention.settled(4.0) is None  # our write may still be answered
    assert contention.settled(9.0) == (
        f"ResourceSlice pool {NODE} of driver {DRIVER}: took it over from agent-b, "
        "which no longer writes it"
    )
    assert not contention.yielding
