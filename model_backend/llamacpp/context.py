"""`LlamaContext`: an inference context over a `LlamaModel`.

A context is sized by the caller and decodes token or embedding batches where only the requested
positions produce logits; logits come back as numpy views of llama.cpp's buffer (no copy per
position). It removes KV cells, switches between causal and non-causal attention, drives dgchat's
diffusion head (llamacpp/head.py) and can be cancelled mid-decode (`AbortFlag`).
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections.abc import Sequence

import numpy as np

from dgchat.model_backend.errors import ContextOverflowError, EngineError, GenerationCancelled
from dgchat.model_backend.llamacpp.build_info import engine_info
from dgchat.model_backend.llamacpp.head import (
    GGML_TYPES,
    HEAD,
    HEAD_RESULTS,
    HeadBatch,
    HeadParams,
    HeadRequest,
    HeadSetup,
    array_ptr,
)
from dgchat.model_backend.llamacpp.library import last_error_line
from dgchat.model_backend.llamacpp.library import llama_cpp as _llama
from dgchat.model_backend.llamacpp.model import LlamaModel
from dgchat.model_backend.params import check_threads
from dgchat.model_backend.sampling import RowStats


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
        # every context is made here (engine, machine profile, distillation): the thread bound of
        # model_backend.params holds for all of them (100000 threads segfaulted in llama.cpp)
        check_threads(n_threads or None, "threads")
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
            raise EngineError(f"could not create a context of {n_ctx} tokens: {last_error_line() or 'out of memory?'}")
        self.n_ctx = int(_llama.llama_n_ctx(self._ptr))
        self.max_tokens = max_tokens
        self.n_seq_max = n_seq_max
        self._mem = _llama.llama_get_memory(self._ptr)
        # whether llama.cpp returns only the requested rows of logits (always with KV memory)
        self._rows_on_request = bool(self._mem) or engine_info().encode_outputs
        self._token_batch = _Batch(max_tokens, 0, n_seq_max)
        self._embd_batch: _Batch | None = None
        self._causal = True
        self.n_decodes = 0
        self._head_setup: HeadSetup | None = None
        self._head_bias_key: bytes | None = None
        self._head_bias_table: np.ndarray | None = None

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

    # -- the diffusion head ---------------------------------------------------------------------
    def configure_head(self, setup: HeadSetup) -> None:
        """(Re)configure the head; a no-op when `setup` is the object already configured."""
        if HEAD is None:
            raise EngineError("this llama-cpp-python has no dgchat head (install with README's command)")
        if setup is self._head_setup:
            return
        p = HeadParams()
        sc = setup.self_conditioning
        keep: list[np.ndarray] = []
        if sc is not None:
            arrays = [np.ascontiguousarray(a, dtype=np.float32) for a in (sc.pre_norm, sc.gate, sc.up, sc.down)]
            keep.extend(arrays)
            p.self_cond = True
            p.n_slots = int(setup.n_slots)
            p.soft_top_k = int(setup.soft_top_k)
            p.embd_t_type = GGML_TYPES["f16" if setup.embd_t_f16 else "f32"]
            p.embed_scale = float(sc.embed_scale)
            p.eps = float(sc.eps)
            p.n_inter = int(arrays[1].shape[0])
            p.w_type = GGML_TYPES["f32"]
            p.pre_norm, p.gate, p.up, p.down = (a.ctypes.data for a in arrays)
        self._head_setup = None
        self._head_bias_key = self._head_bias_table = None
        if HEAD["init"](self._ptr, ctypes.byref(p)) != 0:
            raise EngineError(f"could not set up the diffusion head: {last_error_line() or 'llama.cpp refused it'}")
        self._head_setup = setup

    def set_head_bias(self, table: np.ndarray | None) -> None:
        """The additive logit bias rows the head's requests index (`bias_row`); None: no bias.
        Uploaded only when it changed (the same array object is taken as unchanged)."""
        if table is self._head_bias_table:
            return
        self._head_bias_table = table
        table = None if table is None or table.size == 0 else np.ascontiguousarray(table, dtype=np.float32)
        key = b"" if table is None else table.tobytes()
        if key == self._head_bias_key:
            return
        n = 0 if table is None else table.shape[0]
        if table is not None and table.shape[1] != self.model.n_vocab:
            raise EngineError(f"bias rows have {table.shape[1]} entries, the vocabulary {self.model.n_vocab}")
        if HEAD["set_bias"](self._ptr, array_ptr(table), n) != 0:
            raise EngineError(f"could not set the logit bias: {last_error_line()}")
        self._head_bias_key = key

    # -- decoding -----------------------------------------------------------------------------
    def decode_tokens(
        self,
        tokens: np.ndarray | Sequence[int],
        positions: np.ndarray | Sequence[int],
        *,
        seq_ids: np.ndarray | Sequence[int] | int = 0,
        outputs: OutputSpec = None,
        head: HeadRequest | None = None,
    ) -> np.ndarray | RowStats:
        """Logits of the requested outputs, or with `head` the head's statistics of them (the
        context must have a configured head)."""
        tok = np.asarray(tokens, dtype=np.int32)
        batch = self._token_batch
        n = self._check_size(tok.shape[0])
        batch.tokens[:n] = tok
        return self._run(batch, n, positions, seq_ids, outputs, head)

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

    def _run(self, batch: _Batch, n: int, positions, seq_ids, outputs: OutputSpec,
             head: HeadRequest | None = None) -> np.ndarray | RowStats:
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
        if head is not None:
            self._prepare_head(head, n, out_idx)
        rc = _llama.llama_decode(self._ptr, batch.struct)
        self.n_decodes += 1
        if rc == 2 or (rc != 0 and self._cancel.is_set()):
            self._cancel.clear()
            raise GenerationCancelled("generation cancelled")
        if rc == 1:
            raise ContextOverflowError(f"no room in the KV cache for {n} more tokens (context {self.n_ctx})")
        if rc != 0:
            raise EngineError(f"llama_decode failed with code {rc}: {last_error_line()}")
        if head is not None:
            stats = self._head_results(int(out_idx.size))
            return (stats, self._logits_rows(n, out_idx)) if head.keep_logits else stats
        return self._logits_rows(n, out_idx)

    def _prepare_head(self, head: HeadRequest, n_tokens: int, out_idx: np.ndarray) -> None:
        if self._head_setup is None:
            raise EngineError("the diffusion head is not configured on this context")
        rows_n = int(out_idx.size)
        arrays = {
            "inv_temp": np.ascontiguousarray(head.inv_temp, dtype=np.float32),
            "uniform": np.ascontiguousarray(head.uniform, dtype=np.float32),
            "bias_row": None if head.bias_row is None else np.ascontiguousarray(head.bias_row, dtype=np.int32),
            "sc_write": None if head.sc_write is None else np.ascontiguousarray(head.sc_write, dtype=np.int32),
            "sc_read": None if head.sc_read is None else np.ascontiguousarray(head.sc_read, dtype=np.int32),
        }
        for name in ("inv_temp", "uniform", "bias_row", "sc_write"):
            a = arrays[name]
            if a is not None and a.shape != (rows_n,):
                raise EngineError(f"head input {name} has shape {a.shape}, expected ({rows_n},)")
        if arrays["sc_read"] is not None and arrays["sc_read"].shape != (n_tokens,):
            raise EngineError(f"head input sc_read has shape {arrays['sc_read'].shape}, expected ({n_tokens},)")
        b = HeadBatch(top_k=int(head.top_k), top_p=float(head.top_p), margin=bool(head.margin), n_rows=rows_n,
                       n_tokens=n_tokens, keep_logits=bool(head.keep_logits))
        for name, a in arrays.items():
            setattr(b, name, array_ptr(a))
        if HEAD["prepare"](self._ptr, ctypes.byref(b)) != 0:
            raise EngineError(f"diffusion head: {last_error_line() or 'bad inputs'}")

    def read_head_signal(self, slots: np.ndarray) -> np.ndarray:
        """The self-conditioning signals the head holds in `slots` ([n, n_embd]; for tests)."""
        idx = np.ascontiguousarray(slots, dtype=np.int32)
        out = np.empty((idx.size, self.model.n_embd), dtype=np.float32)
        if HEAD["read_slots"](self._ptr, array_ptr(idx), idx.size, array_ptr(out)) != 0:
            raise EngineError(f"could not read the head's signal: {last_error_line()}")
        return out

    def _head_results(self, n_rows: int) -> RowStats:
        got = ctypes.c_int32(0)
        ptr = HEAD["results"](self._ptr, ctypes.byref(got))
        if not ptr or got.value != n_rows:
            raise EngineError(f"the diffusion head returned {got.value} rows, expected {n_rows}: {last_error_line()}")
        # one array per result: drawn and argmax int32, then entropy, p_drawn, p_argmax, p_second float32
        raw = np.frombuffer((ctypes.c_char * (HEAD_RESULTS * n_rows * 4)).from_address(ptr), dtype=np.uint8).copy()
        ints = raw[: 2 * n_rows * 4].view(np.int32)
        floats = raw[2 * n_rows * 4 :].view(np.float32).reshape(4, n_rows)
        return RowStats(drawn=ints[:n_rows], argmax=ints[n_rows:], entropy=floats[0], p_drawn=floats[1],
                        p_argmax=floats[2], p_second=floats[3])

    def _logits_rows(self, n: int, out_idx: np.ndarray) -> np.ndarray:
        """Rows of llama.cpp's logits buffer for the requested outputs, in request order.

        llama.cpp returns only the flagged rows, except that a stock engine runs models without
        memory (llada, dream) through encode(), which outputs every position. Either way the result
        is a view when the requested rows are contiguous."""
        n_vocab = self.model.n_vocab
        if self._rows_on_request and out_idx.size == 0:
            return np.empty((0, n_vocab), dtype=np.float32)
        ptr = _llama.llama_get_logits(self._ptr)
        if not ptr:
            raise EngineError("llama.cpp returned no logits")
        n_rows = out_idx.size if self._rows_on_request else n
        addr = ctypes.addressof(ptr.contents)
        buf = (ctypes.c_float * (n_rows * n_vocab)).from_address(addr)
        rows = np.frombuffer(buf, dtype=np.float32).reshape(n_rows, n_vocab)
        if self._rows_on_request:
            return rows
        if out_idx.size and np.all(np.diff(out_idx) == 1):
            return rows[out_idx[0] : out_idx[-1] + 1]
        return rows[out_idx]
