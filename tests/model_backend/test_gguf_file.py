"""GGUF headers are validated before llama.cpp sees the file."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from dgchat.model_backend.errors import ModelFileError
from dgchat.model_backend.gguf_file import read_gguf_header, read_tensor


def test_reads_metadata_and_tensors(llada_gguf: Path) -> None:
    h = read_gguf_header(llada_gguf)
    assert h.architecture == "llada"
    assert h.get("llada.block_count") == 2
    assert h.get("tokenizer.ggml.mask_token_id") is not None
    tokens = h.get("tokenizer.ggml.tokens")  # long array, read lazily on demand
    assert isinstance(tokens, list) and len(tokens) > 256 and "<|mask|>" in tokens
    assert "token_embd.weight" in h.tensors
    emb = read_tensor(h, "token_embd.weight")
    assert emb.shape == (len(tokens), 64)


def test_not_gguf(tmp_path: Path) -> None:
    f = tmp_path / "x.gguf"
    f.write_bytes(b"PK\x03\x04" + b"\0" * 100)
    with pytest.raises(ModelFileError, match="not a GGUF file"):
        read_gguf_header(f)


def test_missing_and_folder(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="not found"):
        read_gguf_header(tmp_path / "nope.gguf")
    with pytest.raises(ModelFileError, match="folder"):
        read_gguf_header(tmp_path)


@pytest.mark.parametrize("keep", [10, 40, 3000, -100])
def test_truncated(llada_gguf: Path, tmp_path: Path, keep: int) -> None:
    data = llada_gguf.read_bytes()
    f = tmp_path / "t.gguf"
    f.write_bytes(data[:keep] if keep > 0 else data[:keep])
    with pytest.raises(ModelFileError, match="truncated|not a GGUF"):
        read_gguf_header(f)


def test_bad_version_and_absurd_counts(tmp_path: Path) -> None:
    f = tmp_path / "v.gguf"
    f.write_bytes(b"GGUF" + struct.pack("<IQQ", 99, 0, 0))
    with pytest.raises(ModelFileError, match="version 99"):
        read_gguf_header(f)
    f.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1 << 40, 0))
    with pytest.raises(ModelFileError, match="corrupt"):
        read_gguf_header(f)
    # a string length pointing far past the end of the file
    f.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1 << 50))
    with pytest.raises(ModelFileError):
        read_gguf_header(f)
