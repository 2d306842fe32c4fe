"""llama.cpp's sampler chain (top-k, top-p, temperature, dist), as examples/diffusion uses it: the
exact sampler of reference mode (model_backend/reference_sampler.py)."""

from __future__ import annotations

import ctypes
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass

import numpy as np

from dgchat.model_backend.errors import EngineError
from dgchat.model_backend.llamacpp.library import llama_cpp as _llama

# The example samples each masked position by filling a llama_token_data array with the position's
# logits (the whole vocabulary), applying a chain of top-k, top-p, temperature and dist(seed), and
# reading the candidates the chain leaves behind (calculate_confidence). Calling that chain here
# reproduces the example by construction: the same partial sorts, the same float/double arithmetic
# and the same std::mt19937 stream. The arrays the chain works on are numpy structured arrays (and
# so are the llama_token_data_array headers pointing at them): a row is filled by two vectorised
# copies (logits, and token ids when a sorting stage scrambled them), the headers are reset and the
# results read back for many rows at once, and the per-row Python work is the copy and the call.

TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])  # llama_token_data
_ARRAY_HEADER = np.dtype(  # llama_token_data_array: data, size, selected, sorted (C layout)
    [("data", np.uintp), ("size", np.uintp), ("selected", np.int64), ("sorted", np.bool_)], align=True
)
LLAMA_DEFAULT_SEED = 0xFFFFFFFF  # llama.cpp seeds dist from the clock for this value, not reproducibly
_ENTROPY_EPS = np.float32(1e-10)  # calculate_confidence: p * logf(p + 1e-10)
_CHUNK_BYTES = 8 << 20  # rows per buffer (results are read back a buffer at a time); fits an L3 cache
_ROWS_PER_THREAD = 16  # fewer rows per thread than this are not worth a thread
_MAX_THREADS = 8  # each thread holds a buffer of _CHUNK_BYTES; the GIL-held part of a row caps the gain


def _sampler_api_ok() -> bool:
    names = ("llama_sampler_chain_init", "llama_sampler_chain_default_params", "llama_sampler_chain_add",
             "llama_sampler_init_top_k", "llama_sampler_init_top_p", "llama_sampler_init_temp",
             "llama_sampler_init_dist", "llama_sampler_apply", "llama_sampler_clone", "llama_sampler_free")
    if not all(hasattr(_llama, n) for n in names):
        return False
    td, ta = _llama.llama_token_data, _llama.llama_token_data_array
    return (ctypes.sizeof(td) == TOKEN_DATA.itemsize and ctypes.sizeof(ta) == _ARRAY_HEADER.itemsize
            and all(getattr(ta, f).offset == _ARRAY_HEADER.fields[f][1] for f in _ARRAY_HEADER.names))


SAMPLER_CHAIN = _sampler_api_ok()


@dataclass(frozen=True)
class ChainDraws:
    """Per sampled row, what calculate_confidence in examples/diffusion reads from the candidates."""

    tokens: np.ndarray  # int32: the selected candidate's token id
    p_selected: np.ndarray  # float32: its probability (confidence, origin)
    p_first: np.ndarray  # float32: candidate 0's probability (margin)
    p_second: np.ndarray  # float32: candidate 1's probability, 0 when one candidate is left (margin)
    n_candidates: np.ndarray  # int64: candidates left after top-k / top-p
    entropy: np.ndarray | None  # float32: -sum p * logf(p + 1e-10) over the candidates, when asked


class _RowBuffers:
    """One thread's rows: `capacity` llama_token_data arrays of the whole vocabulary, and one
    llama_token_data_array header per row, both owned by numpy."""

    def __init__(self, n_vocab: int, capacity: int) -> None:
        self.capacity = capacity
        self.cand = np.zeros((capacity, n_vocab), dtype=TOKEN_DATA)
        self.cand["id"] = np.arange(n_vocab, dtype=np.int32)
        self.ids, self.logits, self.probs = self.cand["id"], self.cand["logit"], self.cand["p"]
        self.addrs = self.cand.ctypes.data + np.arange(capacity, dtype=np.uintp) * np.uintp(self.cand.strides[0])
        self.headers = np.zeros(capacity, dtype=_ARRAY_HEADER)
        base = self.headers.ctypes.data
        self._structs = [_llama.llama_token_data_array.from_address(base + i * _ARRAY_HEADER.itemsize)
                         for i in range(capacity)]
        self.refs = [ctypes.byref(s) for s in self._structs]


def _new_chain(top_k: int, top_p: float, temperature: float, seed: int):
    # the order and the conditions of examples/diffusion's chain; top-p keeps at least one token
    chain = _llama.llama_sampler_chain_init(_llama.llama_sampler_chain_default_params())
    if top_k > 0:
        _llama.llama_sampler_chain_add(chain, _llama.llama_sampler_init_top_k(int(top_k)))
    if top_p < 1.0:
        _llama.llama_sampler_chain_add(chain, _llama.llama_sampler_init_top_p(float(top_p), 1))
    if temperature > 0.0:
        _llama.llama_sampler_chain_add(chain, _llama.llama_sampler_init_temp(float(temperature)))
    _llama.llama_sampler_chain_add(chain, _llama.llama_sampler_init_dist(int(seed) & 0xFFFFFFFF))
    return chain


class SamplerChain:
    """llama.cpp's sampler chain built as examples/diffusion builds it, applied to many rows of logits.

    `sample` applies the chain to the given rows in order, exactly as the example's loop over masked
    positions would (the dist sampler's random stream advances once per row). With `threads` > 1 the
    rows are split into contiguous parts sampled concurrently (llama_sampler_apply runs without the
    GIL): each part gets a clone of the chain whose dist stream is advanced to the part's first row,
    so the draws are the ones a single chain makes. Close it (or use it as a context manager) to
    free the samplers."""

    def __init__(self, n_vocab: int, *, top_k: int, top_p: float, temperature: float, seed: int) -> None:
        if not SAMPLER_CHAIN:
            raise EngineError("this llama-cpp-python has no usable llama_sampler API")
        self.n_vocab = int(n_vocab)
        self._chain = _new_chain(top_k, top_p, temperature, seed)
        # top-k and top-p sort the candidates in place, scrambling the ids; temperature and dist
        # leave them where they are, so without a sorting stage the ids are written once
        self._sorts = top_k > 0 or top_p < 1.0
        self._id_row = np.arange(self.n_vocab, dtype=np.int32)
        self._rows_per_chunk = max(1, _CHUNK_BYTES // (self.n_vocab * TOKEN_DATA.itemsize))
        self._buffers: list[_RowBuffers] = []
        self._pool = None
        self._one = np.zeros(1, dtype=TOKEN_DATA)  # a single candidate: advances dist by one draw
        self._one_header = _llama.llama_token_data_array(
            ctypes.cast(self._one.ctypes.data, _llama.llama_token_data_p), 1, -1, False)

    # -- lifetime -------------------------------------------------------------------------------
    def close(self) -> None:
        if getattr(self, "_chain", None):
            _llama.llama_sampler_free(self._chain)
            self._chain = None
        if getattr(self, "_pool", None) is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def __del__(self) -> None:
        self.close()

    def __enter__(self) -> SamplerChain:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- sampling -------------------------------------------------------------------------------
    def sample(self, logits: np.ndarray, rows: np.ndarray, *, entropy: bool = False, threads: int = 1) -> ChainDraws:
        """Apply the chain to `logits[rows[i]]` for i in order; `logits` is (n, n_vocab) float32."""
        if self._chain is None:
            raise EngineError("the sampler chain is closed")
        if logits.ndim != 2 or logits.shape[1] != self.n_vocab or logits.dtype != np.float32:
            raise EngineError(f"logits of shape {logits.shape} ({logits.dtype}); expected (n, {self.n_vocab}) float32")
        rows = np.ascontiguousarray(rows, dtype=np.intp)
        n = int(rows.size)
        if n and (rows.min() < 0 or rows.max() >= logits.shape[0]):
            raise EngineError(f"row index out of range for {logits.shape[0]} rows of logits")
        out = ChainDraws(np.empty(n, np.int32), np.empty(n, np.float32), np.empty(n, np.float32),
                         np.empty(n, np.float32), np.empty(n, np.int64), np.empty(n, np.float32) if entropy else None)
        parts = max(1, min(int(threads), _MAX_THREADS, n // _ROWS_PER_THREAD))
        while len(self._buffers) < parts:
            self._buffers.append(_RowBuffers(self.n_vocab, self._rows_per_chunk))
        if parts == 1:
            self._sample_part(self._chain, self._buffers[0], logits, rows, 0, n, out)
            return out
        bounds = [n * i // parts for i in range(parts + 1)]
        chains, jobs = [self._chain], []
        try:
            for lo in bounds[1:-1]:
                clone = _llama.llama_sampler_clone(self._chain)
                chains.append(clone)
                self._advance(clone, lo)
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=_MAX_THREADS - 1, thread_name_prefix="llama-sampler")
            jobs = [self._pool.submit(self._sample_part, chains[i], self._buffers[i], logits, rows, bounds[i],
                                      bounds[i + 1], out) for i in range(1, parts)]
            self._sample_part(chains[0], self._buffers[0], logits, rows, bounds[0], bounds[1], out)
            for job in jobs:
                job.result()
        except BaseException:
            wait(jobs)  # no clone is freed while a thread may still be applying it
            for c in chains[1:]:
                _llama.llama_sampler_free(c)
            raise
        # the last part's chain has drawn for every row before it and its own: it carries on
        for c in chains[:-1]:
            _llama.llama_sampler_free(c)
        self._chain = chains[-1]
        return out

    def skip(self, n_rows: int) -> None:
        """Advance the chain as `sample` on `n_rows` rows would, without sampling them (for rows
        whose tokens would be thrown away: only the random stream's position matters)."""
        if self._chain is None:
            raise EngineError("the sampler chain is closed")
        self._advance(self._chain, int(n_rows))

    def _advance(self, chain, n_draws: int) -> None:
        """Advance `chain`'s dist stream by `n_draws` rows: dist draws once even for one candidate."""
        header, ref = self._one_header, ctypes.byref(self._one_header)
        for _ in range(n_draws):
            header.size, header.selected, header.sorted = 1, -1, False
            _llama.llama_sampler_apply(chain, ref)

    def _sample_part(self, chain, buf: _RowBuffers, logits: np.ndarray, rows: np.ndarray, lo: int, hi: int,
                     out: ChainDraws) -> None:
        apply = _llama.llama_sampler_apply
        sorts, id_row = self._sorts, self._id_row
        for a in range(lo, hi, buf.capacity):
            m = min(buf.capacity, hi - a)
            h = buf.headers[:m]
            h["data"], h["size"], h["selected"], h["sorted"] = buf.addrs[:m], self.n_vocab, -1, False
            # fill and apply row by row, so each row is still in the core's cache when the chain reads it
            for j, row in enumerate(rows[a:a + m].tolist()):
                buf.logits[j] = logits[row]
                if sorts:
                    buf.ids[j] = id_row
                apply(chain, buf.refs[j])
            moved = np.flatnonzero(h["data"] != buf.addrs[:m])
            for j in moved:  # a sampler may point `data` elsewhere (none of these four do today)
                src = (ctypes.c_char * (int(h["size"][j]) * TOKEN_DATA.itemsize)).from_address(int(h["data"][j]))
                buf.cand[j, : int(h["size"][j])] = np.frombuffer(src, dtype=TOKEN_DATA)
            self._read(buf, h, out, a, m)

    @staticmethod
    def _read(buf: _RowBuffers, h: np.ndarray, out: ChainDraws, a: int, m: int) -> None:
        r = np.arange(m)
        sel = h["selected"].astype(np.intp)
        size = h["size"].astype(np.int64)
        probs = buf.probs[:m]
        out.tokens[a:a + m] = buf.ids[r, sel]
        out.p_selected[a:a + m] = probs[r, sel]
        out.p_first[a:a + m] = probs[:, 0]
        out.p_second[a:a + m] = np.where(size > 1, probs[:, min(1, probs.shape[1] - 1)], np.float32(0))
        out.n_candidates[a:a + m] = size
        if out.entropy is not None:
            width = int(size.max())
            p = np.where(np.arange(width)[None, :] < size[:, None], probs[:, :width], np.float32(0))
            # logf rounded from double (correctly rounded, as glibc's logf is to within 0.52 ulp);
            # product and running sum in float, in candidate order, as the C loop does
            logs = np.log((p + _ENTROPY_EPS).astype(np.float64)).astype(np.float32)
            terms = (p * logs).astype(np.float32)
            out.entropy[a:a + m] = -np.cumsum(terms, axis=1, dtype=np.float32)[:, -1]


class DistSampler:
    """llama_sampler_init_dist(seed) on its own: examples/diffusion's draw of which positions to
    commit when alg_temp > 0."""

    def __init__(self, seed: int) -> None:
        if not SAMPLER_CHAIN:
            raise EngineError("this llama-cpp-python has no usable llama_sampler API")
        self._smpl = _llama.llama_sampler_init_dist(int(seed) & 0xFFFFFFFF)

    def draw(self, logits: np.ndarray, n: int) -> np.ndarray:
        """Indices of `n` draws from softmax(`logits`), each from the same candidates (the example
        applies dist repeatedly to one array, so an index can come twice)."""
        cand = np.zeros(len(logits), dtype=TOKEN_DATA)
        cand["id"] = np.arange(len(logits), dtype=np.int32)
        cand["logit"] = logits
        header = _llama.llama_token_data_array(ctypes.cast(cand.ctypes.data, _llama.llama_token_data_p),
                                               len(logits), -1, False)
        out = np.empty(n, dtype=np.int64)
        for i in range(n):
            _llama.llama_sampler_apply(self._smpl, ctypes.byref(header))
            out[i] = header.selected
            cand["p"][header.selected] = 0.0  # as the example does; dist recomputes every p anyway
            header.selected = -1
        return out

    def close(self) -> None:
        if getattr(self, "_smpl", None):
            _llama.llama_sampler_free(self._smpl)
            self._smpl = None

    def __del__(self) -> None:
        self.close()

    def __enter__(self) -> DistSampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
