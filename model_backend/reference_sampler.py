"""Reference mode: the sampler of llama.cpp's `examples/diffusion/diffusion.cpp`, step for step.

With the same model, prompt tokens and parameters this produces the same tokens as llama.cpp's
`diffusion_generate` (the engine of `llama-diffusion-cli`), including its random draws
(three std::mt19937 seeded with the seed: the sampler chain's dist sampler, the example's own
`rng`, and the dist sampler used when alg_temp > 0) and its quirks, which are kept on purpose
and documented here so the dgchat samplers can differ knowingly:

- the layout: the canvas fills the sequence up to `max_length` (prompt included); with the block
  schedule, `max_length` must be a multiple of the block length and blocks start at the prompt's
  end, so the last block is cut at `max_length`;
- the "entropy" algorithm ranks by *highest* entropy first (it returns -sum p log p as the
  confidence);
- "margin" reads candidates 0 and 1, which are the two most likely tokens only when top-k / top-p
  sorted the candidates, otherwise token ids 0 and 1;
- Gumbel noise is applied to the first row of the logits buffer only;
- with alg_temp > 0 a position can be drawn twice in one step (the draw does not exclude it);
- temperature 0 adds no temperature stage: tokens are drawn at temperature 1 from the top-k / top-p
  candidates (greedy is top-k 1, or top-p 0).

Each masked position is sampled by one of two implementations of the example's sampler chain
(top-k, top-p, temperature, dist):

- `_LlamaChain` (the default): llama.cpp's own chain through its C API (`llamacpp.SamplerChain`),
  exact by construction and as fast as the example itself;
- `_NumpyChain`: the same chain re-implemented in numpy, used when llama-cpp-python lacks the
  sampler API or the seed is LLAMA_DEFAULT_SEED (llama.cpp would seed that from the clock), and
  kept as the cross-check the tests compare the C chain with. Its sorting ties (equal logits) are
  broken by token id; C++'s std::partial_sort leaves their order unspecified, so exactly tied
  logits are the one place the two may differ.

The example's own `rng` (the "random" and "origin" draws, Gumbel noise) stays in Python
(`CxxMt19937`) for both. Entropy uses logf rounded from double; glibc's logf (within 0.52 ulp)
differs from it in the last bit for a few arguments in a thousand, which changes a committed
position only if two positions' entropies tie to the last bit at the cut.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from dgchat.model_backend.cxx_random import CxxMt19937
from dgchat.model_backend.errors import InvalidParameterError
from dgchat.model_backend.llamacpp.sampler_chain import LLAMA_DEFAULT_SEED, SAMPLER_CHAIN, DistSampler, SamplerChain
from dgchat.model_backend.schedules import even_split, timestep_transfer_count

ALGORITHM_IDS = {"origin": 0, "entropy": 1, "margin": 2, "random": 3, "confidence": 4}
CHAINS = ("auto", "llama.cpp", "numpy")
_ENTROPY_EPS = np.float32(1e-10)


@dataclass(frozen=True)
class ReferenceParams:
    steps: int
    max_length: int  # prompt + canvas, as the CLI's -ub
    mask_token_id: int
    algorithm: str = "confidence"
    eps: float = 0.0  # timestep schedule when block_length == 0
    block_length: int = 0
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 0.0  # the C struct's default (0 => keep one token); the CLI passes 0.95
    seed: int = 0
    shift_logits: bool = False
    cfg_scale: float = 0.0
    alg_temp: float = 0.0
    add_gumbel_noise: bool = False


@dataclass
class ReferenceStep:
    """Yielded after every denoising step."""

    step: int  # global step index (0-based)
    total_steps: int
    tokens: np.ndarray  # the whole sequence (prompt + canvas), live view
    committed: np.ndarray  # sequence positions committed in this step
    confidence: np.ndarray  # their confidences
    sampler_seconds: float


# -- the fast path: llama.cpp's own chain -----------------------------------------------------------


class _LlamaChain:
    """The example's `sampler` (top-k, top-p, temperature, dist) and `dist_sampler` (alg_temp > 0),
    called through llama.cpp's C API. The chain is built on the first step, when the vocabulary
    size is known from the logits."""

    def __init__(self, p: ReferenceParams, threads: int) -> None:
        self._p = p
        self._threads = max(1, int(threads))
        self._chain = None
        self._select = DistSampler(p.seed) if p.alg_temp > 0.0 else None

    def _built(self, n_vocab: int):
        if self._chain is None:
            p = self._p
            self._chain = SamplerChain(n_vocab, top_k=p.top_k, top_p=p.top_p, temperature=p.temperature,
                                       seed=p.seed)
        return self._chain

    def sample(self, logits: np.ndarray, rows: np.ndarray, algorithm: str,
               rng: CxxMt19937) -> tuple[np.ndarray, np.ndarray]:
        """Tokens and confidences (calculate_confidence) of `logits[rows]`, in order."""
        chain = self._built(logits.shape[1])
        if algorithm == "random":  # the example's rng, one draw per position in order
            random_conf = rng.uniform_float(int(rows.size))
        d = chain.sample(logits, rows, entropy=algorithm == "entropy", threads=self._threads)
        if algorithm in ("confidence", "origin"):
            return d.tokens, d.p_selected
        if algorithm == "entropy":
            return d.tokens, d.entropy
        if algorithm == "margin":
            return d.tokens, np.where(d.n_candidates > 1, d.p_first - d.p_second, d.p_first).astype(np.float32)
        if algorithm == "random":
            return d.tokens, random_conf
        raise InvalidParameterError(f"unknown algorithm {algorithm!r}")

    def skip(self, logits: np.ndarray, rows: np.ndarray, algorithm: str, rng: CxxMt19937) -> None:
        """Make the draws `sample` would make, without sampling (a step that commits nothing)."""
        self._built(logits.shape[1]).skip(int(rows.size))
        if algorithm == "random":
            rng.uniform_float(int(rows.size))

    def select(self, conf_logits: np.ndarray, n: int) -> np.ndarray:
        """`n` draws of positions from softmax(conf_logits), with repeats (alg_temp > 0)."""
        return self._select.draw(conf_logits, n)

    def close(self) -> None:
        for s in (self._chain, self._select):
            if s is not None:
                s.close()


def _llama_chain_available() -> bool:
    """This llama-cpp-python has the sampler API (else the numpy chain samples)."""
    return SAMPLER_CHAIN


# -- the numpy re-implementation (fallback and cross-check) -----------------------------------------

_CHUNK_ELEMENTS = 1 << 22  # rows are processed in chunks of about this many logits (memory bound)


def _logf(x: np.ndarray) -> np.ndarray:
    """logf of float32 values, correctly rounded (from double), as close to glibc's as numpy gets."""
    return np.log(x.astype(np.float64)).astype(np.float32)


def _entropy(probs: np.ndarray) -> np.ndarray:
    """calculate_confidence's entropy of each row: -sum p * logf(p + 1e-10) in float, in order
    (zeros past the candidates add nothing)."""
    terms = (probs * _logf(probs + _ENTROPY_EPS)).astype(np.float32)
    return -np.cumsum(terms, axis=1, dtype=np.float32)[:, -1]


@dataclass
class _Sampled:
    tokens: np.ndarray  # (n,) chosen token ids
    probs: np.ndarray  # (n, C) normalised probabilities in llama.cpp's candidate order (0 past the cut)
    sel: np.ndarray  # (n,) index of the chosen candidate
    size: np.ndarray  # (n,) number of candidates left after top-k / top-p


def _sample_rows(rows: np.ndarray, p: ReferenceParams, rnds: np.ndarray) -> _Sampled:
    """The sampler chain (top-k, top-p, temperature, dist) applied to each row, vectorised.

    Candidate order, float/double arithmetic and the dist draw follow llama-sampler.cpp: top-k and
    top-p leave the candidates sorted by logit; softmax in top-p sums floats in order; dist takes
    expf(l - max) as floats, sums them in double and picks the first candidate whose running sum
    reaches sum * u. Candidates cut by top-p are kept as -inf (probability 0), which changes none
    of those sums."""
    n, V = rows.shape
    logits = rows.astype(np.float32, copy=True)
    ids: np.ndarray | None = None
    is_sorted = False
    size = np.full(n, V, dtype=np.int64)
    if p.top_k > 0:
        k = min(p.top_k, V)
        order = np.argsort(-logits, axis=1, kind="stable")[:, :k]
        ids, logits, is_sorted = order, np.take_along_axis(logits, order, axis=1), True
        size[:] = k
    if p.top_p < 1.0:
        m = logits.max(axis=1, keepdims=True)
        probs = np.exp((logits - m).astype(np.float64)).astype(np.float32)
        probs = probs / np.cumsum(probs, axis=1, dtype=np.float32)[:, -1:]
        if not is_sorted:
            order = np.argsort(-logits, axis=1, kind="stable")
            ids = order
            logits = np.take_along_axis(logits, order, axis=1)
            probs = np.take_along_axis(probs, order, axis=1)
            is_sorted = True
        hit = np.cumsum(probs, axis=1, dtype=np.float32) >= np.float32(p.top_p)
        last = np.where(hit.any(axis=1), hit.argmax(axis=1) + 1, logits.shape[1])
        logits = np.where(np.arange(logits.shape[1])[None, :] < last[:, None], logits, -np.inf).astype(np.float32)
        size = last.astype(np.int64)
    if p.temperature > 0.0:
        logits = logits / np.float32(p.temperature)
    max_l = logits[:, :1] if is_sorted else logits.max(axis=1, keepdims=True)
    unnorm = np.exp((logits - max_l).astype(np.float64)).astype(np.float32)
    cum = np.cumsum(unnorm.astype(np.float64), axis=1)
    total = cum[:, -1]
    sel = np.sum(cum < (total * rnds)[:, None], axis=1)
    sel = np.minimum(sel, size - 1)
    probs = (unnorm.astype(np.float64) / total[:, None]).astype(np.float32)
    one = size == 1  # dist does not compute probabilities for a single candidate: p = 1
    if one.any():
        probs[one] = 0.0
        probs[one, 0] = 1.0
        sel[one] = 0
    tokens = sel if ids is None else np.take_along_axis(ids, sel[:, None], axis=1)[:, 0]
    return _Sampled(tokens.astype(np.int32), probs, sel, size)


def _dist_probs(logits: np.ndarray, is_sorted: bool) -> tuple[np.ndarray, np.ndarray]:
    """llama_sampler_dist's softmax on one row: float exp, double running sum."""
    max_l = logits[0] if is_sorted else logits.max()
    p = np.exp((logits - max_l).astype(np.float64)).astype(np.float32)
    return p, np.cumsum(p.astype(np.float64))


class _NumpyChain:
    """The same chain in numpy: `_dist` and `_select` replay the std::mt19937 streams of the
    chain's dist sampler and of `dist_sampler` (one double per draw)."""

    def __init__(self, p: ReferenceParams) -> None:
        self._p = p
        self._dist = CxxMt19937(p.seed)
        self._select = CxxMt19937(p.seed)

    def sample(self, logits: np.ndarray, rows: np.ndarray, algorithm: str,
               rng: CxxMt19937) -> tuple[np.ndarray, np.ndarray]:
        n = int(rows.size)
        rnds = self._dist.uniform_double(n)
        tokens = np.empty(n, dtype=np.int32)
        conf = np.empty(n, dtype=np.float32)
        if algorithm == "random":
            conf[:] = rng.uniform_float(n)
        step = max(1, _CHUNK_ELEMENTS // max(1, logits.shape[1]))
        for a in range(0, n, step):
            b = min(n, a + step)
            s = _sample_rows(logits[rows[a:b]], self._p, rnds[a:b])
            tokens[a:b] = s.tokens
            if algorithm in ("confidence", "origin"):
                conf[a:b] = s.probs[np.arange(b - a), s.sel]
            elif algorithm == "entropy":
                conf[a:b] = _entropy(s.probs)
            elif algorithm == "margin":
                second = s.probs[:, min(1, s.probs.shape[1] - 1)]
                conf[a:b] = np.where(s.size > 1, s.probs[:, 0] - second, s.probs[:, 0])
            elif algorithm != "random":
                raise InvalidParameterError(f"unknown algorithm {algorithm!r}")
        return tokens, conf

    def skip(self, logits: np.ndarray, rows: np.ndarray, algorithm: str, rng: CxxMt19937) -> None:
        self._dist.uniform_double(int(rows.size))
        if algorithm == "random":
            rng.uniform_float(int(rows.size))

    def select(self, conf_logits: np.ndarray, n: int) -> np.ndarray:
        order = []
        for rnd in self._select.uniform_double(n):
            if conf_logits.shape[0] == 1:  # dist draws even for a single candidate
                order.append(0)
                continue
            _, cum = _dist_probs(conf_logits, False)
            order.append(min(int(np.searchsorted(cum, cum[-1] * rnd, side="left")), conf_logits.shape[0] - 1))
        return np.asarray(order, dtype=np.int64)

    def close(self) -> None:
        pass


def _make_chain(p: ReferenceParams, chain: str, threads: int) -> _LlamaChain | _NumpyChain:
    if chain not in CHAINS:
        raise InvalidParameterError(f"reference mode: chain must be one of {', '.join(CHAINS)} (got {chain!r})")
    reproducible = (int(p.seed) & 0xFFFFFFFF) != LLAMA_DEFAULT_SEED
    if chain == "llama.cpp" or (chain == "auto" and reproducible and _llama_chain_available()):
        return _LlamaChain(p, threads)
    return _NumpyChain(p)


# -- the denoising loop (diffusion_generate) --------------------------------------------------------


def _transfer_count(step: int, total: int, remaining: int, p: ReferenceParams, schedule: list[int]) -> int:
    if p.block_length > 0:
        return schedule[step] if step < len(schedule) else remaining // (total - step)
    return timestep_transfer_count(step, total, remaining, p.eps)


def reference_denoise(
    input_tokens: np.ndarray,
    params: ReferenceParams,
    logits_fn: Callable[[np.ndarray], np.ndarray],
    clock: Callable[[], float],
    *,
    chain: str = "auto",
    sampler_threads: int = 1,
) -> Iterator[ReferenceStep]:
    """Run llama.cpp's diffusion_generate. `logits_fn(tokens, rows)` returns the float32 logits of
    the sequence's positions `rows` (sorted, unique), one row each: a fresh non-causal pass, as the
    example makes every step (it computes every position's logits; only these are read).

    `chain`: "auto" (llama.cpp's chain when available, else numpy), "llama.cpp" or "numpy".
    `sampler_threads`: threads the llama.cpp chain may sample positions on (same draws)."""
    sampler = _make_chain(params, chain, sampler_threads)
    try:
        yield from _diffusion_generate(input_tokens, params, logits_fn, clock, sampler)
    finally:  # also when the consumer stops early: the C samplers are freed here
        sampler.close()


def _diffusion_generate(
    input_tokens: np.ndarray,
    params: ReferenceParams,
    logits_fn: Callable[[np.ndarray], np.ndarray],
    clock: Callable[[], float],
    sampler: _LlamaChain | _NumpyChain,
) -> Iterator[ReferenceStep]:
    p = params
    n_input = int(input_tokens.shape[0])
    if n_input <= 0 or p.max_length <= n_input:
        return
    out = np.full(p.max_length, p.mask_token_id, dtype=np.int32)
    out[:n_input] = input_tokens
    rng = CxxMt19937(p.seed)  # the example's own std::mt19937
    algorithm = p.algorithm

    num_blocks, steps_per_block = 1, p.steps
    if p.block_length > 0:
        if p.max_length % p.block_length:
            raise InvalidParameterError(
                f"reference mode: total length {p.max_length} must be a multiple of block length {p.block_length}"
            )
        num_blocks = p.max_length // p.block_length
        if p.steps % num_blocks:
            raise InvalidParameterError(
                f"reference mode: steps {p.steps} must be a multiple of the number of blocks {num_blocks}"
            )
        steps_per_block = p.steps // num_blocks

    for block in range(num_blocks):
        if p.block_length > 0:
            b_start = n_input + block * p.block_length
            b_end = min(n_input + (block + 1) * p.block_length, p.max_length)
            schedule = even_split(int(np.count_nonzero(out[b_start:b_end] == p.mask_token_id)), steps_per_block)
        else:
            b_start, b_end, schedule = 0, p.max_length, []
        in_block = np.zeros(p.max_length, dtype=bool)
        in_block[b_start:b_end] = True
        for step in range(steps_per_block):
            global_step = block * steps_per_block + step
            mask_pos = np.flatnonzero((out == p.mask_token_id) & in_block)
            if mask_pos.size == 0:
                break
            # the logits rows the step reads (Dream's shift: position i from row i - 1); the example's
            # Gumbel noise goes to row 0 of its logits buffer, whether or not a masked position reads it
            rows_of = mask_pos - 1 if p.shift_logits else mask_pos.copy()
            if p.shift_logits:
                rows_of[mask_pos == 0] = 0
            gumbel = p.add_gumbel_noise and p.temperature > 0.0
            need = np.unique(rows_of)
            logits = logits_fn(out, need)
            if p.cfg_scale > 0.0:
                cond = np.array(logits, copy=True)
                uncond_tokens = out.copy()
                uncond_tokens[:n_input] = p.mask_token_id
                uncond = logits_fn(uncond_tokens, need)
                logits = uncond + np.float32(p.cfg_scale + 1.0) * (cond - uncond)
            t0 = clock()
            if gumbel:
                u = np.maximum(rng.uniform_double(logits.shape[1]), 1e-20)
                if need[0] == 0:
                    row0 = logits[0]
                    noise = np.power(-np.log(u), p.temperature)
                    row0[:] = (np.exp(row0.astype(np.float64)).astype(np.float32) / noise).astype(np.float32)
            rows_of = np.searchsorted(need, rows_of)  # positions -> rows of `logits`

            n_transfer = _transfer_count(step, steps_per_block, int(mask_pos.size), p, schedule)
            committed: list[int] = []
            confs: list[float] = []
            if algorithm == "origin":
                p_transfer = np.float32(n_transfer) / np.float32(mask_pos.size)
                chosen = np.flatnonzero(rng.uniform_float(int(mask_pos.size)) < p_transfer)
                tokens, conf = sampler.sample(logits, rows_of[chosen], "origin", rng)
                out[mask_pos[chosen]] = tokens
                committed, confs = mask_pos[chosen].tolist(), conf.tolist()
            elif n_transfer <= 0:
                # the example samples every position and then commits none of them: only the
                # random streams' advance is visible, and that is made without the sampling
                sampler.skip(logits, rows_of, algorithm, rng)
            else:
                sampled, conf = sampler.sample(logits, rows_of, algorithm, rng)
                n = min(n_transfer, int(mask_pos.size))
                if p.alg_temp == 0.0:
                    # partial_sort by (confidence desc, index asc)
                    order = np.lexsort((np.arange(conf.size), -conf))[:n]
                else:
                    order = sampler.select((conf / np.float32(p.alg_temp)).astype(np.float32), n)
                for idx in order.tolist():
                    pos = int(mask_pos[idx])
                    out[pos] = sampled[idx]
                    committed.append(pos)
                    confs.append(float(conf[idx]))
            yield ReferenceStep(
                step=global_step,
                total_steps=p.steps,
                tokens=out,
                committed=np.asarray(committed, dtype=np.int64),
                confidence=np.asarray(confs, dtype=np.float32),
                sampler_seconds=clock() - t0,
            )
