"""GGUF -> GGUF remap of the published unsloth / llama.cpp PR #24423 `diffusion-gemma` layout.

The unsloth file itself cannot be downloaded here; fixtures/dg_unsloth.py writes a file of that
layout from the same tiny checkpoint, and the remap must reproduce the direct conversion exactly.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dgchat.convert import convert
from dgchat.convert.errors import ConvertError
from dgchat.model_backend.gguf_file import read_gguf_header
from fixtures import dg_cache
from fixtures.dg_unsloth import write_unsloth_layout

pytest.importorskip("transformers", reason="tiny DiffusionGemma checkpoints are built with transformers")

PROVENANCE = {"dgchat.source", "general.name"}


@pytest.fixture(scope="module")
def unsloth(base: Path) -> Path:
    out = base / "unsloth-layout.gguf"
    if not out.exists():
        write_unsloth_layout(dg_cache.checkpoint(base, "sw8"), out)
    return out


@pytest.fixture(scope="module")
def remapped(base: Path, unsloth: Path) -> Path:
    out = base / "remapped.gguf"
    if not out.exists():
        convert(unsloth, out)
    return out


def _value(h, key):
    v = h.get(key)
    return np.asarray(v) if isinstance(v, list) else v


def test_remap_equals_direct_conversion(base: Path, remapped: Path) -> None:
    a = read_gguf_header(remapped)
    b = read_gguf_header(dg_cache.converted(base, "sw8"))
    assert a.architecture == "gemma4"
    assert set(a.metadata) == set(b.metadata)
    for key in sorted(set(a.metadata) - PROVENANCE):
        va, vb = _value(a, key), _value(b, key)
        same = np.array_equal(va, vb) if isinstance(va, np.ndarray) else va == vb
        assert same, key
    assert a.get("dgchat.source") == "gguf:diffusion-gemma"
    assert set(a.tensors) == set(b.tensors)
    for name, ta in a.tensors.items():
        tb = b.tensors[name]
        assert (ta.shape, ta.ggml_type) == (tb.shape, tb.ggml_type), name
        da = np.fromfile(a.path, np.uint8, ta.nbytes, offset=ta.offset)
        db = np.fromfile(b.path, np.uint8, tb.nbytes, offset=tb.offset)
        assert np.array_equal(da, db), name


def test_remapped_file_gives_identical_logits(base: Path, remapped: Path) -> None:
    from fixtures.dg_engine import Engine

    outs = []
    for path in (remapped, dg_cache.converted(base, "sw8")):
        eng = Engine(path)
        try:
            rng = np.random.default_rng(7)
            enc = eng.encode(rng.integers(7, 384, 20).tolist())
            canvas = rng.integers(0, 384, 8).tolist()
            dec = eng.decode(canvas)
            dec_sc = eng.decode(canvas, dec / 0.7)
            outs.append((enc, dec, dec_sc))
        finally:
            eng.close()
    for x, y in zip(*outs):
        assert np.array_equal(x, y)


def test_missing_sampler_keys_fall_back_to_transformers_defaults(base: Path, tmp_path: Path) -> None:
    src = write_unsloth_layout(dg_cache.checkpoint(base, "sw8"), tmp_path / "no-eb.gguf", with_eb_keys=False)
    res = convert(src, tmp_path / "out.gguf")
    h = read_gguf_header(res.output)
    assert h.get("dgchat.diffusion.max_denoising_steps") == 48
    assert h.get("dgchat.diffusion.entropy_bound") == pytest.approx(0.1)
    assert h.get("dgchat.diffusion.t_min") == pytest.approx(0.4)
    assert h.get("dgchat.diffusion.t_max") == pytest.approx(0.8)
    assert h.get("dgchat.diffusion.stability_threshold") == 1
    assert h.get("dgchat.diffusion.confidence_threshold") == pytest.approx(0.005)
    assert "max_denoising_steps" in h.get("dgchat.diffusion.defaulted")
    assert h.get("dgchat.diffusion.eos_token_ids") == [1, 6]
    assert any("defaults" in n for n in res.notes)


def test_remap_refusals(remapped: Path, unsloth: Path, tmp_path: Path) -> None:
    with pytest.raises(ConvertError, match="already in dgchat's layout"):
        convert(remapped, tmp_path / "again.gguf")
    with pytest.raises(ConvertError, match="keeps its tensor types"):
        convert(unsloth, tmp_path / "q.gguf", outtype="q8_0")
    assert list(tmp_path.iterdir()) == []
