"""The shipped model catalog and the catalog validator's messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from dgchat.hub.catalog import load_catalog
from dgchat.hub.errors import CatalogError


def test_shipped_catalog() -> None:
    cat = load_catalog()
    files = {(e.repo, e.filename) for e in cat if not e.bundled}
    assert files == {
        ("unsloth/diffusiongemma-26B-A4B-it-GGUF", "diffusiongemma-26B-A4B-it-Q4_K_M.gguf"),
        ("unsloth/diffusiongemma-26B-A4B-it-GGUF", "diffusiongemma-26B-A4B-it-Q8_0.gguf"),
        ("mradermacher/LLaDA-8B-Instruct-GGUF", "LLaDA-8B-Instruct.Q4_K_M.gguf"),
        ("bartowski/Dream-org_Dream-v0-Instruct-7B-GGUF", "Dream-org_Dream-v0-Instruct-7B-Q4_K_M.gguf"),
        ("mradermacher/LLaDA-MoE-7B-A1B-Instruct-GGUF", "LLaDA-MoE-7B-A1B-Instruct.Q8_0.gguf"),
    }
    bundled = cat.bundled
    from dgchat.assets import BUNDLED_MODEL_NAME

    assert bundled.repo is None and bundled.installed_name == BUNDLED_MODEL_NAME == "dgchat-tiny-plays.gguf"
    for e in cat:
        assert e.convert == (e.family == "diffusion_gemma"), e.name
        assert e.size > 0 and e.context >= 64 and e.arch.kv_bytes(e.context) > 0
        e.sampler_params().validate()
        assert cat.get(e.name.upper()) is e
    dg = cat.get("diffusiongemma-26b-a4b-q4_k_m")
    assert dg.installed_name == "diffusiongemma-26B-A4B-it-Q4_K_M.dgchat.gguf" and dg.sha256 is None
    assert cat.get("llada-8b-instruct-q4_k_m").installed_name == "LLaDA-8B-Instruct.Q4_K_M.gguf"
    with pytest.raises(CatalogError, match="no model named 'nope' in the catalog"):
        cat.get("nope")


def test_descriptions_leave_sizes_to_the_size_column() -> None:
    """The lists show each size once, in GiB; a description saying "About 4.7 GB" next to "≈4.4 GiB"
    read as two different sizes (issue 16)."""
    import re

    for e in load_catalog():
        assert not re.search(r"\d\s*(GB|MB|GiB|MiB)\b", e.description), (e.name, e.description)


GOOD_ENTRY = """
[[models]]
name = "a"
title = "A"
description = "a model"
family = "llada"
repo = "o/r"
filename = "a.gguf"
size = 100
context = 4096
[models.arch]
n_layer = 2
n_head_kv = 2
head_dim = 64
"""
BUNDLED = """
[[models]]
name = "tiny"
title = "tiny"
description = "bundled"
family = "tiny"
bundled = true
size = 10
context = 512
[models.arch]
n_layer = 1
n_head_kv = 1
head_dim = 8
"""


@pytest.mark.parametrize("text,message", [
    ("schema = 1\n" + GOOD_ENTRY, "exactly one entry must be the bundled model"),
    ("schema = 2\n" + GOOD_ENTRY + BUNDLED, "schema must be 1"),
    ("schema = 1\n[[models\n", "not valid TOML"),
    ("schema = 1\nextra = 1\n" + GOOD_ENTRY + BUNDLED, "unknown top-level key 'extra'"),
    ("schema = 1\n" + GOOD_ENTRY.replace('size = 100', 'size = "big"') + BUNDLED,
     "model a: size must be an integer >= 1"),
    ("schema = 1\n" + GOOD_ENTRY.replace('name = "a"', 'name = "A b"') + BUNDLED, "name must be lower-case"),
    ("schema = 1\n" + GOOD_ENTRY.replace('repo = "o/r"', 'repo = "just-a-name"') + BUNDLED,
     "repo must be 'owner/name'"),
    ("schema = 1\n" + GOOD_ENTRY.replace('a.gguf', '../a.gguf') + BUNDLED, "filename must be a relative path"),
    ("schema = 1\n" + GOOD_ENTRY.replace('a.gguf', 'a.bin') + BUNDLED, "filename must be a .gguf file"),
    ("schema = 1\n" + GOOD_ENTRY.replace('family = "llada"', 'family = "gpt"') + BUNDLED, "family must be one of"),
    ("schema = 1\n" + GOOD_ENTRY.replace('size = 100', 'size = 100\nsha256 = "xyz"') + BUNDLED,
     "sha256 must be 64 hexadecimal digits"),
    ("schema = 1\n" + GOOD_ENTRY.replace('size = 100', 'size = 100\ncolour = "red"') + BUNDLED,
     "model a: unknown key 'colour'"),
    ("schema = 1\n" + GOOD_ENTRY.replace('repo = "o/r"\n', '') + BUNDLED, "model a: missing key 'repo'"),
    ("schema = 1\n" + GOOD_ENTRY.split("[models.arch]")[0] + BUNDLED, "missing \\[models.arch\\] table"),
    ("schema = 1\n" + GOOD_ENTRY.replace('head_dim = 64', 'head_dim = 64\nn_layer_swa = 1') + BUNDLED,
     "n_layer_swa needs sliding_window"),
    ("schema = 1\n" + GOOD_ENTRY + '[models.sampler]\nsteps = 0\n' + BUNDLED, "sampler: --steps must be a positive"),
    ("schema = 1\n" + GOOD_ENTRY + '[models.sampler]\nwarp = 9\n' + BUNDLED, "sampler: unknown key 'warp'"),
    ("schema = 1\n" + GOOD_ENTRY + '[models.sampler]\nsteps = "many"\n' + BUNDLED, "steps must be an integer"),
    ("schema = 1\n" + GOOD_ENTRY + GOOD_ENTRY + BUNDLED, "model name 'a' appears twice"),
    ("schema = 1\n" + GOOD_ENTRY + BUNDLED.replace('bundled = true', 'bundled = true\nrepo = "o/r"'),
     "the bundled model has no repo"),
])
def test_catalog_errors_name_the_problem(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "catalog.toml"
    path.write_text(text)
    with pytest.raises(CatalogError, match=message) as info:
        load_catalog(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value).split(": not valid TOML")[0]


def test_valid_custom_catalog(tmp_path: Path) -> None:
    path = tmp_path / "catalog.toml"
    path.write_text("schema = 1\n" + GOOD_ENTRY + '[models.sampler]\nsteps = 64\ntemperature = 0\n' + BUNDLED)
    cat = load_catalog(path)
    a = cat.get("a")
    assert a.revision == "main" and not a.convert and a.sampler == {"steps": 64, "temperature": 0.0}
    assert cat.by_file("o/r", "a.gguf") is a and cat.bundled.name == "tiny"
    with pytest.raises(CatalogError, match="model catalog not found"):
        load_catalog(tmp_path / "missing.toml")
