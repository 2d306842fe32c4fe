"""`--quantize`: llama.cpp's own quantizer on a GGUF, written atomically.

The quantizer itself is llama.cpp's (`llama_model_quantize`, reached through the one wrapper
module `dgchat.model_backend.llamacpp`): the same per-tensor type choices as `llama-quantize`
(e.g. Q4_K_M keeps some attn_v / ffn_down rows at Q6_K, the output at Q6_K, 1-D tensors and the
MoE router at f32), and it copies every metadata key, so `dgchat.*`, tokenizer and diffusion keys
survive. Only types that need no importance matrix are offered.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from dgchat.convert.errors import ConvertError
from dgchat.convert.writer import _space_error, _validate, check_space, partial_path
from dgchat.model_backend.errors import EngineError, ModelFileError
from dgchat.model_backend.gguf_file import read_gguf_header

# name -> nominal bits per weight of the bulk of the tensors (llama.cpp tools/quantize's table),
# used only to check free space before starting
QUANT_TYPES: dict[str, float] = {
    "Q8_0": 8.5, "Q6_K": 6.56, "Q5_K_M": 5.7, "Q5_K_S": 5.54, "Q5_1": 6.0, "Q5_0": 5.5,
    "Q4_K_M": 4.89, "Q4_K_S": 4.58, "Q4_1": 5.0, "Q4_0": 4.5, "IQ4_NL": 4.5, "IQ4_XS": 4.25,
    "Q3_K_L": 4.27, "Q3_K_M": 3.91, "Q3_K_S": 3.5, "Q2_K": 3.35,
}


def check_type(name: str) -> str:
    key = name.upper()
    if key not in QUANT_TYPES:
        raise ConvertError(f"unknown quantization type {name!r}; choose one of: {', '.join(QUANT_TYPES)}")
    return key


def estimate_bytes(n_weights: int, n_small: int, qtype: str) -> int:
    """Upper-ish estimate of a quantized file: the bulk at the type's rate plus 2 bits/weight of
    slack for the tensors the mix keeps wider, 1-D tensors at f32."""
    return int(n_weights * (QUANT_TYPES[qtype] + 2.0) / 8) + 4 * n_small


def quantize_gguf(src: Path, out: Path, qtype: str, *, progress=None, n_threads: int | None = None) -> int:
    """Quantize `src` into `out` (temporary name + rename; nothing is left on failure).
    progress(i, n, tensor_name) as llama.cpp starts tensor i of n. Returns the output size."""
    import numpy as np

    qtype = check_type(qtype)
    try:
        header = read_gguf_header(src)
    except ModelFileError as exc:
        raise ConvertError(str(exc)) from None
    big = sum(int(np.prod(t.shape)) for t in header.tensors.values() if len(t.shape) > 1 and t.shape[1] > 1)
    small = sum(int(np.prod(t.shape)) for t in header.tensors.values()) - big
    need = estimate_bytes(big, small, qtype)
    folder = out.parent
    check_space(folder, need)

    # imported when a quantization runs, so that dgchat.convert.api (and dgchat.hub, which imports it)
    # loads no llama.cpp
    from dgchat.model_backend import llamacpp  # heavy: llama.cpp's shared library

    tmp = partial_path(out)
    done = False
    try:
        try:
            llamacpp.quantize_model(src, tmp, qtype, n_threads=n_threads, progress=progress)
        except EngineError as exc:
            try:
                free = shutil.disk_usage(folder).free
            except OSError:
                free = None
            # llama.cpp reports a failed write as an iostream exception; say what it most likely is
            if (free is not None and free < need) or "iostream" in str(exc) or "No space" in str(exc):
                raise _space_error(folder, need) from None
            raise ConvertError(f"llama.cpp could not quantize {src.name}: {exc}") from None
        _validate(tmp)
        os.replace(tmp, out)
        done = True
        return out.stat().st_size
    finally:
        if not done:
            try:
                tmp.unlink()
            except FileNotFoundError:
                pass
