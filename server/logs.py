"""The server's stderr lines: escaped, and harmless once stderr is gone.

Anything a client sends (a path, a header, a parser's complaint quoting the request line) is logged
with control and format characters escaped, so `%1b[31m` or `%0a` in a URL cannot colour the
operator's terminal or forge a log line. A server whose stderr pipe was closed (its terminal or
log collector went away) must keep serving and still stop on SIGTERM: the first failed write points
file descriptor 2 at /dev/null, so neither Python nor llama.cpp's C code writes to the dead pipe
again.
"""

from __future__ import annotations

import logging
import os
import sys

MAX_LINE = 2000  # characters of one log line; a 1 MiB request target must not become a 1 MiB log line

_stderr_broken = False


def escape(text: str, limit: int = MAX_LINE) -> str:
    """`text` with every non-printable character (C0/C1 controls, DEL, bidi and other format
    characters, line separators) written as a Python escape, cut to `limit` characters."""
    if len(text) > limit:
        text = text[:limit] + "..."
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def write_stderr(line: str) -> None:
    """Write one line to stderr; never raises. After the first failure stderr is /dev/null."""
    global _stderr_broken
    if _stderr_broken or sys.stderr is None:
        return
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # BrokenPipeError, EIO, or a closed file object
        _stderr_broken = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)  # the buffered line (if any) now drains into /dev/null at exit
            os.close(devnull)
        except OSError:
            pass


class _UvicornErrors(logging.Handler):
    """uvicorn's own error-level messages (a bug in the app, a failed shutdown) as dgchat lines."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            if record.exc_info and record.exc_info[1] is not None:
                exc = record.exc_info[1]
                message += f" ({type(exc).__name__}: {exc})"
            write_stderr(f"dgchat serve: {escape(message)}")
        except Exception:  # noqa: BLE001 - logging must never raise into the server
            pass


_installed = False


def quiet_uvicorn() -> None:
    """uvicorn logs nothing by itself: dgchat writes its own one-line access log and reports
    malformed requests itself; only uvicorn's errors come through, one escaped line each."""
    global _installed
    if _installed:
        return
    _installed = True
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = False
    logging.getLogger("uvicorn.access").disabled = True
    error = logging.getLogger("uvicorn.error")
    error.setLevel(logging.ERROR)
    error.addHandler(_UvicornErrors())
