"""A command run on a pseudo-terminal, as a person at a terminal runs it (the progress tests, the quick-start
recorder in scripts/)."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import termios


def run_on_terminal(argv: list[str], cwd, env: dict[str, str]) -> tuple[int, str]:
    """stdin, stdout and stderr on a 40x120 pseudo-terminal: the exit code and everything the command drew."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, cwd=cwd, env=env)
    os.close(slave)
    chunks = []
    while True:
        ready, _, _ = select.select([master], [], [], 1.0)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    os.close(master)
    return proc.wait(), b"".join(chunks).decode(errors="replace")
