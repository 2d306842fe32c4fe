"""`--precise` is the engine the equivalence tests use: on the DiffusionGemma fixture, the engine the
CLI opens with precise=True gives transformers' tokens at temperature -> 0; the default engine
(f16 KV cache, flash attention on auto) is measured against transformers and printed.

Run with `-s` to see the measurement (README, "Exact mode: --precise")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers", reason="tiny DiffusionGemma checkpoints are built with transformers")

from dgchat.commands.common import open_local_engine  # noqa: E402
from dgchat.model_backend.events import FinalEvent  # noqa: E402
from dgchat.model_backend.llamacpp import engine_info  # noqa: E402
from dgchat.model_backend.masked_diffusion import CanvasTemplate  # noqa: E402
from dgchat.model_backend.params import DiffusionParams  # noqa: E402
from fixtures import dg_cache  # noqa: E402
from fixtures.dg_engine import run_scenario  # noqa: E402
from fixtures.dg_reference import hf_generate  # noqa: E402

EXACT = engine_info().exact_diffusion_gemma
STEPS = 6
# temperatures near 0: both samplers take the argmax; an entropy bound no canvas reaches: every
# position is accepted, nothing is re-noised at random (tests/test_dg_sampler.py, the same setting)
NEAR_ZERO = dict(t_min=0.001, t_max=0.002, entropy_bound=1e6, steps=STEPS, seed=0)


@pytest.fixture(scope="module")
def dg(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.getbasetemp()
    return dg_cache.converted(base, "sw64"), dg_cache.checkpoint(base, "sw64")


def _transformers_tokens(ckpt: Path, prompt: np.ndarray, initial: np.ndarray) -> np.ndarray:
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig

    return hf_generate(ckpt, prompt, initial, max_new_tokens=initial.size, max_denoising_steps=STEPS,
                       t_min=NEAR_ZERO["t_min"], t_max=NEAR_ZERO["t_max"], eos_token_id=None,
                       sampler_config=EntropyBoundSamplerConfig(entropy_bound=NEAR_ZERO["entropy_bound"]))


def _engine_tokens(gguf: Path, *, precise: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """prompt, initial canvas and the answer's tokens on the engine `dgchat generate` opens."""
    with open_local_engine(gguf, n_threads=2, precise=precise) as engine:
        assert engine.precise is precise
        size = int(engine.resolve().gen_length)
        prompt = engine.chat_prompt([{"role": "user", "content": "what is the answer?"}])
        initial = np.random.default_rng(7).integers(0, engine.model.n_vocab, size).astype(np.int32)
        template = CanvasTemplate(np.zeros(size, np.int32), np.zeros(size, bool), initial=initial)
        final = list(engine.generate(prompt, DiffusionParams(**NEAR_ZERO), template=template))[-1]
        assert isinstance(final, FinalEvent)
        return prompt, initial, final.tokens


@pytest.mark.skipif(not EXACT, reason="the exact DiffusionGemma engine needs dgchat's llama.cpp patches")
def test_precise_gives_transformers_tokens_at_zero_temperature(dg) -> None:
    gguf, ckpt = dg
    prompt, initial, ours = _engine_tokens(gguf, precise=True)
    ref = _transformers_tokens(ckpt, prompt, initial)
    np.testing.assert_array_equal(ours, ref[: ours.size])


@pytest.mark.skipif(not EXACT, reason="the exact DiffusionGemma engine needs dgchat's llama.cpp patches")
def test_default_mode_logits_measured_against_transformers(dg) -> None:
    """How far the default engine's logits move (f16 KV cache, flash attention on auto) next to the
    precise one's, on the equivalence scenario of tests/test_dg_numerics.py; printed, bounded
    loosely (the default mode is not an equivalence claim, just not broken)."""
    from fixtures.dg_reference import Reference

    gguf, ckpt = dg
    summaries = {}
    for exact_kv in (True, False):
        d = run_scenario(gguf, ckpt, reference=Reference(ckpt), exact_kv=exact_kv)
        summaries["precise" if exact_kv else "default"] = d.summary()
    _, _, default_tokens = _engine_tokens(gguf, precise=False)
    prompt, initial, precise_tokens = _engine_tokens(gguf, precise=True)
    same = float(np.mean(default_tokens == precise_tokens[: default_tokens.size]))
    for mode, s in summaries.items():
        print(f"\n{mode}: max |logit - transformers| encoder {s['encoder']:.3g}, decoder {s['decoder']:.3g}, "
              f"self-conditioned decoder {s['decoder_sc']:.3g}; argmax agreement {s['argmax_agree']:.4f}")
    print(f"default mode: {same:.0%} of the T->0 answer's tokens equal the precise (transformers') tokens")
    precise, default = summaries["precise"], summaries["default"]
    assert max(precise["encoder"], precise["decoder"], precise["decoder_sc"]) < 3e-4, precise
    assert max(default["encoder"], default["decoder"], default["decoder_sc"]) < 0.5, default
