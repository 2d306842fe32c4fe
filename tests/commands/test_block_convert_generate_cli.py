"""`dgchat convert` then `dgchat generate` on a block-diffusion checkpoint, as a user runs them: the
tiny SDAR checkpoint (fixtures.block_tiny, K-quant friendly widths) converted and quantized in one
run, then answered with `--json` (the engine, the per-block settings and where each came from) and
with `--ar`; a checkpoint of a plain autoregressive Qwen3 is refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from fixtures.block_tiny import checkpoint


def dgchat(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dgchat", *args], capture_output=True, text=True, timeout=300)


def test_convert_quantize_and_generate(base: Path, tmp_path: Path) -> None:
    out = tmp_path / "sdar-q4_k_m.gguf"
    conv = dgchat("convert", str(checkpoint(base, "sdar-q")), "-o", str(out), "--quantize", "Q4_K_M")
    assert conv.returncode == 0, conv.stderr
    assert "block-diffusion sdar -> qwen3" in conv.stdout and out.exists()
    gen = dgchat("generate", "-m", str(out), "-p", "Halt, traveller!", "--max-tokens", "10", "--no-early-stop",
                 "--threads", "1", "--json")
    assert gen.returncode == 0, gen.stderr
    got = json.loads(gen.stdout)
    assert got["engine"] == "block diffusion (SDAR, blocks of 4)" and got["architecture"] == "qwen3"
    assert got["stats"]["tokens"] == 10 and got["stats"]["canvases"] >= 3
    params = got["params"]
    assert params["steps"] == {"value": 4, "source": "model file"}
    assert params["gen_length"] == {"value": 4, "source": "model file"}
    assert params["threshold"]["value"] == 0.85 and params["max_tokens"] == {"value": 10, "source": "flag"}
    ar = dgchat("generate", "-m", str(out), "-p", "Halt, traveller!", "--max-tokens", "6", "--no-early-stop",
                "--threads", "1", "--ar", "--json")
    assert ar.returncode == 0, ar.stderr
    assert json.loads(ar.stdout)["stats"]["tokens"] == 6
    refused = dgchat("generate", "-m", str(out), "-p", "hi", "--block-length", "8")
    assert refused.returncode == 2 and "--block-length 8: this model denoises blocks of 4 tokens" in refused.stderr


def test_a_plain_qwen3_checkpoint_is_refused(base: Path, tmp_path: Path) -> None:
    res = dgchat("convert", str(checkpoint(base, "ar-qwen3")), "-o", str(tmp_path / "ar.gguf"))
    assert res.returncode == 2
    errors = [line for line in res.stderr.splitlines() if line.startswith("dgchat: error:")]
    assert len(errors) == 1 and "autoregressive model, not a block-diffusion checkpoint" in errors[0]
    assert not (tmp_path / "ar.gguf").exists()
