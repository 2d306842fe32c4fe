"""The one thin wrapper over llama-cpp-python's low-level API.

This is the only module in dgchat that imports `llama_cpp` or `ctypes`. Everything above it works
with numpy arrays and plain Python values:

- `LlamaModel`: load a GGUF (GPU offload when the build supports it), vocabulary, metadata.
- `LlamaContext`: a context sized by the caller, decoding token or embedding batches where only the
  requested positions produce logits, logits returned as numpy views of llama.cpp's buffer (no copy
  per position), KV cell removal, causal/non-causal switching, cancellation mid-decode.
- llama.cpp's own log lines are captured in a ring buffer; they reach stderr only when verbose.
- `quantize_model`: llama.cpp's quantizer (`llama_model_quantize`), GGUF in, GGUF out.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dgchat.model_backend.errors import (
    ContextOverflowError,
    EngineError,
    GenerationCancelled,
    ModelFileError,
)
from dgchat.model_backend.gguf_file import GgufHeader, read_gguf_header

# ggml's CPU backend parallelises with OpenMP. With OpenMP's default spin-waiting, a thread that
# loses its core to another process (the UI thread, a browser, a build) stalls every barrier: on a
# loaded 2-core machine a 2-thread decode measured 200 ms instead of 70 ms. Passive waiting costs
# little when the machine is idle. Must be set before libgomp loads; the user's value wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

try:
    import llama_cpp as _llama
except (ImportError, OSError) as exc:  # a missing or broken shared library
    raise EngineError(f"llama-cpp-python could not be loaded: {exc}") from exc

def set_blas_threads(n: int) -> bool:
    """Threads numpy's BLAS may use from now on (process-wide). False when it cannot be set.

    The samplers' matrix products are small next to a decode (DiffusionGemma's self-conditioning
    on the bundled model: ~0.2 GFLOP a step). A multi-threaded BLAS call is gated by its slowest
    thread, so when another process holds a core it waits a whole time slice: on the 2-core dev
    machine with one core busy, 2 BLAS threads made the bundled model's sampler 229 ms a step
    against 7.6 ms with 1 (and slowed the next llama.cpp decode, 18.6 -> 12.2 ms)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return False
    threadpool_limits(limits=max(1, int(n)), user_api="blas")
    return True


_LOG_LINES: deque[str] = deque(maxlen=4000)
_log_state: dict = {"verbose": False, "partial": "", "hook": None}
_log_lock = threading.Lock()


@_llama.llama_log_callback
def _on_log(level: int, text: bytes | None, _user: ctypes.c_void_p) -> None:
    if not text:
        return
    chunk = text.decode("utf-8", errors="replace")
    with _log_lock:
        buf = _log_state["partial"] + chunk
        *lines, _log_state["partial"] = buf.split("\n")
        _LOG_LINES.extend(lines)
    hook = _log_state["hook"]
    if hook is not None:
        try:
            hook(chunk)
        except Exception:  # a progress display must never break llama.cpp's call
            pass
    if _log_state["verbose"]:
        sys.stderr.write(chunk)


_llama.llama_log_set(_on_log, ctypes.c_void_p(0))
_llama.llama_backend_init()


def set_verbose(verbose: bool) -> None:
    """Show llama.cpp's own log lines on stderr (`--verbose`)."""
    _log_state["verbose"] = verbose


def recent_log(n: int = 20) -> list[str]:
    with _log_lock:
        return list(_LOG_LINES)[-n:]


def _last_error_line() -> str:
    """The most specific error llama.cpp logged recently ("error loading model: ..." beats "failed")."""
    lines = [line.strip() for line in recent_log(80)]
    for marker in ("error loading model: ", "error: "):
        for line in reversed(lines):
            if marker in line:
                return line.split(marker, 1)[1].strip()
    for line in reversed(lines):
        low = line.lower()
        if "error" in low or "failed" in low or "exception" in low:
            return line
    return ""


# llama.cpp's quantizer logs "[   3/ 291] blk.0.attn_q.weight - [...]" as it starts each tensor
# (src/llama-quant.cpp, llama_model_quantize_impl); there is no progress callback in its params
_QUANT_PROGRESS = re.compile(r"\[\s*(\d+)/\s*(\d+)\]\s+(\S+)")


def quantize_model(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    ftype: str,
    *,
    n_threads: int | None = None,
    progress: Callable[[int, int, str], None] | None = None,
) -> None:
    """Run llama.cpp's quantizer: `src` GGUF -> `dst` GGUF of file type `ftype` ("Q4_K_M", ...).

    Every metadata key of `src` is copied (llama.cpp copies the whole KV section and updates
    general.file_type). `progress(i, n, tensor_name)` is called as tensor i of n starts. The call
    runs in a worker thread so that Ctrl-C reaches the caller; llama.cpp itself cannot be
    interrupted, so the worker may still be writing `dst` when KeyboardInterrupt propagates.
    Raises EngineError with llama.cpp's own error line on failure."""
    value = getattr(_llama, f"LLAMA_FTYPE_MOSTLY_{ftype.upper()}", None)
    if value is None:
        raise EngineError(f"this llama.cpp has no quantization type {ftype}")
    params = _llama.llama_model_quantize_default_params()
    params.nthread = int(n_threads or 0)  # 0: all cores
    params.ftype = int(value)
    result: dict[str, int] = {}

    def on_log(chunk: str) -> None:
        m = _QUANT_PROGRESS.search(chunk)
        if m and progress is not None:
            progress(int(m.group(1)), int(m.group(2)), m.group(3))

    def work() -> None:
        result["rc"] = int(_llama.llama_model_quantize(os.fsencode(src), os.fsencode(dst), ctypes.byref(params)))

    _log_state["hook"] = on_log
    try:
        worker = threading.Thread(target=work, name="llama-quantize", daemon=True)
        worker.start()
        while worker.is_alive():
            worker.join(0.1)
    finally:
        _log_state["hook"] = None
    if result.get("rc", 1) != 0:
        raise EngineError(_last_error_line() or "llama_model_quantize failed")


@dataclass(frozen=True)
class EngineInfo:
    llama_cpp_version: str
    gpu_offload: bool
    patch_level: int  # 0: stock llama.cpp; >0: dgchat's patch set (engine/patches)

    @property
    def exact_diffusion_gemma(self) -> bool:
        return self.patch_level > 0

    @property
    def noncontiguous_positions(self) -> bool:
        """Non-causal batches may sit between cached cells (engine/patches/0005), as the dual cache needs."""
        return self.patch_level >= 2


def engine_info() -> EngineInfo:
    lib = _llama.llama_cpp._lib
    level = 0
    fn = getattr(lib, "llama_dgchat_patch_level", None)
    if fn is not None:
        fn.restype = ctypes.c_int32
        fn.argtypes = []
        level = int(fn())
    return EngineInfo(
        llama_cpp_version=getattr(_llama, "__version__", "?"),
        gpu_offload=bool(_llama.llama_supports_gpu_offload()),
        patch_level=level,
    )


class LlamaModel:
    """A loaded GGUF model. Validates the header before llama.cpp sees the file."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        n_gpu_layers: int | None = None,
        progress: Callable[[float], bool] | None = None,
        header: GgufHeader | None = None,
    ) -> None:
        self.path = Path(path)
        self.header = header if header is not None else read_gguf_header(self.path)
        params = _llama.llama_model_default_params()
        if n_gpu_layers is None:
            n_gpu_layers = 999 if _llama.llama_supports_gpu_offload() else 0
        params.n_gpu_layers = n_gpu_layers
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
            reason = _last_error_line() or "llama.cpp could not load it"
            raise ModelFileError(f"{self.path.name}: {reason}")
        self._vocab = _llama.llama_model_get_vocab(self._ptr)
        self.n_vocab = int(_llama.llama_vocab_n_tokens(self._vocab))
        self.n_embd = int(_llama.llama_model_n_embd(self._ptr))
        self.n_layer = int(_llama.llama_model_n_layer(self._ptr))
        self.n_ctx_train = int(_llama.llama_model_n_ctx_train(self._ptr))
        self.n_swa = int(_llama.llama_model_n_swa(self._ptr))
        self.n_gpu_layers = n_gpu_layers
        self.is_diffusion_arch = bool(_llama.llama_model_is_diffusion(self._ptr))

    # -- lifetime -----------------------------------------------------------------------------
    def close(self) -> None:
        if getattr(self, "_ptr", None):
            _llama.llama_model_free(self._ptr)
            self._ptr = None

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
        from dgchat.model_backend.gguf_file import read_tensor

        return read_tensor(self.header, "token_embd.weight")


class _Batch:
    """A llama_batch whose arrays are owned by numpy, so filling it is vectorised and copy-free."""

    def __init__(self, capacity: int, n_embd: int, n_seq_max: int) -> None:
        self.capacity = capacity
        self.n_embd = n_embd
        self.tokens = np.zeros(capacity, dtype=np.int32)
        self.embd = np.zeros((capacity, n_embd), dtype=np.float32) if n_embd else None
        self.pos = np.zeros(capacity, dtype=np.int32)
        self.n_seq_id = np.ones(capacity, dtype=np.int32)
        self.seq_ids = np.zeros((capacity, n_seq_max), dtype=np.int32)
        self.logits = np.zeros(capacity, dtype=np.int8)
        row_ptrs = self.seq_ids.ctypes.data + np.arange(capacity, dtype=np.uint64) * self.seq_ids.strides[0]
        self._seq_ptrs = (ctypes.POINTER(_llama.llama_seq_id) * capacity)(
            *[ctypes.cast(int(p), ctypes.POINTER(_llama.llama_seq_id)) for p in row_ptrs]
        )
        self.struct = _llama.llama_batch()
        if self.embd is None:
            self.struct.token = self.tokens.ctypes.data_as(ctypes.POINTER(_llama.llama_token))
        else:
            self.struct.embd = self.embd.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        self.struct.pos = self.pos.ctypes.data_as(ctypes.POINTER(_llama.llama_pos))
        self.struct.n_seq_id = self.n_seq_id.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        self.struct.seq_id = self._seq_ptrs
        self.struct.logits = self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))


OutputSpec = slice | np.ndarray | Sequence[int] | None


def _libc_strlen():
    try:
        libc = ctypes.cdll.msvcrt if sys.platform == "win32" else ctypes.CDLL(None)
        return libc.strlen
    except (OSError, AttributeError):
        return None


_STRLEN = _libc_strlen()


class AbortFlag:
    """A cancel flag that llama.cpp polls between graph nodes without entering Python.

    ggml calls the abort callback after every node; a Python callback costs a GIL round trip each
    time (measured: ~25 ms added to a 7 ms decode of 32 tokens on 2 threads). Instead the callback is
    libc's strlen on a two-byte buffer: "\\0" has length 0 (false: keep going), "\\1" length 1
    (true: abort); the byte after it stays 0, so the length never exceeds 1. Without a usable libc
    the flag falls back to a Python callback."""

    def __init__(self) -> None:
        self._buf = ctypes.create_string_buffer(2)
        self._event = threading.Event()
        self._py_cb = None

    def callback(self):
        """(callback, data) for llama_context_params."""
        if _STRLEN is not None:
            fn = ctypes.cast(_STRLEN, _llama.ggml_abort_callback)
            return fn, ctypes.cast(self._buf, ctypes.c_void_p)
        self._py_cb = _llama.ggml_abort_callback(lambda _data: self._event.is_set())
        return self._py_cb, None

    def set(self) -> None:
        self._event.set()
        self._buf[0] = b"\x01"

    def clear(self) -> None:
        self._event.clear()
        self._buf[0] = b"\x00"

    def is_set(self) -> bool:
        return self._event.is_set()


class LlamaContext:
    """An inference context. `max_tokens` bounds one decode call (and the ubatch: non-causal
    attention needs the whole batch in one ubatch)."""

    def __init__(
        self,
        model: LlamaModel,
        *,
        n_ctx: int,
        max_tokens: int,
        n_seq_max: int = 1,
        n_threads: int | None = None,
        swa_full: bool = True,
        exact_kv: bool = False,
        per_seq_ctx: int | None = None,
    ) -> None:
        per_seq = per_seq_ctx or n_ctx
        if per_seq > model.n_ctx_train > 0:
            raise ContextOverflowError(
                f"{per_seq} tokens needed but {model.path.name} supports at most {model.n_ctx_train}"
            )
        self.model = model
        params = _llama.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = max_tokens
        params.n_ubatch = max_tokens
        params.n_seq_max = n_seq_max
        threads = n_threads or max(1, os.cpu_count() or 1)
        params.n_threads = threads
        params.n_threads_batch = threads
        params.swa_full = swa_full
        # one KV buffer for all sequences: llama.cpp then keeps a batch of several sequences in one
        # ubatch (split_simple); per-sequence buffers split it into equal-length pieces, which
        # would cut a sequence's non-causal attention apart
        params.kv_unified = True
        params.no_perf = True
        if exact_kv:
            # f32 K/V and no flash attention: slower, but logits can be compared with a reference
            # implementation to ~1e-5 instead of the ~1e-3 that an f16 cache allows.
            params.type_k = _llama.GGML_TYPE_F32
            params.type_v = _llama.GGML_TYPE_F32
            params.flash_attn_type = _llama.LLAMA_FLASH_ATTN_TYPE_DISABLED
        self._cancel = AbortFlag()
        params.abort_callback, params.abort_callback_data = self._cancel.callback()
        self._ptr = _llama.llama_init_from_model(model._ptr, params)
        if not self._ptr:
            raise EngineError(f"could not create a context of {n_ctx} tokens: {_last_error_line() or 'out of memory?'}")
        self.n_ctx = int(_llama.llama_n_ctx(self._ptr))
        self.max_tokens = max_tokens
        self.n_seq_max = n_seq_max
        self._mem = _llama.llama_get_memory(self._ptr)
        self._token_batch = _Batch(max_tokens, 0, n_seq_max)
        self._embd_batch: _Batch | None = None
        self._causal = True
        self.n_decodes = 0

    # -- lifetime -----------------------------------------------------------------------------
    def close(self) -> None:
        if getattr(self, "_ptr", None):
            _llama.llama_free(self._ptr)
            self._ptr = None

    def __del__(self) -> None:
        self.close()

    # -- state --------------------------------------------------------------------------------
    @property
    def has_memory(self) -> bool:
        """False for llada/dream/rnd1 GGUFs: every call re-runs the whole batch (no KV cache)."""
        return bool(self._mem)

    def set_causal(self, causal: bool) -> None:
        if causal != self._causal:
            _llama.llama_set_causal_attn(self._ptr, causal)
            self._causal = causal

    @property
    def cancel_event(self) -> AbortFlag:
        """Set it to abort the decode in flight; the decode raises GenerationCancelled."""
        return self._cancel

    def seq_rm(self, seq_id: int, p0: int, p1: int = -1) -> None:
        if self._mem and not _llama.llama_memory_seq_rm(self._mem, seq_id, p0, p1):
            raise EngineError(f"could not remove KV cells [{p0}, {p1}) of sequence {seq_id}")

    def seq_pos_max(self, seq_id: int = 0) -> int:
        """Largest position cached for the sequence, -1 when empty or without memory."""
        if not self._mem:
            return -1
        return int(_llama.llama_memory_seq_pos_max(self._mem, seq_id))

    def clear(self) -> None:
        if self._mem:
            _llama.llama_memory_clear(self._mem, True)

    # -- decoding -----------------------------------------------------------------------------
    def decode_tokens(
        self,
        tokens: np.ndarray | Sequence[int],
        positions: np.ndarray | Sequence[int],
        *,
        seq_ids: np.ndarray | Sequence[int] | int = 0,
        outputs: OutputSpec = None,
    ) -> np.ndarray:
        tok = np.asarray(tokens, dtype=np.int32)
        batch = self._token_batch
        n = self._check_size(tok.shape[0])
        batch.tokens[:n] = tok
        return self._run(batch, n, positions, seq_ids, outputs)

    def decode_embeddings(
        self,
        embeddings: np.ndarray,
        positions: np.ndarray | Sequence[int],
        *,
        seq_ids: np.ndarray | Sequence[int] | int = 0,
        outputs: OutputSpec = None,
    ) -> np.ndarray:
        if self._embd_batch is None:
            self._embd_batch = _Batch(self.max_tokens, self.model.n_embd, self.n_seq_max)
        batch = self._embd_batch
        n = self._check_size(embeddings.shape[0])
        if embeddings.shape[1] != self.model.n_embd:
            raise EngineError(f"embedding width {embeddings.shape[1]} != model width {self.model.n_embd}")
        batch.embd[:n] = embeddings
        return self._run(batch, n, positions, seq_ids, outputs)

    def _check_size(self, n: int) -> int:
        if n == 0:
            raise EngineError("empty batch")
        if n > self.max_tokens:
            raise ContextOverflowError(f"a batch of {n} tokens exceeds this context's limit of {self.max_tokens}")
        return n

    def _run(self, batch: _Batch, n: int, positions, seq_ids, outputs: OutputSpec) -> np.ndarray:
        batch.pos[:n] = np.asarray(positions, dtype=np.int32)
        batch.seq_ids[:n, 0] = seq_ids
        batch.logits[:n] = 0
        if outputs is None:
            out_idx = np.arange(n)
        elif isinstance(outputs, slice):
            out_idx = np.arange(n)[outputs]
        else:
            out_idx = np.asarray(outputs)
            if out_idx.dtype == np.bool_:
                out_idx = np.flatnonzero(out_idx[:n])
            else:
                # llama.cpp returns rows in batch order, so requests are sorted and deduplicated
                out_idx = np.unique(out_idx.astype(np.int64))
        batch.logits[out_idx] = 1
        batch.struct.n_tokens = n
        rc = _llama.llama_decode(self._ptr, batch.struct)
        self.n_decodes += 1
        if rc == 2 or (rc != 0 and self._cancel.is_set()):
            self._cancel.clear()
            raise GenerationCancelled("generation cancelled")
        if rc == 1:
            raise ContextOverflowError(f"no room in the KV cache for {n} more tokens (context {self.n_ctx})")
        if rc != 0:
            raise EngineError(f"llama_decode failed with code {rc}: {_last_error_line()}")
        return self._logits_rows(n, out_idx)

    def _logits_rows(self, n: int, out_idx: np.ndarray) -> np.ndarray:
        """Rows of llama.cpp's logits buffer for the requested outputs, in request order.

        Contexts with memory return only the flagged rows; contexts without memory (llada, dream)
        run encode(), which outputs every position. Either way the result is a view when the
        requested rows are contiguous."""
        n_vocab = self.model.n_vocab
        if self.has_memory and out_idx.size == 0:
            return np.empty((0, n_vocab), dtype=np.float32)
        ptr = _llama.llama_get_logits(self._ptr)
        if not ptr:
            raise EngineError("llama.cpp returned no logits")
        n_rows = out_idx.size if self.has_memory else n
        addr = ctypes.addressof(ptr.contents)
        buf = (ctypes.c_float * (n_rows * n_vocab)).from_address(addr)
        rows = np.frombuffer(buf, dtype=np.float32).reshape(n_rows, n_vocab)
        if self.has_memory:
            return rows
        if out_idx.size and np.all(np.diff(out_idx) == 1):
            return rows[out_idx[0] : out_idx[-1] + 1]
        return rows[out_idx]
