"""The file a rank's main thread is blocked on, from /proc/PID/syscall (issue 32: stuck I/O).

A rank whose save never returns sits at 0% CPU in the kernel: blocked in ``openat`` (an open on a
hung network mount, a FIFO nobody reads), in ``write`` or ``fsync`` (a full pipe, a dead server).
Its stack says "torch/serialization.py"; the kernel says which file. ``/proc/PID/syscall`` of
the main thread gives the syscall number and its arguments: for the calls that take a file
descriptor, ``/proc/PID/fd/N`` names the file; for the ones that take a path (an open that never
returned has no descriptor yet), the path is read from the rank's memory at the argument's
address (``/proc/PID/mem``: the same ptrace access py-spy needs).

Only file-system calls are named: a rank waiting in ``futex`` or ``epoll_wait`` (a collective, a
sleep) is not blocked on a file. Syscall numbers differ between architectures; an unknown
machine names nothing.

Split as the other collectors are: ``parse_syscall`` is pure, ``read_blocked_io`` reads /proc.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass

PATH_MAX = 4096
# What the report carries of a path (monitor.ingest.wire.BlockedIoReport).
PATH_REPORTED = 1024

# (name, index of the fd argument or None, index of the path argument or None), by machine.
_X86_64: dict[int, tuple[str, int | None, int | None]] = {
    0: ("read", 0, None), 1: ("write", 0, None), 2: ("open", None, 0), 3: ("close", 0, None),
    17: ("pread64", 0, None), 18: ("pwrite64", 0, None), 19: ("readv", 0, None), 20: ("writev", 0, None),
    4: ("stat", None, 0), 6: ("lstat", None, 0), 5: ("fstat", 0, None), 21: ("access", None, 0),
    74: ("fsync", 0, None), 75: ("fdatasync", 0, None), 76: ("truncate", None, 0), 77: ("ftruncate", 0, None),
    82: ("rename", None, 0), 83: ("mkdir", None, 0), 85: ("creat", None, 0), 87: ("unlink", None, 0),
    162: ("sync", None, None), 257: ("openat", None, 1), 262: ("newfstatat", None, 1), 263: ("unlinkat", None, 1),
    264: ("renameat", None, 1), 277: ("sync_file_range", 0, None), 285: ("fallocate", 0, None),
    295: ("preadv", 0, None), 296: ("pwritev", 0, None), 316: ("renameat2", None, 1), 332: ("statx", None, 1),
    437: ("openat2", None, 1),
}
_AARCH64: dict[int, tuple[str, int | None, int | None]] = {
    56: ("openat", None, 1), 57: ("close", 0, None), 63: ("read", 0, None), 64: ("write", 0, None),
    65: ("readv", 0, None), 66: ("writev", 0, None), 67: ("pread64", 0, None), 68: ("pwrite64", 0, None),
    79: ("newfstatat", None, 1), 80: ("fstat", 0, None), 81: ("sync", None, None), 82: ("fsync", 0, None),
    83: ("fdatasync", 0, None), 84: ("sync_file_range", 0, None), 34: ("mkdirat", None, 1),
    35: ("unlinkat", None, 1), 38: ("renameat", None, 1), 46: ("ftruncate", 0, None),
    47: ("fallocate", 0, None), 276: ("renameat2", None, 1), 291: ("statx", None, 1), 437: ("openat2", None, 1),
}
SYSCALLS = {"x86_64": _X86_64, "amd64": _X86_64, "aarch64": _AARCH64, "arm64": _AARCH64}


@dataclass(frozen=True)
class Blocked:
    """A file-system call the thread sits in: its name, and the fd or path address it was given."""

    syscall: str
    fd: int | None = None
    path_address: int | None = None


def parse_syscall(text: str, machine: str | None = None) -> Blocked | None:
    """The file-system call in a ``/proc/PID/syscall`` line, or None (running, not in a syscall, or
    in one that takes no file: futex, epoll_wait, nanosleep, ...)."""
    fields = text.split()
    if not fields or not fields[0].lstrip("-").isdigit():
        return None  # "running"
    number = int(fields[0])
    table = SYSCALLS.get((machine or platform.machine()).lower())
    if table is None or number not in table:
        return None
    name, fd_arg, path_arg = table[number]
    try:
        args = [int(a, 16) for a in fields[1:7]]
    except ValueError:
        return None
    fd = args[fd_arg] if fd_arg is not None and fd_arg < len(args) else None
    if fd is not None and fd >= 1 << 31:
        fd = None  # a negative fd (AT_FDCWD and the like), never a file of its own
    address = args[path_arg] if path_arg is not None and path_arg < len(args) else None
    return Blocked(name, fd, address or None)


def read_path(proc_root: str, pid: int, address: int) -> str | None:
    """The NUL-terminated string at ``address`` in the process's memory; None when unreadable."""
    try:
        fd = os.open(f"{proc_root}/{pid}/mem", os.O_RDONLY)
    except OSError:
        return None
    try:
        raw = os.pread(fd, PATH_MAX, address)
    except (OSError, OverflowError, ValueError):
        return None
    finally:
        os.close(fd)
    end = raw.find(b"\0")
    if end <= 0:
        return None
    return raw[:end].decode("utf-8", "replace")


def _read_syscall(proc_root: str, pid: int, machine: str | None) -> tuple[str, Blocked | None]:
    with open(f"{proc_root}/{pid}/syscall") as f:
        text = f.read()
    return text, parse_syscall(text, machine)


def read_blocked_io(proc_root: str, pid: int, machine: str | None = None, state: str | None = None) -> dict | None:
    """``{"syscall", "path", "fd"}`` for the file-system call the main thread is blocked in, or None.
    ``path`` is None when it could not be read. ``state``: the process's kernel state letter; in the
    disk wait (D) its memory is not read (that read can wait on the very mount that hangs)."""
    try:
        text, blocked = _read_syscall(proc_root, pid, machine)
    except OSError:
        return None
    if blocked is None:
        return None
    path = None
    if blocked.fd is not None:
        try:
            path = os.readlink(f"{proc_root}/{pid}/fd/{blocked.fd}")
        except OSError:
            path = None
    elif blocked.path_address is not None and state != "D":
        path = read_path(proc_root, pid, blocked.path_address)
        try:
            again, _ = _read_syscall(proc_root, pid, machine)
        except OSError:
            again = ""
        if again != text:
            path = None  # the call returned meanwhile: what lies at that address now is not its path
        if path is not None and not path.startswith("/"):
            path = _absolute(proc_root, pid, text, path)
    if path is not None:
        path = path[:PATH_REPORTED]
        if not path.isprintable():
            path = None  # not a path: never shown, never sent
    return {"syscall": blocked.syscall, "path": path, "fd": blocked.fd}


def _absolute(proc_root: str, pid: int, syscall_line: str, path: str) -> str:
    """A relative path made absolute from the directory it is relative to: the call's directory fd
    (openat's first argument), or the working directory for AT_FDCWD (as open() passes)."""
    try:
        dirfd = int(syscall_line.split()[1], 16)
    except (IndexError, ValueError):
        return path
    link = "cwd" if dirfd >= 1 << 31 else f"fd/{dirfd}"
    try:
        return os.path.join(os.readlink(f"{proc_root}/{pid}/{link}"), path)
    except OSError:
        return path
