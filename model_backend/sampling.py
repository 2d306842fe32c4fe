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

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Proposal:
    tokens: np.ndarray  # int32 (n,)
    confidence: np.ndarray  # float32 (n,)
    probs: np.ndarray | None = None  # processed distribution (n, V), kept only when asked


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


def propose(
    logits: np.ndarray,
    *,
    temperature: float,
    top_k: int,
    top_p: float,
    algorithm: str,
    rng: np.random.Generator,
    keep_probs: bool = False,
) -> Proposal:
    """Propose a token for each row and say how sure the model is about it."""
    x = logits
    if top_k:
        x = filter_top_k(x, top_k)
    if top_p < 1.0:
        x = filter_top_p(x, top_p)
    greedy = temperature == 0.0
    probs = softmax(x, 1.0 if greedy else temperature)
    if greedy:
        tokens = np.argmax(x, axis=-1).astype(np.int32)
    else:
        # inverse-CDF draw: one uniform per row instead of a Gumbel variate per vocabulary entry
        cdf = np.cumsum(probs, axis=-1)
        u = rng.random(probs.shape[0], dtype=np.float32)[:, None] * cdf[:, -1:]
        tokens = np.minimum(np.sum(cdf < u, axis=-1), probs.shape[-1] - 1).astype(np.int32)
    rows = np.arange(probs.shape[0])
    if algorithm in ("confidence", "origin"):
        conf = probs[rows, tokens]
    elif algorithm == "margin":
        top2 = np.partition(probs, -2, axis=-1)[:, -2:]
        conf = top2[:, 1] - top2[:, 0]
    elif algorithm == "entropy":
        conf = -entropy(probs)
    elif algorithm == "random":
        conf = rng.random(probs.shape[0], dtype=np.float32)
    else:
        raise ValueError(f"unknown algorithm {algorithm!r}")
    return Proposal(tokens, conf.astype(np.float32), probs if keep_probs else None)


def choose_top(confidence: np.ndarray, n: int, alg_temp: float, rng: np.random.Generator) -> np.ndarray:
    """Indices of the n positions to commit: the n most confident, or with alg_temp > 0 a draw
    without replacement from softmax(confidence / alg_temp) (Dream's stochastic selection)."""
    n = min(n, confidence.shape[0])
    if n <= 0:
        return np.empty(0, dtype=np.int64)
    if alg_temp > 0:
        w = confidence.astype(np.float64) / alg_temp
        w = np.exp(w - w.max())
        return rng.choice(confidence.shape[0], size=n, replace=False, p=w / w.sum())
    # stable: ties go to the leftmost position
    order = np.argsort(-confidence, kind="stable")
    return order[:n]


def choose_threshold(confidence: np.ndarray, threshold: float) -> np.ndarray:
    """Fast-dLLM parallel decoding: every position at or above the threshold, at least the best one."""
    picked = np.flatnonzero(confidence >= threshold)
    if picked.size == 0 and confidence.size:
        picked = np.array([int(np.argmax(confidence))])
    return picked


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
