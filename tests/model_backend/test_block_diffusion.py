"""Block diffusion (SDAR, BD3LM) against transformers and the published samplers.

The oracles: tiny random checkpoints of transformers' own Qwen3 / Qwen2 (tests/fixtures/block_tiny.py),
converted by `dgchat convert`, their logits under the 4-D block-causal mask (transformers' forward
with an explicit mask, no cache) and torch references of SDAR's and dllm's sampling loops
(tests/fixtures/block_reference.py, recomputing the whole sequence every step). dgchat runs the same
file through llama.cpp with patch 0017's mask, its KV cache, chunked prompts and merged store passes.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from fixtures.block_reference import bd3lm_generate, linear_counts, sdar_generate
from fixtures.block_tiny import block_causal_logits, converted, torch_model

from dgchat.model_backend import sampling, schedules
from dgchat.model_backend.block_denoiser import prompt_offset
from dgchat.model_backend.block_diffusion import BlockDiffusionEngine
from dgchat.model_backend.block_source import BlockLlamaSource
from dgchat.model_backend.errors import InvalidParameterError
from dgchat.model_backend.events import FinalEvent, StepEvent
from dgchat.model_backend.loader import load_engine
from dgchat.model_backend.param_resolution import CHAT, CONFIG, DERIVED, FLAG, Layer, resolved_for
from dgchat.model_backend.params import DiffusionParams
from dgchat.model_backend.requests import CanvasTemplate, DenoiseRequest, EncodeRequest

_ENGINES: dict[tuple[str, str], BlockDiffusionEngine] = {}


def engine_for(base: Path, name: str) -> BlockDiffusionEngine:
    """One precise (f32 KV cache) engine per converted tiny checkpoint, kept for the module."""
    key = (str(base), name)
    if key not in _ENGINES:
        engine = load_engine(converted(base, name), precise=True)
        assert isinstance(engine, BlockDiffusionEngine)
        _ENGINES[key] = engine
    return _ENGINES[key]


def teardown_module() -> None:
    for engine in _ENGINES.values():
        engine.close()
    _ENGINES.clear()


def prompt_ids(engine: BlockDiffusionEngine, n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    specials = set(int(t) for t in engine.eog_ids()) | {int(engine.info.mask_token)}
    ids = rng.integers(0, 300, n * 2)
    return np.array([t for t in ids if t not in specials][:n], dtype=np.int32)


def answer(engine: BlockDiffusionEngine, prompt: np.ndarray, **kw) -> FinalEvent:
    final = None
    for event in engine.generate(prompt, DiffusionParams(**kw)):
        if isinstance(event, FinalEvent):
            final = event
    assert final is not None
    return final


def close(got: np.ndarray, want: np.ndarray) -> float:
    """The largest difference relative to the largest logit."""
    return float(np.abs(got - want).max() / np.abs(want).max())


# -- the forward pass --------------------------------------------------------------------------

@pytest.mark.parametrize("name,prompt_len", [("sdar", 10), ("sdar-b8", 13), ("bd3lm", 21), ("bd3lm-qwen2", 7)])
def test_logits_match_transformers(base: Path, name: str, prompt_len: int) -> None:
    """The prompt's pass, a block step against the cache, the merged store + next step, and a later
    step against the stored block: each equals transformers' forward of the whole sequence under the
    block-causal mask."""
    engine = engine_for(base, name)
    model = torch_model(base, name)
    B = engine.block_size
    mask = int(engine.info.mask_token)
    prompt = prompt_ids(engine, prompt_len, seed=prompt_len)
    pad = prompt_offset(prompt.size, engine._setup())
    first = ((pad + prompt.size) // B) * B  # the first answer block's start position
    whole = prompt[: first - pad]
    tail = prompt[first - pad:]
    canvas = np.concatenate([tail, np.full(B - tail.size, mask)]).astype(np.int32)
    finished = canvas.copy()
    finished[finished == mask] = prompt_ids(engine, int((canvas == mask).sum()), seed=99)
    nxt = np.full(B, mask, np.int32)
    nxt[1] = int(prompt[0])
    seq = np.concatenate([whole, finished, nxt])
    want = block_causal_logits(model, seq, B, pad=pad)
    want_first = block_causal_logits(model, np.concatenate([whole, canvas]), B, pad=pad)

    source = BlockLlamaSource(engine, 1, pad + seq.size + B, on_backend=False)
    n = whole.size
    if n:
        (got,) = source.answer([(0, EncodeRequest(whole, np.arange(pad, first, dtype=np.int32), np.arange(n)))])
        assert close(got, want[:n]) < 1e-4
    pos = np.arange(first, first + B, dtype=np.int32)
    (got,) = source.answer([(0, DenoiseRequest(canvas, pos, None, True, rows=np.arange(B)))])
    assert close(got, want_first[n:]) < 1e-4
    (got,) = source.answer([(0, DenoiseRequest(nxt, pos + B, None, True, rows=np.arange(B), commit=(finished, pos)))])
    assert close(got, want[n + B:]) < 1e-4
    rows = np.array([0, 2, 3])
    (got,) = source.answer([(0, DenoiseRequest(nxt, pos + B, None, False, rows=rows))])
    assert close(got, want[n + B:][rows]) < 1e-4
    assert source.ctx.seq_pos_max(0) == first + B - 1  # the finished block stayed, the step's cells did not


def test_long_prompt_is_one_decode(base: Path) -> None:
    """A prompt of hundreds of tokens is one decode, not one per block: its last rows equal
    transformers' over the whole prompt."""
    engine = engine_for(base, "sdar")
    model = torch_model(base, "sdar")
    n = 600
    prompt = np.tile(prompt_ids(engine, 50, seed=3), n // 50 + 1)[:n]
    source = BlockLlamaSource(engine, 1, n + 8, on_backend=False)
    before = source.ctx.n_decodes
    outputs = np.array([0, 299, 300, n - 1])
    (got,) = source.answer([(0, EncodeRequest(prompt, np.arange(n, dtype=np.int32), outputs))])
    assert source.ctx.n_decodes - before == 1
    want = block_causal_logits(model, prompt, engine.block_size)[outputs]
    assert close(got, want) < 1e-4


def test_without_the_block_mask_the_logits_differ(base: Path) -> None:
    """The check above can fail: the same prompt decoded with plain bidirectional attention (one
    block holding the whole prompt) gives other logits than the block-causal forward."""
    engine = engine_for(base, "sdar")
    model = torch_model(base, "sdar")
    prompt = prompt_ids(engine, 12, seed=4)
    block_causal = block_causal_logits(model, prompt, engine.block_size)
    bidirectional = block_causal_logits(model, prompt, 4096)
    source = BlockLlamaSource(engine, 1, 64, on_backend=False)
    (got,) = source.answer([(0, EncodeRequest(prompt, np.arange(12, dtype=np.int32), np.arange(12)))])
    assert close(got, block_causal) < 1e-4
    assert close(got, bidirectional) > 1e-2


# -- the samplers --------------------------------------------------------------------------------

SDAR_CASES = [  # (prompt length, steps, threshold (None: SDAR's static schedule), temperature)
    (3, 4, None, 0.0), (9, 4, 0.3, 0.0), (10, 2, 0.5, 0.0), (8, 3, 0.2, 0.0), (10, 4, None, 0.9), (5, 3, 0.2, 1.0),
]


@pytest.mark.parametrize("prompt_len,steps,threshold,temperature", SDAR_CASES)
def test_sdar_tokens_match_reference(base: Path, prompt_len: int, steps: int, threshold: float | None,
                                     temperature: float) -> None:
    engine = engine_for(base, "sdar")
    model = torch_model(base, "sdar")
    prompt = prompt_ids(engine, prompt_len, seed=prompt_len + steps)
    eog = set(int(t) for t in engine.eog_ids())
    got = answer(engine, prompt, steps=steps, threshold=1.0 if threshold is None else threshold,
                 temperature=temperature, max_tokens=21, seed=11)
    want = sdar_generate(model, prompt.tolist(), mask_id=int(engine.info.mask_token), block=engine.block_size,
                         steps=steps, threshold=threshold, temperature=temperature, max_tokens=21, eog=eog, seed=11)
    assert got.tokens.tolist() == want
    assert len(want) == 21 or got.stop_reason == "eos"


BD3LM_CASES = [(5, 32, 0.0, 40), (33, 8, 0.0, 40), (12, 5, 0.8, 36), (32, 16, 1.0, 32)]


@pytest.mark.parametrize("prompt_len,steps,temperature,max_tokens", BD3LM_CASES)
def test_bd3lm_tokens_match_reference(base: Path, prompt_len: int, steps: int, temperature: float,
                                      max_tokens: int) -> None:
    """Including a shorter last block (max_tokens not a multiple of 32) and prompts that are not a
    whole number of blocks (dllm's left padding)."""
    engine = engine_for(base, "bd3lm")
    model = torch_model(base, "bd3lm")
    prompt = prompt_ids(engine, prompt_len, seed=prompt_len)
    eog = set(int(t) for t in engine.eog_ids())
    got = answer(engine, prompt, steps=steps, temperature=temperature, max_tokens=max_tokens, seed=5)
    want = bd3lm_generate(model, prompt.tolist(), mask_id=int(engine.info.mask_token), block=engine.block_size,
                          steps=steps, temperature=temperature, max_tokens=max_tokens, eog=eog, seed=5)
    assert got.tokens.tolist() == want


def test_host_and_backend_sampling_agree(base: Path) -> None:
    engine = engine_for(base, "sdar")
    prompt = prompt_ids(engine, 9, seed=2)
    for temperature in (0.0, 0.7):
        host = answer(engine, prompt, temperature=temperature, max_tokens=16, seed=3, sampler_on="host")
        backend = answer(engine, prompt, temperature=temperature, max_tokens=16, seed=3, sampler_on="auto")
        assert host.tokens.tolist() == backend.tokens.tolist()
        assert backend.stats.sampler_on == ("backend" if engine.backend_sampler else "host")


def test_linear_schedule_equals_dllms() -> None:
    for count in range(1, 65):
        for steps in range(1, 70, 3):
            got = schedules.linear_transfer_counts(count, steps)
            assert got == linear_counts(count, steps), (count, steps)
            assert sum(got) == count


def test_dynamic_rule() -> None:
    conf = np.array([0.9, 0.2, 0.95, 0.85, 0.3], np.float32)
    assert sampling.choose_dynamic(conf, 1, 0.85).tolist() == [0, 2]  # strictly above: 0.85 stays
    assert sampling.choose_dynamic(conf, 2, 0.85).tolist() == [0, 2]
    assert sorted(sampling.choose_dynamic(conf, 3, 0.85).tolist()) == [0, 2, 3]  # too few above: the top 3
    assert sampling.choose_dynamic(conf, 1, 1.0).tolist() == [2]


def test_ar_mode_is_the_causal_lm(base: Path) -> None:
    """--ar decodes the same weights left to right with causal attention: greedy tokens equal
    transformers' causal greedy decoding."""
    import torch

    engine = engine_for(base, "sdar")
    model = torch_model(base, "sdar")
    prompt = prompt_ids(engine, 7, seed=8)
    got = answer(engine, prompt, autoregressive=True, max_tokens=12, early_stop=False)
    ids = prompt.tolist()
    with torch.no_grad():
        for _ in range(12):
            logits = model(torch.tensor([ids])).logits[0, -1]
            ids.append(int(logits.argmax()))
    assert got.tokens.tolist() == ids[7:]


# -- generation: events, batches, cancel, stops ----------------------------------------------------

def test_events_show_one_block_at_a_time(base: Path) -> None:
    engine = engine_for(base, "sdar")
    B = engine.block_size
    prompt = prompt_ids(engine, 10, seed=1)  # 10 = 2 whole blocks + 2 prompt tokens in the first answer block
    events = list(engine.generate(prompt, DiffusionParams(max_tokens=14, threshold=1.0, early_stop=False)))
    steps = [e for e in events if isinstance(e, StepEvent)]
    final = events[-1]
    assert isinstance(final, FinalEvent) and final.stats.tokens == 14
    assert steps[0].canvas_length == B - 2 and steps[-1].canvas_length == B
    blocks = sorted({e.canvas_index for e in steps})
    assert blocks == list(range(len(blocks))) and len(blocks) == 1 + -(-(14 - 2) // B)
    for e in steps:  # the answer so far is every finished block, in order
        assert np.array_equal(e.answer_tokens, final.tokens[: e.answer_tokens.size])
    # one decode for the prompt, then exactly one per step: the stores ride along
    assert final.stats.steps == len(steps) and final.stats.prompt_s > 0


def test_one_decode_per_step_and_the_next_turn_reuses_the_conversation(base: Path) -> None:
    """One decode for the prompt, then exactly one per step (the stores ride along). A next turn
    that repeats the conversation so far decodes only from the first block where it differs, and
    answers as a fresh context does."""
    engine = engine_for(base, "sdar")
    B = engine.block_size
    prompt = prompt_ids(engine, 22, seed=6)
    engine.forget_prefix()
    answer(engine, prompt[:3], max_tokens=4)  # the context exists afterwards
    engine.forget_prefix()
    before = engine._ctx.n_decodes
    first = answer(engine, prompt, max_tokens=16, threshold=1.0, early_stop=False)
    assert engine._ctx.n_decodes - before == 1 + first.stats.steps and first.stats.prompt_reused == 0
    # the next turn: the conversation so far (prompt, answer) and a new message
    turn = np.concatenate([prompt, first.tokens, prompt_ids(engine, 9, seed=12)]).astype(np.int32)
    before = engine._ctx.n_decodes
    reused = answer(engine, turn, max_tokens=12, threshold=1.0, early_stop=False)
    assert reused.stats.prompt_reused == ((prompt.size + first.tokens.size) // B) * B
    assert engine._ctx.n_decodes - before == 1 + reused.stats.steps
    engine.forget_prefix()
    fresh = answer(engine, turn, max_tokens=12, threshold=1.0, early_stop=False)
    assert fresh.stats.prompt_reused == 0 and fresh.tokens.tolist() == reused.tokens.tolist()
    # the same prompt again (regenerate): nothing of the prompt is decoded
    before = engine._ctx.n_decodes
    again = answer(engine, turn, max_tokens=12, threshold=1.0, early_stop=False)
    assert again.stats.prompt_reused == (turn.size // B) * B
    assert engine._ctx.n_decodes - before == again.stats.steps and again.tokens.tolist() == fresh.tokens.tolist()


def test_batch_equals_one_at_a_time(base: Path) -> None:
    engine = engine_for(base, "sdar")
    prompts = [prompt_ids(engine, n, seed=n) for n in (5, 11, 8)]
    params = [DiffusionParams(max_tokens=13, seed=s, temperature=t) for s, t in ((1, 0.0), (2, 0.8), (3, 0.0))]
    alone = [answer(engine, p, **{k: getattr(q, k) for k in ("max_tokens", "seed", "temperature")}).tokens.tolist()
             for p, q in zip(prompts, params)]
    together: dict[int, list[int]] = {}
    for i, event in engine.generate_batch(prompts, params):
        if isinstance(event, FinalEvent):
            together[i] = event.tokens.tolist()
    assert [together[i] for i in range(3)] == alone


def test_cancel_keeps_the_decided_prefix(base: Path) -> None:
    engine = engine_for(base, "sdar")
    prompt = prompt_ids(engine, 9, seed=7)
    full = answer(engine, prompt, max_tokens=40, threshold=1.0, early_stop=False)
    cancel = threading.Event()
    final = None
    for event in engine.generate(prompt, DiffusionParams(max_tokens=40, threshold=1.0, early_stop=False),
                                 cancel=cancel):
        if isinstance(event, StepEvent) and event.step == 10:
            cancel.set()
        if isinstance(event, FinalEvent):
            final = event
    assert final.stop_reason == "cancelled"
    assert 0 < final.tokens.size < full.tokens.size
    assert final.tokens.tolist() == full.tokens[: final.tokens.size].tolist()


def test_end_token_ends_the_answer(base: Path) -> None:
    """A logit bias that makes the end of turn certain ends the answer at once, without spending
    the block's remaining steps."""
    engine = engine_for(base, "sdar")
    end = int(engine.end_token)
    prompt = prompt_ids(engine, 8, seed=9)
    final = answer(engine, prompt, max_tokens=40, logit_bias=((end, 100.0),))
    assert final.stop_reason == "eos" and final.tokens.size == 0 and final.stats.steps == 1


# -- settings -----------------------------------------------------------------------------------

def test_settings_and_their_sources(base: Path) -> None:
    engine = engine_for(base, "sdar")
    p = engine.resolve()
    assert (p.steps, p.gen_length, p.block_length, p.threshold, p.temperature) == (4, 4, 4, 0.85, 0.0)
    table = resolved_for(engine, [Layer(CONFIG, {"gen_length": 128}), Layer(CHAT, {"steps": 2})])
    assert table.params.gen_length == 4 and table.sources["gen_length"] == DERIVED
    assert table.params.steps == 2 and table.sources["steps"] == CHAT
    with pytest.raises(InvalidParameterError, match="blocks of 4 tokens"):
        resolved_for(engine, [Layer(FLAG, {"gen_length": 64})])
    for bad in ({"eps": 0.1}, {"factor": 1.0}, {"mode": "reference"}, {"cache": "prefix"}, {"cfg_scale": 1.0}):
        with pytest.raises(InvalidParameterError):
            engine.resolve(DiffusionParams(**bad))


def test_infill_is_refused_with_the_reason(base: Path) -> None:
    engine = engine_for(base, "sdar")
    template = CanvasTemplate(np.zeros(8, np.int32), np.array([True] * 2 + [False] * 4 + [True] * 2))
    with pytest.raises(InvalidParameterError, match="cannot see text to the right"):
        list(engine.generate(prompt_ids(engine, 5), DiffusionParams(), template=template))


def test_prompt_longer_than_the_context(base: Path) -> None:
    from dgchat.model_backend.errors import ContextOverflowError

    engine = engine_for(base, "sdar")
    with pytest.raises(ContextOverflowError, match="context"):
        list(engine.generate(np.zeros(engine.n_ctx_max, np.int32) + 5, DiffusionParams(max_tokens=8)))


# -- hostile files --------------------------------------------------------------------------------

def _with_value(src: Path, dest: Path, key: str, vtype: int | None, value: object = None) -> Path:
    from fuzz.gguf_mutate import KV, parse, serialize

    g = parse(src.read_bytes())
    g.kvs = [kv for kv in g.kvs if kv.key != key]
    if vtype is not None:
        g.kvs.append(KV(key, vtype, value))
    dest.write_bytes(serialize(g))
    return dest


def _hostile_cases():
    from fuzz.gguf_mutate import STR, U32

    return [
        ("dgchat.engine.attention_block", U32, 0, "dgchat.engine.attention_block = 0 is outside [1, 4096]"),
        ("dgchat.engine.attention_block", U32, 5000, "dgchat.engine.attention_block = 5000 is outside [1, 4096]"),
        ("dgchat.engine.attention_block", STR, "four", "dgchat.engine.attention_block = 'four' is not an integer"),
        ("dgchat.engine.attention_block", None, None, "needs dgchat.engine.attention_block"),
        ("dgchat.block_diffusion.variant", STR, "llada", "variant = 'llada' is not one of sdar, bd3lm"),
        ("tokenizer.ggml.mask_token_id", None, None, "block-diffusion GGUF has no mask token"),
        ("dgchat.family", None, None, "is a causal (autoregressive) model"),  # a plain qwen3 file
    ]


@pytest.mark.parametrize("case", range(7))
def test_hostile_block_keys_are_refused_with_one_line(base: Path, tmp_path: Path, case: int) -> None:
    from dgchat.model_backend.errors import ModelFileError, UnsupportedModelError
    from dgchat.model_backend.gguf_file import read_gguf_header
    from dgchat.model_backend.model_info import inspect_header

    key, vtype, value, pattern = _hostile_cases()[case]
    path = _with_value(converted(base, "sdar"), tmp_path / "bad.gguf", key, vtype, value)
    with pytest.raises((ModelFileError, UnsupportedModelError)) as info:
        inspect_header(read_gguf_header(path))
    assert pattern in str(info.value) and "\n" not in str(info.value)


def test_engine_refuses_a_block_size_of_the_wrong_type(base: Path, tmp_path: Path) -> None:
    """Patch 0017 reads the key as a uint32 and throws otherwise: the load fails with one line."""
    from fuzz.gguf_mutate import I32

    from dgchat.model_backend.errors import DgchatError

    path = _with_value(converted(base, "sdar"), tmp_path / "i32.gguf", "dgchat.engine.attention_block", I32, 4)
    with pytest.raises(DgchatError) as info:
        load_engine(path)
    assert "dgchat.engine.attention_block must be a uint32" in str(info.value) and "\n" not in str(info.value)


def test_pseudo_log_likelihood_equals_transformers(base: Path) -> None:
    """The model's own score of a text (NPC ranking): each answer token masked in turn, its log
    probability under the block-causal forward, as transformers computes it."""
    engine = engine_for(base, "bd3lm")  # left padding: the positions move with the context
    model = torch_model(base, "bd3lm")
    context, reply = prompt_ids(engine, 11, seed=21), prompt_ids(engine, 6, seed=22)
    got = engine.pseudo_log_likelihood(context, reply, groups=reply.size)
    seq = np.concatenate([context, reply])
    pad = prompt_offset(context.size, engine._setup())
    want = []
    for i in range(reply.size):
        masked = seq.copy()
        masked[context.size + i] = engine.info.mask_token
        row = block_causal_logits(model, masked, engine.block_size, pad=pad)[context.size + i].astype(np.float64)
        want.append(row[reply[i]] - (row.max() + np.log(np.exp(row - row.max()).sum())))
    assert np.allclose(got, want, atol=1e-3)
