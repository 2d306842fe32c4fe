"""KV-cache reuse (prefix / dual) and batched generation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dgchat.model_backend.loader import load_engine
from dgchat.model_backend.events import FinalEvent, StepEvent
from dgchat.model_backend.llamacpp import engine_info
from dgchat.model_backend.logits_source import LlamaLogits
from dgchat.model_backend.requests import LogitsRequest
from dgchat.model_backend.params import DiffusionParams


@pytest.fixture(scope="module")
def llama_engine(llama_nc_gguf: Path):
    with load_engine(llama_nc_gguf) as engine:
        yield engine


def _final(events) -> FinalEvent:
    return [e for e in events if isinstance(e, FinalEvent)][0]


def _request(engine, prompt_len=12, canvas=32, block=(8, 16), start=True, seed=0) -> LogitsRequest:
    rng = np.random.default_rng(seed)
    seq = np.concatenate([rng.integers(0, 300, prompt_len), np.full(canvas, engine.info.mask_token)]).astype(np.int32)
    seq[prompt_len:prompt_len + block[0]] = rng.integers(0, 300, block[0])  # earlier blocks are decided
    b0, b1 = prompt_len + block[0], prompt_len + block[1]
    return LogitsRequest(seq, np.arange(b0, b1), (b0, b1), start)


DUAL_OK = engine_info().noncontiguous_positions


def test_dual_cache_on_a_stock_engine_says_why() -> None:
    if DUAL_OK:
        pytest.skip("patched engine: dual cache is available (covered below)")
    from dgchat.model_backend.errors import InvalidParameterError

    with pytest.raises(InvalidParameterError, match="patched llama.cpp"):
        LlamaLogits(type("E", (), {"info": type("I", (), {"has_kv_memory": True})()})(), "dual")


@pytest.mark.parametrize("mode", ["prefix", pytest.param("dual", marks=pytest.mark.skipif(
    not DUAL_OK, reason="dual cache needs the patched engine (README install)"))])
def test_block_start_equals_full_pass_and_cells_do_not_leak(llama_engine, mode: str) -> None:
    req = _request(llama_engine)
    full = LlamaLogits(llama_engine, "none").logits(req).copy()
    src = LlamaLogits(llama_engine, mode)
    first = src.logits(req).copy()
    np.testing.assert_array_equal(first, full)  # a block's first step is a full pass
    ctx = llama_engine._ctx
    b0, b1 = req.block
    if mode == "prefix":
        assert ctx.seq_pos_max(0) == b0 - 1  # only the prefix stays
    else:
        assert ctx.seq_pos_max(0) == req.sequence.size - 1  # prefix and suffix stay, block dropped
    again = src.logits(LogitsRequest(req.sequence, req.rows, req.block, False)).copy()
    assert again.shape == full.shape
    if mode == "dual":  # nothing changed since the full pass: the cached view is the full view
        np.testing.assert_allclose(again, full, atol=2e-3)
    else:  # the suffix is not visible any more: close but not the same
        assert 0 < np.abs(again - full).max()
    assert ctx.seq_pos_max(0) == (b0 - 1 if mode == "prefix" else req.sequence.size - 1)


@pytest.mark.parametrize("mode", ["none", "prefix", pytest.param("dual", marks=pytest.mark.skipif(
    not DUAL_OK, reason="dual cache needs the patched engine (README install)"))])
def test_cached_generation_is_repeatable(llama_engine, mode: str) -> None:
    prompt = llama_engine.encode("Good morrow, friend. What news?")
    params = DiffusionParams(gen_length=32, block_length=8, steps=16, cache=mode, seed=4, max_tokens=64)
    a = _final(llama_engine.generate(prompt, params))
    b = _final(llama_engine.generate(prompt, params))  # a second conversation sees no stale cells
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert a.stats.steps == b.stats.steps > 0


def test_prefix_cache_decodes_fewer_tokens(llama_engine) -> None:
    """Later steps of a block decode the block only: fewer tokens through llama.cpp per step."""
    prompt = llama_engine.encode("Halt! " * 20)
    counted = {}
    for mode in ("none", "prefix"):
        src = LlamaLogits(llama_engine, mode)
        sizes = []
        orig = llama_engine._ctx.decode_tokens if llama_engine._ctx else None
        ctx = llama_engine.context_for(512)

        def spy(tokens, positions, **kw):
            sizes.append(len(tokens))
            return type(ctx).decode_tokens(ctx, tokens, positions, **kw)

        ctx.decode_tokens = spy
        try:
            req = _request(llama_engine, prompt_len=prompt.size, canvas=64, block=(0, 16))
            src.logits(req)
            src.logits(LogitsRequest(req.sequence, req.rows, req.block, False))
        finally:
            del ctx.decode_tokens
        counted[mode] = sizes
    assert counted["none"][1] == prompt.size + 64
    assert counted["prefix"][1] == 16


@pytest.mark.parametrize("fixture", ["llada_gguf", "llama_nc_gguf"])
def test_batched_equals_unbatched(request, fixture: str) -> None:
    """A batch changes the shapes of llama.cpp's matrix products, so logits agree to ~1e-5 (f32
    cache), not bit for bit: the precise engine keeps that from flipping a sampled token."""
    path = request.getfixturevalue(fixture)
    with load_engine(path, precise=True) as engine:
        prompts = [engine.encode(t) for t in ("Halt, traveller!", "Good morrow.", "Once upon a time a dragon")]
        params = [DiffusionParams(gen_length=24, block_length=8, steps=12, seed=s, temperature=0.7, max_tokens=48)
                  for s in (1, 2, 3)]
        single = [_final(engine.generate(p, q)).tokens for p, q in zip(prompts, params)]
        finals: dict[int, FinalEvent] = {}
        steps: dict[int, int] = {0: 0, 1: 0, 2: 0}
        for i, event in engine.generate_batch(prompts, params):
            if isinstance(event, FinalEvent):
                finals[i] = event
            else:
                assert isinstance(event, StepEvent)
                steps[i] += 1
        assert sorted(finals) == [0, 1, 2] and all(v > 0 for v in steps.values())
        for i in range(3):
            np.testing.assert_array_equal(finals[i].tokens, single[i])


def test_auto_cache_is_prefix_only_with_kv_memory(llama_engine, llada_gguf: Path) -> None:
    assert llama_engine.resolve(DiffusionParams()).cache == "prefix"
    assert llama_engine.resolve(DiffusionParams(cache="none")).cache == "none"
    reference = llama_engine.resolve(DiffusionParams(mode="reference", eps=1e-3))
    assert reference.cache == "none"  # reference mode always recomputes: its output never changes
    with load_engine(llada_gguf) as llada:  # no KV memory in llama.cpp's llada graph
        assert llada.resolve(DiffusionParams()).cache == "none"
    # the default run is the prefix-cached one, token for token
    prompt = llama_engine.encode("Halt! Who goes there?")
    auto = _final(llama_engine.generate(prompt, DiffusionParams(steps=16, gen_length=32, block_length=8, seed=2)))
    prefix = _final(llama_engine.generate(prompt, DiffusionParams(steps=16, gen_length=32, block_length=8, seed=2,
                                                                  cache="prefix")))
    assert np.array_equal(auto.tokens, prefix.tokens)
