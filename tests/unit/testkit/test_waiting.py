import pytest

from dra_gpu.testing import eventually


async def test_eventually_returns_the_first_truthy_value() -> None:
    calls = iter([None, 0, "found"])
    assert await eventually(lambda: next(calls), interval=0) == "found"


async def test_eventually_awaits_async_probes() -> None:
    async def probe() -> int:
        return 3

    assert await eventually(probe) == 3


async def test_eventually_times_out_naming_what_and_the_last_value() -> None:
    with pytest.raises(TimeoutError, match=r"the thing not reached within 0s; last: \[\]"):
        await eventually(lambda: [], timeout=0, interval=0, what="the thing")
