"""DiffusionParams.FIELDS, the one table of the settings' types and ranges: it lists every field,
and `validate` takes each value at the ends of its row's range and refuses one just outside."""

from __future__ import annotations

from dataclasses import fields

import pytest

from dgchat.model_backend.errors import InvalidParameterError
from dgchat.model_backend.params import MAX_STEPS, PARAM_FIELDS, DiffusionParams


def test_every_field_has_a_row_with_help() -> None:
    assert DiffusionParams.FIELDS is PARAM_FIELDS
    assert list(PARAM_FIELDS) == [f.name for f in fields(DiffusionParams)]
    assert all(spec.help for spec in PARAM_FIELDS.values())
    assert PARAM_FIELDS["steps"].highest == MAX_STEPS == 8192


def _numbers() -> list[str]:
    return [name for name, spec in PARAM_FIELDS.items() if spec.kind in (int, float)]


def _outside(value: float, kind: type, upward: bool) -> float:
    step = 1 if kind is int else max(1e-9, abs(value) * 1e-9)
    return value + step if upward else value - step


@pytest.mark.parametrize("name", _numbers())
def test_validate_agrees_with_the_table(name: str) -> None:
    spec = PARAM_FIELDS[name]
    lo, hi = spec.lowest, spec.highest
    for value, inside in ((lo, not spec.lo_open), (hi, not spec.hi_open),
                          (_outside(lo, spec.kind, upward=False), False), (_outside(hi, spec.kind, upward=True), False)):
        value = spec.kind(value)
        params = DiffusionParams(**{name: value})
        assert spec.in_range(value) == inside, (name, value)
        if inside:
            params.validate()
        else:
            with pytest.raises(InvalidParameterError):
                params.validate()


@pytest.mark.parametrize("name, what", [
    ("steps", "a positive integer"),
    ("top_k", "an integer >= 0"),
    ("seed", "an integer >= 0"),
    ("temperature", "a number >= 0"),
    ("threshold", "a number in (0, 1]"),
    ("eps", "a number in [0, 1)"),
    ("cache", "one of auto, none, prefix, dual"),
    ("gumbel", "true or false"),
])
def test_what_a_field_takes(name: str, what: str) -> None:
    assert PARAM_FIELDS[name].what == what


@pytest.mark.parametrize("kwargs, message", [
    # the rules of one field alone: the messages the CLI, config and server have always shown
    ({"steps": 0}, "--steps must be a positive integer (got 0)"),
    ({"steps": MAX_STEPS + 1}, f"--steps must be at most {MAX_STEPS} (got {MAX_STEPS + 1})"),
    ({"temperature": -1.0}, "--temperature must be >= 0 (got -1.0)"),
    ({"threshold": 2.0}, "--threshold must be in (0, 1] (got 2.0)"),
    ({"eps": 1.0}, "--eps must be in [0, 1) (got 1.0)"),
    ({"pad_bias": -101.0}, "--pad-bias must be at most 100 in size (got -101.0)"),
    ({"algorithm": "best"}, "--algorithm must be one of confidence, entropy, margin, random, origin (got 'best')"),
    ({"gumbel": 1}, "gumbel must be true or false (got 1)"),
    # the rules between fields come after
    ({"t_min": 2.0, "t_max": 1.0}, "need 0 <= t_min < t_max"),
    ({"t_max": 0.0}, "--t-max must be at least 1e-06"),
    ({"gen_length": 100, "block_length": 32}, "canvas length 100 is not divisible by block length 32"),
])
def test_messages(kwargs: dict, message: str) -> None:
    with pytest.raises(InvalidParameterError) as info:
        DiffusionParams(**kwargs).validate()
    assert message in str(info.value)
