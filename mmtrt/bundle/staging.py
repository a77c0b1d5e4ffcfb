"""Staging folders that outlive nothing: SIGTERM cleans up like Ctrl-C, and folders of dead compiles are swept.

A staging folder holds an owner file naming the host, the boot, the pid and the pid's start time of the compile
that writes it. A folder is swept only when that compile provably no longer runs: same host, and either another
boot or no process with that pid and start time. A folder without an owner file, or from another host sharing
the file system, is left alone: nothing proves it dead.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import threading
from pathlib import Path
from typing import Any

from mmtrt.errors import Terminated

OWNER = ".mmtrt-owner"
PATTERNS = (".*.tmp-*", ".*.old-*")


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (clock ticks after boot): a reused pid has another; None off Linux."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _me() -> dict[str, Any]:
    pid = os.getpid()
    return {"host": socket.gethostname(), "boot": _boot_id(), "pid": pid, "started": _start_time(pid)}


def claim(folder: Path) -> None:
    (folder / OWNER).write_text(json.dumps(_me()))


def is_dead(owner: dict[str, Any]) -> bool:
    me = _me()
    if owner.get("host") != me["host"] or not isinstance(owner.get("pid"), int):
        return False
    if owner.get("boot") and me["boot"] and owner["boot"] != me["boot"]:
        return True
    try:
        os.kill(owner["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    started = _start_time(owner["pid"])
    return owner.get("started") is not None and started is not None and started != owner["started"]


def sweep_stale(parent: Path) -> list[Path]:
    """Remove the staging folders in `parent` whose compile is provably dead; returns them."""
    swept = []
    for folder in sorted(p for pattern in PATTERNS for p in Path(parent).glob(pattern)):
        try:
            owner = json.loads((folder / OWNER).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(owner, dict) and is_dead(owner):
            shutil.rmtree(folder, ignore_errors=True)
            swept.append(folder)
    return swept


_terminated = threading.Event()


def _raise_terminated(signum, frame):
    _terminated.set()
    raise Terminated("SIGTERM")


def raise_if_terminated() -> None:
    """Raise Terminated if SIGTERM came: its exception can be swallowed when the handler runs inside a finalizer
    (Python ignores exceptions raised in __del__ and GC callbacks), so commits check this flag as well."""
    if _terminated.is_set():
        raise Terminated("SIGTERM")


@contextlib.contextmanager
def sigterm_as_interrupt():
    """SIGTERM raises Terminated (a KeyboardInterrupt) while the block runs, so its cleanup runs; main thread only,
    where Python delivers signals."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    if previous is not _raise_terminated:
        _terminated.clear()
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def signals_deferred():
    """Ctrl-C and SIGTERM wait until the block is done: the renames that swap a bundle in are never cut halfway."""
    blocked = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
