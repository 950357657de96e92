"""Start a pytest-xdist worker as a node of its own: pid 1 of a fresh PID namespace with its own /proc.

pytest-xdist runs ``python -u -c BOOTSTRAP`` for each worker; tests/conftest.py makes that
``python tests/node_worker.py -u -c BOOTSTRAP``. Run as root, this re-executes itself under
``unshare --pid --fork --mount-proc --kill-child`` and then, as pid 1 of the new namespace, starts
the real worker as its child, reaps orphans (as an init does) and exits with the worker's status.

Why: every e2e test starts a real agent that finds training ranks by reading /proc, as on a real
node. Workers in one PID namespace would each see the others' ranks and trace them (two agents
fighting over ptrace, reports landing in the wrong monitor). In a namespace of its own each worker
is one node: its agent sees its own ranks only, and when the worker exits the kernel ends every
process it left behind.

Without root (or without ``unshare``) the worker runs as is, in the shared namespace.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile

# Also imported by tests/netns.py (NODE_NAMESPACE_MARK): a worker never sweeps another's fabrics.
INSIDE = "HANGWATCH_TEST_NODE_NAMESPACE"


def _can_unshare() -> bool:
    return os.geteuid() == 0 and shutil.which("unshare") is not None


def _forward(worker: int, sig: int) -> None:
    try:
        os.kill(worker, sig)
    except ProcessLookupError:  # the worker ended between its exit and our waitpid
        pass


def _as_init(argv: list[str]) -> int:
    # A /tmp of the node's own, removed when the worker ends: torchrun leaves a torchelastic_*
    # log directory behind for every job (and killed jobs leave more), hundreds per suite run.
    node_tmp = tempfile.mkdtemp(prefix="hw-node-")
    os.environ["TMPDIR"] = node_tmp
    try:
        return _run_worker(argv)
    finally:
        shutil.rmtree(node_tmp, ignore_errors=True)


def _run_worker(argv: list[str]) -> int:
    worker = os.fork()
    if worker == 0:
        os.execv(sys.executable, [sys.executable, *argv])
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, _f: _forward(worker, s))
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 1
        except InterruptedError:
            continue
        if pid == worker:
            return os.waitstatus_to_exitcode(status)


def main(argv: list[str]) -> int:
    if os.environ.get(INSIDE) == str(os.getpid()) == "1":
        return _as_init(argv)
    if os.environ.get(INSIDE) is None and _can_unshare():
        os.environ[INSIDE] = "1"
        os.execvp("unshare", ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child",
                              sys.executable, os.path.abspath(__file__), *argv])
    os.environ.pop(INSIDE, None)
    os.execv(sys.executable, [sys.executable, *argv])
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
