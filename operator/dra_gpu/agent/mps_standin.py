"""A stand-in for ``nvidia-cuda-mps-control``, for the simulated backend (no GPU, no MPS).

It goes through the lifecycle the agent gives the real daemon (``agent.mps``), with the same
interface, so tests on real nodes exercise that lifecycle:

- ``python -m dra_gpu.agent.mps_standin -d``: start the daemon in the background (own session)
  and return; it writes its pid to ``$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid``, as
  the real one does, listens on ``$CUDA_MPS_PIPE_DIRECTORY/control`` (a unix socket) and logs to
  ``$CUDA_MPS_LOG_DIRECTORY/control.log``.
- ``python -m dra_gpu.agent.mps_standin`` with commands on stdin (``echo quit | ...``): sends
  each to the daemon and prints its answer; exits 1 if no daemon answers.

It keeps what it would enforce in ``$CUDA_MPS_PIPE_DIRECTORY/dra-gpu-standin.json``, which a
share's container reads through the mounted pipe directory: its pid, the GPU it serves
(``CUDA_VISIBLE_DEVICES``), the default pinned-memory limit per GPU and the default active
thread percentage it was told. Commands: ``set_default_device_pinned_mem_limit <dev> <value>``,
``set_default_active_thread_percentage <n>``, ``get_default_device_pinned_mem_limit <dev>``,
``get_default_active_thread_percentage``, ``quit``. It exits on ``quit`` and on SIGTERM,
removing its socket, pid file and state file (as the real daemon removes its pipes).

Standard library only, so it starts fast and imports nothing of the agent.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

PID_FILE = "nvidia-cuda-mps-control.pid"
SOCKET = "control"
STATE = "dra-gpu-standin.json"


def _pipe_dir() -> Path:
    return Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"))


def _log_dir() -> Path:
    return Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps"))


def _write_state(pipe: Path, state: dict[str, Any]) -> None:
    temp = pipe / f".{STATE}.tmp"
    temp.write_text(json.dumps(state, indent=1, sort_keys=True) + "\n")
    temp.chmod(0o644)
    temp.replace(pipe / STATE)


def _serve(pipe: Path, log_dir: Path) -> None:
    log = (log_dir / "control.log").open("a", buffering=1)
    state: dict[str, Any] = {
        "pid": os.getpid(),
        "visibleDevices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
        "defaultDevicePinnedMemLimit": {},
        "defaultActiveThreadPercentage": None,
        "started": time.time(),
    }
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    (pipe / SOCKET).unlink(missing_ok=True)
    os.chdir(pipe)  # bound by a relative name: a deep pipe directory passes sun_path's limit
    listener.bind(SOCKET)
    listener.listen(8)
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True
        listener.close()

    signal.signal(signal.SIGTERM, stop)
    _write_state(pipe, state)
    (pipe / PID_FILE).write_text(f"{os.getpid()}\n")
    log.write(f"[{time.ctime()}] stand-in control daemon started, pid {os.getpid()}\n")
    try:
        while not stopping:
            try:
                conn, _ = listener.accept()
            except OSError:
                break
            with conn:
                line = conn.makefile("r").readline().strip()
                log.write(f"[{time.ctime()}] {line}\n")
                answer, stopping = _answer(line, state)
                _write_state(pipe, state)
                conn.sendall(answer.encode() + b"\n")
    finally:
        for name in (SOCKET, PID_FILE, STATE):
            (pipe / name).unlink(missing_ok=True)
        log.write(f"[{time.ctime()}] stand-in control daemon exiting\n")


def _answer(line: str, state: dict[str, Any]) -> tuple[str, bool]:
    words = line.split()
    if not words:
        return "", False
    match words:
        case ["quit"]:
            return "", True
        case ["set_default_device_pinned_mem_limit", device, value]:
            state["defaultDevicePinnedMemLimit"][device] = value
            return "", False
        case ["get_default_device_pinned_mem_limit", device]:
            return str(state["defaultDevicePinnedMemLimit"].get(device, "")), False
        case ["set_default_active_thread_percentage", value] if value.isdigit():
            state["defaultActiveThreadPercentage"] = int(value)
            return value, False
        case ["get_default_active_thread_percentage"]:
            return str(state["defaultActiveThreadPercentage"] or 100), False
    return f"unknown or malformed command: {line}", False


def _daemonize() -> int:
    pipe, log_dir = _pipe_dir(), _log_dir()
    pipe.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    if os.fork() > 0:
        return 0  # the caller's process: the daemon reports itself through the pid file
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    try:
        _serve(pipe, log_dir)
    finally:
        os._exit(0)


def _client() -> int:
    path = _pipe_dir() / SOCKET
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            os.chdir(path.parent)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(10)
                conn.connect(SOCKET)
                conn.sendall(line.strip().encode() + b"\n")
                answer = conn.makefile("r").read()
        except OSError as err:
            print(f"cannot reach the MPS control daemon at {path}: {err}", file=sys.stderr)
            return 1
        sys.stdout.write(answer)
    return 0


def main(argv: list[str]) -> int:
    if argv == ["-d"]:
        return _daemonize()
    if not argv:
        return _client()
    print("usage: python -m dra_gpu.agent.mps_standin [-d]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
