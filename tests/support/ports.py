"""A port on 127.0.0.1 that is free now, for a server a test starts.

Owns: ``free_port`` (the kernel picks it: bind to port 0, read it back, close).
Must not: reserve it; the server the test starts binds it next.
"""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
