"""Just enough TOML writing (strings, numbers, lists of strings) for character cards, config.toml edits and
hardware.toml; tomllib only reads."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


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
