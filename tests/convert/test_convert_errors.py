"""dgchat convert's failure modes on the masked-diffusion families: specific one-line errors, and no
output (not even a partial file) after a failure, an interruption or a full disk."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from dgchat.convert import convert
from dgchat.convert.errors import ConvertError
from fixtures import convert_cache as cc

pytest.importorskip("tokenizers")


def _copy(base: Path, name: str, dest: Path, shards: int = 1) -> Path:
    shutil.copytree(cc.checkpoint(base, name, "F32", shards), dest)
    return dest


def _edit_config(folder: Path, **changes) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (folder / "config.json").write_text(json.dumps(cfg))


def _ggufs(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.suffix == ".gguf" or p.name.startswith(".dgchat-partial"))


def test_unknown_architecture_lists_every_family(base: Path, tmp_path: Path) -> None:
    src = _copy(base, "llada", tmp_path / "other")
    _edit_config(src, architectures=["MistralForCausalLM"])
    with pytest.raises(ConvertError) as info:
        convert(src, tmp_path / "o.gguf")
    msg = str(info.value)
    assert msg.startswith("unsupported architecture MistralForCausalLM; supported: ")
    for arch in ("LLaDAModelLM", "LLaDAMoEModelLM", "DreamModel", "RND1LM", "DiffusionGemmaForBlockDiffusion"):
        assert arch in msg


@pytest.mark.parametrize("name, change, message", [
    ("llada", {"include_bias": True}, "include_bias .* is not supported"),
    ("llada", {"block_type": "sequential"}, "block_type='sequential' is not supported"),
    ("dream", {"rope_scaling": {"type": "yarn", "factor": 4.0}}, "rope_scaling .* is not supported"),
    ("llada-moe", {"shared_expert_intermediate_size": 64}, "a shared expert is not supported"),
    ("llada-moe", {"moe_router_score_function": "sigmoid"}, "moe_router_score_function='sigmoid'"),
    ("rnd1", {"norm_topk_prob": False}, "norm_topk_prob other than true"),
    ("rnd1", {"num_experts": None}, "num_experts is missing"),
])
def test_unsupported_variants_are_named(base: Path, tmp_path: Path, name: str, change: dict, message: str) -> None:
    src = _copy(base, name, tmp_path / name)
    _edit_config(src, **change)
    with pytest.raises(ConvertError, match=message):
        convert(src, tmp_path / "o.gguf")
    assert _ggufs(tmp_path) == []


def test_missing_shard(base: Path, tmp_path: Path) -> None:
    src = _copy(base, "dream", tmp_path / "sharded", shards=3)
    (src / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(ConvertError, match="missing shard model-00002-of-00003.safetensors; the download is incomplete"):
        convert(src, tmp_path / "o.gguf")


def test_shape_mismatch_unsupported_dtype_unexpected_tensor(base: Path, tmp_path: Path) -> None:
    from safetensors.numpy import load_file, save_file

    sd = load_file(str(cc.checkpoint(base, "llada-moe") / "model.safetensors"))
    cases = [
        ("shape", "model.layers.1.mlp.experts.3.up_proj.weight", np.zeros((16, 64), np.float32),
         r"tensor model.layers.1.mlp.experts.3.up_proj.weight has shape \[16, 64\], the config implies \[32, 64\]"),
        ("dtype", "model.norm.weight", np.zeros(64, np.int64), "tensor model.norm.weight has dtype I64; supported: BF16, F16, F32"),
        ("extra", "model.layers.0.mlp.shared_expert.up_proj.weight", np.zeros((8, 64), np.float32),
         "unexpected tensor model.layers.0.mlp.shared_expert.up_proj.weight"),
    ]
    for case, key, value, message in cases:
        src = _copy(base, "llada-moe", tmp_path / case)
        d = dict(sd)
        d[key] = value
        save_file(d, str(src / "model.safetensors"))
        with pytest.raises(ConvertError, match=message):
            convert(src, tmp_path / f"{case}.gguf")
    assert _ggufs(tmp_path) == []


def test_mask_token_is_required(base: Path, tmp_path: Path) -> None:
    src = _copy(base, "rnd1", tmp_path / "nomask")
    _edit_config(src, mask_token_id=None)
    tc = json.loads((src / "tokenizer_config.json").read_text())
    tc.pop("mask_token")
    (src / "tokenizer_config.json").write_text(json.dumps(tc))
    with pytest.raises(ConvertError, match="no mask token"):
        convert(src, tmp_path / "o.gguf")


def test_unknown_pre_tokenizer(base: Path, tmp_path: Path) -> None:
    """llama.cpp picks its split regex by name: a tokenizer whose regex it has no name for would be
    tokenized differently, so it is refused rather than guessed."""
    src = _copy(base, "dream", tmp_path / "oddtok")
    tj = json.loads((src / "tokenizer.json").read_text())
    tj["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\p{L}+|\p{N}|[^\p{L}\p{N}]+"
    (src / "tokenizer.json").write_text(json.dumps(tj))
    with pytest.raises(ConvertError, match="unrecognised byte-level pre-tokenizer .split regex"):
        convert(src, tmp_path / "o.gguf")


def test_gguf_source_rules(base: Path, tmp_path: Path) -> None:
    src = cc.converted(base, "llada")
    with pytest.raises(ConvertError, match="already in dgchat's layout; nothing to convert .--cache-capable"):
        convert(src, tmp_path / "o.gguf")
    with pytest.raises(ConvertError, match="a GGUF source keeps its tensor types"):
        convert(src, tmp_path / "o.gguf", outtype="f16", cache_capable=True)


def test_interrupted_or_failed_conversion_leaves_nothing(base: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import dgchat.convert.families.masked as masked

    real = masked.encode
    for exc in (KeyboardInterrupt(), ConvertError("simulated failure")):
        calls = {"n": 0}

        def flaky(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == 7:
                raise exc
            return real(*args, **kwargs)

        monkeypatch.setattr(masked, "encode", flaky)
        with pytest.raises((KeyboardInterrupt, ConvertError)):
            convert(cc.checkpoint(base, "llada-moe"), tmp_path / "out.gguf", cache_capable=True)
        assert list(tmp_path.iterdir()) == []


def test_dry_run_cli(base: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dgchat.cli import main

    ckpt = cc.checkpoint(base, "llada-moe")
    assert main(["convert", str(ckpt), "-o", str(tmp_path), "--dry-run", "--cache-capable"]) == 0
    out = capsys.readouterr().out
    # 3 global + 2 layers x 12 (3 norms, q/k/v/o, q/k norm, router, 3 expert tensors) + 2 x 3 zero shared experts
    assert "llada-moe -> hy_v3 GGUF: 33 tensors (27 f32, 6 f16)" in out and "f32" in out and "MB (dry run" in out
    assert main(["convert", str(ckpt), "--dry-run", "--quantize", "q4_k_m"]) == 0
    out = capsys.readouterr().out
    assert "then quantized to Q4_K_M" in out and "llada-moe -> llada-moe GGUF: 27 tensors" in out
    assert list(tmp_path.iterdir()) == [] and not (ckpt.parent / f"{ckpt.name}-q4_k_m.gguf").exists()
    with pytest.raises(SystemExit) as info:  # argparse refuses it
        main(["convert", str(ckpt), "--quantize", "Q9_X"])
    assert info.value.code == 2 and "invalid choice: 'Q9_X'" in capsys.readouterr().err


def _tmpfs_available() -> bool:
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                           capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _tmpfs_available(), reason="needs unshare + mount (user namespaces) for a tiny tmpfs")
def test_real_disk_full_on_a_tiny_tmpfs(base: Path, tmp_path: Path) -> None:
    """A 256 KiB tmpfs (private mount namespace) fills up mid-write: both the streaming writer and
    llama.cpp's quantizer report a full disk and leave the filesystem empty. The free-space
    pre-check is switched off so the writes really hit ENOSPC."""
    ckpt = cc.checkpoint(base, "llada")
    gguf_src = cc.converted(base, "llada-q")
    mnt = tmp_path / "small"
    mnt.mkdir()
    script = textwrap.dedent(f"""
        import os, sys
        import dgchat.convert.writer as writer
        writer.check_space = lambda *a, **k: None
        from dgchat.convert import convert
        from dgchat.convert.errors import ConvertError
        for kwargs in ({{"source": {str(ckpt)!r}}}, {{"source": {str(gguf_src)!r}, "quantize": "Q8_0"}}):
            try:
                convert(out={str(mnt)!r} + "/out.gguf", **kwargs)
                print("NO ERROR")
            except ConvertError as exc:
                print("ERROR", exc)
            print("LEFT", sorted(os.listdir({str(mnt)!r})))
    """)
    (tmp_path / "fill.py").write_text(script)
    cmd = f"mount -t tmpfs -o size=256k tmpfs {mnt} && {sys.executable} {tmp_path / 'fill.py'}"
    res = subprocess.run(["unshare", "-rm", "sh", "-c", cmd], capture_output=True, text=True, timeout=120)
    lines = res.stdout.splitlines()
    assert res.returncode == 0, res.stderr[-2000:]
    assert [ln.split(" ", 1)[0] for ln in lines] == ["ERROR", "LEFT", "ERROR", "LEFT"], res.stdout
    assert all("not enough disk space" in ln for ln in lines if ln.startswith("ERROR")), res.stdout
    assert all(ln == "LEFT []" for ln in lines if ln.startswith("LEFT")), res.stdout
