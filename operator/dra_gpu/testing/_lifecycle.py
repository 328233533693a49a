"""What every long-lived part of the kit shares: ``with part:`` starts it and stops it after."""

from __future__ import annotations

from typing import Self


class StartStop:
    """A part of the kit with ``start`` and ``stop``, usable as a context manager."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
