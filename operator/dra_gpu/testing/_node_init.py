"""The first process of a real node: ``python _node_init.py NODE.json``, run by ``RealNode`` as
PID 1 of its own PID, mount and network namespaces (``unshare``). Standard library only, run by
path (like ``_pdeathsig.py``).

It makes the node's view of the host (bind mounts of the node's state over ``/run``,
``/var/lib``, ``/var/log`` and the sysctl files the kubelet writes; the node's addresses on its
loopback), starts the loopback forwarders to the API server and the node's end of the API
server's egress (``_egress.py node``: the API server's dials to the kubelet and to pods arrive
there), containerd (imports the images) and the kubelet, and reaps what dies. SIGTERM stops
the kubelet, then containerd, then exits: the kernel then ends every process left in the PID
namespace (shims, containers) and the mounts and interfaces go with the namespaces. SIGHUP
restarts the kubelet (as systemd would), with the argv NODE.json holds then
(``RealNode.upgrade_kubelet`` swaps its binary).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def log(message: str) -> None:
    print(f"[node-init {time.strftime('%H:%M:%S')}] {message}", flush=True)


class Node:
    def __init__(self, spec: dict, spec_file: Path | None = None) -> None:  # type: ignore[type-arg]
        self.spec = spec
        self.spec_file = spec_file
        self.logs = Path(spec["logs"])
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self.stopping = False
        self.restart_kubelet = False

    def run(self, *argv: str) -> None:
        subprocess.run(argv, check=True, stdin=subprocess.DEVNULL)

    def spawn(self, name: str, argv: list[str], cwd: str | None = None) -> subprocess.Popen[bytes]:
        with (self.logs / f"{name}.log").open("ab") as out:
            child = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd
            )
        self.children[name] = child
        return child

    def stop(self, name: str, grace: float = 15.0) -> None:
        child = self.children.pop(name, None)
        if child is None or child.poll() is not None:
            return
        child.terminate()
        try:
            child.wait(grace)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()

    def setup(self) -> None:
        os.environ.update(self.spec["env"])
        for source, target in self.spec["binds"]:
            self.run("mount", "--bind", source, target)
        self.run("ip", "link", "set", "lo", "up")
        for address in self.spec["addresses"]:
            self.run("ip", "addr", "add", address, "dev", "lo")
        for index, (listen, connect, cwd) in enumerate(self.spec["forwards"]):
            self.spawn(f"forward-{index}", ["socat", listen, connect], cwd=cwd)
        argv, cwd = self.spec["egress"]
        self.spawn("egress", argv, cwd=cwd)

    def start_containerd(self) -> None:
        spec = self.spec["containerd"]
        containerd = self.spawn("containerd", spec["argv"])
        socket = Path(spec["socket"])
        deadline = time.monotonic() + 60
        while not socket.exists():
            if containerd.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"containerd did not start; see {self.logs}/containerd.log")
            time.sleep(0.1)
        for archive in spec["images"]:
            ctr = [spec["ctr"], "--address", str(socket), "-n", "k8s.io"]
            with (self.logs / "images.log").open("ab") as out:
                subprocess.run(
                    [*ctr, "images", "import", archive],
                    check=True,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )

    def serve(self) -> int:
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, self._on_term)
        signal.signal(signal.SIGHUP, self._on_hup)
        self.setup()
        self.start_containerd()
        self.spawn("kubelet", self.spec["kubelet"])
        log("started")
        while not self.stopping:
            if self.restart_kubelet:
                self.restart_kubelet = False
                log("restarting the kubelet")
                self.stop("kubelet")
                if self.spec_file is not None:  # its binary may have been swapped
                    self.spec["kubelet"] = json.loads(self.spec_file.read_text())["kubelet"]
                self.spawn("kubelet", self.spec["kubelet"])
            for name, child in list(self.children.items()):
                if child.poll() is not None:
                    log(f"{name} exited with {child.returncode}: stopping the node")
                    self.stopping = True
            self._reap()
            time.sleep(0.2)
        self.stop("kubelet")
        self.stop("containerd")
        for name in list(self.children):
            self.stop(name, grace=2)
        log("stopped")
        return 0

    def _reap(self) -> None:
        """PID 1 adopts every orphan of the namespace (shims, container processes)."""
        ours = {child.pid for child in self.children.values()}
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None or info.si_pid in ours:
                return  # ours are reaped by their Popen
            os.waitpid(info.si_pid, 0)

    def _on_term(self, *_: object) -> None:
        self.stopping = True

    def _on_hup(self, *_: object) -> None:
        self.restart_kubelet = True


def main() -> int:
    spec_file = Path(sys.argv[1])
    return Node(json.loads(spec_file.read_text()), spec_file).serve()


if __name__ == "__main__":
    sys.exit(main())
