"""The `dgchat` extension of a request is checked against DiffusionParams.FIELDS, the table every
reader of settings uses: a request may ask for what a local run may (MAX_STEPS, one bound), and the
served model's context and vocabulary bound the canvas and top_k further (no model loaded here)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dgchat.model_backend.params import MAX_STEPS, PARAM_FIELDS
from dgchat.server.errors import ApiError
from dgchat.server.openai_api import REQUEST_FIELDS, STREAM_KEYS, parse_dgchat


def _refused(ext: dict, engine=None) -> str:
    with pytest.raises(ApiError) as info:
        parse_dgchat({"dgchat": ext}, engine)
    return str(info.value.param)


def test_steps_have_one_bound() -> None:
    assert parse_dgchat({"dgchat": {"steps": MAX_STEPS}}) == {"steps": MAX_STEPS}
    assert _refused({"steps": MAX_STEPS + 1}) == "dgchat.steps"


@pytest.mark.parametrize("name", [n for n in REQUEST_FIELDS if PARAM_FIELDS[n].kind in (int, float)])
def test_each_setting_takes_its_table_range(name: str) -> None:
    spec = PARAM_FIELDS[name]
    for value, inside in ((spec.lowest, not spec.lo_open), (spec.highest, not spec.hi_open)):
        value = spec.kind(value)
        if inside:
            assert parse_dgchat({"dgchat": {name: value}}) == {name: value}
        else:
            assert _refused({name: value}) == f"dgchat.{name}"


def test_the_model_bounds_the_canvas_and_top_k() -> None:
    engine = SimpleNamespace(n_ctx_max=512, n_vocab=1000)
    assert parse_dgchat({"dgchat": {"gen_length": 512, "top_k": 1000}}, engine) == {"gen_length": 512, "top_k": 1000}
    assert _refused({"gen_length": 513}, engine) == "dgchat.gen_length"
    assert _refused({"block_length": 513}, engine) == "dgchat.block_length"
    assert _refused({"top_k": 1001}, engine) == "dgchat.top_k"


def test_choices_and_response_options() -> None:
    assert _refused({"algorithm": "fastest"}) == "dgchat.algorithm"
    assert _refused({"cache": "all"}) == "dgchat.cache"
    assert parse_dgchat({"dgchat": {key: True for key in STREAM_KEYS}}) == {key: True for key in STREAM_KEYS}
    assert _refused({"canvas": 1}) == "dgchat.canvas"
    assert _refused({"warp": 9}) == "dgchat.warp"
