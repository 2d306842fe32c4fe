"""Exact mode at DiffusionGemma's real vocabulary size (262,144 tokens).

On a CPU the self-conditioning soft embedding over a vocabulary above 65,536 tokens defaults to each
position's 256 likeliest tokens (a 256 x 262,144 x d product per step is the cost it avoids).
`--precise` promises transformers' numbers, so it takes the exact product at every size; this
checks it on a tiny random checkpoint with that vocabulary: the whole generation equals
transformers' token for token, and `generate --precise --json` says which form ran."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from dgchat.model_backend.events import FinalEvent, StepEvent  # noqa: E402
from dgchat.model_backend.llamacpp import engine_info  # noqa: E402
from dgchat.model_backend.loader import load_engine  # noqa: E402
from dgchat.model_backend.params import DiffusionParams  # noqa: E402
from dgchat.model_backend.requests import CanvasTemplate  # noqa: E402
from fixtures.dg_cache import checkpoint, converted  # noqa: E402
from fixtures.dg_reference import hf_generate  # noqa: E402

VOCAB = 262_144
pytestmark = pytest.mark.skipif(not engine_info().exact_diffusion_gemma,
                                reason="exact DiffusionGemma needs dgchat's engine (README's install)")


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("dg-wide")
    return checkpoint(base, "v262k"), converted(base, "v262k")


def _generate(gguf: Path, *, precise: bool, soft_embedding: str = "auto") -> tuple[np.ndarray, np.ndarray,
                                                                                   FinalEvent]:
    """A deterministic generation (every position accepted) from a fixed canvas. Temperatures of 1e-6:
    among 262,144 random logits the top two can be closer than the 0.002 the 384-token tests use
    allows, and there the two samplers' different random draws would pick differently."""
    with load_engine(gguf, precise=precise, n_threads=2) as engine:
        assert engine.model.n_vocab == VOCAB
        length = int(engine.resolve().gen_length)
        prompt = engine.chat_prompt([{"role": "user", "content": "what is the answer?"}])
        initial = np.random.default_rng(7).integers(0, VOCAB, length).astype(np.int32)
        params = DiffusionParams(t_min=1e-6, t_max=2e-6, entropy_bound=1e6, steps=6, seed=0,
                                 soft_embedding=soft_embedding)
        template = CanvasTemplate(np.zeros(length, np.int32), np.zeros(length, bool), initial=initial)
        events = list(engine.generate(prompt, params, template=template))
    assert sum(isinstance(e, StepEvent) for e in events) >= 2  # self-conditioning ran after the first step
    final = events[-1]
    assert isinstance(final, FinalEvent)
    return prompt, initial, final


def test_precise_takes_the_exact_soft_embedding_and_equals_transformers(wide) -> None:
    ckpt, gguf = wide
    prompt, initial, final = _generate(gguf, precise=True)
    assert final.stats.soft_embedding == "exact"
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig

    hf = hf_generate(ckpt, prompt, initial, max_new_tokens=initial.size, max_denoising_steps=6, t_min=1e-6,
                     t_max=2e-6, sampler_config=EntropyBoundSamplerConfig(entropy_bound=1e6), eos_token_id=None)
    np.testing.assert_array_equal(final.tokens, hf[: final.tokens.size])
    # without exact mode a CPU keeps the cheaper form at this size, and says so
    _, _, fast = _generate(gguf, precise=False)
    assert fast.stats.soft_embedding == "top-256"


def test_generate_precise_json_reports_the_exact_soft_embedding(wide) -> None:
    from dgchat.cli import main

    _, gguf = wide
    for flag, form in (("--precise", "exact"), ("--no-precise", "top-256")):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = main(["generate", "-m", str(gguf), "-p", "Halt!", "--json", "--max-tokens", "8", "--steps", "4",
                       flag])
        assert rc in (0, None)
        report = json.loads(buf.getvalue())
        assert report["stats"]["soft_embedding"] == form, flag


def test_only_the_exact_soft_embedding_gives_transformers_self_conditioned_logits(wide) -> None:
    """Why precise needs the exact form at this size: one self-conditioned decoder pass through
    llama.cpp with each form of the soft embedding, against transformers' pass with the same signal.
    Measured on this fixture: exact 2.3e-5 (argmax 100 %), top-256 4.75 (argmax 12.5 %; logits up to ~6)."""
    from fixtures.dg_engine import SC_TEMPERATURE, Engine
    from fixtures.dg_reference import Reference

    ckpt, gguf = wide
    ref, eng = Reference(ckpt), Engine(gguf)
    try:
        rng = np.random.default_rng(0)
        length = int(eng.header.get("dgchat.diffusion.canvas_length"))
        prompt = rng.integers(7, VOCAB, 20).tolist()
        eng.encode(prompt)
        ref.encode(prompt)
        signal = ref.decode(rng.integers(0, VOCAB, length).tolist()) / SC_TEMPERATURE
        canvas = rng.integers(0, VOCAB, length).tolist()
        want = ref.decode(canvas, signal)
        errors = {}
        for form, top_k in (("exact", None), ("top-256", 256)):
            inputs = eng.sc.decoder_inputs(eng.embedding, np.asarray(canvas), signal, top_k=top_k)
            eng.ctx.set_causal(False)
            got = eng.ctx.decode_embeddings(inputs, np.arange(eng.n_past, eng.n_past + length)).copy()
            eng.ctx.seq_rm(0, eng.n_past, -1)
            eng.ctx.set_causal(True)
            errors[form] = float(np.abs(got - want).max())
    finally:
        eng.close()
    assert errors["exact"] < 3e-4, errors  # float32 noise (test_diffusion_gemma_numerics' EXACT)
    assert errors["top-256"] > 0.1, errors  # the approximation precise must not take here
