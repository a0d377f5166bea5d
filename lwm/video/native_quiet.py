"""Keeping decord's and its ffmpeg's own log lines off stderr, where the tools' progress bars are: decord's C++
writes them straight to fd 2, and what they say comes back as a VideoError with a short message anyway."""

from __future__ import annotations

import os
import re
import sys
import tempfile
import threading

# The native libraries' log lines: decord's C++ (dmlc) '[12:34:56] /path/file.cc:83: ...', ffmpeg's '[h264 @ 0x55d0] ...'.
_NATIVE_LINE = re.compile(rb"^\[[\d:]+\] \S+:\d+: |^\[[^\]]+ @ 0x[0-9a-fA-F]+\] ")


class NativeQuiet:
    """With it, fd 2 points to a temporary file while decord runs: its C++ writes log lines ('ERROR opening: ...')
    straight to fd 2, past both ffmpeg's log level and sys.stderr, and its errors come back as exceptions anyway.
    Other lines that reach fd 2 meanwhile (another thread's) are written to stderr afterwards. Counted, so nested or
    concurrent uses share one redirect and the last one out restores fd 2."""

    _lock = threading.Lock()
    _depth = 0
    _saved: int | None = None
    _sink = None

    def __enter__(self) -> None:
        cls = type(self)
        with cls._lock:
            cls._depth += 1
            if cls._depth > 1:
                return
            sink = saved = None
            try:
                if sys.stderr is not None:
                    sys.stderr.flush()  # Python's pending text belongs before the redirect
                sink = tempfile.TemporaryFile()
                saved = os.dup(2)
                os.dup2(sink.fileno(), 2)
            except (OSError, ValueError):  # no usable fd 2 (closed): nothing to keep clean
                if saved is not None:
                    os.close(saved)
                if sink is not None:
                    sink.close()
                return
            cls._saved, cls._sink = saved, sink

    def __exit__(self, *exc) -> None:
        cls = type(self)
        with cls._lock:
            cls._depth -= 1
            if cls._depth > 0 or cls._saved is None:
                return
            saved, sink, cls._saved, cls._sink = cls._saved, cls._sink, None, None
            os.dup2(saved, 2)
            os.close(saved)
            with sink:
                sink.seek(0)
                other = [line for line in sink.read().splitlines(keepends=True) if not _NATIVE_LINE.match(line)]
            if other:
                os.write(2, b"".join(other))
