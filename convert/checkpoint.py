"""Reads a Hugging Face checkpoint folder tensor by tensor, without loading it into memory.

A checkpoint folder holds `config.json`, optionally `generation_config.json` and tokenizer files,
and one or more `*.safetensors` shards (listed by `model.safetensors.index.json` when sharded).
Shards are memory-mapped; `Checkpoint.load` returns a numpy view of one tensor's bytes, so a
conversion touches each tensor once and never holds the whole model.

safetensors layout (https://github.com/huggingface/safetensors, "Format"): an 8-byte little-endian
header length N, N bytes of JSON mapping tensor name -> {dtype, shape, data_offsets=[begin, end]}
(offsets relative to the end of the header), then the raw little-endian data.
"""

from __future__ import annotations

import json
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dgchat.convert.errors import ConvertError

# safetensors dtype -> (numpy storage dtype, our name). bf16 has no numpy dtype: it is kept as its
# raw uint16 bit pattern and converted only when a float is actually needed.
_DTYPES: dict[str, tuple[np.dtype, str]] = {
    "F32": (np.dtype("<f4"), "f32"),
    "F16": (np.dtype("<f2"), "f16"),
    "BF16": (np.dtype("<u2"), "bf16"),
}
_MAX_HEADER = 100 * 1024 * 1024


@dataclass(frozen=True)
class SourceTensor:
    name: str
    dtype: str  # "f32", "f16" or "bf16"
    shape: tuple[int, ...]
    file: Path
    offset: int  # absolute byte offset in `file`
    nbytes: int


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """bf16 bit patterns (uint16) -> float32 values (exact: bf16 is the top half of an f32)."""
    wide = bits.astype(np.uint32)
    wide <<= 16  # in place: one tensor-sized temporary, not two
    return wide.view(np.float32)


def f32_to_bf16(values: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns with round-to-nearest-even (NaN stays NaN)."""
    x = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounding = ((x >> 16) & 1) + 0x7FFF
    out = ((x + rounding) >> 16).astype(np.uint16)
    nan = np.isnan(values)
    if nan.any():
        out[nan] = 0x7FC0
    return out


def to_f32(arr: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bf16":
        return bf16_to_f32(arr)
    return np.asarray(arr, dtype=np.float32)


def _read_json(path: Path, required: bool) -> dict[str, Any] | None:
    if not path.is_file():
        if required:
            raise ConvertError(f"{path.parent}: no {path.name} (not a Hugging Face checkpoint folder?)")
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConvertError(f"{path}: unreadable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ConvertError(f"{path}: expected a JSON object")
    return data


class Checkpoint:
    """A Hugging Face checkpoint folder. Use as a context manager (closes the shard mappings)."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise ConvertError(f"{self.folder}: not a folder")
        self.config: dict[str, Any] = _read_json(self.folder / "config.json", required=True) or {}
        self.generation_config: dict[str, Any] | None = _read_json(
            self.folder / "generation_config.json", required=False
        )
        self._maps: dict[Path, mmap.mmap] = {}
        self._files: dict[Path, Any] = {}
        self.tensors: dict[str, SourceTensor] = {}
        self._index()

    # -- lifetime -----------------------------------------------------------------------------
    def close(self) -> None:
        for mm in self._maps.values():
            try:
                mm.close()
            except BufferError:
                pass  # a numpy view still refers to it; the mapping goes away with the view
        for fh in self._files.values():
            fh.close()
        self._maps.clear()
        self._files.clear()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- index --------------------------------------------------------------------------------
    def _shard_files(self) -> list[Path]:
        index_path = self.folder / "model.safetensors.index.json"
        if index_path.is_file():
            index = _read_json(index_path, required=True) or {}
            weight_map = index.get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise ConvertError(f"{index_path}: no weight_map")
            shards = sorted({str(v) for v in weight_map.values()})
            missing = [s for s in shards if not (self.folder / s).is_file()]
            if missing:
                raise ConvertError(
                    f"{self.folder}: missing shard {missing[0]}"
                    + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
                    + "; the download is incomplete"
                )
            self._expected = set(weight_map)
            return [self.folder / s for s in shards]
        self._expected = None
        files = sorted(self.folder.glob("*.safetensors"))
        if not files:
            if any(self.folder.glob("*.bin")) or any(self.folder.glob("*.pt")):
                raise ConvertError(f"{self.folder}: only pickle weights (*.bin/*.pt); dgchat reads safetensors only")
            raise ConvertError(f"{self.folder}: no *.safetensors weights")
        return files

    def _index(self) -> None:
        for path in self._shard_files():
            self._index_shard(path)
        if self._expected is not None:
            absent = sorted(self._expected - set(self.tensors))
            if absent:
                raise ConvertError(f"{self.folder}: tensor {absent[0]} is listed in the index but not in its shard")

    def _index_shard(self, path: Path) -> None:
        size = path.stat().st_size
        try:
            with open(path, "rb") as fh:
                head = fh.read(8)
                if len(head) < 8:
                    raise ConvertError(f"{path.name}: truncated safetensors file")
                (n,) = struct.unpack("<Q", head)
                if n > min(size - 8, _MAX_HEADER):
                    raise ConvertError(f"{path.name}: corrupt safetensors header (length {n})")
                header = json.loads(fh.read(n))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConvertError(f"{path.name}: unreadable safetensors header ({exc})") from None
        data_start = 8 + n
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            dtype = meta.get("dtype")
            if dtype not in _DTYPES:
                raise ConvertError(
                    f"{path.name}: tensor {name} has dtype {dtype}; supported: {', '.join(sorted(_DTYPES))}"
                )
            shape = tuple(int(d) for d in meta.get("shape", []))
            begin, end = (int(x) for x in meta.get("data_offsets", (0, -1)))
            expected = int(np.prod(shape, dtype=np.int64)) * _DTYPES[dtype][0].itemsize
            if end - begin != expected:
                raise ConvertError(
                    f"{path.name}: tensor {name} holds {end - begin} bytes but shape {list(shape)} "
                    f"of {dtype} needs {expected}"
                )
            if data_start + end > size:
                raise ConvertError(f"{path.name}: truncated (tensor {name} ends past the end of the file)")
            if name in self.tensors:
                raise ConvertError(f"{path.name}: tensor {name} also appears in {self.tensors[name].file.name}")
            self.tensors[name] = SourceTensor(name, _DTYPES[dtype][1], shape, path, data_start + begin, expected)

    # -- access -------------------------------------------------------------------------------
    def has(self, name: str) -> bool:
        return name in self.tensors

    def info(self, name: str) -> SourceTensor:
        try:
            return self.tensors[name]
        except KeyError:
            raise ConvertError(f"{self.folder}: tensor {name} is missing from the checkpoint") from None

    def _map(self, path: Path) -> mmap.mmap:
        mm = self._maps.get(path)
        if mm is None:
            fh = open(path, "rb")
            self._files[path] = fh
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            self._maps[path] = mm
        return mm

    def load(self, name: str, expect_shape: tuple[int, ...] | None = None) -> np.ndarray:
        """The tensor as stored (bf16 as uint16 bits), a read-only view of the mapped shard."""
        t = self.info(name)
        if expect_shape is not None and tuple(expect_shape) != t.shape:
            raise ConvertError(
                f"{self.folder.name}: tensor {name} has shape {list(t.shape)}, the config implies {list(expect_shape)}"
            )
        storage = next(d for d, n in _DTYPES.values() if n == t.dtype)
        count = t.nbytes // storage.itemsize
        return np.frombuffer(self._map(t.file), dtype=storage, count=count, offset=t.offset).reshape(t.shape)

    def release(self, name: str) -> None:
        """Drop the pages of `name` from this process's resident set once it has been written.

        The shards are mapped read-only, so the pages stay in the page cache and any later access
        simply faults them back in; without this the resident set grows to the whole checkpoint."""
        t = self.tensors.get(name)
        mm = self._maps.get(t.file) if t is not None else None
        advice = getattr(mmap, "MADV_DONTNEED", None)
        if mm is None or advice is None:
            return
        start = t.offset - t.offset % mmap.PAGESIZE
        end = min(len(mm), t.offset + t.nbytes)
        if end > start:
            try:
                mm.madvise(advice, start, end - start)
            except (OSError, ValueError):
                pass

    def load_f32(self, name: str, expect_shape: tuple[int, ...] | None = None) -> np.ndarray:
        return to_f32(self.load(name, expect_shape), self.info(name).dtype)
