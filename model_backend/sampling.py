"""Token-level math on rows of logits: filtering, sampling, confidence. Pure numpy, vectorised.

Semantics follow the published reference samplers (Dream's `sample_tokens`, LLaDA's `generate`):
temperature 0 is argmax; otherwise a draw from softmax(logits / T) after top-k / top-p filtering.
Confidence of a proposal is measured on that processed distribution:
- "confidence": p(chosen token)            (Dream maskgit_plus, LLaDA low_confidence)
- "margin":     p(top-1) - p(top-2)        (Dream topk_margin)
- "entropy":    sum p log p  (= -entropy; higher means more certain, Dream's neg_entropy)
- "random":     uniform random             (LLaDA random remasking)
- "origin":     p(chosen token); positions are then chosen at random (Austin et al. 2021)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np


@dataclass(frozen=True)
class Proposal:
    tokens: np.ndarray  # int32 (n,)
    confidence: np.ndarray  # float32 (n,)


@dataclass(frozen=True)
class RowStats:
    """Per row of logits, what a diffusion sampler needs of the processed distribution: the numbers
    the engine's diffusion head computes on the backend (engine/patches/0006) instead of returning
    the logits, and that `row_stats` computes from logits on the host."""

    drawn: np.ndarray  # int32: inverse-CDF draw (token id order) with the row's uniform
    argmax: np.ndarray  # int32: the most likely token
    entropy: np.ndarray  # float32, nats
    p_drawn: np.ndarray  # float32
    p_argmax: np.ndarray  # float32
    p_second: np.ndarray  # float32: second largest probability (0 unless asked for)
    host_s: float = 0.0  # seconds the host spent computing them (0: the backend did)

    def take(self, rows: slice | np.ndarray) -> RowStats:
        return RowStats(*(getattr(self, f)[rows] for f in _ROW_FIELDS), host_s=self.host_s)

    def split(self, sizes: Sequence[int]) -> list[RowStats]:
        """Consecutive slices of the rows (the requests of a batched call)."""
        edges = np.cumsum([0, *sizes])
        return [self.take(slice(a, b)) for a, b in zip(edges[:-1], edges[1:])]

    @staticmethod
    def concat(parts: Sequence[RowStats]) -> RowStats:
        return RowStats(*(np.concatenate([getattr(p, f) for p in parts]) for f in _ROW_FIELDS),
                        host_s=sum(p.host_s for p in parts))


_ROW_FIELDS = ("drawn", "argmax", "entropy", "p_drawn", "p_argmax", "p_second")


@dataclass(frozen=True)
class SampleSpec:
    """What a sampler asks of each requested row instead of its logits: the statistics of
    softmax(filter(logits + bias) / temperature). `uniform` is None for greedy rows (temperature 0:
    no filter-free draw is needed and the temperature is 1)."""

    temperature: float
    top_k: int
    top_p: float
    uniform: np.ndarray | None  # float32 (rows,)
    margin: bool = False  # compute p_second
    bias_ids: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    bias_values: np.ndarray = field(default_factory=lambda: np.empty(0, np.float32))

    @property
    def inv_temp(self) -> float:
        return 1.0 / self.temperature if self.uniform is not None and self.temperature > 0 else 1.0

    def bias_row(self, n_vocab: int) -> np.ndarray | None:
        """The bias as a dense row (-inf bans), None without one."""
        if self.bias_ids.size == 0:
            return None
        row = np.zeros(n_vocab, dtype=np.float32)
        np.add.at(row, self.bias_ids, self.bias_values)
        return row

    def stats(self, logits: np.ndarray | RowStats) -> RowStats:
        """The host implementation: `row_stats` of these logits (copied; the bias is added here),
        timed as host work. RowStats (a source that computed them on the backend) pass through."""
        if isinstance(logits, RowStats):
            return logits
        t0 = time.perf_counter()
        x = np.array(logits, dtype=np.float32, copy=True)
        if self.bias_ids.size:
            x[:, self.bias_ids] += self.bias_values
        uniform = self.uniform if self.uniform is not None else np.zeros(x.shape[0], np.float32)
        stats = row_stats(x, inv_temp=self.inv_temp, uniform=uniform, top_k=self.top_k, top_p=self.top_p,
                          margin=self.margin)
        return replace(stats, host_s=time.perf_counter() - t0)


_BIAS_TABLES: dict[tuple, np.ndarray] = {}  # the last few tables: a generation asks for the same one every step


def bias_table(specs: Sequence[SampleSpec], n_vocab: int) -> tuple[np.ndarray | None, np.ndarray]:
    """The distinct logit biases of a batch's requests as dense rows, and each request's row
    (None and zeros when no request has a bias). The same biases give the same (read-only) array."""
    keys = [(spec.bias_ids.tobytes(), spec.bias_values.tobytes()) for spec in specs]
    if not any(ids for ids, _ in keys):
        return None, np.zeros(len(specs), dtype=np.int32)
    distinct = list(dict.fromkeys(keys))
    index = np.array([distinct.index(k) for k in keys], dtype=np.int32)
    cache_key = (n_vocab, tuple(distinct))
    table = _BIAS_TABLES.get(cache_key)
    if table is None:
        first = {k: spec for k, spec in zip(keys, specs)}
        rows = [first[k].bias_row(n_vocab) for k in distinct]
        table = np.stack([r if r is not None else np.zeros(n_vocab, dtype=np.float32) for r in rows])
        table.flags.writeable = False
        if len(_BIAS_TABLES) >= 8:
            _BIAS_TABLES.clear()
        _BIAS_TABLES[cache_key] = table
    return table, index


def filter_top_k(logits: np.ndarray, k: int) -> np.ndarray:
    """Keep each row's k largest logits, set the rest to -inf (in place on a copy)."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = np.partition(logits, -k, axis=-1)[:, -k][:, None]
    return np.where(logits >= kth, logits, -np.inf).astype(np.float32, copy=False)


def filter_top_p(logits: np.ndarray, p: float) -> np.ndarray:
    """Nucleus filtering: keep the smallest set of tokens whose probability reaches p."""
    if p >= 1.0:
        return logits
    order = np.argsort(-logits, axis=-1)
    sorted_logits = np.take_along_axis(logits, order, axis=-1)
    probs = _softmax(sorted_logits)
    cum = np.cumsum(probs, axis=-1)
    remove_sorted = cum - probs > p  # keep the token that crosses p
    remove = np.zeros_like(remove_sorted)
    np.put_along_axis(remove, order, remove_sorted, axis=-1)
    return np.where(remove, -np.inf, logits).astype(np.float32, copy=False)


def _softmax(x: np.ndarray) -> np.ndarray:
    m = np.max(x, axis=-1, keepdims=True)
    e = np.exp(x - m, dtype=np.float32)
    e /= np.sum(e, axis=-1, keepdims=True)
    return e


def softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    if temperature not in (0.0, 1.0):
        logits = logits / np.float32(temperature)
    return _softmax(logits)


def entropy(probs: np.ndarray) -> np.ndarray:
    """Shannon entropy (nats) of each row."""
    with np.errstate(divide="ignore", invalid="ignore"):
        plogp = np.where(probs > 0, probs * np.log(probs), 0.0)
    return -np.sum(plogp, axis=-1)


def softmax_and_entropy(processed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """softmax(processed) and the entropy of each row (torch.distributions.Categorical's, in
    float32) in a few passes over the vocabulary (the step's largest cost on a small model): with
    e = exp(x - m) and s = sum(e), p = e / s and H = log s - sum(e * (x - m)) / s."""
    shifted = processed - processed.max(axis=-1, keepdims=True)
    e = np.exp(shifted, dtype=np.float32)
    total = np.sum(e, axis=-1, keepdims=True, dtype=np.float32)
    probs = e / total
    if not np.isfinite(shifted).all():  # -inf logits (a ban): 0 * -inf must count as 0
        logp = shifted - np.log(total)
        return probs, -np.sum(np.where(probs > 0, logp, np.float32(0.0)) * probs, axis=-1, dtype=np.float32)
    weighted = np.einsum("ij,ij->i", e, shifted, dtype=np.float32)
    return probs, (np.log(total[:, 0]) - weighted / total[:, 0]).astype(np.float32)


def log_prob_of(logits: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """log softmax(logits)[row, tokens[row]] per row, in float64 (a model's own score of a text)."""
    x = np.asarray(logits, dtype=np.float64)
    m = x.max(axis=1, keepdims=True)
    logz = m[:, 0] + np.log(np.exp(x - m).sum(axis=1))
    return x[np.arange(x.shape[0]), np.asarray(tokens)] - logz


def inverse_cdf(probs: np.ndarray, uniform: np.ndarray) -> np.ndarray:
    """For each row, the first index whose cumulative probability reaches uniform * row total: a
    categorical draw. The running sum is a float32 sum in index order, as ggml's cumsum on the CPU
    backend computes it, so the host and the engine's diffusion head draw the same token for the same
    uniform (a chunked sum is cheaper but puts tail draws on different sides of float ties)."""
    cdf = np.cumsum(probs, axis=-1, dtype=np.float32)
    target = uniform.astype(np.float32) * cdf[:, -1]
    return np.minimum(np.sum(cdf < target[:, None], axis=-1), probs.shape[-1] - 1).astype(np.int32)


def row_stats(
    logits: np.ndarray,
    *,
    inv_temp: float | np.ndarray,
    uniform: np.ndarray,
    top_k: int = 0,
    top_p: float = 1.0,
    margin: bool = False,
) -> RowStats:
    """The statistics of softmax(filter(logits) * inv_temp) per row, filters as `filter_top_k` and
    `filter_top_p` (at temperature 1, before the temperature): the specification of what the
    engine's diffusion head computes on the backend."""
    x = logits
    if top_k:
        x = filter_top_k(x, top_k)
    if top_p < 1.0:
        x = filter_top_p(x, top_p)
    scale = np.asarray(inv_temp, dtype=np.float32)
    x = (x * (scale[:, None] if scale.ndim else scale)).astype(np.float32, copy=False)
    probs, h = softmax_and_entropy(x)
    rows = np.arange(x.shape[0])
    drawn = inverse_cdf(probs, np.asarray(uniform, dtype=np.float32))
    argmax = np.argmax(x, axis=-1).astype(np.int32)
    second = np.partition(probs, -2, axis=-1)[:, -2] if margin and x.shape[1] > 1 else np.zeros(x.shape[0], np.float32)
    return RowStats(drawn, argmax, h, probs[rows, drawn], probs[rows, argmax], second.astype(np.float32))


def draw_uniform(n: int, temperature: float, rng: np.random.Generator) -> np.ndarray | None:
    """The per-row uniforms of a proposal's draw (None when greedy: nothing is drawn)."""
    return rng.random(n, dtype=np.float32) if temperature > 0.0 else None


def proposal(stats: RowStats, *, greedy: bool, algorithm: str, rng: np.random.Generator) -> Proposal:
    """A token per row and how sure the model is about it, from the row statistics.

    Greedy rows take the argmax (its probability at temperature 1 is the confidence), others the
    drawn token. "random" draws its confidences from `rng` after the tokens' uniforms."""
    tokens = stats.argmax if greedy else stats.drawn
    if algorithm in ("confidence", "origin"):
        conf = stats.p_argmax if greedy else stats.p_drawn
    elif algorithm == "margin":
        conf = stats.p_argmax - stats.p_second
    elif algorithm == "entropy":
        conf = -stats.entropy
    elif algorithm == "random":
        conf = rng.random(tokens.shape[0], dtype=np.float32)
    else:
        raise ValueError(f"unknown algorithm {algorithm!r}")
    return Proposal(tokens.astype(np.int32), np.asarray(conf, dtype=np.float32))


def propose(
    logits: np.ndarray,
    *,
    temperature: float,
    top_k: int,
    top_p: float,
    algorithm: str,
    rng: np.random.Generator,
) -> Proposal:
    """Propose a token for each row and say how sure the model is about it (all on the host).

    Temperature 0 is argmax; otherwise an inverse-CDF draw (one uniform per row) from
    softmax(filtered logits / T). Confidence is measured on that processed distribution."""
    spec = SampleSpec(temperature, top_k, top_p, draw_uniform(logits.shape[0], temperature, rng),
                      margin=algorithm == "margin")
    return proposal(spec.stats(logits), greedy=spec.uniform is None, algorithm=algorithm, rng=rng)


def choose_top(confidence: np.ndarray, n: int, alg_temp: float, rng: np.random.Generator) -> np.ndarray:
    """Indices of the n positions to commit: the n most confident, or with alg_temp > 0 a draw
    without replacement from softmax(confidence / alg_temp) (Dream's stochastic selection)."""
    n = min(n, confidence.shape[0])
    if n <= 0:
        return np.empty(0, dtype=np.int64)
    if alg_temp > 0:
        w = confidence.astype(np.float64) / alg_temp
        w = np.exp(w - w.max())
        p = w / w.sum()
        if np.count_nonzero(p) >= n:
            return rng.choice(confidence.shape[0], size=n, replace=False, p=p)
        # a small alg_temp underflows all but the top weights to 0: n distinct draws are then the top n
    # stable: ties go to the leftmost position
    order = np.argsort(-confidence, kind="stable")
    return order[:n]


def choose_threshold(confidence: np.ndarray, threshold: float) -> np.ndarray:
    """Fast-dLLM parallel decoding: every position at or above the threshold, at least the best one."""
    picked = np.flatnonzero(confidence >= threshold)
    if picked.size == 0 and confidence.size:
        picked = np.array([int(np.argmax(confidence))])
    return picked


def choose_dynamic(confidence: np.ndarray, k: int, threshold: float) -> np.ndarray:
    """SDAR's `low_confidence_dynamic` (JetAstra/SDAR generate.py): if at least k positions have a
    confidence strictly above the threshold, all of them; otherwise the k most confident (ties to the
    leftmost). `confidence` holds only the positions that may be committed (the masked ones), so k
    is capped at their number (SDAR's torch.topk over -inf entries could pick decided positions)."""
    high = np.flatnonzero(confidence > threshold)
    if high.size >= k:
        return high
    return np.argsort(-confidence, kind="stable")[:k]


def choose_factor(confidence: np.ndarray, factor: float) -> np.ndarray:
    """Fast-dLLM's factor rule: commit the n most confident positions for the largest n with
    (n + 1) * (1 - c_n) <= factor, where c_n is the n-th highest confidence (at least one)."""
    if confidence.size == 0:
        return np.empty(0, dtype=np.int64)
    order = np.argsort(-confidence, kind="stable")
    c = confidence[order]
    n = np.arange(1, c.size + 1)
    ok = (n + 1) * (1.0 - c) <= factor
    ok[0] = True
    # the rule holds for a prefix of the sorted list; stop at the first failure
    count = int(np.argmin(ok)) if not ok.all() else c.size
    return order[: max(count, 1)]
