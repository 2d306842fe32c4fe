"""JSON in and out of the API, strictly.

Python's `json` reads `NaN`, `Infinity` and `1e999` (an infinite float) and integers of any length
(a 5,000-digit one raises ValueError, not a JSON error), and keeps lone surrogates (`"\\ud800"`) in
strings that cannot be encoded again. None of that is JSON a client means to send: each is refused
here with a message that says what was wrong. Output never contains NaN/Infinity (invalid JSON).
"""

from __future__ import annotations

import json
import math
from typing import Any

MAX_INT_DIGITS = 20  # 2**64 has 20 digits: every integer the API takes (seeds, ids, counts) fits
MAX_DEPTH = 64  # nesting; the API's deepest legitimate body is about 5 levels


class JsonError(ValueError):
    """The body is not JSON the API accepts; the message says why."""


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise JsonError(f"an integer has {len(text.lstrip('-'))} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise JsonError(f"the number {text[:40]} is out of range")
    return value


def _constant(name: str) -> Any:
    raise JsonError(f"{name} is not a JSON value (numbers must be finite)")


def _check(value: Any, depth: int = 0) -> None:
    """Strings must be encodable (no lone surrogates); nesting is bounded."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise JsonError("a string contains a lone UTF-16 surrogate (\\ud800-\\udfff)") from None
    elif isinstance(value, (list, dict)):
        if depth >= MAX_DEPTH:
            raise JsonError(f"the body is nested more than {MAX_DEPTH} levels deep")
        if isinstance(value, dict):
            for k, v in value.items():
                _check(k, depth + 1)
                _check(v, depth + 1)
        else:
            for v in value:
                _check(v, depth + 1)


def loads(raw: bytes) -> Any:
    """Parse a request body; raises JsonError with a message fit for the client."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise JsonError("the request body is not UTF-8") from None
    try:
        value = json.loads(text, parse_int=_int, parse_float=_float, parse_constant=_constant)
    except json.JSONDecodeError as exc:
        raise JsonError(f"the request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") \
            from None
    except RecursionError:
        raise JsonError("the request body is nested too deeply") from None
    _check(value)
    return value


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON; a non-finite float (a statistic divided by zero) becomes null."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except ValueError:
        text = json.dumps(_finite(value), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text.encode("utf-8", "replace")
