"""Capturing what C libraries print to file descriptor 2.

libtiff and friends write warnings straight to the process's stderr, below Python's
``sys.stderr``: in a scan that would be noise on the user's terminal, and the warning
belongs to the file being read anyway.
"""

from __future__ import annotations

import os
import tempfile

MAX_CHARS = 500


class CStderrCapture:
    """Redirect file descriptor 2 into a private temp file, so C libraries (libtiff) that
    print warnings straight to stderr end up in the file's record, not on the user's screen."""

    def __init__(self) -> None:
        self._file = tempfile.TemporaryFile()
        self._saved_fd: int | None = None

    def start(self) -> None:
        self._saved_fd = os.dup(2)
        os.dup2(self._file.fileno(), 2)

    def stop(self) -> None:
        if self._saved_fd is not None:
            os.dup2(self._saved_fd, 2)
            os.close(self._saved_fd)
            self._saved_fd = None

    def take(self) -> str | None:
        fd = self._file.fileno()
        written = os.lseek(fd, 0, os.SEEK_CUR)
        if written == 0:
            return None
        text = os.pread(fd, min(written, 4 * MAX_CHARS), 0).decode("utf-8", "replace")
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        lines = dict.fromkeys(line.strip() for line in text.splitlines() if line.strip())
        return "; ".join(lines)[:MAX_CHARS] or None
