"""dgchat.strict_json, the one strict reader of the server's request bodies and the remote client's
answers: each refusal raised as the caller's own error, with a message naming what was wrong."""

from __future__ import annotations

import pytest

from dgchat import strict_json


class CallerError(ValueError):
    """Stands for remote.wire.WireError or the server's 400 answer."""


@pytest.mark.parametrize("raw, message", [
    (b"\xff\xfe", "the body is not UTF-8 text"),
    (b'{"a": }', "the body is not valid JSON (Expecting value at line 1 column 7)"),
    (b"[" * 30000 + b"]" * 30000, f"the body is nested more than {strict_json.MAX_DEPTH} levels deep"),
    (b"[" * (strict_json.MAX_DEPTH + 1) + b"]" * (strict_json.MAX_DEPTH + 1), "nested more than"),
    (b"1" * (strict_json.MAX_INT_DIGITS + 1), "an integer has 21 digits (at most 20)"),
    (b"[1e400]", "the number 1e400 is out of range"),
    (b'{"x": NaN}', "NaN is not a JSON number"),
    (b'["\\ud800"]', "a string holds a lone UTF-16 surrogate"),
])
def test_what_is_not_strict_json_raises_the_callers_error(raw: bytes, message: str) -> None:
    with pytest.raises(CallerError) as caught:
        strict_json.loads(raw, CallerError, subject="the body")
    assert message in str(caught.value)


def test_strict_json_reads_what_it_should() -> None:
    nested = b"[" * strict_json.MAX_DEPTH + b"]" * strict_json.MAX_DEPTH
    assert strict_json.loads(nested, CallerError) is not None
    assert strict_json.loads('{"s": "\\ud83d\\ude00", "n": -12345678901234567890, "f": 1.5e300}', CallerError) == \
        {"s": "\U0001f600", "n": -12345678901234567890, "f": 1.5e300}


def test_dumps_writes_no_nan() -> None:
    written = strict_json.dumps({"a": float("nan"), "b": [float("inf"), 1.0], "c": "é"})
    assert written == '{"a":null,"b":[null,1.0],"c":"é"}'.encode()
