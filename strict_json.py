"""JSON read strictly and written safely: the one reader of what a client sends `dgchat serve`
(server/asgi.py) and of what a server sends dgchat (remote/wire.py).

Python's `json` reads `NaN`, `Infinity` and `1e999` (an infinite float), integers of any length (a
5,000-digit one raises ValueError, not a JSON error), nesting until a RecursionError, and keeps lone
surrogates (`"\\ud800"`) in strings that cannot be encoded again. None of that is JSON anyone means
to send: `loads` refuses each with a message that says what was wrong, raised as the caller's own
error (`error(message)`: remote.wire.WireError, or the server's 400 answer). `dumps` never writes
NaN or Infinity (invalid JSON).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

MAX_DEPTH = 64  # nesting; the API's deepest legitimate body and OpenAI's answers are about 6 levels deep
MAX_INT_DIGITS = 20  # 2**64 has 20 digits: every integer either side reads (seeds, ids, counts) fits

ErrorFor = Callable[[str], BaseException]  # the caller's error, made from the message


def loads(raw: bytes | str, error: ErrorFor, *, subject: str = "it") -> Any:
    """`raw` as JSON, strictly: UTF-8, nested at most MAX_DEPTH levels (a 100,000-deep document is an
    error, not a RecursionError), integers of at most MAX_INT_DIGITS digits, finite numbers, no lone
    UTF-16 surrogates in strings. Anything else raises `error(message)`; `subject` names the document
    in the messages ("the request body is not UTF-8 text")."""
    if isinstance(raw, (bytes, bytearray, memoryview)):
        data = bytes(raw)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise error(f"{subject} is not UTF-8 text") from None
    else:
        text = raw
        data = raw.encode("utf-8", "surrogatepass")
    slow = _needs_hooks(data)
    hooks = _Hooks(error)
    try:
        if slow:
            value = json.loads(text, parse_int=hooks.parse_int, parse_float=hooks.parse_float,
                               parse_constant=hooks.parse_constant)
        else:
            value = json.loads(text, parse_constant=hooks.parse_constant)
    except json.JSONDecodeError as exc:
        raise error(f"{subject} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except RecursionError:  # the C parser's own depth guard
        raise error(f"{subject} is nested more than {MAX_DEPTH} levels deep") from None
    _check_tree(value, strings=slow, error=error, subject=subject)
    return value


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON; a non-finite float (a statistic divided by zero) becomes null."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except ValueError:
        text = json.dumps(_finite(value), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text.encode("utf-8", "replace")


class _Hooks:
    """json.loads's number and constant hooks, raising the caller's error."""

    def __init__(self, error: ErrorFor) -> None:
        self.error = error

    def parse_int(self, text: str) -> int:
        digits = len(text.lstrip("-"))
        if digits > MAX_INT_DIGITS:
            raise self.error(f"an integer has {digits} digits (at most {MAX_INT_DIGITS})")
        return int(text)

    def parse_float(self, text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            raise self.error(f"the number {text[:40]} is out of range")
        return value

    def parse_constant(self, name: str) -> Any:
        raise self.error(f"{name} is not a JSON number")


# What only the slow, hook-based parse can check: an integer of 21 digits or more, an exponent of 3
# digits (1e400 is inf), a \\uD800-\\uDFFF escape (a surrogate, perhaps lone). Most documents have none
# of them (a canvas is thousands of small integers), and skip a Python call per number. (A float with
# at most 20 digits on either side of its point and a 2-digit exponent is finite.)
_DIGITS = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))  # digits as "0", the rest " "
_EXPONENT = re.compile(rb"[eE][+-]?\d{3}")
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")


def _needs_hooks(data: bytes) -> bool:
    # bytes.translate and `in` run at C speed; a regex looking for 21 digits at every digit does not
    return (b"0" * (MAX_INT_DIGITS + 1) in data.translate(_DIGITS) or _EXPONENT.search(data) is not None
            or (b"\\u" in data and _SURROGATE.search(data) is not None))


_CONTAINERS = (list, dict)


def _check_tree(value: Any, *, strings: bool, error: ErrorFor, subject: str) -> None:
    """Depth (and with `strings`, lone surrogates) of a parsed document, without recursion (a deep
    one cannot overflow this) and without a Python step per number or string of a list."""
    if not isinstance(value, _CONTAINERS):
        if strings and isinstance(value, str):
            _check_strings([value], error)
        return
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth >= MAX_DEPTH:
            raise error(f"{subject} is nested more than {MAX_DEPTH} levels deep")
        children = list(item.values()) if isinstance(item, dict) else item
        kinds = set(map(type, children))
        if strings:
            if isinstance(item, dict):
                _check_strings(item.keys(), error)
            if str in kinds:
                _check_strings((c for c in children if type(c) is str), error)
        if list in kinds or dict in kinds:
            stack.extend((c, depth + 1) for c in children if type(c) in _CONTAINERS)


def _check_strings(strings: Any, error: ErrorFor) -> None:
    for item in strings:
        if not item.isascii():
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise error("a string holds a lone UTF-16 surrogate (\\ud800-\\udfff)") from None


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
