"""The daemons and GPU settings that make a shared GPU shared: MPS and time-slicing.

It owns, per shared GPU the node's recorded claims hold shares of, what the sharing mode needs
while any share is prepared, and nothing once the last one is gone:

- MPS: one control daemon per GPU (``nvidia-cuda-mps-control -d`` with ``CUDA_VISIBLE_DEVICES``
  of that GPU), started before the first share's spec is written and stopped (``quit``) after
  the last share's unprepare; the GPU set to ``EXCLUSIVE_PROCESS`` while it runs (one process
  may open the GPU: the MPS server, through which every client runs) and back to ``DEFAULT``
  after. Its pipe and log directories are ``<state dir>/<gpu>/pipe`` and ``log``; a share's
  containers get the pipe directory at ``/tmp/nvidia-mps`` (``CUDA_MPS_PIPE_DIRECTORY``) and the
  daemon's ``/dev/shm`` at theirs, through the claim's CDI spec, as NVIDIA's DRA driver mounts
  them (``sharing.go``, ``GetCDIContainerEdits``).
- TimeSlicing: the GPU's time-slice, when the policy names one (``timeSlice``), set with
  ``nvidia-smi compute-policy --set-timeslice`` for the first share and set back to
  ``Default`` after the last (NVIDIA's ``TimeSlicingManager``).

One daemon per GPU, not NVIDIA's one per claim: NVIDIA's claim holds its GPUs whole and the
pods sharing the claim share the daemon; here each share is a claim of its own, and a GPU in
``EXCLUSIVE_PROCESS`` mode admits one MPS server, so all shares of a GPU must reach the same
control daemon. So a container reaches one daemon (one pipe directory), and a claim with MPS
shares of two GPUs is refused.

What MPS enforces here: the daemon's ``set_default_device_pinned_mem_limit <uuid> <MiB>M`` (the
policy's default share) and ``set_default_active_thread_percentage`` (``activeThreadPercentage``)
apply to every client of the GPU's MPS server; a share's own limit is its client environment
(``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``, ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``, from
``claims.share_env``), which MPS applies per client process. The server cannot tell shares
apart otherwise: a process that rewrites its own environment before CUDA starts can change
its limit; MPS has no per-client limit a client cannot set itself.

Lifecycle across restarts: the daemon runs in its own session (``-d`` forks into the
background), so it outlives an agent process; its pid is the daemon's own pid file in the pipe
directory (``nvidia-cuda-mps-control.pid``). At start (``sync`` from ``recover``) a daemon whose
pid is alive and whose ``/proc/<pid>/cmdline`` is the daemon's is adopted; a GPU whose daemon
is gone (a crash, a reboot, an agent container's restart: a container's processes die with it)
has its leftovers (pipes, pid file) removed and the daemon started again if recorded shares
still need it; a GPU no recorded share needs is put back as it was. What was set is recorded in
``<state dir>/<gpu>/state.json``, so the undo survives a restart too.

Process and file I/O, all of it in worker threads; one lock orders starts and stops.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from dra_gpu.agent import files
from dra_gpu.devices import edits, model

log = logging.getLogger(__name__)

PIPE_IN_CONTAINER = "/tmp/nvidia-mps"
"""Where a share's containers find the daemon's pipe directory (NVIDIA's DRA driver's path)."""
SHM_IN_CONTAINER = "/dev/shm"
PID_FILE = "nvidia-cuda-mps-control.pid"
"""The control daemon writes its pid here, in its pipe directory (MPS documentation)."""
STATE_FILE = "state.json"
START_SECONDS = 10.0
"""How long a daemon has to write its pid file, and a control command to answer."""
STOP_SECONDS = 10.0
"""How long a daemon has to exit after ``quit`` before it gets SIGTERM (then SIGKILL)."""
_MIB = 2**20


class MpsError(ValueError):
    """A share that cannot be given its sharing: the message names the GPU and what failed."""


@runtime_checkable
class GpuControls(Protocol):
    """A backend capability: the GPU settings sharing needs (``isinstance`` tells)."""

    async def set_compute_mode(self, device: str, uuid: str, exclusive: bool) -> None:
        """``EXCLUSIVE_PROCESS`` or ``DEFAULT`` for GPU ``device`` (``gpu-0``) with ``uuid``."""
        ...

    async def set_time_slice(self, device: str, uuid: str, time_slice: str) -> None:
        """The GPU's time-slice, one of ``model.TIME_SLICES``."""
        ...


@dataclasses.dataclass(frozen=True)
class SharedGpu:
    """A GPU that prepared shares hold, as the inventory has it."""

    device: str
    uuid: str
    sharing: model.Sharing

    @classmethod
    def of(cls, device: model.Device) -> SharedGpu:
        assert device.sharing is not None
        return cls(device.name, device.uuid, device.sharing)


class Sharing:
    """Per shared GPU, the daemon and settings its mode needs (module docstring).

    ``hold`` before a share's spec is written (what the claim's containers get back),
    ``release`` once the checkpoint records the claim or its prepare failed, ``sync`` with the
    GPUs recorded claims hold shares of, after an unprepare and at start.
    """

    def __init__(
        self,
        state_dir: Path,
        control: Sequence[str],
        controls: GpuControls | None = None,
        *,
        shm_dir: Path = Path("/dev/shm"),
    ) -> None:
        self.state_dir = state_dir
        self.control = tuple(control)
        """The control daemon's argv: ``nvidia-cuda-mps-control`` or the stand-in's."""
        self.controls = controls
        self.shm_dir = shm_dir
        self._holds: dict[str, tuple[SharedGpu, ...]] = {}
        self._lock = asyncio.Lock()

    # ---- the state's calls ---------------------------------------------------------------

    async def hold(self, uid: str, shares: Sequence[SharedGpu]) -> edits.Edits:
        """Make the GPUs of a claim's ``shares`` shared (start what is not running) and say what
        its containers get: for MPS the pipe directory and ``/dev/shm`` mounts and
        ``CUDA_MPS_PIPE_DIRECTORY``. Raises ``MpsError``."""
        mps = sorted({s.device for s in shares if s.sharing.mode == "MPS"})
        if len(mps) > 1:
            raise MpsError(
                f"it holds MPS shares of {' and '.join(mps)}; a container reaches one MPS "
                "control daemon and this driver runs one per GPU: claim MPS shares of one GPU"
            )
        self._holds[uid] = tuple(shares)
        try:
            async with self._lock:
                for gpu in {s.device: s for s in shares}.values():
                    await self._ensure(gpu)
        except Exception:
            self._holds.pop(uid, None)
            raise
        if not mps:
            return edits.Edits()
        return edits.Edits(
            {"CUDA_MPS_PIPE_DIRECTORY": PIPE_IN_CONTAINER},
            mounts=(
                edits.Mount(str(self.pipe_dir(mps[0])), PIPE_IN_CONTAINER),
                edits.Mount(str(self.shm_dir), SHM_IN_CONTAINER),
            ),
        )

    def release(self, uid: str) -> None:
        """The claim's prepare is over: recorded (``sync`` sees it) or failed."""
        self._holds.pop(uid, None)

    async def sync(self, recorded: Sequence[SharedGpu]) -> list[str]:
        """Start what the GPUs of ``recorded`` (and prepares under way) need, adopt what runs,
        clean up after crashed daemons, and stop and undo everything else; what it did."""
        async with self._lock:
            wanted = {g.device: g for g in recorded}
            for shares in self._holds.values():
                wanted.update({g.device: g for g in shares})
            done: list[str] = []
            for device in await asyncio.to_thread(self._known):
                if device not in wanted:
                    done.extend(await self._undo(device))
            for gpu in wanted.values():
                done.extend(await self._ensure(gpu))
            return done

    # ---- paths and records ---------------------------------------------------------------

    def gpu_dir(self, device: str) -> Path:
        return self.state_dir / device

    def pipe_dir(self, device: str) -> Path:
        return self.gpu_dir(device) / "pipe"

    def log_dir(self, device: str) -> Path:
        return self.gpu_dir(device) / "log"

    def _known(self) -> list[str]:
        try:
            return sorted(p.name for p in self.state_dir.iterdir() if p.is_dir())
        except FileNotFoundError:
            return []

    def _read_state(self, device: str) -> dict[str, Any]:
        path = self.gpu_dir(device) / STATE_FILE
        try:
            body = json.loads(path.read_bytes())
        except FileNotFoundError:
            return {}
        except ValueError:
            log.warning("%s is not JSON: taken as nothing set", path)
            return {}
        return body if isinstance(body, dict) else {}

    def _write_state(self, device: str, state: Mapping[str, Any]) -> None:
        directory = self.gpu_dir(device)
        directory.mkdir(parents=True, exist_ok=True)
        files.atomic_write(directory / STATE_FILE, json.dumps(dict(state)).encode(), mode=0o644)

    # ---- ensure and undo -----------------------------------------------------------------

    async def _ensure(self, gpu: SharedGpu) -> list[str]:
        """What ``gpu``'s mode needs, made so (idempotent); what it changed."""
        state = await asyncio.to_thread(self._read_state, gpu.device)
        done: list[str] = []
        if gpu.sharing.mode == "MPS":
            if state.get("timeSlice") is not None:  # it was time-sliced before: undo that
                done.extend(await self._undo(gpu.device))
                state = {}
            pid = await asyncio.to_thread(self._running, gpu.device)
            if pid is not None:
                return done
            if await asyncio.to_thread(self._clean_leftovers, gpu.device):
                done.append(f"cleaned up after the MPS daemon of {gpu.device}, which had died")
            state = {**state, "uuid": gpu.uuid, "mode": "MPS"}
            if not state.get("exclusive") and self.controls is not None:
                await self._set_compute_mode(gpu.device, gpu.uuid, exclusive=True)
                state["exclusive"] = True
                await asyncio.to_thread(self._write_state, gpu.device, state)
            pid = await asyncio.to_thread(self._start_blocking, gpu)
            state["pid"] = pid
            await asyncio.to_thread(self._write_state, gpu.device, state)
            log.info("started the MPS control daemon of %s (%s): pid %d", gpu.device, gpu.uuid, pid)
            done.append(f"started the MPS control daemon of {gpu.device} (pid {pid})")
            return done
        wanted = gpu.sharing.time_slice
        if state.get("mode") == "MPS":  # it was under MPS before
            done.extend(await self._undo(gpu.device))
            state = {}
        if wanted is None or state.get("timeSlice") == wanted:
            return done
        if self.controls is None:
            raise MpsError(f"{gpu.device}: this node's backend cannot set a GPU's time-slice")
        state = {**state, "uuid": gpu.uuid, "mode": "TimeSlicing", "timeSlice": wanted}
        await asyncio.to_thread(self._write_state, gpu.device, state)  # first: undo needs it
        try:
            await self.controls.set_time_slice(gpu.device, gpu.uuid, wanted)
        except Exception as exc:
            raise MpsError(f"{gpu.device}: setting its time-slice to {wanted}: {exc}") from None
        done.append(f"set the time-slice of {gpu.device} to {wanted}")
        return done

    async def _undo(self, device: str) -> list[str]:
        """Stop ``device``'s daemon, put its settings back, forget it."""
        state = await asyncio.to_thread(self._read_state, device)
        uuid = str(state.get("uuid", ""))
        done: list[str] = []
        if state.get("mode") == "MPS" or (self.pipe_dir(device) / PID_FILE).exists():
            pid = await asyncio.to_thread(self._stop_blocking, device)
            if pid is not None:
                done.append(f"stopped the MPS control daemon of {device} (pid {pid})")
        if state.get("exclusive") and self.controls is not None:
            await self._set_compute_mode(device, uuid, exclusive=False)
        if state.get("timeSlice") not in (None, "Default") and self.controls is not None:
            try:
                await self.controls.set_time_slice(device, uuid, "Default")
            except Exception as exc:
                raise MpsError(f"{device}: setting its time-slice back to Default: {exc}") from None
            done.append(f"set the time-slice of {device} back to Default")
        await asyncio.to_thread(shutil.rmtree, self.gpu_dir(device), True)
        return done

    async def _set_compute_mode(self, device: str, uuid: str, *, exclusive: bool) -> None:
        assert self.controls is not None
        mode = "EXCLUSIVE_PROCESS" if exclusive else "DEFAULT"
        try:
            await self.controls.set_compute_mode(device, uuid, exclusive)
        except Exception as exc:
            raise MpsError(f"{device}: setting its compute mode to {mode}: {exc}") from None

    # ---- the daemon (blocking: worker threads) -------------------------------------------

    def _env(self, device: str, uuid: str) -> dict[str, str]:
        return {
            **os.environ,
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir(device)),
            "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir(device)),
            "CUDA_VISIBLE_DEVICES": uuid,
        }

    def _running(self, device: str) -> int | None:
        """The pid of ``device``'s daemon if it runs (alive, not a zombie, our program)."""
        try:
            pid = int((self.pipe_dir(device) / PID_FILE).read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        return pid if is_daemon(pid, self._program) else None

    @property
    def _program(self) -> str:
        return Path(self.control[-1]).name

    def _clean_leftovers(self, device: str) -> bool:
        """Remove a dead daemon's pipes and pid file; True if there were any."""
        pipe = self.pipe_dir(device)
        try:
            leftovers = list(pipe.iterdir())
        except FileNotFoundError:
            return False
        for path in leftovers:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        return bool(leftovers)

    def _start_blocking(self, gpu: SharedGpu) -> int:
        for path in (self.pipe_dir(gpu.device), self.log_dir(gpu.device)):
            path.mkdir(parents=True, exist_ok=True)
        env = self._env(gpu.device, gpu.uuid)
        argv = [*self.control, "-d"]
        output = self.log_dir(gpu.device) / "start.log"
        # Not pipes: the daemon it forks could keep them open, and we would wait for it.
        try:
            with output.open("wb") as sink:
                started = subprocess.run(
                    argv,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                    timeout=START_SECONDS,
                    start_new_session=True,
                    check=False,
                )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise MpsError(f"{gpu.device}: starting {' '.join(argv)}: {exc}") from None
        if started.returncode != 0:
            said = output.read_text(errors="replace").strip()
            raise MpsError(f"{gpu.device}: {' '.join(argv)} exited {started.returncode}: {said}")
        deadline = time.monotonic() + START_SECONDS
        while (pid := self._running(gpu.device)) is None:
            if time.monotonic() > deadline:
                raise MpsError(
                    f"{gpu.device}: the MPS control daemon wrote no pid file in "
                    f"{self.pipe_dir(gpu.device)} within {START_SECONDS:g}s"
                )
            time.sleep(0.05)
        commands = [
            f"set_default_device_pinned_mem_limit {gpu.uuid} "
            f"{int(model.parse_quantity(gpu.sharing.memory.default)) // _MIB}M"
        ]
        if gpu.sharing.active_thread_percentage is not None:
            commands.append(
                f"set_default_active_thread_percentage {gpu.sharing.active_thread_percentage}"
            )
        for command in commands:
            self._command(gpu.device, gpu.uuid, command)
        return pid

    def _command(self, device: str, uuid: str, command: str) -> str:
        """Send one command to ``device``'s daemon (``echo <command> | <control>``)."""
        try:
            done = subprocess.run(
                list(self.control),
                env=self._env(device, uuid),
                input=command + "\n",
                capture_output=True,
                text=True,
                timeout=START_SECONDS,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise MpsError(f"{device}: MPS control command {command!r}: {exc}") from None
        if done.returncode != 0:
            raise MpsError(
                f"{device}: MPS control command {command!r} exited {done.returncode}: "
                f"{(done.stderr or done.stdout).strip()}"
            )
        return done.stdout

    def _stop_blocking(self, device: str) -> int | None:
        """``quit`` to ``device``'s daemon, then signals; the pid it had, None if none ran."""
        pid = self._running(device)
        if pid is None:
            self._clean_leftovers(device)
            return None
        uuid = str(self._read_state(device).get("uuid", ""))
        try:
            self._command(device, uuid, "quit")
        except MpsError as exc:
            log.warning("%s; signalling it instead", exc)
        for sig in (None, signal.SIGTERM, signal.SIGKILL):
            if sig is not None:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    break
            deadline = time.monotonic() + STOP_SECONDS
            while is_daemon(pid, self._program) and time.monotonic() < deadline:
                time.sleep(0.05)
            if not is_daemon(pid, self._program):
                break
        self._clean_leftovers(device)
        return pid


def is_daemon(pid: int, program: str) -> bool:
    """Whether process ``pid`` is alive (not a zombie) and runs ``program`` (its command line
    names it): a recycled pid is someone else's."""
    proc = Path(f"/proc/{pid}")
    try:
        cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        stat = (proc / "stat").read_text()
    except OSError:
        return False
    if stat.rpartition(")")[2].split()[:1] == ["Z"]:
        return False
    return any(Path(arg.decode(errors="replace")).name == program for arg in cmdline if arg)
