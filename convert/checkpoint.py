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
import math
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
_MAX_DIMS = 8


def _show(value: Any) -> str:
    """A name or value from the file for a one-line message: as is when it is short printable text,
    else repr'd (no line breaks, no control characters) and cut short."""
    if isinstance(value, str) and value.isprintable() and len(value) <= 80:
        return value
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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
    except OSError as exc:
        raise ConvertError(f"{path}: cannot read it ({exc.strerror or type(exc).__name__})") from None
    except UnicodeDecodeError:
        raise ConvertError(f"{path}: unreadable JSON (not UTF-8 text)") from None
    except json.JSONDecodeError as exc:  # the message names a position, never the file's text
        raise ConvertError(f"{path}: unreadable JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise ConvertError(f"{path}: unreadable JSON (nested too deeply)") from None
    if not isinstance(data, dict):
        raise ConvertError(f"{path}: expected a JSON object")
    return data


DGCHAT_GENERATION_FILE = "dgchat_generation.json"


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
        # dgchat's own sampler defaults for this checkpoint (DiffusionGemma's `pad_bias`), kept out of
        # generation_config.json, whose transformers class refuses keys it does not know
        self.dgchat_generation: dict[str, Any] | None = _read_json(
            self.folder / DGCHAT_GENERATION_FILE, required=False
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
    def _inside(self, name: Any, what: str) -> Path:
        """`name` as a file inside the checkpoint folder, or ConvertError. Shard names come from the
        (untrusted) index: `../../etc/passwd`, an absolute path or a symlink out of the folder would
        otherwise make the converter read, and quote, files that are not part of the checkpoint."""
        if not isinstance(name, str) or not name or "\0" in name:
            raise ConvertError(f"{self.folder.name}: {what} {_show(name)} is not a file name")
        root = self.folder.resolve()
        path = (self.folder / name).resolve()
        if Path(name).is_absolute() or (path != root and root not in path.parents):
            raise ConvertError(f"{self.folder.name}: {what} {_show(name)} is outside the checkpoint folder")
        return path

    def _shard_files(self) -> list[Path]:
        index_path = self.folder / "model.safetensors.index.json"
        if index_path.is_file():
            index = _read_json(index_path, required=True) or {}
            weight_map = index.get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise ConvertError(f"{index_path}: no weight_map")
            for value in weight_map.values():
                if not isinstance(value, str):
                    raise ConvertError(f"{index_path}: shard name {_show(value)} is not a file name")
            shards = sorted(set(weight_map.values()))
            paths = [self._inside(s, "shard") for s in shards]
            missing = [s for s, p in zip(shards, paths) if not p.is_file()]
            if missing:
                raise ConvertError(
                    f"{self.folder}: missing shard {_show(missing[0])}"
                    + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
                    + "; the download is incomplete"
                )
            self._expected = set(weight_map)
            return paths
        self._expected = None
        files = sorted(self._inside(p.name, "shard") for p in self.folder.glob("*.safetensors"))
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
                raise ConvertError(f"{self.folder}: tensor {_show(absent[0])} is listed in the index but not in its shard")

    def _index_shard(self, path: Path) -> None:
        """Read one shard's header and check every entry against the file, in Python integers (no
        int64 overflow: a shape of [2^62, 4] with empty offsets once passed a numpy size check)."""
        size = path.stat().st_size
        try:
            with open(path, "rb") as fh:
                head = fh.read(8)
                if len(head) < 8:
                    raise ConvertError(f"{path.name}: truncated safetensors file")
                (n,) = struct.unpack("<Q", head)
                # the length is not quoted: for a file that is not safetensors it is 8 of its bytes
                if n > min(size - 8, _MAX_HEADER):
                    raise ConvertError(f"{path.name}: not a safetensors file (its header length does not fit the file)")
                header = json.loads(fh.read(n))
        except OSError as exc:
            raise ConvertError(f"{path.name}: cannot read it ({exc.strerror or type(exc).__name__})") from None
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            raise ConvertError(f"{path.name}: not a safetensors file (its header is not JSON)") from None
        if not isinstance(header, dict):
            raise ConvertError(f"{path.name}: not a safetensors file (its header is a JSON {type(header).__name__}, "
                               f"not an object)")
        data_start = 8 + n
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            where = f"{path.name}: tensor {_show(name)}"
            if not isinstance(meta, dict):
                raise ConvertError(f"{where}: its entry is not an object")
            dtype = meta.get("dtype")
            if not isinstance(dtype, str) or dtype not in _DTYPES:
                raise ConvertError(f"{where} has dtype {_show(dtype)}; supported: {', '.join(sorted(_DTYPES))}")
            shape = meta.get("shape", [])
            if (not isinstance(shape, list) or len(shape) > _MAX_DIMS
                    or not all(_is_int(d) and d >= 0 for d in shape)):
                raise ConvertError(f"{where}: shape {_show(shape)} is not a list of up to {_MAX_DIMS} sizes >= 0")
            offsets = meta.get("data_offsets")
            if (not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_int(x) for x in offsets)
                    or not 0 <= offsets[0] <= offsets[1]):
                raise ConvertError(f"{where}: data_offsets {_show(offsets)} are not [begin, end] with 0 <= begin <= end")
            begin, end = offsets
            expected = math.prod(shape) * _DTYPES[dtype][0].itemsize  # Python int: exact at any size
            if end - begin != expected:
                raise ConvertError(
                    f"{where} holds {end - begin} bytes but shape {_show(shape)} of {dtype} needs {expected}"
                )
            if data_start + end > size:
                raise ConvertError(f"{path.name}: truncated ({where[len(path.name) + 2:]} ends past the end of the file)")
            if name in self.tensors:
                raise ConvertError(f"{where} also appears in {self.tensors[name].file.name}")
            self.tensors[name] = SourceTensor(name, _DTYPES[dtype][1], tuple(shape), path, data_start + begin, expected)

    # -- access -------------------------------------------------------------------------------
    def has(self, name: str) -> bool:
        return name in self.tensors

    def info(self, name: str) -> SourceTensor:
        try:
            return self.tensors[name]
        except KeyError:
            raise ConvertError(f"{self.folder}: tensor {_show(name)} is missing from the checkpoint") from None

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
