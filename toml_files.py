"""Reading the TOML files people write, share and download: config.toml, character cards, NPC
lines files, the model catalog, the hardware corrections. Every TOML reader in dgchat goes
through here (tomllib is never called directly), so each of them is bounded the same way:

- regular files only: a FIFO, a device or a socket given as a card or a config would block the
  read (or never end); the file is opened without blocking and refused unless fstat says it is a
  regular file (checked on the open file, so nothing can be swapped in between);
- at most MAX_TOML_BYTES: these files are a few KB; a bigger one is a mistake or an attack;
- nesting at most MAX_TOML_DEPTH deep: tomllib parses arrays and inline tables recursively, so a
  file of 100,000 `[` raised RecursionError (a traceback); a dotted key of 100,000 parts
  (a.a.a...) costs tomllib quadratic time and memory (gigabytes) and nests the result as deep. The
  text is scanned for its bracket depth and dotted-key length before tomllib sees it (a linear
  scan), RecursionError is caught in case the scan is fooled, and the parsed value is measured
  once more (headers and dotted keys add up).

A problem is a TomlFileError with a one-line reason (no path): each caller words it with its own
error type and the file's name, e.g. `CardError(f"{path}: {exc}")`.
"""

from __future__ import annotations

import os
import re
import stat
import tomllib
from pathlib import Path
from typing import Any

MAX_TOML_BYTES = 4 << 20
MAX_TOML_DEPTH = 32  # tables and arrays inside each other; dgchat's files use at most 3


class TomlFileError(Exception):
    """A TOML file that cannot be used; str() is one line, without the path. `kind` says which
    problem: missing, folder, special, unreadable, too-large, encoding, syntax, depth."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind


_KINDS = {stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFSOCK: "a socket"}


def read_regular_file(path: str | Path, limit: int = MAX_TOML_BYTES) -> bytes:
    """The bytes of `path`, which must be a regular file of at most `limit` bytes (TomlFileError)."""
    try:
        # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise TomlFileError("missing", "no such file") from None
    except IsADirectoryError:
        raise TomlFileError("folder", "is a folder, not a file") from None
    except OSError as exc:
        raise TomlFileError("unreadable", f"cannot read ({exc.strerror or exc})") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):  # (POSIX opens a folder for reading; reading it then fails)
            raise TomlFileError("folder", "is a folder, not a file")
        if not stat.S_ISREG(info.st_mode):
            what = _KINDS.get(stat.S_IFMT(info.st_mode))
            raise TomlFileError("special", f"is {what}, not a regular file" if what else "is not a regular file")
        if info.st_size > limit:
            raise TomlFileError("too-large", f"is {info.st_size:,} bytes; the limit is {limit:,}")
        chunks = []
        size = 0
        while size <= limit:  # the size may have changed since fstat: read at most limit + 1
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise TomlFileError("too-large", f"is over {limit:,} bytes, the limit")
        return b"".join(chunks)
    except OSError as exc:
        raise TomlFileError("unreadable", f"cannot read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)


# A key part (bare or quoted) and a dotted key: `a.b."c"` is three parts.
_PART = r'''[A-Za-z0-9_-]++|"(?:[^"\\\n]|\\.)*+"|'[^'\n]*+\''''
_PART_RE = re.compile(_PART)
# What the scan looks at: dotted keys (tried first, so that `"a".b` is one key; a lone string or
# word is no dotted key and falls through), strings and comments (skipped whole; an unterminated
# string runs to the end of its line, or of the file for a multi-line one, so that every token
# is consumed once and the scan stays linear on hostile text), words, brackets and braces,
# newlines (for the line number). Possessive quantifiers: no backtracking.
_TOKENS = re.compile(
    rf'''(?P<key>(?:{_PART})(?:[ \t]*+\.[ \t]*+(?:{_PART}))++)'''
    r'''|(?P<skip>"""(?:[^"\\]|\\.|"(?!""))*+(?:"{3,5}|\Z)'''
    r"""|'''(?:[^']|'(?!''))*+(?:'{3,5}|\Z)"""
    r'''|"(?:[^"\\\n]|\\.)*+"?|'[^'\n]*+'?|#[^\n]*+|[A-Za-z0-9_-]++)'''
    r'''|(?P<open>[\[{])|(?P<close>[\]}])|\n''', re.S)


def _scan_depth(text: str, limit: int) -> int | None:
    """The line on which brackets and braces (outside strings and comments) nest deeper than
    `limit`, or a dotted key has more than `limit` parts, or None. A cheap scan: tomllib reports
    what is not valid TOML. (tomllib recurses on nesting, and works in time and memory quadratic
    in a dotted key's length: a 100,000-part key took gigabytes.)"""
    depth = 0
    line = 1
    for match in _TOKENS.finditer(text):
        kind = match.lastgroup
        if kind == "open":
            depth += 1
            if depth > limit:
                return line
        elif kind == "close":
            depth = max(0, depth - 1)
        elif kind == "key":
            if len(_PART_RE.findall(match.group())) > limit:
                return line
        elif kind == "skip":
            line += match.group().count("\n")  # a multi-line string
        else:
            line += 1
    return None


def _value_depth(value: Any, limit: int) -> bool:
    """Whether `value` (tomllib's result) nests tables and arrays deeper than `limit` (iterative)."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, (dict, list)):
                if depth + 1 > limit:
                    return True
                stack.append((child, depth + 1))
    return False


def parse_toml(text: str, *, max_depth: int = MAX_TOML_DEPTH) -> dict[str, Any]:
    """tomllib.loads with the nesting bound (TomlFileError: syntax or depth)."""
    line = _scan_depth(text, max_depth)
    if line is not None:
        raise TomlFileError("depth", f"nested more than {max_depth} levels deep (line {line}: brackets, braces or "
                                     "the parts of a dotted key)")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TomlFileError("syntax", f"not valid TOML ({exc})") from None
    except RecursionError:
        raise TomlFileError("depth", f"nested more than {max_depth} levels deep") from None
    if _value_depth(data, max_depth):
        raise TomlFileError("depth", f"nested more than {max_depth} levels deep")
    return data


def read_toml(path: str | Path, *, limit: int = MAX_TOML_BYTES) -> dict[str, Any]:
    """A TOML file read with every bound above; TomlFileError says what is wrong in one line."""
    raw = read_regular_file(path, limit)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise TomlFileError("encoding", "not UTF-8 text") from None
    return parse_toml(text)
