"""A block-diffusion checkpoint from the stand-in hub to an answer: the catalog's checkpoint entry
for an SDAR-layout checkpoint (tests/fixtures/block_tiny.py, K-quant friendly widths) is downloaded
file by file, verified, converted and quantized to Q4_K_M by the real converter and llama.cpp, the
checkpoint removed, and the installed GGUF runs as a block-diffusion model (the other phases' edge
cases are in test_checkpoint_pull.py, on a LLaDA checkpoint)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fixtures.block_tiny import checkpoint

from dgchat.hub import download as dl
from dgchat.hub.catalog import load_catalog
from dgchat.hub.manager import ModelManager
from dgchat.model_backend.block_diffusion import BlockDiffusionEngine
from dgchat.model_backend.events import FinalEvent
from dgchat.model_backend.gguf_file import read_gguf_header
from dgchat.model_backend.loader import load_engine
from dgchat.model_backend.params import DiffusionParams

REPO = "dgchat-test/Tiny-SDAR-Chat"
NAME = "tiny-sdar-chat-q4_k_m"
OPTIONAL = ("generation_config.json", "chat_template.jinja", "added_tokens.json", "special_tokens_map.json")


def _catalog(path: Path, files: dict[str, bytes]) -> Path:
    required = [n for n in files if n not in OPTIONAL]
    total = sum(len(d) for d in files.values())
    path.write_text(f'''schema = 1
[[models]]
name = "{NAME}"
title = "Tiny SDAR checkpoint, Q4_K_M"
description = "A tiny random SDAR-layout checkpoint the stand-in hub serves."
family = "block_diffusion"
repo = "{REPO}"
files = {json.dumps(required)}
optional_files = {json.dumps([n for n in OPTIONAL if n in files] + ["special_tokens_map.json"])}
checkpoint_size = {total}
quant = "Q4_K_M"
size = {total // 6}
size_exact = false
context = 2048
rank = 50
[models.arch]
n_layer = 2
n_head_kv = 2
head_dim = 64
n_embd = 256
n_head = 4
n_ff = 512
n_vocab = 512
[models.sampler]
block_length = 4
steps = 4
threshold = 0.85
temperature = 0.0
max_tokens = 512

[[models]]
name = "dgchat-tiny-plays"
title = "dgchat tiny (bundled)"
description = "bundled"
family = "tiny"
bundled = true
size = 12_500_000
size_exact = false
context = 4096
rank = 0
[models.arch]
n_layer = 4
n_head_kv = 2
head_dim = 64
''', encoding="utf-8")
    return path


@pytest.fixture
def mgr(hub, hf_home, base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModelManager:
    folder = checkpoint(base, "sdar-q")
    files = {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and p.name != "README.md"}
    for name, data in files.items():
        hub.add_file(REPO, name, data, lfs=name.endswith(".safetensors"))
    monkeypatch.setenv("DGCHAT_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(dl, "PROGRESS_INTERVAL", 0.0)
    catalog = load_catalog(_catalog(tmp_path / "catalog.toml", files))
    return ModelManager(endpoint=hub.endpoint, catalog=catalog, hf_cache_dir=hf_home / "hub")


def test_sdar_checkpoint_pulled_converted_and_answering(mgr: ModelManager) -> None:
    events: list = []
    res = mgr.pull(NAME, progress=events.append, retry_delay=0)
    phases = {e.phase for e in events}
    assert {"downloading", "verifying", "converting", "quantizing"} <= phases
    path = res.path
    assert path.name == "Tiny-SDAR-Chat-Q4_K_M.gguf" and path.exists()
    assert not (mgr.models_dir / ".partial" / f"{NAME}.checkpoint").exists()  # removed once converted
    header = read_gguf_header(path)
    assert header.get("general.file_type") == 15  # LLAMA_FTYPE_MOSTLY_Q4_K_M
    assert (header.get("dgchat.family"), header.get("dgchat.block_diffusion.variant"),
            header.get("dgchat.engine.attention_block")) == ("block-diffusion", "sdar", 4)
    engine = load_engine(path)
    try:
        assert isinstance(engine, BlockDiffusionEngine) and engine.block_size == 4
        prompt = engine.chat_prompt([{"role": "user", "content": "Halt, traveller!"}])
        final = [e for e in engine.generate(prompt, DiffusionParams(max_tokens=12, early_stop=False))
                 if isinstance(e, FinalEvent)][0]
        assert final.tokens.size == 12 and final.stats.canvases == 3
        assert np.all(final.tokens < engine.n_vocab)
    finally:
        engine.close()
