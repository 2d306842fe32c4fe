"""dgchat's diffusion head (engine/patches/0006): its C bindings and the types callers configure it with.

The vocabulary-wide part of a denoising step, computed in llama.cpp's graph on the device that
computed the logits: per output row the drawn token, the argmax, the entropy and three
probabilities come back instead of the row's logits (see llama_dgchat_head_* in the patched llama.h).
`LlamaContext` (llamacpp/context.py) drives it; `HEAD` is None with an engine without the patch.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dgchat.model_backend.llamacpp.library import llama_cpp as _llama

HEAD_RESULTS = 6
GGML_TYPES = {"f32": 0, "f16": 1, "bf16": 30}  # enum ggml_type


class HeadParams(ctypes.Structure):
    """llama_dgchat_head_params: how a context's head is set up (HeadSetup, as C sees it)."""

    _fields_ = [
        ("self_cond", ctypes.c_bool),
        ("n_slots", ctypes.c_int32),
        ("soft_top_k", ctypes.c_int32),
        ("embd_t_type", ctypes.c_int),
        ("embed_scale", ctypes.c_float),
        ("eps", ctypes.c_float),
        ("n_inter", ctypes.c_int32),
        ("w_type", ctypes.c_int),
        ("pre_norm", ctypes.c_void_p),
        ("gate", ctypes.c_void_p),
        ("up", ctypes.c_void_p),
        ("down", ctypes.c_void_p),
    ]


class HeadBatch(ctypes.Structure):
    """llama_dgchat_head_batch: the head's inputs for one decode (HeadRequest, as C sees it)."""

    _fields_ = [
        ("top_k", ctypes.c_int32),
        ("top_p", ctypes.c_float),
        ("margin", ctypes.c_bool),
        ("n_rows", ctypes.c_int32),
        ("inv_temp", ctypes.c_void_p),
        ("uniform", ctypes.c_void_p),
        ("bias_row", ctypes.c_void_p),
        ("sc_write", ctypes.c_void_p),
        ("n_tokens", ctypes.c_int32),
        ("sc_read", ctypes.c_void_p),
        ("keep_logits", ctypes.c_bool),
    ]


def _bind_head() -> dict[str, Callable] | None:
    """The head's C functions with their signatures, or None when this engine lacks patch 0006."""
    lib = _llama.llama_cpp._lib
    if getattr(lib, "llama_dgchat_head_prepare", None) is None:
        return None
    sigs = {
        "llama_dgchat_head_init": (ctypes.c_int32, [ctypes.c_void_p, ctypes.POINTER(HeadParams)]),
        "llama_dgchat_head_set_bias": (ctypes.c_int32, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32]),
        "llama_dgchat_head_prepare": (ctypes.c_int32, [ctypes.c_void_p, ctypes.POINTER(HeadBatch)]),
        "llama_dgchat_head_results": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int32)]),
        "llama_dgchat_head_read_slots": (ctypes.c_int32, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p]),
    }
    fns = {}
    for name, (restype, argtypes) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
        fns[name.removeprefix("llama_dgchat_head_")] = fn
    return fns


HEAD = _bind_head()  # name -> bound function, without the llama_dgchat_head_ prefix


def array_ptr(a: np.ndarray | None) -> int | None:
    """The address of an array's data for a C pointer field (None: NULL)."""
    return None if a is None else a.ctypes.data


@dataclass(frozen=True, eq=False)
class SelfConditioningWeights:
    """DiffusionGemma's self-conditioning MLP as the head runs it (float32, PyTorch Linear layout)."""

    pre_norm: np.ndarray  # [d]
    gate: np.ndarray  # [inter, d]
    up: np.ndarray  # [inter, d]
    down: np.ndarray  # [d, inter]
    embed_scale: float
    eps: float
    source: object = None  # what the weights were taken from (callers tell a stale setup by it)


@dataclass(frozen=True, eq=False)
class HeadSetup:
    """How a context's head is configured. `soft_top_k` 0: the soft embedding over the whole
    vocabulary (a transposed copy of token_embd on the device, f16 when `embd_t_f16`)."""

    self_conditioning: SelfConditioningWeights | None = None
    n_slots: int = 0
    soft_top_k: int = 0
    embd_t_f16: bool = False


@dataclass(frozen=True)
class HeadRequest:
    """The head's inputs for one decode, one entry per requested output row (in output order)."""

    inv_temp: np.ndarray  # float32: 1 / temperature (1 for greedy rows)
    uniform: np.ndarray  # float32 in [0, 1): the draw of each row
    top_k: int = 0
    top_p: float = 1.0
    margin: bool = False
    bias_row: np.ndarray | None = None  # int32: row of the bias table per output row
    sc_write: np.ndarray | None = None  # int32: self-conditioning slot each row writes (None: no signal)
    sc_read: np.ndarray | None = None  # int32 per batch token: the slot its decoder input reads (0: none)
    keep_logits: bool = False  # also return the logits: (RowStats, logits) (tests compare with the host)
