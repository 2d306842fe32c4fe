"""Reads and validates a GGUF header before llama.cpp ever opens the file.

llama.cpp trusts the file it is given; a truncated download or a random file can crash it or make
it allocate absurd amounts of memory. This module parses the header with explicit bounds, checks
that every tensor's data lies inside the file, and returns the metadata as Python values.
Format reference: ggml/docs/gguf.md in the llama.cpp tree.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from dgchat.model_backend.errors import ModelFileError

GGUF_MAGIC = b"GGUF"
_MAX_TENSORS = 1_000_000
_MAX_KV = 100_000
_MAX_STRING = 64 * 1024 * 1024
_MAX_DIMS = 8
# Arrays longer than this are not materialised unless asked for (vocabularies have 262k entries).
_EAGER_ARRAY_LIMIT = 256

# GGUF value types
_U8, _I8, _U16, _I16, _U32, _I32, _F32, _BOOL, _STR, _ARR, _U64, _I64, _F64 = range(13)
_SCALAR = {
    _U8: "<B", _I8: "<b", _U16: "<H", _I16: "<h", _U32: "<I", _I32: "<i",
    _F32: "<f", _BOOL: "<?", _U64: "<Q", _I64: "<q", _F64: "<d",
}


@dataclass(frozen=True)
class LazyArray:
    """A long metadata array left unread; `GgufHeader.array()` reads it on demand."""

    item_type: int
    count: int
    offset: int


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml order: ne[0] is the contiguous dimension
    ggml_type: int
    offset: int  # absolute offset of the data in the file
    nbytes: int

    @property
    def type_name(self) -> str:
        try:
            return GGMLQuantizationType(self.ggml_type).name
        except ValueError:
            return f"type{self.ggml_type}"


@dataclass
class GgufHeader:
    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    data_offset: int = 0
    file_size: int = 0
    values_checked: bool = field(default=False, repr=False)  # model_check.check_model_header passed

    @property
    def architecture(self) -> str | None:
        arch = self.metadata.get("general.architecture")
        return arch if isinstance(arch, str) else None

    def get(self, key: str, default: Any = None) -> Any:
        value = self.metadata.get(key, default)
        if isinstance(value, LazyArray):
            return self.array(key)
        return value

    def arch_key(self, suffix: str, default: Any = None) -> Any:
        """`{arch}.{suffix}`, e.g. arch_key("attention.causal")."""
        return self.get(f"{self.architecture}.{suffix}", default)

    def array(self, key: str) -> list[Any]:
        value = self.metadata.get(key)
        if not isinstance(value, LazyArray):
            return value
        with open(self.path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            reader = _Reader(mm, self.path)
            reader.pos = value.offset
            return [reader.value(value.item_type) for _ in range(value.count)]


class _Reader:
    def __init__(self, buf: mmap.mmap | bytes, path: Path) -> None:
        self.buf = buf
        self.pos = 0
        self.size = len(buf)
        self.path = path

    def _need(self, n: int) -> None:
        if n < 0 or self.pos + n > self.size:
            raise ModelFileError(
                f"{self.path.name}: truncated GGUF header (needs {self.pos + n} bytes, file has {self.size})"
            )

    def unpack(self, fmt: str) -> Any:
        n = struct.calcsize(fmt)
        self._need(n)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return value

    def string(self) -> str:
        length = self.unpack("<Q")
        if length > _MAX_STRING:
            raise ModelFileError(f"{self.path.name}: corrupt GGUF header (string of {length} bytes)")
        self._need(length)
        raw = bytes(self.buf[self.pos : self.pos + length])
        self.pos += length
        return raw.decode("utf-8", errors="replace")

    def value(self, vtype: int, lazy: bool = False) -> Any:
        if vtype in _SCALAR:
            return self.unpack(_SCALAR[vtype])
        if vtype == _STR:
            return self.string()
        if vtype == _ARR:
            item_type = self.unpack("<I")
            count = self.unpack("<Q")
            if item_type == _ARR:
                raise ModelFileError(f"{self.path.name}: nested arrays are not supported in GGUF metadata")
            if item_type not in _SCALAR and item_type != _STR:
                raise ModelFileError(f"{self.path.name}: corrupt GGUF header (array item type {item_type})")
            if item_type in _SCALAR:
                self._need(count * struct.calcsize(_SCALAR[item_type]))
            elif count > self.size:
                raise ModelFileError(f"{self.path.name}: corrupt GGUF header (array of {count} strings)")
            if lazy and count > _EAGER_ARRAY_LIMIT:
                start = self.pos
                if item_type in _SCALAR:
                    self.pos += count * struct.calcsize(_SCALAR[item_type])
                else:
                    for _ in range(count):
                        length = self.unpack("<Q")
                        if length > _MAX_STRING:
                            raise ModelFileError(f"{self.path.name}: corrupt GGUF header (string of {length} bytes)")
                        self._need(length)
                        self.pos += length
                return LazyArray(item_type, count, start)
            return [self.value(item_type) for _ in range(count)]
        raise ModelFileError(f"{self.path.name}: corrupt GGUF header (value type {vtype})")


def tensor_nbytes(shape: tuple[int, ...], ggml_type: int) -> int:
    try:
        block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        raise ModelFileError(f"unknown ggml tensor type {ggml_type}") from None
    n = 1
    for d in shape:
        n *= d
    if n % block_size:
        raise ModelFileError(f"tensor of {n} elements is not a multiple of its block size {block_size}")
    return n // block_size * type_size


def read_tensor(header: GgufHeader, name: str) -> np.ndarray:
    """Tensor data as float32 numpy, in numpy order (reversed ggml shape). Quantized types are dequantized."""
    info = header.tensors.get(name)
    if info is None:
        raise ModelFileError(f"{header.path.name}: tensor {name!r} not found")
    raw = np.memmap(header.path, dtype=np.uint8, mode="r", offset=info.offset, shape=(info.nbytes,))
    qtype = GGMLQuantizationType(info.ggml_type)
    shape = tuple(reversed(info.shape))
    if qtype == GGMLQuantizationType.F32:
        return np.asarray(raw.view(np.float32).reshape(shape))
    if qtype == GGMLQuantizationType.F16:
        return raw.view(np.float16).reshape(shape).astype(np.float32)
    if qtype == GGMLQuantizationType.BF16:
        bits = raw.view(np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32).reshape(shape)
    rows = raw.reshape(-1, info.nbytes // max(1, int(np.prod(shape[:-1]))))
    return dequantize(rows, qtype).reshape(shape).astype(np.float32, copy=False)


def read_gguf_header(path: str | os.PathLike[str]) -> GgufHeader:
    """Parse and validate `path`. Raises ModelFileError with a one-line reason on any problem."""
    path = Path(path)
    if not path.exists():
        raise ModelFileError(f"model file not found: {path}")
    if path.is_dir():
        raise ModelFileError(f"{path} is a folder, not a GGUF file")
    try:
        if not path.is_file():
            raise ModelFileError(f"{path.name}: not a regular file")
        file_size = path.stat().st_size
        if file_size < 24:
            raise ModelFileError(f"{path.name}: not a GGUF file (only {file_size} bytes)")
        with open(path, "rb") as fh:
            if fh.read(4) != GGUF_MAGIC:
                raise ModelFileError(f"{path.name}: not a GGUF file (bad magic bytes)")
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                return _parse(mm, path, file_size)
    except OSError as exc:  # unreadable (permissions, I/O error, a device): one line, not a traceback
        raise ModelFileError(f"{path.name}: cannot read it ({exc.strerror or type(exc).__name__})") from None


def _parse(mm: mmap.mmap, path: Path, file_size: int) -> GgufHeader:
    r = _Reader(mm, path)
    r.pos = 4
    version = r.unpack("<I")
    if version not in (2, 3):
        raise ModelFileError(f"{path.name}: unsupported GGUF version {version} (expected 2 or 3)")
    n_tensors = r.unpack("<Q")
    n_kv = r.unpack("<Q")
    if n_tensors > _MAX_TENSORS or n_kv > _MAX_KV:
        raise ModelFileError(f"{path.name}: corrupt GGUF header ({n_tensors} tensors, {n_kv} keys)")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = r.string()
        vtype = r.unpack("<I")
        if key in metadata:  # ggml's own reader refuses it too; which value would win is undefined
            raise ModelFileError(f"{path.name}: corrupt GGUF header (metadata key {key[:80]!r} appears twice)")
        metadata[key] = r.value(vtype, lazy=True)
    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise ModelFileError(f"{path.name}: corrupt GGUF header (alignment {alignment!r})")
    infos: list[tuple[str, tuple[int, ...], int, int]] = []
    for _ in range(n_tensors):
        name = r.string()
        n_dims = r.unpack("<I")
        if n_dims == 0 or n_dims > _MAX_DIMS:
            raise ModelFileError(f"{path.name}: corrupt tensor info for {name!r} ({n_dims} dims)")
        shape = tuple(r.unpack("<Q") for _ in range(n_dims))
        ggml_type = r.unpack("<I")
        offset = r.unpack("<Q")
        infos.append((name, shape, ggml_type, offset))
    data_offset = (r.pos + alignment - 1) // alignment * alignment
    header = GgufHeader(path=path, version=version, metadata=metadata, data_offset=data_offset, file_size=file_size)
    for name, shape, ggml_type, offset in infos:
        try:
            nbytes = tensor_nbytes(shape, ggml_type)
        except ModelFileError as exc:
            raise ModelFileError(f"{path.name}: tensor {name!r}: {exc}") from None
        start = data_offset + offset
        if start + nbytes > file_size:
            raise ModelFileError(
                f"{path.name}: file is truncated (tensor {name!r} ends at byte {start + nbytes}, "
                f"file has {file_size}); re-download or re-convert it"
            )
        if name in header.tensors:
            raise ModelFileError(f"{path.name}: duplicate tensor {name!r}")
        header.tensors[name] = TensorInfo(name, shape, ggml_type, start, nbytes)
    return header
