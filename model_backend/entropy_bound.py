"""DiffusionGemma's uniform-state sampler, one denoising step as a pure function.

Written from transformers 5.23 `generation_diffusion_gemma.py` (`EntropyBoundSampler`,
`LinearTemperatureScheduleLogitsProcessor`, `StableAndConfidentStoppingCriteria`,
`DiffusionGemmaGenerationMixin._denoising_step`):

- step n counts down from N to 1; the logits are divided by t = t_min + (t_max - t_min) * n / N;
- a denoiser canvas is drawn from softmax(processed logits); the argmax canvas is the draft;
- acceptance: positions sorted by entropy (ascending); the k lowest are accepted while
  sum_{i<=k} H_i - H_k <= entropy_bound (so at least one), following arXiv:2505.24857;
- accepted positions take the denoiser's token, all others are re-randomised uniformly;
- stop when the argmax canvas equals the previous `stability_threshold` argmax canvases and the
  mean entropy of the processed distribution is below `confidence_threshold`;
- the processed logits are the next step's self-conditioning input.

The step splits in two: the vocabulary-wide statistics of each position (`sampling.row_stats`,
or the engine's diffusion head on the backend) and the O(canvas) decisions
(`entropy_bound_update`). The random draws come in as arguments (`StepDraws`), so a test can feed
the implementations the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dgchat.model_backend.sampling import RowStats, row_stats


@dataclass(frozen=True)
class EntropyBoundConfig:
    steps: int
    entropy_bound: float
    t_min: float
    t_max: float
    stability_threshold: int
    confidence_threshold: float


@dataclass(frozen=True)
class StepDraws:
    uniform: np.ndarray  # (L,) in [0, 1): one categorical draw per position
    renoise: np.ndarray  # (L,) uniform random token ids for the positions not accepted

    @classmethod
    def draw(cls, rng: np.random.Generator, length: int, vocab: int) -> StepDraws:
        return cls(rng.random(length), rng.integers(0, vocab, length, dtype=np.int64).astype(np.int32))


@dataclass
class StepResult:
    canvas: np.ndarray  # the next current canvas (accepted tokens kept, the rest re-randomised)
    denoised: np.ndarray  # the tokens drawn from the denoiser at every position
    argmax: np.ndarray  # the draft: argmax of the processed logits
    accepted: np.ndarray  # bool (L,)
    mean_entropy: float
    processed: np.ndarray | None = None  # logits / temperature (host steps): the next self-conditioning input


def temperature(cur_step: int, cfg: EntropyBoundConfig) -> float:
    """cur_step runs from cfg.steps down to 1."""
    return cfg.t_min + (cfg.t_max - cfg.t_min) * (cur_step / cfg.steps)


def accept_mask(token_entropy: np.ndarray, bound: float, eligible: np.ndarray | None = None) -> np.ndarray:
    """Lowest-entropy positions whose cumulative entropy minus the largest accepted stays <= bound.
    Positions not `eligible` (fixed text) never count and are never accepted here. Float32 with a
    double running sum, as torch's CPU cumsum."""
    h = token_entropy.astype(np.float32)
    if eligible is not None:
        h = np.where(eligible, h, np.float32(np.inf))
    order = np.argsort(h, kind="stable")
    sorted_h = h[order]
    finite = np.isfinite(sorted_h)
    cum = np.cumsum(np.where(finite, sorted_h, 0.0).astype(np.float64)).astype(np.float32)
    take = ((cum - sorted_h) <= np.float32(bound)) & finite
    mask = np.zeros_like(take)
    mask[order] = take
    return mask


def entropy_bound_update(
    current: np.ndarray,
    stats: RowStats,
    cfg: EntropyBoundConfig,
    renoise: np.ndarray,
    fixed: np.ndarray | None = None,
) -> StepResult:
    """The step's decisions from its per-position statistics (O(canvas), no vocabulary-wide work):
    accept the most certain positions, re-randomise the rest. `fixed` marks positions whose tokens
    are given and never re-randomised."""
    denoised = stats.drawn.astype(np.int32)
    argmax = stats.argmax.astype(np.int32, copy=True)
    h = stats.entropy
    free = None if fixed is None else ~fixed
    accepted = accept_mask(h, cfg.entropy_bound, free)
    canvas = np.where(accepted, denoised, renoise).astype(np.int32)
    if fixed is not None:
        canvas[fixed] = current[fixed]
        argmax[fixed] = current[fixed]
    mean_h = float(np.mean(h if free is None else h[free])) if (free is None or free.any()) else 0.0
    return StepResult(canvas=canvas, denoised=denoised, argmax=argmax, accepted=accepted, mean_entropy=mean_h)


def entropy_bound_step(
    current: np.ndarray,
    logits: np.ndarray,
    cur_step: int,
    cfg: EntropyBoundConfig,
    draws: StepDraws,
    fixed: np.ndarray | None = None,
) -> StepResult:
    """One denoising step on the host, logits in: the temperature schedule, the per-position
    statistics of softmax(processed) (`row_stats`), then `entropy_bound_update`."""
    processed = (logits / np.float32(temperature(cur_step, cfg))).astype(np.float32)
    stats = row_stats(processed, inv_temp=1.0, uniform=draws.uniform)
    result = entropy_bound_update(current, stats, cfg, draws.renoise, fixed)
    result.processed = processed
    return result


class StabilityTracker:
    """StableAndConfidentStoppingCriteria for one sequence."""

    def __init__(self, threshold: int, confidence_threshold: float) -> None:
        self.threshold = threshold
        self.confidence_threshold = confidence_threshold
        self.history: list[np.ndarray] = []

    def update(self, argmax: np.ndarray, mean_entropy: float) -> bool:
        if self.threshold == 0:
            stable = True
        else:
            stable = len(self.history) == self.threshold and all(np.array_equal(h, argmax) for h in self.history)
            self.history = (self.history + [argmax.copy()])[-self.threshold:]
        return stable and mean_entropy < self.confidence_threshold
