"""`LlamaModel`: a GGUF loaded by llama.cpp (on the GPU, in RAM or both as a placement plans it:
model_backend/placement.py; layers on registered RPC servers), its vocabulary and metadata. The
header is checked before llama.cpp sees it."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from dgchat.model_backend import rpc_probe
from dgchat.model_backend.errors import EngineError, ModelFileError
from dgchat.model_backend.gguf_file import GgufHeader, read_gguf_header, read_tensor
from dgchat.model_backend.llamacpp.build_info import use_extra_buffer_types
from dgchat.model_backend.llamacpp.devices import local_gpu_present
from dgchat.model_backend.llamacpp.library import last_error_line
from dgchat.model_backend.llamacpp.library import llama_cpp as _llama
from dgchat.model_backend.llamacpp.offload import decide_placement, tensor_overrides
from dgchat.model_backend.llamacpp.rpc_backend import rpc_in_use, rpc_model_closed, rpc_model_loaded
from dgchat.model_backend.model_check import check_model_header
from dgchat.model_backend.placement import Placement


class LlamaModel:
    """A loaded GGUF model. Validates the header before llama.cpp sees the file."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        n_gpu_layers: int | None = None,
        progress: Callable[[float], bool] | None = None,
        header: GgufHeader | None = None,
        placement: Placement | None = None,
    ) -> None:
        """placement: where the weights go (n_gpu_layers and the tensors kept in RAM); None plans
        one here (llamacpp/offload.py) with `n_gpu_layers` forced when given."""
        self.path = Path(path)
        self.header = header if header is not None else read_gguf_header(self.path)
        # llama.cpp GGML_ASSERTs (aborts the process) on some out-of-range values: none reach it
        check_model_header(self.header)
        params = _llama.llama_model_default_params()
        # layers go to local GPUs and registered RPC servers (model_backend/rpc.py); llama.cpp
        # puts the RPC servers first and splits the layers by each device's free memory
        remote = rpc_probe.registered()
        gpu = local_gpu_present()
        if placement is None:
            placement = decide_placement(self.header, gpu_layers=n_gpu_layers)
        self.placement = placement
        n_gpu_layers = placement.gpu_layers
        params.n_gpu_layers = n_gpu_layers
        # llama.cpp reads the patterns during the load; they are kept for the model's life anyway
        self._overrides = tensor_overrides(placement.overrides())
        if self._overrides is not None:
            params.tensor_buft_overrides = ctypes.cast(self._overrides[0], ctypes.c_void_p)
        params.use_extra_bufts = use_extra_buffer_types()
        if remote and n_gpu_layers > 0 and not rpc_in_use():
            rpc_probe.check_before_load()  # llama.cpp aborts the process on a server that went away
        self._progress_cb = None
        if progress is not None:

            def _cb(fraction: float, _user: ctypes.c_void_p) -> bool:
                try:
                    return bool(progress(float(fraction)))
                except Exception:  # a UI callback must never crash the loader
                    return True

            self._progress_cb = _llama.llama_progress_callback(_cb)
            params.progress_callback = self._progress_cb
        self._ptr = _llama.llama_model_load_from_file(str(self.path).encode(), params)
        if not self._ptr:
            reason = last_error_line() or "llama.cpp could not load it"
            raise ModelFileError(f"{self.path.name}: {reason}")
        self._holds_rpc = bool(remote and n_gpu_layers > 0)
        if self._holds_rpc:
            rpc_model_loaded()
        self._vocab_ptr = _llama.llama_model_get_vocab(self._ptr)
        self.n_vocab = int(_llama.llama_vocab_n_tokens(self._vocab))
        self.n_embd = int(_llama.llama_model_n_embd(self._ptr))
        self.n_layer = int(_llama.llama_model_n_layer(self._ptr))
        self.n_ctx_train = int(_llama.llama_model_n_ctx_train(self._ptr))
        self.n_swa = int(_llama.llama_model_n_swa(self._ptr))
        self.n_gpu_layers = n_gpu_layers
        # llama.cpp offloads the output layer (the LM head) first: n_gpu_layers = N puts it and the
        # last N-1 repeating layers on the GPU (src/llama-model.cpp, i_gpu_start), on the last
        # device (an RPC server's may be a CPU, so only a local GPU counts here)
        self.output_on_gpu = gpu and n_gpu_layers > 0
        self.is_diffusion_arch = bool(_llama.llama_model_is_diffusion(self._ptr))
        self._named: frozenset[int] | None = None  # bos, eos, ... ids (is_special)

    @property
    def _vocab(self) -> ctypes.c_void_p:
        """The vocabulary lives inside the model: after close() llama.cpp has freed it, and a call
        through the stale pointer would crash the process, so it is an error instead."""
        if not getattr(self, "_ptr", None):
            raise EngineError("the model was closed: its vocabulary is gone (use the engine inside its `with`)")
        return self._vocab_ptr

    # -- lifetime -----------------------------------------------------------------------------
    def close(self) -> None:
        if getattr(self, "_ptr", None):
            _llama.llama_model_free(self._ptr)
            self._ptr = None
            if getattr(self, "_holds_rpc", False):
                rpc_model_closed()
                self._holds_rpc = False

    def __del__(self) -> None:
        self.close()

    def __enter__(self) -> LlamaModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- metadata -----------------------------------------------------------------------------
    @property
    def architecture(self) -> str:
        return self.header.architecture or "?"

    def description(self) -> str:
        buf = ctypes.create_string_buffer(256)
        _llama.llama_model_desc(self._ptr, buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    def size_bytes(self) -> int:
        return int(_llama.llama_model_size(self._ptr))

    # -- vocabulary ---------------------------------------------------------------------------
    def _special(self, fn: Callable[[object], int]) -> int | None:
        tok = int(fn(self._vocab))
        return None if tok < 0 else tok

    @property
    def bos(self) -> int | None:
        return self._special(_llama.llama_vocab_bos)

    @property
    def eos(self) -> int | None:
        return self._special(_llama.llama_vocab_eos)

    @property
    def eot(self) -> int | None:
        return self._special(_llama.llama_vocab_eot)

    @property
    def mask(self) -> int | None:
        return self._special(_llama.llama_vocab_mask)

    @property
    def pad(self) -> int | None:
        return self._special(_llama.llama_vocab_pad)

    @property
    def add_bos(self) -> bool:
        return bool(_llama.llama_vocab_get_add_bos(self._vocab))

    def is_eog(self, token: int) -> bool:
        return bool(_llama.llama_vocab_is_eog(self._vocab, int(token)))

    def eog_ids(self) -> np.ndarray:
        """Every end-of-generation token id (eos, eot, and the ones llama.cpp derives)."""
        return np.array([t for t in range(self.n_vocab) if self.is_eog(t)], dtype=np.int32)

    def is_control(self, token: int) -> bool:
        return bool(_llama.llama_vocab_is_control(self._vocab, int(token)))

    def parsed_as_special(self, token: int) -> bool:
        """Whether tokenizing with parse_special=True is what produces this token from its text
        (control and unknown tokens; user-defined ones are matched either way)."""
        if not 0 <= int(token) < self.n_vocab:
            return False
        attr = int(_llama.llama_vocab_get_attr(self._vocab, int(token)))
        return bool(attr & (_llama.LLAMA_TOKEN_ATTR_CONTROL | _llama.LLAMA_TOKEN_ATTR_UNKNOWN))

    def is_special(self, token: int) -> bool:
        """Whether a token's text is markup, not answer text: control and unknown tokens (the ones
        llama.cpp's detokenizer leaves out of an answer) and the ids the vocabulary names (bos,
        eos, eot, pad, mask: a file may forget to mark these as control). Ids outside the
        vocabulary count as special (they have no text)."""
        if not 0 <= int(token) < self.n_vocab:
            return True
        if int(token) in self._named_ids():
            return True
        attr = int(_llama.llama_vocab_get_attr(self._vocab, int(token)))
        return bool(attr & (_llama.LLAMA_TOKEN_ATTR_CONTROL | _llama.LLAMA_TOKEN_ATTR_UNKNOWN))

    def _named_ids(self) -> frozenset[int]:
        named = self._named
        if named is None:
            fns = (_llama.llama_vocab_bos, _llama.llama_vocab_eos, _llama.llama_vocab_eot, _llama.llama_vocab_pad,
                   _llama.llama_vocab_mask)
            named = self._named = frozenset(t for t in (self._special(fn) for fn in fns) if t is not None)
        return named

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> np.ndarray:
        raw = text.encode("utf-8")
        n_max = len(raw) + 8
        buf = (_llama.llama_token * n_max)()
        n = _llama.llama_tokenize(self._vocab, raw, len(raw), buf, n_max, add_special, parse_special)
        if n < 0:
            n_max = -n
            buf = (_llama.llama_token * n_max)()
            n = _llama.llama_tokenize(self._vocab, raw, len(raw), buf, n_max, add_special, parse_special)
            if n < 0:
                raise EngineError("tokenization failed")
        return np.ctypeslib.as_array(buf)[:n].astype(np.int32)

    def token_piece(self, token: int, *, special: bool = True) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = _llama.llama_token_to_piece(self._vocab, int(token), buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = _llama.llama_token_to_piece(self._vocab, int(token), buf, len(buf), 0, special)
        return buf.raw[: max(n, 0)]

    def detokenize(
        self, tokens: Sequence[int] | np.ndarray, *, remove_special: bool = False, unparse_special: bool = False
    ) -> str:
        arr = np.ascontiguousarray(tokens, dtype=np.int32)
        if arr.size == 0:
            return ""
        ptr = arr.ctypes.data_as(ctypes.POINTER(_llama.llama_token))
        cap = max(64, arr.size * 16)
        for _ in range(2):
            buf = ctypes.create_string_buffer(cap)
            n = _llama.llama_detokenize(self._vocab, ptr, arr.size, buf, cap, remove_special, unparse_special)
            if n >= 0:
                return buf.raw[:n].decode("utf-8", errors="replace")
            cap = -n + 1
        raise EngineError("detokenization failed")

    def embedding_matrix(self) -> np.ndarray:
        """token_embd.weight as float32 (n_vocab, n_embd), read from the file (dequantized)."""
        return read_tensor(self.header, "token_embd.weight")
