"""The shipped model catalog and the catalog validator's messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from dgchat.hub.catalog import load_catalog
from dgchat.hub.errors import CatalogError


def test_shipped_catalog() -> None:
    cat = load_catalog()
    files = {(e.repo, e.filename) for e in cat if not e.bundled and not e.checkpoint}
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


def test_shipped_checkpoint_entries() -> None:
    """SDAR 1.7B (Q4_K_M, Q8_0), 4B, 8B and the 0.6B BD3LM: block diffusion, converted here."""
    cat = load_catalog()
    ckpts = {e.name: e for e in cat if e.checkpoint}
    assert set(ckpts) == {"sdar-1.7b-chat-q4_k_m", "sdar-1.7b-chat-q8_0", "sdar-4b-chat-q4_k_m",
                          "sdar-8b-chat-q4_k_m", "qwen3-0.6b-diffusion-bd3lm-q4_k_m"}
    for e in ckpts.values():
        assert e.family == "block_diffusion" and e.filename is None and not e.convert and e.sha256 is None
        assert e.revision == "main" and not e.pinned  # no commit could be read from the hub here
        assert {"config.json", "tokenizer.json", "tokenizer_config.json"} <= set(e.files)
        assert "chat_template.jinja" in e.optional_files and not any(f.endswith(".py") for f in e.files)
        assert e.quant in ("Q4_K_M", "Q8_0") and e.download_size == e.checkpoint_size > e.size
        assert e.installed_name == f"{e.repo.split('/')[1]}-{e.quant}.gguf"
        assert e.sampler["temperature"] == 0.0 and e.sampler["steps"] == e.sampler["block_length"]
        a = e.arch
        assert (a.n_head_kv, a.head_dim, a.n_vocab) == (8, 128, 151936)
        # the bf16 checkpoint is ~2 bytes a parameter (embedding and, untied, the output head)
        layer = a.n_embd * a.n_head * a.head_dim * 2 + a.n_embd * a.n_head_kv * a.head_dim * 2 + 3 * a.n_embd * a.n_ff
        untied = e.name.startswith("sdar")
        params = a.n_layer * layer + a.n_vocab * a.n_embd * (2 if untied else 1)
        assert 2 * params < e.checkpoint_size < 2 * params * 1.02, e.name  # + the ~11 MB tokenizer
    sdar = ckpts["sdar-1.7b-chat-q4_k_m"]
    assert sdar.repo == "JetLM/SDAR-1.7B-Chat" and sdar.weight_files == ("model.safetensors",)
    assert (sdar.arch.n_layer, sdar.arch.n_embd, sdar.arch.n_head, sdar.arch.n_ff) == (28, 2048, 16, 6144)
    assert ckpts["sdar-1.7b-chat-q8_0"].quant == "Q8_0" and sdar.quant == "Q4_K_M"
    assert sdar.sampler == {"block_length": 4, "steps": 4, "threshold": 0.85, "temperature": 0.0, "max_tokens": 512}
    bd3lm = ckpts["qwen3-0.6b-diffusion-bd3lm-q4_k_m"]
    assert bd3lm.repo == "dllm-hub/Qwen3-0.6B-diffusion-bd3lm-v0.1" and bd3lm.sampler["block_length"] == 32
    assert (bd3lm.arch.n_embd, bd3lm.arch.n_ff) == (1024, 3072)
    assert 380_000_000 < bd3lm.size < 450_000_000  # "~0.4 GB at Q4"
    # the 4B and 8B: shard names from the index files of JetAstra/SDAR training/model/*/
    assert ckpts["sdar-4b-chat-q4_k_m"].weight_files == (
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
    assert len(ckpts["sdar-8b-chat-q4_k_m"].weight_files) == 4
    for e in (ckpts["sdar-4b-chat-q4_k_m"], ckpts["sdar-8b-chat-q4_k_m"]):
        assert "model.safetensors.index.json" in e.files


def test_checkpoint_quants_are_ones_the_converter_offers() -> None:
    from dgchat.convert.quantize import QUANT_TYPES
    from dgchat.hub.catalog import CHECKPOINT_QUANTS, QUANTS

    assert set(CHECKPOINT_QUANTS) <= set(QUANT_TYPES) and set(CHECKPOINT_QUANTS) <= set(QUANTS)


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


CHECKPOINT = """
[[models]]
name = "c"
title = "C"
description = "a checkpoint"
family = "block_diffusion"
repo = "o/c"
files = ["config.json", "tokenizer.json", "model.safetensors"]
checkpoint_size = 1000
quant = "Q4_K_M"
size = 300
context = 4096
[models.arch]
n_layer = 2
n_head_kv = 2
head_dim = 64
"""


def _ck(old: str, new: str) -> str:
    assert old in CHECKPOINT
    return "schema = 1\n" + CHECKPOINT.replace(old, new) + BUNDLED


@pytest.mark.parametrize("text,message", [
    (_ck('files = ["config.json", "tokenizer.json", "model.safetensors"]', 'files = []'),
     "model c: files must be a list of file names \\(at least one\\)"),
    (_ck('files = ["config.json", "tokenizer.json", "model.safetensors"]', 'files = "model.safetensors"'),
     "model c: files must be a list of file names"),
    (_ck('"config.json", ', ''), "model c: files must include config.json"),
    (_ck('"tokenizer.json", ', ''), "model c: files must include tokenizer.json"),
    (_ck('"model.safetensors"', '"model.bin"'), "model c: files may list safetensors, JSON"),
    (_ck('"model.safetensors"', '"model.safetensors", "modeling_sdar.py"'), "no code, no pickled weights"),
    (_ck('"model.safetensors"', '"generation_config.json"'), "model c: files must include the weights"),
    (_ck('"model.safetensors"', '"a.safetensors", "b.safetensors"'),
     "files lists 2 safetensors shards but not model.safetensors.index.json"),
    (_ck('"model.safetensors"', '"sub/model.safetensors"'), "must list plain file names at the top of the repo"),
    (_ck('"model.safetensors"', '"model.safetensors", "config.json"'), "files lists 'config.json' twice"),
    (_ck('checkpoint_size = 1000\n', ''), "model c: missing key 'checkpoint_size'"),
    (_ck('quant = "Q4_K_M"\n', ''), "model c: missing key 'quant'"),
    (_ck('quant = "Q4_K_M"', 'quant = "F16"'), "model c: quant must be a type a checkpoint is quantized to"),
    (_ck('repo = "o/c"', 'repo = "o/c"\nfilename = "c.gguf"'), "give either filename .* or files"),
    (_ck('size = 300', 'size = 300\nconvert = true'), "model c: convert is for a GGUF entry"),
    (_ck('size = 300', 'size = 300\nsha256 = "' + "a" * 64 + '"'), "model c: sha256 is for a GGUF entry"),
    (_ck('size = 300', 'size = 300\noptional_files = ["config.json"]'),
     "'config.json' is in both files and optional_files"),
    (_ck('head_dim = 64\n', 'head_dim = 64\n[models.file_sha256]\n"other.json" = "' + "a" * 64 + '"\n'),
     "file_sha256 names 'other.json', which files does not list"),
    (_ck('head_dim = 64\n', 'head_dim = 64\n[models.file_sha256]\n"config.json" = "xyz"\n'),
     "file_sha256.config.json must be 64 hexadecimal digits"),
    ("schema = 1\n" + GOOD_ENTRY.replace('size = 100', 'size = 100\ncheckpoint_size = 5') + BUNDLED,
     "model a: checkpoint_size belongs to a checkpoint entry"),
    ("schema = 1\n" + CHECKPOINT + CHECKPOINT.replace('name = "c"', 'name = "d"') + BUNDLED,
     "model d: the checkpoint o/c at Q4_K_M is listed twice"),
    ("schema = 1\n" + GOOD_ENTRY + BUNDLED.replace('bundled = true', 'bundled = true\nfiles = ["config.json"]'),
     "the bundled model has no repo, filename or files"),
])
def test_checkpoint_entry_errors_name_the_entry_and_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "catalog.toml"
    path.write_text(text)
    with pytest.raises(CatalogError, match=message) as info:
        load_catalog(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_valid_checkpoint_entry(tmp_path: Path) -> None:
    path = tmp_path / "catalog.toml"
    pin = "b" * 64
    path.write_text("schema = 1\n" + CHECKPOINT.replace('size = 300', 'size = 300\nrevision = "' + "c" * 40 + '"\n'
                    'optional_files = ["chat_template.jinja"]') + '[models.file_sha256]\n"config.json" = "' + pin
                    + '"\n' + BUNDLED)
    c = load_catalog(path).get("c")
    assert c.checkpoint and c.files == ("config.json", "tokenizer.json", "model.safetensors")
    assert c.optional_files == ("chat_template.jinja",) and c.file_sha256 == {"config.json": pin}
    assert c.download_size == 1000 and c.installed_name == "c-Q4_K_M.gguf" and c.download_name == "c.checkpoint"
    assert c.family == "block_diffusion" and not c.pinned  # two of its three files have no pin
    pins = "\n".join(f'"{f}" = "{pin}"' for f in c.files)
    path.write_text("schema = 1\n" + CHECKPOINT.replace('size = 300', 'size = 300\nrevision = "' + "c" * 40 + '"')
                    + '[models.file_sha256]\n' + pins + "\n" + BUNDLED)
    assert load_catalog(path).get("c").pinned


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
