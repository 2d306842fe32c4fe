"""The random-weight full-shape DiffusionGemma writer (tests/bench/make_fullshape_dg.py).

The writer's small-dimension variant goes through the same code as the 14 GB file: it must load in
the real llama.cpp as a DiffusionGemma, run diffusion and left-to-right decoding with finite
logits, and hold exactly the tensors, shapes and storage types asked for. The 30-layer plan is
checked without writing it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader
from gguf.constants import GGMLQuantizationType as Q
from gguf.quants import dequantize

import bench.make_fullshape_dg as fullshape
from bench.make_fullshape_dg import TINY, FullShapeSpec, build_plan, embedding_qtype, write_fullshape_dg
from dgchat.model_backend.loader import load_engine
from dgchat.model_backend.events import FinalEvent
from dgchat.model_backend.params import DiffusionParams


@pytest.fixture(scope="module")
def tiny_q4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_fullshape_dg(tmp_path_factory.mktemp("fullshape") / "dg-tiny-q4_0.gguf", **TINY)


def _final(events) -> FinalEvent:
    finals = [e for e in events if isinstance(e, FinalEvent)]
    assert len(finals) == 1
    return finals[0]


def test_loads_as_diffusion_gemma_and_runs(tiny_q4: Path) -> None:
    with load_engine(tiny_q4) as engine:
        assert engine.info.family == "diffusion_gemma"
        assert engine.info.defaults["gen_length"] == TINY["canvas_length"]
        assert engine.model.n_vocab == TINY["n_vocab"]
        prompt = engine.chat_prompt([{"role": "user", "content": "hello there, traveller"}])
        assert engine.detokenize(prompt).count("hello there, traveller") == 1

        # the causal encoder's logits: finite and not flat
        logp = engine.pseudo_log_likelihood(prompt[:4], prompt[4:])
        assert np.isfinite(logp).all() and np.ptp(logp) > 1e-3

        # diffusion at fixed steps (the bench's setting): 2 canvases of exactly 2 steps each
        params = DiffusionParams(steps=2, gen_length=16, max_tokens=32, early_stop=False, confidence_threshold=-1.0)
        final = _final(engine.generate(prompt, params))
        assert final.stats.steps == 4 and final.stats.canvases == 2
        assert final.tokens.size == 32 and final.tokens.min() >= 0 and final.tokens.max() < TINY["n_vocab"]
        assert np.unique(final.tokens).size > 1  # NaN logits would give one argmax everywhere
        assert final.stats.model_s > 0 and final.stats.sampler_s > 0

        ar = _final(engine.generate(prompt, DiffusionParams(autoregressive=True, max_tokens=4, early_stop=False)))
        assert ar.tokens.size == 4 and ar.stats.steps == 4


def _tensors(path: Path) -> dict[str, tuple[str, list[int]]]:
    return {t.name: (t.tensor_type.name, [int(n) for n in t.shape]) for t in GGUFReader(path).tensors}


def test_tensor_types_and_shapes(tiny_q4: Path) -> None:
    t = _tensors(tiny_q4)
    d, v, ff, e, eff = TINY["n_embd"], TINY["n_vocab"], TINY["n_ff"], TINY["n_expert"], TINY["expert_ff"]
    # ggml order (ne0 first); the tied embedding as llama-quantize stores it in a Q4_0 file
    assert t["token_embd.weight"] == ("Q6_K", [d, v])
    assert t["output_norm.weight"] == ("F32", [d])
    for il, (hd, kv) in enumerate(((TINY["head_dim_swa"], TINY["n_head_kv_swa"]),
                                   (TINY["head_dim_full"], TINY["n_head_kv_full"]))):
        b = f"blk.{il}."
        assert t[b + "attn_q.weight"] == ("Q4_0", [d, TINY["n_head"] * hd])
        assert t[b + "attn_k.weight"] == ("Q4_0", [d, kv * hd])
        assert t[b + "attn_output.weight"] == ("Q4_0", [TINY["n_head"] * hd, d])
        assert t[b + "attn_q_norm.weight"] == ("F32", [hd])
        assert t[b + "ffn_gate.weight"] == ("Q4_0", [d, ff])
        assert t[b + "ffn_down.weight"] == ("Q4_0", [ff, d])
        assert t[b + "ffn_gate_inp.weight"] == ("F32", [d, e])  # the router stays f32
        assert t[b + "ffn_gate_up_exps.weight"] == ("Q4_0", [d, 2 * eff, e])
        assert t[b + "ffn_down_exps.weight"] == ("Q4_0", [eff, d, e])
        assert t[b + "ffn_down_exps.scale"] == ("F32", [e])
        assert t[b + "layer_output_scale.weight"] == ("F32", [1])
    assert "blk.0.attn_v.weight" in t and "blk.1.attn_v.weight" not in t  # full layers: K is V
    assert len(t) == 3 + 22 + 21


def test_random_blocks_dequantize_to_the_intended_spread(tiny_q4: Path) -> None:
    for tensor in GGUFReader(tiny_q4).tensors:
        values = dequantize(tensor.data, tensor.tensor_type)
        assert np.isfinite(values).all(), tensor.name
        if tensor.tensor_type != Q.F32:
            assert 0.017 < values.std() < 0.023 and abs(values.mean()) < 0.003, tensor.name
        elif tensor.name.endswith(("norm.weight", ".scale")):
            assert 0.7 < values.mean() < 1.3, tensor.name


def test_q8_0_in_many_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # tiny tensors fit one chunk; a small chunk size exercises the streaming of a tensor in pieces
    monkeypatch.setattr(fullshape, "CHUNK_BYTES", 4096)
    path = write_fullshape_dg(tmp_path / "dg-tiny-q8_0.gguf", qtype="q8_0", **TINY)
    reader = GGUFReader(path)
    t = {x.name: x for x in reader.tensors}
    assert t["token_embd.weight"].tensor_type == Q.Q8_0  # llama-quantize keeps a Q8_0 file's embedding Q8_0
    experts = t["blk.0.ffn_gate_up_exps.weight"]
    assert experts.tensor_type == Q.Q8_0 and experts.data.nbytes > 4096
    values = dequantize(experts.data, experts.tensor_type)
    assert np.isfinite(values).all() and 0.017 < values.std() < 0.023
    assert int(reader.fields["general.file_type"].contents()) == 7  # LLAMA_FTYPE_MOSTLY_Q8_0


def test_full_size_plan_has_the_real_dimensions() -> None:
    spec = FullShapeSpec()
    plan, tensors = build_plan(spec, Q.Q4_0, embedding_qtype(Q.Q4_0, spec.n_embd), seed=0)
    shapes = {t.name: (t.qtype, t.shape) for t in tensors}  # numpy order
    assert shapes["token_embd.weight"] == (Q.Q6_K, (262_144, 2816))
    assert shapes["blk.0.attn_q.weight"] == (Q.Q4_0, (16 * 256, 2816))
    assert shapes["blk.0.attn_k.weight"] == (Q.Q4_0, (8 * 256, 2816))
    assert shapes["blk.5.attn_q.weight"] == (Q.Q4_0, (16 * 512, 2816))
    assert shapes["blk.5.attn_k.weight"] == (Q.Q4_0, (2 * 512, 2816))
    assert shapes["blk.0.ffn_gate.weight"] == (Q.Q4_0, (2112, 2816))
    assert shapes["blk.0.ffn_gate_up_exps.weight"] == (Q.Q4_0, (128, 2 * 704, 2816))
    assert plan.get("gemma4.block_count") == 30
    assert plan.get("gemma4.expert_used_count") == 8
    assert plan.get("gemma4.attention.sliding_window") == 1024
    assert plan.get("gemma4.final_logit_softcapping") == 30.0
    pattern = plan.get("gemma4.attention.sliding_window_pattern")
    assert [i for i, swa in enumerate(pattern) if not swa] == [5, 11, 17, 23, 29]
    assert plan.get("dgchat.diffusion.canvas_length") == 256
    assert plan.get("dgchat.diffusion_gemma.self_cond.intermediate_size") == 2112
    assert 14.0e9 < plan.total_bytes < 15.0e9
