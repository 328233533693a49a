"""The agent gives a burst's memory back once the burst is over (``agent.memory``), measured in a
fresh interpreter: a burst that leaves its heap fragmented (one small object in twenty kept,
as calls that leave a record behind do) would otherwise stay resident."""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHECK = textwrap.dedent(
    """
    import asyncio
    from dra_gpu.agent import memory

    async def main():
        trimmer = asyncio.create_task(memory.trim_after_bursts(period=0.05))
        await asyncio.sleep(0.1)
        burst = [bytearray(1000) for _ in range(60_000)]
        kept = burst[::20]
        del burst
        grown = memory.resident_mib()
        for _ in range(40):
            await asyncio.sleep(0.05)
            if grown - memory.resident_mib() > 30:
                break
        trimmer.cancel()
        print(f"{grown - memory.resident_mib():.1f} {len(kept)}")

    asyncio.run(main())
    """
)


def test_memory_of_a_burst_is_given_back_once_it_is_over() -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    given_back, kept = float(out[0]), int(out[1])
    assert kept == 3_000
    assert given_back > 30, f"only {given_back} MiB of a ~60 MiB burst given back"


def test_without_a_burst_nothing_is_collected() -> None:
    script = textwrap.dedent(
        """
        import asyncio, gc
        from dra_gpu.agent import memory

        async def main():
            before = gc.get_stats()[2]["collections"]
            trimmer = asyncio.create_task(memory.trim_after_bursts(period=0.01))
            await asyncio.sleep(0.3)
            trimmer.cancel()
            print(gc.get_stats()[2]["collections"] - before)

        asyncio.run(main())
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == ["0"]
