"""model_backend.diffusion_gemma_embed: decoder input embeddings from the GGUF-stored weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dgchat.model_backend.diffusion_gemma_embed import SelfConditioning, layer_scalars
from dgchat.model_backend.gguf_file import read_gguf_header, read_tensor
from fixtures import dg_cache

pytest.importorskip("transformers", reason="tiny DiffusionGemma checkpoints are built with transformers")


@pytest.fixture(scope="module")
def reference(base: Path):
    from fixtures.dg_reference import Reference

    return Reference(dg_cache.checkpoint(base, "sw8"))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_matches_transformers(base: Path, reference, dtype: str) -> None:
    header = read_gguf_header(dg_cache.converted(base, "sw8", dtype))
    sc = SelfConditioning.from_gguf(header)
    emb = read_tensor(header, "token_embd.weight")
    rng = np.random.default_rng(0)
    canvas = rng.integers(0, 384, 8)
    logits = rng.normal(0, 3, (8, 384)).astype(np.float32)
    tol = 1e-5 if dtype == "float32" else 5e-2  # bf16 file vs the f32 reference weights
    # sharp logits (a low temperature): many probabilities are float32 subnormals, which the soft
    # embedding flushes to zero (engine/patches/0010) without moving the result
    sharp = logits * np.float32(30)
    z = np.exp((sharp - sharp.max(axis=1, keepdims=True)).astype(np.float64))
    p = (z / z.sum(axis=1, keepdims=True)).astype(np.float32)
    assert ((p > 0) & (p < np.finfo(np.float32).tiny)).sum() >= 10
    for sc_logits in (None, logits, sharp):
        ours = sc.decoder_inputs(emb, canvas, sc_logits)
        ref = reference.decoder_input_embeddings(canvas.tolist(), sc_logits)
        assert ours.dtype == np.float32 and ours.shape == (8, 64)
        assert np.abs(ours - ref).max() < tol
    # top-k soft embeddings approach the exact ones as k grows
    exact = sc.decoder_inputs(emb, canvas, logits)
    errs = [np.abs(sc.decoder_inputs(emb, canvas, logits, top_k=k) - exact).max() for k in (8, 64, 384)]
    assert errs[0] >= errs[1] >= errs[2] and errs[2] < 1e-5


def test_layer_scalars_round_trip(base: Path) -> None:
    from safetensors.numpy import load_file

    sd = load_file(str(dg_cache.checkpoint(base, "sw8") / "model.safetensors"))
    got = layer_scalars(dg_cache.converted(base, "sw8"))
    for which, prefix in (("encoder", "model.encoder.language_model"), ("decoder", "model.decoder")):
        want = [sd[f"{prefix}.layers.{i}.layer_scalar"][0] for i in range(4)]
        assert got[which] == pytest.approx(want)
