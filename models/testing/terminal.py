# SPDX-License-Identifier: Apache-2.0
"""What a 120-column terminal shows of a writer's output: a real pseudo-terminal, so code that
asks ``isatty()`` takes its terminal branch (progress bars, carriage returns)."""

from __future__ import annotations

import fcntl
import os
import select
import struct
import termios
from collections.abc import Callable
from typing import TextIO


def terminal_output(write: Callable[[TextIO], None], columns: int = 120) -> str:
    """Everything ``write(tty)`` sent to a fresh pseudo-terminal of ``columns`` columns."""
    controller, terminal = os.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    with open(terminal, "w", closefd=True) as tty:
        write(tty)
        tty.flush()
    shown = b""
    while select.select([controller], [], [], 0.5)[0]:  # everything the terminal received
        try:
            chunk = os.read(controller, 1 << 16)
        except OSError:  # EIO: the terminal side is closed and drained
            break
        if not chunk:
            break
        shown += chunk
    os.close(controller)
    return shown.decode(errors="replace")
