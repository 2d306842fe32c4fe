"""Streaming GGUF writer: header and metadata first, then tensor data one tensor at a time.

Built on the `gguf` package's `GGUFWriter` in its incremental mode (add_tensor_info for every
tensor, write header / KV / tensor-info sections, then `write_tensor_data` per tensor), so only one
tensor is ever materialised. The file is written to a temporary name in the destination folder and
moved into place with `os.replace` once it is complete and its header re-validates; any failure
(bad input found mid-way, disk full, Ctrl-C) removes the partial file.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFWriter
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, LlamaFileType

from dgchat.convert.checkpoint import f32_to_bf16, to_f32
from dgchat.convert.errors import ConvertError
from dgchat.model_backend.errors import ModelFileError
from dgchat.model_backend.gguf_file import read_gguf_header

Q = GGMLQuantizationType
OUTTYPES = ("auto", "f32", "f16", "bf16", "q8_0")
_SOURCE_TYPES = {"f32": Q.F32, "f16": Q.F16, "bf16": Q.BF16}
_NAMED_TYPES = {"f32": Q.F32, "f16": Q.F16, "bf16": Q.BF16, "q8_0": Q.Q8_0}
_FILE_TYPES = {Q.F32: LlamaFileType.ALL_F32, Q.F16: LlamaFileType.MOSTLY_F16,
               Q.BF16: LlamaFileType.MOSTLY_BF16, Q.Q8_0: LlamaFileType.MOSTLY_Q8_0}
# headroom on top of the tensor bytes when checking free space (metadata, alignment padding)
_SPACE_MARGIN = 64 * 1024 * 1024
PARTIAL_PREFIX = ".dgchat-partial-"

ProgressFn = Callable[[int, int, str], None]
"""progress(bytes_written, bytes_total, tensor_name), called after each tensor."""


def tensor_nbytes(shape: Sequence[int], qtype: GGMLQuantizationType) -> int:
    block, size = GGML_QUANT_SIZES[qtype]
    n = int(np.prod(shape, dtype=np.int64)) if len(shape) else 1
    if n % block:
        raise ConvertError(f"{n} elements cannot be stored as {qtype.name} (block size {block})")
    return n // block * size


def pick_type(outtype: str, source_dtype: str, shape: Sequence[int], *, keep_f32: bool = False) -> GGMLQuantizationType:
    """GGUF storage type for one tensor. 1-D tensors (norms, scales) and `keep_f32` ones stay f32."""
    if outtype not in OUTTYPES:
        raise ConvertError(f"unknown output type {outtype!r}; choose one of: {', '.join(OUTTYPES)}")
    if keep_f32 or len(shape) < 2:
        return Q.F32
    if outtype == "auto":
        return _SOURCE_TYPES[source_dtype]
    qtype = _NAMED_TYPES[outtype]
    if qtype == Q.Q8_0 and shape[-1] % GGML_QUANT_SIZES[Q.Q8_0][0]:
        return Q.F16  # rows not divisible into q8_0 blocks
    return qtype


def encode(data: np.ndarray, source_dtype: str, qtype: GGMLQuantizationType) -> np.ndarray:
    """Convert stored data (bf16 as uint16 bits) into the bytes/array GGUF expects for `qtype`."""
    if qtype == Q.BF16 and source_dtype == "bf16":
        return np.ascontiguousarray(data, dtype=np.uint16)
    if qtype == Q.F16 and source_dtype == "f16":
        return np.ascontiguousarray(data, dtype=np.float16)
    values = to_f32(data, source_dtype)
    if qtype == Q.F32:
        return np.ascontiguousarray(values, dtype=np.float32)
    if qtype == Q.F16:
        return np.ascontiguousarray(values.astype(np.float16))
    if qtype == Q.BF16:
        return f32_to_bf16(values)
    if qtype == Q.Q8_0:
        from gguf.quants import quantize

        return quantize(np.ascontiguousarray(values, dtype=np.float32), Q.Q8_0)
    raise ConvertError(f"cannot write tensors as {qtype.name}")


@dataclass
class TensorPlan:
    """One output tensor: its GGUF name, logical shape (numpy order), type, and how to produce it."""

    name: str
    shape: tuple[int, ...]
    qtype: GGMLQuantizationType
    produce: Callable[[], np.ndarray]  # returns data already encoded for `qtype`
    # called once the tensor is on disk: lets a memory-mapped source drop the pages it touched, so
    # the resident set stays near one tensor instead of growing to the whole checkpoint
    release: Callable[[], None] | None = None

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.shape, self.qtype)


@dataclass
class GGUFPlan:
    """Everything needed to write one GGUF file."""

    arch: str
    kv: list[tuple[str, Any, GGUFValueType, GGUFValueType | None]] = field(default_factory=list)
    tensors: list[TensorPlan] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    # -- metadata helpers ---------------------------------------------------------------------
    def add(self, key: str, value: Any, vtype: GGUFValueType, sub_type: GGUFValueType | None = None) -> None:
        for i, (k, *_rest) in enumerate(self.kv):
            if k == key:
                self.kv[i] = (key, value, vtype, sub_type)
                return
        self.kv.append((key, value, vtype, sub_type))

    def u32(self, key: str, v: int) -> None:
        self.add(key, int(v), GGUFValueType.UINT32)

    def i32(self, key: str, v: int) -> None:
        self.add(key, int(v), GGUFValueType.INT32)

    def f32(self, key: str, v: float) -> None:
        self.add(key, float(v), GGUFValueType.FLOAT32)

    def boolean(self, key: str, v: bool) -> None:
        self.add(key, bool(v), GGUFValueType.BOOL)

    def string(self, key: str, v: str) -> None:
        self.add(key, str(v), GGUFValueType.STRING)

    def array(self, key: str, values: Sequence[Any] | np.ndarray, sub_type: GGUFValueType) -> None:
        if len(values) == 0:
            raise ConvertError(f"metadata array {key} would be empty")
        if isinstance(values, np.ndarray):
            values = np.ascontiguousarray(values.reshape(-1))
        self.add(key, values, GGUFValueType.ARRAY, sub_type)

    def get(self, key: str, default: Any = None) -> Any:
        for k, v, *_rest in self.kv:
            if k == key:
                return v
        return default

    def file_type(self) -> int:
        types = [t.qtype for t in self.tensors if len(t.shape) >= 2]
        if not types:
            return int(LlamaFileType.ALL_F32)
        most = max(set(types), key=types.count)
        return int(_FILE_TYPES.get(most, LlamaFileType.GUESSED))

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


_NUMPY_ARRAY_TYPES = {
    GGUFValueType.FLOAT32: "<f4", GGUFValueType.UINT16: "<u2", GGUFValueType.INT16: "<i2",
    GGUFValueType.UINT32: "<u4", GGUFValueType.INT32: "<i4", GGUFValueType.UINT8: "u1", GGUFValueType.INT8: "i1",
    GGUFValueType.UINT64: "<u8", GGUFValueType.INT64: "<i8", GGUFValueType.FLOAT64: "<f8",
}


class _Writer(GGUFWriter):
    """GGUFWriter that packs numpy metadata arrays in one go.

    The stock writer packs arrays element by element, which takes minutes for the millions of
    values dgchat stores as metadata (self-conditioning weights). The bytes are identical."""

    def _pack_val(self, val: Any, vtype: GGUFValueType, add_vtype: bool, sub_type: GGUFValueType | None = None) -> bytes:
        if vtype == GGUFValueType.ARRAY and isinstance(val, np.ndarray) and sub_type in _NUMPY_ARRAY_TYPES:
            head = self._pack("I", vtype) if add_vtype else b""
            head += self._pack("I", sub_type) + self._pack("Q", val.size)
            return head + np.ascontiguousarray(val, dtype=_NUMPY_ARRAY_TYPES[sub_type]).tobytes()
        return super()._pack_val(val, vtype, add_vtype, sub_type)


def _space_error(folder: Path, need: int) -> ConvertError:
    size = f"{need / 1e9:.2f} GB" if need >= 1e9 else f"{need / 1e6:.1f} MB"
    return ConvertError(f"not enough disk space in {folder} (the output needs about {size})")


def _is_full_disk(exc: OSError) -> bool:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return True
    # numpy's tofile reports a short write without an errno: "N requested and M written"
    return exc.errno is None and "requested and" in str(exc)


def write_gguf(plan: GGUFPlan, out: Path, progress: ProgressFn | None = None) -> int:
    """Write `plan` to `out` atomically. Returns the file size in bytes."""
    out = Path(out)
    folder = out.parent
    if not folder.is_dir():
        raise ConvertError(f"output folder {folder} does not exist")
    total = plan.total_bytes
    check_space(folder, total)

    tmp = partial_path(out)
    writer = _Writer(None, plan.arch)
    done = False
    try:
        for key, value, vtype, sub_type in plan.kv:
            if key == "general.architecture":
                continue
            writer.add_key_value(key, value, vtype, sub_type)
        for t in plan.tensors:
            dtype = np.float16 if t.qtype == Q.F16 else np.float32
            writer.add_tensor_info(t.name, t.shape, np.dtype(dtype), t.nbytes,
                                   raw_dtype=None if t.qtype in (Q.F32, Q.F16) else t.qtype)
        writer.write_header_to_file(tmp)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        written = 0
        for t in plan.tensors:
            data = t.produce()
            if data.nbytes != t.nbytes:
                raise ConvertError(f"internal error: tensor {t.name} produced {data.nbytes} bytes, expected {t.nbytes}")
            writer.write_tensor_data(data)
            del data
            if t.release is not None:
                t.release()
            written += t.nbytes
            if progress is not None:
                progress(written, total, t.name)
        writer.flush()
        assert writer.fout is not None
        for fh in writer.fout:
            os.fsync(fh.fileno())
        writer.close()
        _validate(tmp)
        os.replace(tmp, out)
        done = True
        return out.stat().st_size
    except OSError as exc:
        if _is_full_disk(exc):
            raise _space_error(folder, total + _SPACE_MARGIN) from None
        raise ConvertError(f"could not write {out}: {exc.strerror or exc}") from None
    finally:
        if not done:
            writer.close()
            try:
                tmp.unlink()
            except FileNotFoundError:
                pass


def finish_plan(plan: GGUFPlan, name: str) -> None:
    """general.name, general.file_type (the dominant tensor type) and the quantization version."""
    plan.string("general.name", name)
    plan.u32("general.file_type", plan.file_type())
    if any(t.qtype not in (Q.F32, Q.F16, Q.BF16) for t in plan.tensors):
        plan.u32("general.quantization_version", 2)


def check_space(folder: Path, need: int) -> None:
    """Refuse to start when the destination cannot hold `need` more bytes (plus headroom)."""
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return
    if free < need + _SPACE_MARGIN:
        raise _space_error(folder, need + _SPACE_MARGIN)


def partial_path(out: Path) -> Path:
    """A temporary name next to `out`; partial files never carry the final name."""
    return out.parent / f"{PARTIAL_PREFIX}{out.name}-{secrets.token_hex(4)}"


def _validate(path: Path) -> None:
    try:
        read_gguf_header(path)
    except ModelFileError as exc:
        raise ConvertError(f"internal error: the written file does not validate: {exc}") from None
