"""Just enough TOML writing (strings, numbers, lists of strings) for character cards, config.toml edits and
hardware.toml; tomllib only reads. `set_keys` edits a few keys of a file a person also edits, line by
line, so that their comments and layout stay."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_ANY_TABLE = re.compile(r"^\s*\[")  # a table's header (or an array of tables')
_ANY_KEY = re.compile(r"^\s*[A-Za-z0-9_\"'-]+\s*=")  # a line that sets a key


def toml_string(value: str) -> str:
    # a JSON string is a valid TOML basic string, except that TOML also wants DEL escaped
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def toml_key(key: str) -> str:
    return key if _BARE_KEY.match(key) else toml_string(key)


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, (list, tuple)):
        items = [toml_value(v) for v in value]
        if not items:
            return "[]"
        return "[\n" + "".join(f"    {item},\n" for item in items) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def toml_table(pairs: Iterable[tuple[str, object]]) -> str:
    return "".join(f"{toml_key(k)} = {toml_value(v)}\n" for k, v in pairs)


def set_keys(text: str, table: str | None, values: dict[str, object | None]) -> str:
    """`text`, a TOML file, with these keys of one table set (a None value: the key removed) and every
    other line as it was: comments, other keys, other tables. `table` None is the top level, whose
    keys go just before the first table (after it they would belong to that table). A table left with
    no keys loses its header (its comments stay); a table not there is appended. Only `key = ...` and
    `"key" = ...` lines are found: the caller parses the result to check it holds what was meant (a
    key written another way, such as `server.url = ...`, or a multi-line value, is not edited here)."""
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    names = "|".join(alternative for key in values for alternative in (re.escape(key), re.escape(f'"{key}"')))
    edited = re.compile(rf"^\s*({names})\s*=")
    new = [f"{toml_key(key)} = {toml_value(value)}\n" for key, value in values.items() if value is not None]
    if table is None:
        first_table = next((i for i, line in enumerate(lines) if _ANY_TABLE.match(line)), len(lines))
        top = [line for line in lines[:first_table] if not edited.match(line)]
        return "".join([*top, *new, *lines[first_table:]])
    header_re = re.compile(rf"^\s*\[\s*{re.escape(table)}\s*\]\s*(#.*)?$")
    header = next((i for i, line in enumerate(lines) if header_re.match(line)), None)
    if header is None:
        if new:
            if lines and lines[-1].strip():
                lines.append("\n")
            lines += [f"[{toml_key(table)}]\n", *new]
        return "".join(lines)
    end = next((i for i in range(header + 1, len(lines)) if _ANY_TABLE.match(lines[i])), len(lines))
    body = [line for line in lines[header + 1:end] if not edited.match(line)]
    if new or any(_ANY_KEY.match(line) for line in body):
        lines[header:end] = [lines[header], *new, *body]
    else:  # nothing left in the table: the header goes too (its comments stay)
        lines[header:end] = body
    return "".join(lines)
