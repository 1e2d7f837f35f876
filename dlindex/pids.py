"""Whether a file's writer still runs: leftovers named after a process, and the check that it is gone.

Leftovers of killed runs (export folders, ``features export`` files, the advisor's scratch
copies) and scan rows left ``running`` are named after their writer's pid and start time, so a
later run removes only those of processes that are gone: a pid that now belongs to another
process has another start time. A leaf below every layer: the catalog asks ``pid_alive`` too.
"""

from __future__ import annotations

import os
import socket
import zlib


def host_tag() -> str:
    """8 hex digits of this host's name: a file another machine wrote on a shared disk is never
    judged by this machine's process table."""
    return f"{zlib.crc32(socket.gethostname().encode()):08x}"


def process_start(pid: int) -> int:
    """When ``pid`` started, in clock ticks after boot (Linux /proc); 0 where unknown or gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
        # The command name (field 2) is parenthesised and may hold spaces: count after its ")".
        return int(text[text.rindex(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return 0


def pid_alive(pid: int | None, start: int = 0) -> bool:
    """Whether process ``pid`` runs on this machine and, when ``start`` is known, is the same
    process that started then (True when unsure: another user's process, no /proc)."""
    if not pid or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OverflowError, ValueError):
        return False  # no such pid can exist
    except PermissionError:
        pass  # someone else's process, but alive
    if start:
        now = process_start(pid)
        if now and now != start:
            return False  # that pid now belongs to another process
    return True
