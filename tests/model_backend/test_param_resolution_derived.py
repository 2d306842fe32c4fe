"""The rules that derive settings from other settings (model_backend/param_resolution), one per kind
of run, pinned to the numbers their callers used before the rules moved there: dgchat serve's
fitted canvas and infill, the setup wizard's test answer, drafting proposals and NPC lines."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dgchat.model_backend.param_resolution import (
    BLOCK_FALLBACK,
    CARD,
    DERIVED,
    MASKED_EPS,
    MASKED_FALLBACK,
    NPC,
    UNIFORM_FALLBACK,
    Layer,
    canvas_for_answer,
    drafting_steps,
    family_fallback,
    infill_layer,
    npc_line_layers,
    one_block,
    one_canvas_answer,
    proportional_steps,
    rewrite_layer,
    short_answer,
    steps_per_position,
)
from dgchat.model_backend.params import DiffusionParams

LLADA = DiffusionParams(gen_length=128, block_length=32, steps=128)  # LLaDA generate.py's settings, resolved


def test_family_fallback() -> None:
    assert family_fallback("diffusion_gemma") is UNIFORM_FALLBACK and UNIFORM_FALLBACK["steps"] == 48
    assert family_fallback("block_diffusion") is BLOCK_FALLBACK
    assert family_fallback("llada") is MASKED_FALLBACK and family_fallback("masked") is MASKED_FALLBACK
    assert (MASKED_FALLBACK["steps"], MASKED_FALLBACK["gen_length"], UNIFORM_FALLBACK["gen_length"]) == (128, 128, 256)


@pytest.mark.parametrize("steps, canvas, model_canvas, n_blocks, round_up, want", [
    (128, 16, 128, 1, True, 16),  # LLaDA's 1 step a token kept
    (48, 32, 256, 1, False, 6),  # DiffusionGemma's 48 steps over 256 positions, on 32
    (1, 8, 128, 1, True, 1),  # at least one step
    (100, 32, 128, 2, True, 26),  # 25 rounded up to a multiple of the 2 blocks
    (100, 32, 128, 2, False, 24),  # ... and down
    (2, 32, 128, 4, True, 4),  # at least one step a block
    (2, 32, 128, 4, False, 4),
])
def test_proportional_steps(steps, canvas, model_canvas, n_blocks, round_up, want) -> None:
    assert proportional_steps(steps, canvas, model_canvas, n_blocks, round_up=round_up) == want


@pytest.mark.parametrize("model, max_tokens, steps, want", [
    (LLADA, 16, None, {"gen_length": 16, "steps": 16}),  # fits in one block: the canvas is the answer
    (LLADA, 40, None, {"gen_length": 64, "steps": 64}),  # whole blocks
    (LLADA, 100, None, {"gen_length": 128, "steps": 128}),
    (LLADA, 128, None, {}),  # the model's canvas already
    (LLADA, 500, None, {}),
    (LLADA, 16, 5, {"gen_length": 16}),  # the request's steps stay
    (DiffusionParams(gen_length=128, block_length=32, steps=50), 70, None, {"gen_length": 96, "steps": 39}),
    (DiffusionParams(gen_length=512, steps=512, eps=MASKED_EPS), 100, None, {"gen_length": 100, "steps": 100}),
    (DiffusionParams(gen_length=256, steps=48), 64, None, {"gen_length": 64, "steps": 12}),  # DiffusionGemma
])
def test_canvas_for_answer(model, max_tokens, steps, want) -> None:
    layer = canvas_for_answer(model, max_tokens, steps)
    assert layer.source == DERIVED and dict(layer.values) == want


@pytest.mark.parametrize("full, block_diffusion, want", [
    (LLADA, False, {"gen_length": 32, "block_length": 32, "steps": 32, "max_tokens": 32}),
    # config steps 100, blocks of 16: 25 steps rounded down to a multiple of the 2 blocks
    (DiffusionParams(gen_length=128, block_length=16, steps=100), False,
     {"gen_length": 32, "block_length": 16, "steps": 24, "max_tokens": 32}),
    # a block that does not divide the test canvas: one block
    (DiffusionParams(gen_length=144, block_length=48, steps=144), False,
     {"gen_length": 32, "block_length": None, "steps": 32, "max_tokens": 32}),
    (DiffusionParams(gen_length=256, steps=48), False,
     {"gen_length": 32, "block_length": None, "steps": 6, "max_tokens": 32}),  # DiffusionGemma
    (DiffusionParams(gen_length=32, steps=32), False, {}),  # short already
    (DiffusionParams(gen_length=4, block_length=4, steps=4, max_tokens=512), True, {"max_tokens": 32}),  # SDAR
    (DiffusionParams(gen_length=4, block_length=4, steps=4, max_tokens=20), True, {}),
])
def test_short_answer(full, block_diffusion, want) -> None:
    layer = short_answer(full, 32, block_diffusion=block_diffusion)
    assert layer.source == DERIVED and dict(layer.values) == want


def test_one_block_and_steps_per_position() -> None:
    assert one_block(10) == {"block_length": None, "eps": MASKED_EPS, "gen_length": 10, "max_tokens": 10}
    assert MASKED_EPS == 1e-3
    assert one_block(10, 0.05)["eps"] == 0.05
    assert (steps_per_position(12), steps_per_position(0)) == (12, 1)


def test_infill_layer() -> None:
    masked = infill_layer(DiffusionParams(), 20, 12, uniform_state=False)
    assert masked.source == DERIVED
    assert dict(masked.values) == {"block_length": None, "eps": MASKED_EPS, "gen_length": 20, "max_tokens": 20,
                                   "steps": 12}
    assert "steps" not in infill_layer(DiffusionParams(), 20, 12, uniform_state=True).values  # DiffusionGemma's own
    chosen = infill_layer(DiffusionParams(steps=5, eps=0.01), 20, 12, uniform_state=False).values
    assert "steps" not in chosen and chosen["eps"] == 0.01
    assert infill_layer(DiffusionParams(), 4, 0, uniform_state=False).values["steps"] == 1


def test_drafting_rules() -> None:
    assert (drafting_steps(9, None), drafting_steps(9, 4), drafting_steps(9, 64)) == (9, 4, 9)
    rewrite = rewrite_layer(DiffusionParams(block_length=8), 40, 9, uniform_state=False)
    assert dict(rewrite.values) == {"block_length": None, "eps": MASKED_EPS, "gen_length": 40, "max_tokens": 40,
                                    "steps": 9}
    assert rewrite_layer(DiffusionParams(steps=4), 40, 9, uniform_state=False).values["steps"] == 4
    assert "steps" not in rewrite_layer(DiffusionParams(), 40, 9, uniform_state=True).values
    assert dict(one_canvas_answer(DiffusionParams(gen_length=64, max_tokens=512)).values) == {"max_tokens": 64}
    assert not one_canvas_answer(DiffusionParams(gen_length=64, max_tokens=32)).values


def _model(family: str) -> SimpleNamespace:
    return SimpleNamespace(block_diffusion=family == "block", uniform_state=family == "uniform")


def test_npc_line_layers() -> None:
    bias = ((7, -100.0),)
    card = DiffusionParams(temperature=0.3)
    free = npc_line_layers(_model("masked"), card, canvas=24, to_fill=24, template=False, seed=5, bias=bias,
                           temperature=0.8)
    assert free == [Layer(NPC, {"temperature": 0.8, "eps": MASKED_EPS, "steps": 24}), Layer.of(CARD, card),
                    Layer(NPC, {"block_length": None, "gen_length": 24, "max_tokens": 24, "seed": 5,
                                "logit_bias": bias})]
    # a card's block length: the canvas rounded up to whole blocks, a step a position
    blocks = npc_line_layers(_model("masked"), DiffusionParams(block_length=8), canvas=12, to_fill=12, template=False,
                             seed=5, bias=(), temperature=0.8)
    assert blocks[0].values == {"temperature": 0.8, "steps": 16} and blocks[2].values["gen_length"] == 16
    template = npc_line_layers(_model("masked"), DiffusionParams(), canvas=20, to_fill=6, template=True, seed=5,
                               bias=(), temperature=0.8)
    assert template[0].values["steps"] == 6 and template[2].values["gen_length"] == 20
    uniform = npc_line_layers(_model("uniform"), DiffusionParams(), canvas=20, to_fill=20, template=False, seed=5,
                              bias=(), temperature=0.8)
    assert uniform[0].values == {} and uniform[2].values["gen_length"] == 20
    block = npc_line_layers(_model("block"), DiffusionParams(), canvas=12, to_fill=12, template=False, seed=5,
                            bias=bias, temperature=0.8)
    assert block[0] == Layer(NPC, {"temperature": 0.8})
    assert block[2] == Layer(NPC, {"max_tokens": 12, "seed": 5, "logit_bias": bias})
