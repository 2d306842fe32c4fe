"""dgchat.convert on real tiny DiffusionGemma checkpoints (transformers save_pretrained)."""

from __future__ import annotations

import errno
import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from dgchat.convert import convert
from dgchat.convert.errors import ConvertError
from dgchat.model_backend.gguf_file import read_gguf_header, read_tensor
from fixtures import dg_cache

pytest.importorskip("transformers", reason="tiny DiffusionGemma checkpoints are built with transformers")

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def ckpt(base: Path) -> Path:
    return dg_cache.checkpoint(base, "sw8")


@pytest.fixture(scope="module")
def gguf_path(base: Path) -> Path:
    return dg_cache.converted(base, "sw8")


def _safetensors_header(path: Path) -> tuple[dict, int]:
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        return json.loads(fh.read(n)), n


def _leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.startswith(".dgchat-partial-")]


def test_layout_is_stock_gemma4_plus_dgchat_keys(ckpt: Path, gguf_path: Path) -> None:
    h = read_gguf_header(gguf_path)
    cfg = json.loads((ckpt / "config.json").read_text())
    gen = json.loads((ckpt / "generation_config.json").read_text())
    tc = cfg["text_config"]
    assert h.architecture == "gemma4"
    assert h.get("gemma4.block_count") == 4
    assert h.get("gemma4.attention.sliding_window") == 8
    assert h.get("gemma4.attention.sliding_window_pattern") == [True, False, True, False]
    assert h.get("gemma4.attention.head_count_kv") == [2, 1, 2, 1]
    assert h.get("gemma4.attention.key_length") == 32 and h.get("gemma4.attention.key_length_swa") == 16
    assert h.get("gemma4.expert_count") == 4 and h.get("gemma4.expert_used_count") == 2
    assert h.get("gemma4.final_logit_softcapping") == pytest.approx(30.0)
    # only tensors the stock gemma4 loader knows
    names = set(h.tensors)
    assert not any("enc_" in n or "self_cond" in n for n in names)
    assert "blk.1.attn_v.weight" not in names and "blk.0.attn_v.weight" in names  # k_eq_v full layers
    assert {"rope_freqs.weight", "token_embd.weight", "output_norm.weight"} <= names
    freqs = read_tensor(h, "rope_freqs.weight")
    assert freqs.tolist() == np.array([1.0] * 4 + [1e30] * 12, np.float32).tolist()  # 0.25 of 32 dims rotate
    # layer scalars: the tensor holds the encoder set, the metadata both sets
    from safetensors.numpy import load_file

    sd = load_file(str(ckpt / "model.safetensors"))
    enc = [float(sd[f"model.encoder.language_model.layers.{i}.layer_scalar"][0]) for i in range(4)]
    dec = [float(sd[f"model.decoder.layers.{i}.layer_scalar"][0]) for i in range(4)]
    assert [float(read_tensor(h, f"blk.{i}.layer_output_scale.weight")[0]) for i in range(4)] == pytest.approx(enc)
    assert h.get("dgchat.diffusion_gemma.layer_scalars.encoder") == pytest.approx(enc)
    assert h.get("dgchat.engine.layer_output_scale.non_causal") == pytest.approx(dec)
    assert h.get("dgchat.engine.non_causal_type") == 3
    assert h.get("dgchat.diffusion_gemma.layer_output_scale_tensor") == "encoder"
    # diffusion defaults from generation_config.json
    assert h.get("dgchat.diffusion.canvas_length") == cfg["canvas_length"]
    assert h.get("dgchat.diffusion.max_denoising_steps") == gen["max_denoising_steps"]
    assert h.get("dgchat.diffusion.entropy_bound") == pytest.approx(gen["sampler_config"]["entropy_bound"])
    assert h.get("dgchat.diffusion.t_min") == pytest.approx(gen["t_min"])
    assert h.get("dgchat.diffusion.t_max") == pytest.approx(gen["t_max"])
    assert h.get("dgchat.diffusion.stability_threshold") == gen["stability_threshold"]
    assert h.get("dgchat.diffusion.confidence_threshold") == pytest.approx(gen["confidence_threshold"])
    assert h.get("dgchat.diffusion.eos_token_ids") == gen["eos_token_id"]
    assert h.get("dgchat.diffusion.defaulted") is None
    assert h.get("dgchat.diffusion.pad_bias") is None  # only where generation_config names one
    # tokenizer
    assert h.get("tokenizer.ggml.model") == "gemma4"
    assert len(h.get("tokenizer.ggml.tokens")) == tc["vocab_size"]
    assert h.get("tokenizer.ggml.eos_token_id") == 1 and h.get("tokenizer.ggml.eot_token_id") == 6
    assert h.get("tokenizer.ggml.mask_token_id") == 4
    assert "<|turn>" in h.get("tokenizer.chat_template")


def test_a_pad_bias_in_dgchat_generation_json_becomes_the_models_default(ckpt: Path, tmp_path: Path) -> None:
    """dgchat_generation.json (not generation_config.json, whose transformers class refuses keys it
    does not know) carries the pad bias into the GGUF; the engine reads it as the default."""
    from dgchat.model_backend.model_info import inspect_header

    src = tmp_path / "ckpt"
    shutil.copytree(ckpt, src)
    (src / "dgchat_generation.json").write_text(json.dumps({"pad_bias": -1.5}))
    h = read_gguf_header(convert(src, tmp_path / "pad.gguf").output)
    assert h.get("dgchat.diffusion.pad_bias") == pytest.approx(-1.5)
    assert inspect_header(h).defaults["pad_bias"] == pytest.approx(-1.5)
    for bad in ("-1", 1e9, True):
        (src / "dgchat_generation.json").write_text(json.dumps({"pad_bias": bad}))
        with pytest.raises(ConvertError, match="dgchat_generation.json: pad_bias = .* is not a number in"):
            convert(src, tmp_path / "bad.gguf")
    (src / "dgchat_generation.json").write_text("[1, 2]")
    with pytest.raises(ConvertError, match="expected a JSON object"):
        convert(src, tmp_path / "bad.gguf")
    assert not (tmp_path / "bad.gguf").exists()


def test_stock_llama_cpp_loads_it_and_tokenizes_like_transformers(ckpt: Path, gguf_path: Path) -> None:
    from transformers import AutoTokenizer

    from dgchat.model_backend.llamacpp import LlamaModel

    tok = AutoTokenizer.from_pretrained(str(ckpt))
    with LlamaModel(gguf_path, n_gpu_layers=0) as model:
        assert model.n_vocab == 384 and model.n_layer == 4 and model.n_swa == 8
        for text in ["hello world! the answer is 42 é", "  two  spaces\nnew line", "tokens, canvases"]:
            assert model.tokenize(text, add_special=False).tolist() == tok(text)["input_ids"]
        chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                       add_generation_prompt=True)
        ids = model.tokenize(chat, add_special=False, parse_special=True).tolist()
        assert ids == tok(chat, add_special_tokens=False)["input_ids"]
        assert model.bos == 2 and model.is_eog(1) and model.is_eog(6)


def test_bf16_checkpoint_stays_bf16_and_outtypes(base: Path) -> None:
    from gguf.constants import GGMLQuantizationType as Q

    bf16 = read_gguf_header(dg_cache.converted(base, "sw8", "bfloat16"))
    assert Q(bf16.tensors["token_embd.weight"].ggml_type) == Q.BF16
    assert Q(bf16.tensors["blk.0.ffn_gate_up_exps.weight"].ggml_type) == Q.BF16
    assert Q(bf16.tensors["blk.0.attn_norm.weight"].ggml_type) == Q.F32
    assert bf16.get("dgchat.diffusion_gemma.self_cond.dtype") == "bf16"
    q8 = read_gguf_header(dg_cache.converted(base, "sw8", "float32", "q8_0"))
    assert Q(q8.tensors["blk.0.attn_q.weight"].ggml_type) == Q.Q8_0
    assert Q(q8.tensors["blk.0.ffn_gate_inp.weight"].ggml_type) == Q.F32  # the router stays exact
    assert q8.get("general.file_type") == 7
    from dgchat.model_backend.llamacpp import LlamaModel

    for h in (bf16, q8):
        with LlamaModel(h.path, n_gpu_layers=0) as model:
            assert model.n_layer == 4


def test_sharded_checkpoint_converts_identically(ckpt: Path, gguf_path: Path, tmp_path: Path) -> None:
    from safetensors.numpy import load_file, save_file

    sharded = tmp_path / "sharded"
    shutil.copytree(ckpt, sharded)
    (sharded / "model.safetensors").unlink()
    sd = load_file(str(ckpt / "model.safetensors"))
    names = sorted(sd)
    half = len(names) // 2
    weight_map = {}
    for i, part in enumerate((names[:half], names[half:])):
        fname = f"model-0000{i + 1}-of-00002.safetensors"
        save_file({n: sd[n] for n in part}, str(sharded / fname))
        weight_map.update({n: fname for n in part})
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    out = convert(sharded, tmp_path / "sharded.gguf").output
    a, b = read_gguf_header(out), read_gguf_header(gguf_path)
    assert set(a.tensors) == set(b.tensors)
    for name in a.tensors:
        assert np.array_equal(read_tensor(a, name), read_tensor(b, name)), name


def test_dry_run_writes_nothing(ckpt: Path, tmp_path: Path) -> None:
    res = convert(ckpt, tmp_path / "x.gguf", dry_run=True)
    assert res.dry_run and res.output is None and res.n_tensors > 50 and res.n_bytes > 0
    assert list(tmp_path.iterdir()) == []


def test_default_output_name_and_progress(ckpt: Path, tmp_path: Path) -> None:
    src = tmp_path / "MyModel"
    shutil.copytree(ckpt, src)
    seen: list[tuple[int, int, str]] = []
    res = convert(src, progress=lambda done, total, name: seen.append((done, total, name)))
    assert res.output == tmp_path / "MyModel-f32.gguf" and res.output.is_file()
    assert seen[-1][0] == seen[-1][1] and len(seen) == res.n_tensors


def test_failure_mid_write_leaves_nothing(ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dgchat.convert.families.diffusion_gemma as family

    real = family.encode
    calls = {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 10:
            raise ConvertError("simulated failure")
        return real(*args, **kwargs)

    monkeypatch.setattr(family, "encode", flaky)
    with pytest.raises(ConvertError, match="simulated"):
        convert(ckpt, tmp_path / "out.gguf")
    assert list(tmp_path.iterdir()) == []


def test_disk_full_is_a_clear_error(ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dgchat.convert.writer as writer

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(writer.shutil, "disk_usage", lambda _p: usage._replace(free=1000))
    with pytest.raises(ConvertError, match="not enough disk space"):
        convert(ckpt, tmp_path / "out.gguf")
    monkeypatch.undo()

    def enospc(self, tensor, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(writer._Writer, "write_tensor_data", enospc)
    with pytest.raises(ConvertError, match="not enough disk space"):
        convert(ckpt, tmp_path / "out.gguf")
    assert list(tmp_path.iterdir()) == []


def test_missing_shard(ckpt: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(ckpt, bad)
    sd_names = list(_safetensors_header(ckpt / "model.safetensors")[0])
    wm = {n: "model.safetensors" for n in sd_names if n != "__metadata__"}
    wm[sd_names[1]] = "model-00002-of-00002.safetensors"
    (bad / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    with pytest.raises(ConvertError, match="missing shard model-00002-of-00002.safetensors"):
        convert(bad, tmp_path / "o.gguf")


def test_shape_mismatch_and_unsupported_dtype(ckpt: Path, tmp_path: Path) -> None:
    from safetensors.numpy import load_file, save_file

    sd = load_file(str(ckpt / "model.safetensors"))
    for case, edit, message in [
        ("shape", lambda d: d.__setitem__("model.decoder.layers.0.self_attn.q_proj.weight",
                                          np.zeros((8, 64), np.float32)), "has shape \\[8, 64\\]"),
        ("dtype", lambda d: d.__setitem__("model.decoder.norm.weight", np.zeros(64, np.int64)), "dtype I64"),
    ]:
        bad = tmp_path / case
        shutil.copytree(ckpt, bad)
        d = dict(sd)
        edit(d)
        save_file(d, str(bad / "model.safetensors"))
        with pytest.raises(ConvertError, match=message):
            convert(bad, tmp_path / f"{case}.gguf")
    # a shard whose header promises more bytes than the file holds
    trunc = tmp_path / "trunc"
    shutil.copytree(ckpt, trunc)
    st = trunc / "model.safetensors"
    st.write_bytes(st.read_bytes()[:-1000])
    with pytest.raises(ConvertError, match="truncated"):
        convert(trunc, tmp_path / "t.gguf")
    assert not any(p.suffix == ".gguf" for p in tmp_path.iterdir())


def test_unknown_architecture_lists_supported(ckpt: Path, tmp_path: Path) -> None:
    other = tmp_path / "llama"
    shutil.copytree(ckpt, other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["architectures"] = ["LlamaForCausalLM"]
    (other / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConvertError, match="unsupported architecture LlamaForCausalLM; supported: .*DiffusionGemmaForBlockDiffusion"):
        convert(other, tmp_path / "o.gguf")

    import gguf

    w = gguf.GGUFWriter(tmp_path / "llama.gguf", "llama")
    w.add_tensor("token_embd.weight", np.zeros((4, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ConvertError, match="unsupported GGUF architecture 'llama'; supported: diffusion-gemma"):
        convert(tmp_path / "llama.gguf", tmp_path / "o.gguf")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ConvertError, match="not a checkpoint folder or a GGUF"):
        convert(tmp_path / "notes.txt")
    with pytest.raises(ConvertError, match="unknown output type"):
        convert(ckpt, outtype="q4_k")


def test_cli(ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dgchat.cli import main

    assert main(["convert", str(ckpt), "-o", str(tmp_path / "cli.gguf")]) == 0
    assert (tmp_path / "cli.gguf").is_file()
    assert "cli.gguf" in capsys.readouterr().out
    assert main(["convert", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dgchat: error: ") and "no such file" in err[0]


def test_byte_level_bpe_tokenizer(tmp_path: Path) -> None:
    """The other BPE flavour (LLaDA, Dream/Qwen2): GPT-2 byte-level, model "gpt2"."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from dgchat.convert.tokenizer_gguf import read_hf_tokenizer

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>", "<|mask|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["hello world, the quick brown fox"] * 20, trainer)
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|endoftext|>", "mask_token": "<|mask|>", "chat_template": "{{ messages }}"}))
    v = read_hf_tokenizer(tmp_path, n_vocab=320, spm_model="unused")
    assert (v.model, v.pre) == ("gpt2", "gpt-2")
    assert len(v.tokens) == 320 and v.tokens[-1] == "[PAD319]" and v.types[-1] == 5  # padded, UNUSED
    assert v.types[v.tokens.index("<|endoftext|>")] == 3  # CONTROL
    assert v.special["eos"] == v.tokens.index("<|endoftext|>") and v.special["mask"] == 1
    assert v.merges and all(len(m.split(" ")) == 2 for m in v.merges)
    assert v.chat_template == "{{ messages }}" and v.add_bos is False
    assert read_hf_tokenizer(tmp_path, n_vocab=320, spm_model="x", byte_level_pre="qwen2").pre == "qwen2"
    with pytest.raises(ConvertError, match="embeds only 100"):
        read_hf_tokenizer(tmp_path, n_vocab=100, spm_model="x")


def test_full_layer_dims_from_save_pretrained_and_hand_written_configs() -> None:
    """save_pretrained writes the full layers' overrides in per_layer_config, and only those that
    differ from the base (global_head_dim == head_dim gives an empty dict); a hand-written config
    without per_layer_config gets transformers' defaults (global_head_dim 512)."""
    from transformers import DiffusionGemmaConfig

    from dgchat.convert.families.diffusion_gemma import hparams_from_config

    text = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "layer_types": ["sliding_attention", "full_attention"], "num_attention_heads": 2,
            "num_key_value_heads": 1, "head_dim": 32, "num_experts": 2, "top_k_experts": 1,
            "moe_intermediate_size": 32, "sliding_window": 64}
    for extra, want in (({"global_head_dim": 32, "num_global_key_value_heads": 1}, (32, 1)),
                        ({"global_head_dim": 64, "num_global_key_value_heads": 2}, (64, 2)),
                        ({}, (512, 1))):
        saved = DiffusionGemmaConfig(text_config=text | extra).to_dict()
        assert "per_layer_config" in saved["text_config"]
        hp = hparams_from_config(saved)
        assert (hp.head_dim_full, hp.n_head_kv[1]) == want, extra
        hand = {"text_config": text | extra}
        hp = hparams_from_config(hand)
        assert (hp.head_dim_full, hp.n_head_kv[1]) == want, extra
