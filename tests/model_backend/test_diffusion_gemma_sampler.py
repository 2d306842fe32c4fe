"""DiffusionGemma's sampler and generation loop against transformers' reference implementation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from dgchat.model_backend.loader import load_engine  # noqa: E402
from dgchat.model_backend.entropy_bound import (  # noqa: E402
    EntropyBoundConfig,
    StabilityTracker,
    StepDraws,
    entropy_bound_step,
)
from dgchat.model_backend.events import FinalEvent, StepEvent  # noqa: E402
from dgchat.model_backend.llamacpp import engine_info  # noqa: E402
from dgchat.model_backend.requests import CanvasTemplate  # noqa: E402
from dgchat.model_backend.params import DiffusionParams  # noqa: E402
from fixtures.dg_cache import checkpoint, converted  # noqa: E402
from fixtures.dg_reference import hf_generate  # noqa: E402
from fixtures.device import skip_if_lavapipe_crashed  # noqa: E402

EXACT = engine_info().exact_diffusion_gemma


def _hf_sampler(cfg: EntropyBoundConfig, L: int, V: int):
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
        EntropyBoundSampler,
        EntropyBoundSamplerConfig,
        LinearTemperatureScheduleLogitsProcessor,
    )

    sampler = EntropyBoundSampler(EntropyBoundSamplerConfig(entropy_bound=cfg.entropy_bound), L, V, cfg.steps)
    temp = LinearTemperatureScheduleLogitsProcessor(cfg.t_min, cfg.t_max, cfg.steps)
    return sampler, temp


@pytest.mark.parametrize("seed, bound", [(0, 0.1), (1, 0.5), (2, 2.0), (3, 0.01)])
def test_one_step_matches_transformers_given_the_same_draws(seed: int, bound: float) -> None:
    L, V = 24, 64
    cfg = EntropyBoundConfig(steps=48, entropy_bound=bound, t_min=0.4, t_max=0.8, stability_threshold=1,
                             confidence_threshold=0.005)
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((L, V)) * rng.uniform(0.5, 6, (L, 1))).astype(np.float32)
    current = rng.integers(0, V, L).astype(np.int32)
    draws = StepDraws.draw(rng, L, V)
    cur_step = int(rng.integers(1, cfg.steps + 1))
    ours = entropy_bound_step(current, logits, cur_step, cfg, draws)

    sampler, temp = _hf_sampler(cfg, L, V)
    processed = temp(None, torch.from_numpy(logits)[None], cur_step=torch.tensor(cur_step))
    np.testing.assert_allclose(ours.processed, processed[0].numpy(), rtol=1e-6)
    np.testing.assert_array_equal(ours.argmax, processed[0].argmax(-1).numpy())
    denoiser = torch.from_numpy(ours.denoised.astype(np.int64))[None]
    accepted = sampler.accept_canvas(torch.from_numpy(current.astype(np.int64))[None], denoiser, processed, cur_step)
    np.testing.assert_array_equal(ours.accepted, sampler.accepted_token_mask[0].numpy())
    assert 1 <= ours.accepted.sum() <= L
    sampler.initialize_canvas = lambda batch_size, device: torch.from_numpy(draws.renoise.astype(np.int64))[None]
    renoised = sampler.renoise_canvas(accepted, cur_step)
    np.testing.assert_array_equal(ours.canvas, renoised[0].numpy())


def test_denoiser_draws_follow_the_distribution() -> None:
    L, V = 4000, 5
    cfg = EntropyBoundConfig(steps=10, entropy_bound=0.1, t_min=1.0, t_max=1.0 + 1e-6, stability_threshold=1,
                             confidence_threshold=0.005)
    p = np.array([0.5, 0.25, 0.15, 0.1, 0.0]) + 1e-12
    logits = np.log(p)[None].repeat(L, 0).astype(np.float32)
    res = entropy_bound_step(np.zeros(L, np.int32), logits, 10, cfg, StepDraws.draw(np.random.default_rng(0), L, V))
    np.testing.assert_allclose(np.bincount(res.denoised, minlength=V) / L, p, atol=0.03)


def test_stopping_criterion_matches_transformers() -> None:
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import StableAndConfidentStoppingCriteria

    rng = np.random.default_rng(0)
    for threshold in (0, 1, 2):
        hf = StableAndConfidentStoppingCriteria(threshold, 0.5)
        ours = StabilityTracker(threshold, 0.5)
        canvases = [rng.integers(0, 3, 6) for _ in range(3)]
        seq = [canvases[0], canvases[0], canvases[1], canvases[1], canvases[1], canvases[2]]
        for i, a in enumerate(seq):
            sharp = np.full((6, 4), -30.0, np.float32)
            sharp[np.arange(6), a % 4] = 0.0 if i % 2 else 30.0  # alternate confident / unsure
            logits = torch.from_numpy(sharp)[None]
            expect = bool(hf(torch.from_numpy(a)[None], logits)[0])
            probs = torch.softmax(logits[0], -1).numpy()
            mean_h = float(np.mean(-(probs * np.log(np.maximum(probs, 1e-30))).sum(-1)))
            assert ours.update(a, mean_h) == expect, (threshold, i)


@pytest.fixture(scope="module")
def dg_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("dg-gen")
    return {name: converted(base, name) for name in ("sw8", "sw64")} | {
        f"ckpt-{name}": checkpoint(base, name) for name in ("sw8", "sw64")
    }


@pytest.mark.parametrize("name", ["sw8", "sw64"])
def test_whole_generation_matches_transformers(dg_files, name: str) -> None:
    """Deterministic setting: temperatures near 0 make both samplers take the argmax, and an
    entropy bound no canvas reaches accepts every position, so no random re-noising happens.
    Both start from the same canvas; the outputs must be the same tokens on the patched engine."""
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig

    with load_engine(dg_files[name], precise=True) as engine:
        L = int(engine.resolve().gen_length)
        prompt = engine.chat_prompt([{"role": "user", "content": "what is the answer?"}])
        initial = np.random.default_rng(7).integers(0, engine.model.n_vocab, L).astype(np.int32)
        params = DiffusionParams(t_min=0.001, t_max=0.002, entropy_bound=1e6, steps=6, seed=0)
        template = CanvasTemplate(np.zeros(L, np.int32), np.zeros(L, bool), initial=initial)
        events = list(engine.generate(prompt, params, template=template))
        final = events[-1]
        assert isinstance(final, FinalEvent)
        steps = [e for e in events if isinstance(e, StepEvent)]
        assert all(e.uniform_state for e in steps)
        hf = hf_generate(dg_files[f"ckpt-{name}"], prompt, initial, max_new_tokens=L, max_denoising_steps=6,
                          t_min=0.001, t_max=0.002, sampler_config=EntropyBoundSamplerConfig(entropy_bound=1e6),
                          eos_token_id=None)
        if EXACT:
            np.testing.assert_array_equal(final.tokens, hf[: final.tokens.size])
            assert final.engine_label.startswith("DiffusionGemma, patched")
        else:  # the stock engine runs, labelled, and differs
            assert "APPROXIMATE" in final.engine_label


def test_diffusion_gemma_cli_and_ar(dg_files) -> None:
    import json
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "dgchat", "generate", "-m", str(dg_files["sw64"]), "-p", "hello",
                          "--max-tokens", "16", "--json"], capture_output=True, text=True, timeout=300)
    skip_if_lavapipe_crashed(res.returncode)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["architecture"] == "gemma4" and out["stats"]["steps"] > 0
    assert out["engine"].startswith("DiffusionGemma, patched") == EXACT
    res = subprocess.run([sys.executable, "-m", "dgchat", "generate", "-m", str(dg_files["sw64"]), "-p", "hello",
                          "--max-tokens", "10", "--ar", "--json"], capture_output=True, text=True, timeout=300)
    skip_if_lavapipe_crashed(res.returncode)
    assert res.returncode == 0, res.stderr
    ar = json.loads(res.stdout)
    assert ar["stats"]["steps"] == len(ar["tokens"]) + (1 if ar["stop_reason"] == "eos" else 0)
    bad = subprocess.run([sys.executable, "-m", "dgchat", "generate", "-m", str(dg_files["sw64"]), "-p", "x",
                          "--threshold", "0.9"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "entropy-bound" in bad.stderr


def test_pad_bias_moves_the_pad_token_while_denoising_only(dg_files) -> None:
    """A large pad bias fills every canvas with pads; a ban in logit_bias still wins over it; --ar
    never reads it (random weights: the pad is one token of 384 otherwise)."""
    with load_engine(dg_files["sw64"]) as engine:
        pad = engine.model.pad
        assert pad is not None and engine.resolve().pad_bias == 0.0
        prompt = engine.chat_prompt([{"role": "user", "content": "hello world"}])

        def final(**kw) -> np.ndarray:
            events = list(engine.generate(prompt, DiffusionParams(seed=3, max_tokens=16, **kw)))
            assert isinstance(events[-1], FinalEvent)
            return events[-1].tokens

        plain = final()
        assert (plain != pad).any()
        assert (final(pad_bias=60.0) == pad).all()
        assert not (final(pad_bias=60.0, logit_bias=((pad, -100.0),)) == pad).any()
        np.testing.assert_array_equal(final(autoregressive=True, pad_bias=60.0), final(autoregressive=True))


def test_ar_mode_equals_causal_greedy_decoding(dg_files) -> None:
    """--ar is the encoder as a causal LM: greedy tokens equal transformers' encoder argmax chain."""
    from fixtures.dg_reference import Reference

    with load_engine(dg_files["sw64"], precise=True) as engine:
        prompt = engine.chat_prompt([{"role": "user", "content": "hello world"}])
        final = [e for e in engine.generate(prompt, DiffusionParams(autoregressive=True, max_tokens=8))
                 if isinstance(e, FinalEvent)][0]
    ref = Reference(dg_files["ckpt-sw64"])
    logits = ref.encode(prompt.tolist())
    toks = []
    for _ in range(final.tokens.size):
        t = int(logits[-1].argmax())
        toks.append(t)
        logits = ref.encode([t])
    np.testing.assert_array_equal(final.tokens, toks)


def test_inverse_cdf_draws_the_categorical_of_the_uniform() -> None:
    from dgchat.model_backend.sampling import inverse_cdf

    rng = np.random.default_rng(7)
    for v in (5, 128, 1000, 8192):
        logits = (rng.standard_normal((300, v)) * rng.uniform(0.1, 8, (300, 1))).astype(np.float32)
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p = (p / p.sum(-1, keepdims=True)).astype(np.float32)
        u = rng.random(300).astype(np.float32)
        drawn = inverse_cdf(p, u)
        assert drawn.min() >= 0 and drawn.max() < v
        # exact in float64 except where the target is a float tie with a boundary
        cdf = np.cumsum(p.astype(np.float64), axis=-1)
        exact = np.array([np.searchsorted(c, t * c[-1], side="left") for c, t in zip(cdf, u.astype(np.float64))])
        differ = np.flatnonzero(drawn != exact)
        for row in differ:
            lo, hi = sorted((int(drawn[row]), int(exact[row])))
            assert np.abs(cdf[row, lo:hi] - u[row] * cdf[row, -1]).min() < 1e-5
        assert differ.size <= 3
    # 4000 draws of a 3-token distribution follow it
    probs = np.tile(np.array([[0.7, 0.2, 0.1]], np.float32), (4000, 1))
    freq = np.bincount(inverse_cdf(probs, rng.random(4000).astype(np.float32)), minlength=3) / 4000
    np.testing.assert_allclose(freq, [0.7, 0.2, 0.1], atol=0.03)
