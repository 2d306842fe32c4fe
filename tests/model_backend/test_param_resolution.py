"""The one precedence of sampler settings, with the source of every value (pure: no model loaded)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dgchat.model_backend.errors import InvalidParameterError
from dgchat.model_backend.model_info import ModelInfo
from dgchat.model_backend.param_resolution import (
    CHAT,
    CONFIG,
    DEFAULT,
    DERIVED,
    FAMILY_DEFAULT,
    FLAG,
    MODEL_FILE,
    REQUEST,
    Layer,
    explain,
    precise_setting,
    resolve_params,
    resolved_for,
)
from dgchat.model_backend.params import DiffusionParams


def _info(family: str = "masked", defaults: dict | None = None, from_file: tuple[str, ...] = (),
          kv: bool = False) -> ModelInfo:
    return ModelInfo(architecture="llada" if family == "masked" else "gemma4", family=family, preset="llada",
                     has_kv_memory=kv, mask_token=5, shift_logits=False, chat_template=None, name="t",
                     context_length=4096, defaults=dict(defaults or {}), file_defaults=frozenset(from_file))


LLADA = _info(defaults=dict(steps=128, gen_length=128, block_length=32, algorithm="confidence", temperature=0.0,
                            top_p=0.95), from_file=("top_p",))
GEMMA = _info("diffusion_gemma", dict(steps=48, entropy_bound=0.1, t_min=0.4, t_max=0.8, stability_threshold=1,
                                      confidence_threshold=0.005, temperature=0.0, algorithm="entropy",
                                      pad_bias=-2.0, gen_length=64), from_file=("pad_bias", "gen_length"))


def test_each_layer_overrides_the_ones_below_and_names_itself() -> None:
    layers = [Layer.of(CONFIG, {"steps": 64, "temperature": 0.5, "gen_length": 64}),
              Layer.of(CHAT, {"temperature": 0.7, "seed": 0}),
              Layer.of(FLAG, DiffusionParams(steps=16))]
    r = resolve_params(LLADA, layers)
    p = r.params
    assert (p.steps, p.temperature, p.gen_length, p.top_p, p.block_length) == (16, 0.7, 64, 0.95, 32)
    assert r.source("steps") == FLAG and r.source("temperature") == CHAT and r.source("gen_length") == CONFIG
    assert r.source("top_p") == MODEL_FILE and r.source("block_length") == FAMILY_DEFAULT
    assert r.source("seed") == CHAT  # a chat's stored seed 0 is a choice
    assert r.source("max_tokens") == DERIVED and p.max_tokens == 64
    assert r.source("cache") == DERIVED and p.cache == "none"
    assert r.source("cfg_scale") == DEFAULT
    table = r.table()
    assert table["steps"] == {"value": 16, "source": FLAG} and "eps" not in table  # unset: not in effect


def test_the_values_are_the_engines_rules() -> None:
    # a user's eps drops the model's block schedule; a block as long as the canvas becomes eps 1e-3
    r = resolve_params(LLADA, [Layer.of(FLAG, {"eps": 0.01})])
    assert r.params.block_length is None and r.params.eps == 0.01 and r.source("eps") == FLAG
    r = resolve_params(LLADA, [Layer.of(FLAG, {"gen_length": 16})])
    assert r.params.block_length is None and r.params.eps == 1e-3 and r.source("eps") == FAMILY_DEFAULT
    kv = replace(LLADA, has_kv_memory=True)
    assert resolve_params(kv, None).params.cache == "prefix"
    assert resolve_params(kv, DiffusionParams(mode="reference")).params.cache == "none"
    assert resolve_params(_info(), None).params.gen_length == 128  # the engine's fallback: a family default


def test_diffusion_gemma_layers() -> None:
    r = resolve_params(GEMMA, [Layer.of(CONFIG, {"t_max": 0.9}), Layer.of(REQUEST, {"steps": 7})])
    assert r.params.steps == 7 and r.source("steps") == REQUEST
    assert r.params.t_max == 0.9 and r.source("t_max") == CONFIG
    assert r.params.pad_bias == -2.0 and r.source("pad_bias") == MODEL_FILE
    assert r.params.t_min == 0.4 and r.source("t_min") == FAMILY_DEFAULT
    assert r.params.max_tokens == 256 and r.source("max_tokens") == DERIVED
    assert r.params.cache == "none" and r.params.block_length is None
    with pytest.raises(InvalidParameterError, match="masked-diffusion options"):
        resolve_params(GEMMA, [Layer.of(FLAG, {"threshold": 0.9})])
    with pytest.raises(InvalidParameterError, match="uniform-state"):
        resolve_params(GEMMA, DiffusionParams(mode="reference"))


def test_precise_is_a_setting_with_a_source() -> None:
    assert precise_setting() == (False, DEFAULT)
    assert precise_setting((CONFIG, True), (FLAG, None)) == (True, CONFIG)
    assert precise_setting((CONFIG, True), (FLAG, False)) == (False, FLAG)
    r = resolve_params(LLADA, None, precise=(True, FLAG))
    assert r.table()["precise"] == {"value": True, "source": FLAG}
    assert "precise" not in resolve_params(LLADA, None).table()


def test_sources_of_values_decided_elsewhere() -> None:
    layers = [Layer.of(CONFIG, {"steps": 64}), Layer.of(REQUEST, {"temperature": 0.3, "gen_length": 512})]
    final = resolve_params(LLADA, layers).params
    fitted = replace(final, gen_length=48, steps=24)  # a server fitted the canvas to max_tokens
    r = explain(fitted, layers, LLADA)
    assert r.source("temperature") == REQUEST and r.source("top_p") == MODEL_FILE
    assert r.source("gen_length") == DERIVED and r.source("steps") == DERIVED
    assert r.source("block_length") == FAMILY_DEFAULT and r.source("seed") == DEFAULT


def test_resolved_for_an_engine_uses_its_resolve() -> None:
    class Shadow:  # an engine whose own resolve changes a value: its value wins, credited as derived
        info = LLADA

        def resolve(self, params: DiffusionParams) -> DiffusionParams:
            return replace(resolve_params(LLADA, params).params, top_k=3)

    r = resolved_for(Shadow(), [Layer.of(FLAG, {"steps": 32})])
    assert r.params.top_k == 3 and r.source("top_k") == DERIVED and r.source("steps") == FLAG

    class Plain(Shadow):
        def resolve(self, params: DiffusionParams) -> DiffusionParams:
            return resolve_params(LLADA, params).params

    r = resolved_for(Plain(), [Layer.of(FLAG, {"steps": 32})])
    assert r.source("top_k") == FAMILY_DEFAULT and r.source("top_p") == MODEL_FILE


def test_unknown_setting_is_refused() -> None:
    with pytest.raises(InvalidParameterError, match="unknown sampler setting 'stepz'"):
        Layer.of(CHAT, {"stepz": 3})
