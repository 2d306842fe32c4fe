"""dgchat convert on tiny LLaDA / Dream / LLaDA-MoE / RND1 checkpoints in their published HF layouts.

Logits of the converted files, run by llama.cpp through the engine wrapper with f32 KV and no flash
attention (`exact_kv`), are compared with numpy forwards written from each family's modeling code
(tests/fixtures/convert_reference.py). Tolerance: 1e-4 absolute on logits of magnitude ~30 (rms ~8);
the measured differences are ~1e-5 (float32 accumulation in ggml)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dgchat.convert import convert
from dgchat.model_backend.gguf_file import read_gguf_header, read_tensor
from dgchat.model_backend.llamacpp import LlamaContext, LlamaModel
from fixtures import convert_cache as cc
from fixtures.convert_reference import reference_logits
from fixtures.convert_tiny import TOKENIZE_SAMPLES, TOKENIZERS, reference_weights

pytest.importorskip("tokenizers")

TOL = 1e-4
CACHE_ARCH = {"llada": "llama", "dream": "qwen2", "llada-moe": "hy_v3", "rnd1": "qwen3moe"}
PRE = {"llada": "llama-bpe", "dream": "qwen2", "llada-moe": "llada-moe", "rnd1": "qwen2"}
SHIFT = {"llada": False, "dream": True, "llada-moe": False, "rnd1": True}


def _prompt(m: LlamaModel, text: str = "Halt, traveller! None may pass the gate.", masks: int = 10) -> np.ndarray:
    return np.concatenate([m.tokenize(text, add_special=False), np.full(masks, m.mask, np.int32)])


def _logits(path: Path, tokens: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    with LlamaModel(path, n_gpu_layers=0) as m:
        tokens = _prompt(m) if tokens is None else tokens
        ctx = LlamaContext(m, n_ctx=256, max_tokens=256, exact_kv=True)
        ctx.set_causal(False)
        out = ctx.decode_tokens(tokens, np.arange(tokens.size)).copy()
        ctx.close()
    return tokens, out


@pytest.mark.parametrize("cache_capable", [False, True], ids=["native", "kvcache"])
@pytest.mark.parametrize("name", [*cc.FAMILIES, "llada-tied"])
def test_logits_match_numpy_forward_of_the_modeling_code(base: Path, name: str, cache_capable: bool) -> None:
    path = cc.converted(base, name, cache_capable)
    tokens, out = _logits(path)
    ref = reference_logits(cc.config(base, name), reference_weights(cc.SPECS[name]), tokens)
    assert out.shape == ref.shape
    err = np.abs(out - ref).max()
    assert err < TOL, (name, cache_capable, err)
    assert np.abs(ref).max() > 10  # the comparison is not between near-zero numbers


@pytest.mark.parametrize("fam", cc.FAMILIES)
def test_layout_and_keys(base: Path, fam: str) -> None:
    from dgchat.model_backend.model_info import inspect_header

    cfg = cc.config(base, fam)
    for cache_capable in (False, True):
        h = read_gguf_header(cc.converted(base, fam, cache_capable))
        arch = CACHE_ARCH[fam] if cache_capable else {"llada-moe": "llada-moe"}.get(fam, fam)
        assert h.architecture == arch
        assert h.get(f"{arch}.attention.causal") is False
        assert h.get("diffusion.shift_logits") is SHIFT[fam]
        assert h.get("tokenizer.ggml.model") == "gpt2" and h.get("tokenizer.ggml.pre") == PRE[fam]
        assert h.get("tokenizer.ggml.mask_token_id") == cfg["mask_token_id"]
        assert h.get("tokenizer.ggml.eos_token_id") == cfg["eos_token_id"]
        assert h.get("tokenizer.ggml.add_bos_token") is (fam == "llada")
        assert len(h.get("tokenizer.ggml.tokens")) == cc.SPECS[fam].rows  # padded to the embedding rows
        assert h.get("tokenizer.chat_template") == TOKENIZERS[fam].template
        assert h.get("dgchat.family") == fam and h.get("dgchat.format") == 1
        assert h.get("dgchat.defaults_source")
        info = inspect_header(h)
        assert info.family == "masked" and info.has_kv_memory is cache_capable
        assert info.shift_logits is SHIFT[fam] and info.mask_token == cfg["mask_token_id"]
        assert info.preset == {"llada-moe": "llada"}.get(fam, fam)
        # the family's published sampler settings reach the engine's defaults
        assert info.defaults["steps"] == h.get("dgchat.steps") and info.defaults["algorithm"] == h.get("dgchat.algorithm")
    h = read_gguf_header(cc.converted(base, fam))
    names = set(h.tensors)
    assert {"token_embd.weight", "output_norm.weight", "output.weight", "blk.1.ffn_norm.weight"} <= names
    if fam in ("llada-moe", "rnd1"):
        assert h.tensors["blk.0.ffn_gate_exps.weight"].shape == (64, cc.SPECS[fam].expert_ff, 8)  # ggml order
        assert h.tensors["blk.0.ffn_gate_inp.weight"].type_name == "F32"
        assert "blk.0.attn_q_norm.weight" in names
    if fam == "rnd1":
        assert h.get("rnd1.attention.key_length") == 32 and h.get("rnd1.expert_used_count") == 2
    if fam == "dream":
        assert "blk.0.attn_q.bias" in names and "blk.0.attn_output.bias" not in names


def test_defaults_per_family(base: Path) -> None:
    got = {fam: read_gguf_header(cc.converted(base, fam)) for fam in cc.FAMILIES}
    llada = got["llada"]
    assert (llada.get("dgchat.steps"), llada.get("dgchat.gen_length"), llada.get("dgchat.block_length"),
            llada.get("dgchat.algorithm"), llada.get("dgchat.temperature")) == (128, 128, 32, "confidence", 0.0)
    assert got["llada-moe"].get("dgchat.block_length") == 32
    dream = got["dream"]
    assert (dream.get("dgchat.steps"), dream.get("dgchat.gen_length"), dream.get("dgchat.algorithm")) == (512, 512, "entropy")
    assert dream.get("dgchat.eps") == pytest.approx(1e-3) and dream.get("dgchat.temperature") == pytest.approx(0.2)
    assert got["rnd1"].get("dgchat.algorithm") == "entropy" and got["rnd1"].get("dgchat.steps") == 256
    # a cache-capable Dream written as qwen2 keeps Dream's sampler and shifted logits
    from dgchat.model_backend.model_info import inspect_header

    info = inspect_header(read_gguf_header(cc.converted(base, "dream", True)))
    assert info.preset == "dream" and info.shift_logits and info.defaults["eps"] == pytest.approx(1e-3)


@pytest.mark.parametrize("fam", cc.FAMILIES)
def test_tokenization_equals_the_tokenizers_library(base: Path, fam: str) -> None:
    from tokenizers import Tokenizer

    hf = Tokenizer.from_file(str(cc.checkpoint(base, fam) / "tokenizer.json"))
    spec = TOKENIZERS[fam]
    specials = [" ".join(spec.specials) + " then text", spec.mask * 3 + "x" + spec.mask,
                f"{spec.specials[0]}user{spec.specials[-2]}hello{spec.eos}"]
    with LlamaModel(cc.converted(base, fam), n_gpu_layers=0) as m:
        for text in TOKENIZE_SAMPLES + specials:
            ours = m.tokenize(text, add_special=False, parse_special=True).tolist()
            assert ours == hf.encode(text, add_special_tokens=False).ids, text
            if PRE[fam] != "llama-bpe":  # llama.cpp cleans spaces before punctuation for llama-bpe
                assert m.detokenize(ours, unparse_special=True) == text
        assert m.mask == hf.token_to_id(spec.mask) and m.is_eog(hf.token_to_id(spec.eos))
        assert not m.is_eog(m.mask)


@pytest.mark.parametrize("fam", cc.FAMILIES)
def test_gguf_to_cache_capable_copies_tensors_and_keeps_logits(base: Path, fam: str, tmp_path: Path) -> None:
    src = cc.converted(base, fam)
    res = convert(src, tmp_path, cache_capable=True)
    assert res.output == tmp_path / f"{src.stem}.kvcache.gguf" and res.gguf_arch == CACHE_ARCH[fam]
    a, b = read_gguf_header(src), read_gguf_header(res.output)
    direct = read_gguf_header(cc.converted(base, fam, True))
    assert set(b.tensors) == set(direct.tensors)
    raw_a, raw_b = src.read_bytes(), res.output.read_bytes()
    for name, info in a.tensors.items():  # every source tensor copied byte for byte
        ib = b.tensors[name]
        assert raw_a[info.offset:info.offset + info.nbytes] == raw_b[ib.offset:ib.offset + ib.nbytes], name
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "dgchat.steps", "diffusion.shift_logits"):
        assert b.get(key) == a.get(key)
    assert b.get(f"{CACHE_ARCH[fam]}.block_count") == 2
    tokens, ref = _logits(src)
    _, out = _logits(res.output, tokens)
    assert np.abs(out - ref).max() < TOL  # the same function; the graphs order float ops differently
    # a cache-capable file is already what --cache-capable makes
    from dgchat.convert.errors import ConvertError

    with pytest.raises(ConvertError, match="already in dgchat's layout"):
        convert(res.output, tmp_path / "again.gguf", cache_capable=True)


def test_upstream_style_gguf_gets_dgchat_keys(base: Path, tmp_path: Path) -> None:
    """A llada GGUF as llama.cpp's converter writes it (no dgchat keys, no mask id key): the remap
    adds the family's defaults and finds the mask token by its text."""
    import gguf

    src = cc.converted(base, "llada")
    reader = gguf.GGUFReader(src)
    up = tmp_path / "upstream-llada.gguf"
    w = gguf.GGUFWriter(str(up), "llada")
    for field in reader.fields.values():
        if field.name.startswith(("dgchat.", "GGUF.", "general.architecture", "diffusion.")) or \
                field.name == "tokenizer.ggml.mask_token_id":
            continue
        vtype = field.types[0]
        value = field.contents()
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(field.name, value, vtype, sub_type=sub)
    for t in reader.tensors:
        w.add_tensor(t.name, np.array(t.data), raw_shape=list(reversed(t.shape.tolist())), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    res = convert(up, tmp_path / "fixed.gguf")
    h = read_gguf_header(res.output)
    assert h.architecture == "llada" and h.get("dgchat.steps") == 128 and h.get("dgchat.source") == "gguf:llada"
    assert h.get("tokenizer.ggml.mask_token_id") == cc.config(base, "llada")["mask_token_id"]
    assert h.get("diffusion.shift_logits") is False
    tokens, ref = _logits(src)
    _, out = _logits(res.output, tokens)
    np.testing.assert_array_equal(out, ref)


def test_bf16_checkpoint_stays_bf16_bit_for_bit(base: Path) -> None:
    from gguf.constants import GGMLQuantizationType as Q

    from dgchat.convert.checkpoint import Checkpoint
    from dgchat.convert.families.masked import rope_pairs

    ckpt_dir = cc.checkpoint(base, "llada", "BF16")
    h = read_gguf_header(cc.converted(base, "llada", dtype="BF16"))
    assert Q(h.tensors["token_embd.weight"].ggml_type) == Q.BF16
    assert Q(h.tensors["blk.0.attn_q.weight"].ggml_type) == Q.BF16
    assert Q(h.tensors["blk.0.attn_norm.weight"].ggml_type) == Q.F32  # 1-D tensors stay f32
    assert h.get("general.file_type") == 32
    raw = h.path.read_bytes()
    with Checkpoint(ckpt_dir) as ckpt:
        for src, dst, perm in (("model.transformer.blocks.0.v_proj.weight", "blk.0.attn_v.weight", None),
                               ("model.transformer.blocks.0.q_proj.weight", "blk.0.attn_q.weight", rope_pairs(4))):
            want = ckpt.load(src)
            want = perm(want) if perm else want
            t = h.tensors[dst]
            assert raw[t.offset:t.offset + t.nbytes] == np.ascontiguousarray(want).tobytes()
    # --outtype f32 widens exactly: logits equal the numpy forward of the bf16 weights
    f32 = cc.converted(base, "llada", dtype="BF16", outtype="f32")
    tokens, out = _logits(f32)
    ref = reference_logits(cc.config(base, "llada"), reference_weights(cc.SPECS["llada"], "BF16"), tokens)
    assert np.abs(out - ref).max() < TOL
    f16 = read_gguf_header(cc.converted(base, "llada", dtype="BF16", outtype="f16"))
    assert Q(f16.tensors["blk.0.ffn_down.weight"].ggml_type) == Q.F16 and f16.get("general.file_type") == 1


def test_sharded_checkpoint_converts_identically(base: Path, tmp_path: Path) -> None:
    sharded = cc.checkpoint(base, "rnd1", "F32", shards=3)
    assert (sharded / "model.safetensors.index.json").is_file()
    res = convert(sharded, tmp_path / "sharded.gguf")
    a, b = read_gguf_header(res.output), read_gguf_header(cc.converted(base, "rnd1"))
    assert list(a.tensors) == list(b.tensors)
    for name in a.tensors:
        assert np.array_equal(read_tensor(a, name), read_tensor(b, name)), name


@pytest.mark.parametrize("fam", cc.FAMILIES)
def test_engine_generates_from_converted_files_with_every_cache(base: Path, fam: str) -> None:
    from dgchat.model_backend.loader import load_engine
    from dgchat.model_backend.events import FinalEvent
    from dgchat.model_backend.llamacpp import engine_info
    from dgchat.model_backend.params import DiffusionParams

    params = DiffusionParams(gen_length=16, steps=8, block_length=8, seed=1, temperature=0.0, top_p=1.0)
    modes = ["none", "prefix"] + (["dual"] if engine_info().noncontiguous_positions else [])
    results = {}
    for cache_capable in (False, True):
        with load_engine(cc.converted(base, fam, cache_capable), precise=True, n_threads=2) as engine:
            prompt = engine.chat_prompt([{"role": "user", "content": "Halt! Who goes there?"}])
            for mode in modes if cache_capable else ["none"]:
                final = [e for e in engine.generate(prompt, params.updated(cache=mode)) if isinstance(e, FinalEvent)][0]
                assert final.stats.steps > 0
                results[(cache_capable, mode)] = final.tokens.tolist()
    # without a cache both files run the same function: the same answer
    assert results[(True, "none")] == results[(False, "none")]
