"""Run a command that dies with its parent: ``python _pdeathsig.py PARENT_PID CMD [ARG...]``.

Test processes (control plane, agents) must not outlive a killed test run. The kernel's
parent-death signal does that, but setting it from ``subprocess``'s ``preexec_fn`` runs Python
in the forked child of a process that has gRPC threads, which can crash there. So the parent
starts this small script instead (run by path, importing nothing of ours): it sets the signal,
checks that the parent is still the one that started it, and replaces itself with the command
(the signal survives ``exec``).
"""

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def main() -> None:
    parent, argv = int(sys.argv[1]), sys.argv[2:]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        sys.exit(f"prctl(PR_SET_PDEATHSIG) failed: errno {ctypes.get_errno()}")
    if os.getppid() != parent:  # the parent died before the signal was armed
        sys.exit(0)
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main()
