"""Reference mode produces the same tokens as llama.cpp's own diffusion sampler.

The comparison runs examples/diffusion/diffusion.cpp from the llama-cpp-python 0.3.36 sdist,
compiled unchanged against the installed libllama (tests/fixtures/llama_reference.py), on the same
GGUF, prompt tokens, context size and thread count. Reference mode samples positions with
llama.cpp's own sampler chain (llamacpp.SamplerChain) by default; the numpy re-implementation of
that chain is checked against the C++ example too, and against the C chain on synthetic logits.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from fixtures.llama_reference import build_harness, run_llama_diffusion
from dgchat.model_backend import llamacpp, reference_sampler
from dgchat.model_backend.loader import load_engine
from dgchat.model_backend.errors import EngineError
from dgchat.model_backend.events import FinalEvent
from dgchat.model_backend.params import DiffusionParams
from dgchat.model_backend.reference_sampler import ReferenceParams, reference_denoise

needs_cxx = pytest.mark.skipif(shutil.which("g++") is None, reason="needs a C++ compiler")
needs_chain = pytest.mark.skipif(not llamacpp.SAMPLER_CHAIN, reason="llama-cpp-python without the sampler API")

CONFIGS = [
    # (schedule, sampler settings)
    ("block", dict(top_k=1, temperature=0.0, algorithm="confidence")),  # greedy
    ("eps", dict(top_k=1, temperature=0.0, algorithm="confidence")),
    ("eps", dict(top_k=40, top_p=0.95, temperature=0.8, algorithm="confidence")),  # the CLI's defaults
    ("block", dict(top_p=0.9, temperature=0.5, algorithm="random")),
    ("eps", dict(temperature=0.7, algorithm="entropy")),
    ("block", dict(top_k=20, temperature=1.0, algorithm="margin")),
    ("eps", dict(temperature=1.0, algorithm="origin")),
    ("block", dict(top_k=10, temperature=1.0, algorithm="confidence", alg_temp=0.5)),
    ("eps", dict(temperature=1.5, algorithm="confidence", gumbel=True)),
    # more steps than tokens: some steps commit nothing (reference mode skips their sampling)
    ("eps-slow", dict(top_k=40, top_p=0.95, temperature=0.8, algorithm="confidence")),
    ("eps-slow", dict(temperature=0.5, algorithm="random")),
]


@pytest.fixture(scope="module")
def harness() -> Path:
    return build_harness()


@needs_cxx
@pytest.mark.parametrize("chain", ["llama.cpp", "numpy"])
@pytest.mark.parametrize("arch", ["llada", "dream"])
@pytest.mark.parametrize("schedule, cfg", CONFIGS)
def test_same_tokens_as_llama_cpp(harness: Path, llada_gguf: Path, dream_gguf: Path, arch: str, schedule: str,
                                  cfg: dict, chain: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if chain == "llama.cpp" and not llamacpp.SAMPLER_CHAIN:
        pytest.skip("llama-cpp-python without the sampler API")
    if chain == "numpy":  # the engine asks for "auto": make the numpy chain the one available
        monkeypatch.setattr(reference_sampler, "_llama_chain_available", lambda: False)
    path = llada_gguf if arch == "llada" else dream_gguf
    with load_engine(path) as engine:
        prompt = engine.encode("Halt, traveller! None may pass")
        if schedule == "block":
            extra, steps, L = dict(block_length=16), 16, 64 - prompt.size
        elif schedule == "eps":
            extra, steps, L = dict(eps=0.001), 24, 40
        else:
            extra, steps, L = dict(eps=0.001), 48, 40
        params = DiffusionParams(steps=steps, gen_length=L, mode="reference", seed=1234, **extra, **cfg)
        final = [e for e in engine.generate(prompt, params) if isinstance(e, FinalEvent)][0]
        ours = np.concatenate([prompt, final.extra["sequence"]])
        theirs = run_llama_diffusion(
            harness, path, prompt, n_ctx=engine._ctx_tokens, n_threads=os.cpu_count() or 1,
            steps=steps, max_length=prompt.size + L, seed=1234, shift_logits=engine.info.shift_logits,
            **extra, **cfg,
        )
    mask = engine.info.mask_token
    # the run really filled the canvas. Not always every position: llama.cpp can sample the mask token
    # itself, and with alg_temp draw a position twice in one step; reference mode keeps both quirks.
    assert float(np.mean(theirs[prompt.size:] != mask)) > 0.5
    assert len(set(theirs[prompt.size:].tolist())) > 1 or cfg.get("top_k") == 1
    np.testing.assert_array_equal(ours, theirs)


# -- the C chain against the numpy chain, on synthetic logits ------------------------------------------
# A vocabulary over 1024 tokens takes top-p's adaptive partial sort, top-k over 128 the bucket sort.

N_VOCAB = 1500
MASK = N_VOCAB - 1
PROMPT = np.array([3, 14, 15, 92, 65], dtype=np.int32)


def _synthetic_logits(max_length: int, scale: float = 3.0):
    """A fixed function of the tokens, like a model: the same tokens always give the same logits."""
    rng = np.random.default_rng(7)
    emb = rng.standard_normal((N_VOCAB, 16)).astype(np.float32)
    pos = rng.standard_normal((max_length, 16)).astype(np.float32)
    w = (rng.standard_normal((16, N_VOCAB)) * scale).astype(np.float32)

    def logits_fn(tokens: np.ndarray, rows: np.ndarray) -> np.ndarray:
        h = emb[tokens] + pos[: tokens.size] + emb[tokens].mean(axis=0)  # every position sees the others
        # einsum, not a BLAS product: a multi-threaded BLAS stalls on a busy machine
        return np.einsum("td,dv->tv", np.tanh(h[rows]), w).astype(np.float32)

    return logits_fn


def _run(params: ReferenceParams, chain: str, threads: int = 1) -> tuple[np.ndarray, list]:
    steps = list(reference_denoise(PROMPT, params, _synthetic_logits(params.max_length), lambda: 0.0, chain=chain,
                                   sampler_threads=threads))
    trace = [(s.committed.tolist(), s.confidence.tolist()) for s in steps]
    return steps[-1].tokens.copy(), trace


CHAIN_CONFIGS = [
    dict(top_k=40, top_p=0.95, temperature=0.8),  # the CLI's defaults
    dict(top_k=40, top_p=0.95, temperature=0.8, algorithm="entropy"),
    dict(top_k=200, top_p=0.9, temperature=1.2, algorithm="margin"),
    dict(top_p=0.9, temperature=0.6, algorithm="margin"),
    dict(temperature=0.7, top_p=1.0, algorithm="entropy"),
    dict(temperature=1.0, top_p=1.0, algorithm="margin"),  # unsorted candidates: token ids 0 and 1
    dict(top_k=1, top_p=1.0),
    dict(top_k=10, temperature=1.0, top_p=1.0, alg_temp=0.5),
    dict(top_k=300, temperature=0.9, top_p=1.0, alg_temp=0.2, algorithm="entropy"),
    dict(top_k=40, top_p=0.95, temperature=1.0, algorithm="origin"),
    dict(top_p=0.8, temperature=0.5, algorithm="random"),
    dict(top_k=40, top_p=0.95, temperature=1.5, add_gumbel_noise=True),
    dict(top_k=40, top_p=0.95, temperature=0.8, cfg_scale=0.5, shift_logits=True),
]


@needs_chain
@pytest.mark.parametrize("seed", [0, 987654321])
@pytest.mark.parametrize("cfg", CHAIN_CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("schedule", ["eps", "block"])
def test_llama_chain_and_numpy_chain_agree(cfg: dict, seed: int, schedule: str) -> None:
    extra = dict(eps=0.001, steps=24) if schedule == "eps" else dict(block_length=16, steps=16)
    params = ReferenceParams(max_length=64, mask_token_id=MASK, seed=seed, **extra, **cfg)
    c_tokens, c_trace = _run(params, "llama.cpp")
    n_tokens, n_trace = _run(params, "numpy")
    assert np.count_nonzero(c_tokens[PROMPT.size:] != MASK) > 30
    np.testing.assert_array_equal(c_tokens, n_tokens)
    # the same positions committed in the same order. Confidences may differ in the last bit: numpy
    # rounds expf / logf from double, glibc's are within 0.52 ulp of that
    assert [c for c, _ in c_trace] == [c for c, _ in n_trace]
    for (_, a), (_, b) in zip(c_trace, n_trace):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


@needs_chain
@pytest.mark.parametrize("cfg", [dict(top_k=40, top_p=0.95, temperature=0.8),
                                 dict(top_p=1.0, temperature=0.7, algorithm="entropy")])
def test_threads_give_the_same_draws(cfg: dict) -> None:
    # 59 masked positions: split over 3 threads, each with a clone of the chain advanced to its rows
    params = ReferenceParams(steps=12, max_length=64, mask_token_id=MASK, eps=0.001, seed=5, **cfg)
    one = _run(params, "llama.cpp", threads=1)
    three = _run(params, "llama.cpp", threads=3)
    np.testing.assert_array_equal(one[0], three[0])
    assert one[1] == three[1]


@needs_chain
@pytest.mark.parametrize("cfg", [dict(top_k=40, top_p=0.95, temperature=0.8), dict(top_k=1, top_p=1.0, temperature=0.0),
                                 dict(top_k=0, top_p=1.0, temperature=1.3), dict(top_k=0, top_p=0.5, temperature=0.0)])
def test_sampler_chain_reads_what_calculate_confidence_reads(cfg: dict) -> None:
    rng = np.random.default_rng(3)
    logits = (rng.standard_normal((50, 3000)) * 4).astype(np.float32)
    rows = rng.integers(0, 50, size=45)
    rnds = reference_sampler.CxxMt19937(11).uniform_double(rows.size)
    params = ReferenceParams(steps=1, max_length=2, mask_token_id=0, **cfg)
    expect = reference_sampler._sample_rows(logits[rows], params, rnds)
    second = expect.probs[:, min(1, expect.probs.shape[1] - 1)]
    for threads in (1, 2):
        with llamacpp.SamplerChain(3000, seed=11, **cfg) as chain:
            got = chain.sample(logits, rows, entropy=True, threads=threads)
        idx = np.arange(rows.size)
        np.testing.assert_array_equal(got.tokens, expect.tokens)
        np.testing.assert_array_equal(got.n_candidates, expect.size)
        close = dict(rtol=1e-6, atol=1e-7)  # glibc's expf vs numpy's correctly rounded one: last bit
        np.testing.assert_allclose(got.p_selected, expect.probs[idx, expect.sel], **close)
        np.testing.assert_allclose(got.p_first, expect.probs[:, 0], **close)
        np.testing.assert_allclose(got.p_second, np.where(expect.size > 1, second, 0), **close)
        np.testing.assert_allclose(got.entropy, reference_sampler._entropy(expect.probs), **close)


@needs_chain
def test_dist_sampler_draws_with_repeats_like_the_example() -> None:
    conf_logits = (np.random.default_rng(2).random(30) / 0.3).astype(np.float32)
    with llamacpp.DistSampler(99) as dist:
        got = dist.draw(conf_logits, 40)
    params = ReferenceParams(steps=1, max_length=2, mask_token_id=0, seed=99)
    np.testing.assert_array_equal(got, reference_sampler._NumpyChain(params).select(conf_logits, 40))
    assert len(set(got.tolist())) < 40  # positions can be drawn twice


@needs_chain
def test_sampler_chain_is_freed() -> None:
    chain = llamacpp.SamplerChain(100, top_k=5, top_p=1.0, temperature=1.0, seed=1)
    with chain:
        chain.sample(np.zeros((2, 100), np.float32), np.array([0, 1]))
    with pytest.raises(EngineError):
        chain.sample(np.zeros((2, 100), np.float32), np.array([0, 1]))
    chain.close()  # closing twice is fine
    with pytest.raises(EngineError):
        llamacpp.SamplerChain(100, top_k=5, top_p=1.0, temperature=1.0, seed=1).sample(
            np.zeros((2, 100), np.float32), np.array([2]))


def test_default_seed_uses_the_numpy_chain() -> None:
    # llama.cpp seeds dist from the clock for LLAMA_DEFAULT_SEED; dgchat's seeds are reproducible
    p = ReferenceParams(steps=1, max_length=8, mask_token_id=0, seed=0xFFFFFFFF)
    assert isinstance(reference_sampler._make_chain(p, "auto", 1), reference_sampler._NumpyChain)
