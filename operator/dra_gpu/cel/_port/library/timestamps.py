"""The timestamp and duration getters of cel-go's standard library: ``getFullYear``,
``getMonth``, ``getDayOfYear``, ``getDate``, ``getDayOfMonth``, ``getDayOfWeek``, ``getHours``,
``getMinutes``, ``getSeconds``, ``getMilliseconds`` (each in UTC or a given time zone, an IANA
name or a ``+hh:mm`` offset), and a duration's ``getHours`` ... ``getMilliseconds``.

Owns: ``IMPLEMENTATIONS`` of the getters.
Must not: read the machine's local time zone (a timestamp is UTC unless a zone is given).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from dra_gpu.cel._port import golang
from dra_gpu.cel._port.library import standard
from dra_gpu.cel._port.values import CelError, Duration, Timestamp

__all__ = ["IMPLEMENTATIONS"]


def _local(ts: Timestamp, tz: str | None) -> tuple[int, int]:
    """(seconds in the zone's local time, nanoseconds), as t.In(loc)."""
    seconds, nanos = divmod(ts.nanos, standard.NS)
    if tz is None:
        return seconds, nanos
    return seconds + _zone_offset(tz, seconds), nanos


def _zone_offset(tz: str, seconds: int) -> int:
    if ":" not in tz:
        import zoneinfo

        try:
            zone = zoneinfo.ZoneInfo(tz if tz else "UTC")
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise CelError(f"unknown time zone {tz}") from None
        import datetime

        try:
            moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
        except (OverflowError, OSError, ValueError):
            raise CelError(f"time zone {tz} cannot be applied to this time") from None
        offset = moment.astimezone(zone).utcoffset()
        return int(offset.total_seconds()) if offset is not None else 0
    hours_text, _, minutes_text = tz.partition(":")
    hours = golang.parse_int(hours_text)
    minutes = golang.parse_int(minutes_text)
    if hours is None or minutes is None:
        raise CelError(f'strconv.Atoi: parsing "{tz}": invalid syntax')
    minutes_east = hours * 60 - minutes if tz.startswith("-") else hours * 60 + minutes
    return minutes_east * 60


def _civil(ts: Timestamp, tz: str | None) -> tuple[Any, int, int]:
    import datetime

    local, nanos = _local(ts, tz)
    days, rest = divmod(local, 86400)
    date = datetime.date.fromordinal(days + datetime.date(1970, 1, 1).toordinal())
    return date, rest, nanos


def _timestamp_getter(part: str) -> Callable[..., int]:
    def get(ts: Timestamp, tz: str | None = None) -> int:
        date, rest, nanos = _civil(ts, tz)
        if part == "year":
            return int(date.year)
        if part == "month":
            return int(date.month) - 1
        if part == "dayOfYear":
            return int(date.timetuple().tm_yday) - 1
        if part == "dayOfMonth":
            return int(date.day) - 1
        if part == "date":
            return int(date.day)
        if part == "dayOfWeek":
            return (int(date.weekday()) + 1) % 7
        if part == "hours":
            return rest // 3600
        if part == "minutes":
            return rest % 3600 // 60
        if part == "seconds":
            return rest % 60
        return nanos // 1_000_000

    return get


def _duration_getter(unit: int) -> Callable[[Duration], int]:
    def get(d: Duration) -> int:
        if unit == standard.NS:
            return standard.trunc_div(d.nanos, standard.NS)  # Seconds() truncated by Int()
        if unit == 1_000_000:
            return standard.trunc_div(d.nanos, unit)  # Milliseconds(): integer division
        # Hours()/Minutes() are float64 values truncated by types.Int
        whole = standard.trunc_div(d.nanos, unit)
        rest = d.nanos - whole * unit
        return int(float(whole) + float(rest) / unit)

    return get


def _implementations() -> dict[str, Callable[..., Any]]:
    impl: dict[str, Callable[..., Any]] = {
        "duration_to_hours": _duration_getter(3_600_000_000_000),
        "duration_to_minutes": _duration_getter(60_000_000_000),
        "duration_to_seconds": _duration_getter(standard.NS),
        "duration_to_milliseconds": _duration_getter(1_000_000),
    }
    for getter, part in (
        ("year", "year"), ("month", "month"), ("day_of_year", "dayOfYear"),
        ("day_of_month", "dayOfMonth"), ("day_of_month_1_based", "date"),
        ("day_of_week", "dayOfWeek"), ("hours", "hours"), ("minutes", "minutes"),
        ("seconds", "seconds"), ("milliseconds", "milliseconds"),
    ):  # fmt: skip
        impl[f"timestamp_to_{getter}"] = _timestamp_getter(part)
        impl[f"timestamp_to_{getter}_with_tz"] = _timestamp_getter(part)
    impl["timestamp_to_day_of_month_zero_based"] = _timestamp_getter("dayOfMonth")
    impl["timestamp_to_seconds_tz"] = _timestamp_getter("seconds")
    return impl


IMPLEMENTATIONS: Final = _implementations()
