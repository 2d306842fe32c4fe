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

Sorting ties (equal logits) are broken by token id here; C++'s std::partial_sort leaves their order
unspecified, so exactly tied logits are the one place the two may differ.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from dgchat.model_backend.cxx_random import CxxMt19937
from dgchat.model_backend.errors import InvalidParameterError
from dgchat.model_backend.schedules import even_split, timestep_transfer_count

ALGORITHM_IDS = {"origin": 0, "entropy": 1, "margin": 2, "random": 3, "confidence": 4}


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


def _row_candidates(row: np.ndarray, p: ReferenceParams) -> tuple[np.ndarray, np.ndarray, bool]:
    """Apply the chain's top-k, top-p and temperature stages to one row.
    Returns (token ids, logits, sorted) in llama.cpp's candidate order."""
    ids = np.arange(row.shape[0], dtype=np.int32)
    logits = row.astype(np.float32, copy=True)
    is_sorted = False
    if p.top_k > 0:
        k = min(p.top_k, logits.shape[0])
        order = np.argsort(-logits, kind="stable")[:k]
        ids, logits, is_sorted = ids[order], logits[order], True
    if p.top_p < 1.0:
        # softmax without sorting, float accumulation, as llama_sampler_softmax_impl
        m = logits.max()
        probs = np.exp((logits - m).astype(np.float64)).astype(np.float32)
        probs = probs / np.cumsum(probs, dtype=np.float32)[-1]
        if not is_sorted:
            order = np.argsort(-logits, kind="stable")
            ids, logits, probs = ids[order], logits[order], probs[order]
            is_sorted = True
        cum = np.cumsum(probs, dtype=np.float32)
        hit = np.flatnonzero(cum >= np.float32(p.top_p))
        last = int(hit[0]) + 1 if hit.size else logits.shape[0]
        ids, logits = ids[:last], logits[:last]
    if p.temperature > 0.0:
        logits = logits / np.float32(p.temperature)
    return ids, logits, is_sorted


def _dist_probs(logits: np.ndarray, is_sorted: bool) -> tuple[np.ndarray, np.ndarray]:
    """llama_sampler_dist's softmax: float exp, double running sum. Returns (p_unnormalised, cumsum)."""
    max_l = logits[0] if is_sorted else logits.max()
    p = np.exp((logits - max_l).astype(np.float64)).astype(np.float32)
    return p, np.cumsum(p.astype(np.float64))


def _sample_row(row: np.ndarray, p: ReferenceParams, rnd: float) -> tuple[int, np.ndarray, int]:
    """One application of the sampler chain. Returns (token, normalised probs, selected index)."""
    ids, logits, is_sorted = _row_candidates(row, p)
    if ids.shape[0] == 1:
        return int(ids[0]), np.ones(1, dtype=np.float32), 0
    unnorm, cum = _dist_probs(logits, is_sorted)
    total = cum[-1]
    sel = int(np.searchsorted(cum, total * rnd, side="left"))
    sel = min(sel, ids.shape[0] - 1)
    probs = (unnorm.astype(np.float64) / total).astype(np.float32)
    return int(ids[sel]), probs, sel


def _confidence(probs: np.ndarray, sel: int, algorithm: str, rng: CxxMt19937) -> float:
    if algorithm in ("confidence", "origin"):
        return float(probs[sel])
    if algorithm == "entropy":
        terms = (probs * np.log(probs + np.float32(1e-10))).astype(np.float32)
        return float(-np.cumsum(terms, dtype=np.float32)[-1])
    if algorithm == "margin":
        return float(probs[0] - probs[1]) if probs.shape[0] > 1 else float(probs[0])
    if algorithm == "random":
        return float(rng.uniform_float(1)[0])
    raise InvalidParameterError(f"unknown algorithm {algorithm!r}")


def _transfer_count(step: int, total: int, remaining: int, p: ReferenceParams, schedule: list[int]) -> int:
    if p.block_length > 0:
        return schedule[step] if step < len(schedule) else remaining // (total - step)
    return timestep_transfer_count(step, total, remaining, p.eps)


def reference_denoise(
    input_tokens: np.ndarray,
    params: ReferenceParams,
    logits_fn: Callable[[np.ndarray], np.ndarray],
    clock: Callable[[], float],
) -> Iterator[ReferenceStep]:
    """Run llama.cpp's diffusion_generate. `logits_fn(tokens)` returns the (max_length, V) logits
    of the full sequence (a fresh non-causal pass, as the example does every step)."""
    p = params
    n_input = int(input_tokens.shape[0])
    if n_input <= 0 or p.max_length <= n_input:
        return
    out = np.full(p.max_length, p.mask_token_id, dtype=np.int32)
    out[:n_input] = input_tokens
    chain_rng = CxxMt19937(p.seed)  # the dist sampler at the end of the chain
    rng = CxxMt19937(p.seed)  # the example's own std::mt19937
    select_rng = CxxMt19937(p.seed)  # dist_sampler, used when alg_temp > 0
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
        for step in range(steps_per_block):
            global_step = block * steps_per_block + step
            logits = logits_fn(out)
            if p.cfg_scale > 0.0:
                cond = np.array(logits, copy=True)
                uncond_tokens = out.copy()
                uncond_tokens[:n_input] = p.mask_token_id
                uncond = logits_fn(uncond_tokens)
                logits = uncond + np.float32(p.cfg_scale + 1.0) * (cond - uncond)
            t0 = clock()
            in_block = np.zeros(p.max_length, dtype=bool)
            in_block[b_start:b_end] = True
            mask_pos = np.flatnonzero((out == p.mask_token_id) & in_block)
            if mask_pos.size == 0:
                break
            if p.add_gumbel_noise and p.temperature > 0.0:
                row0 = logits[0]
                u = np.maximum(rng.uniform_double(row0.shape[0]), 1e-20)
                noise = np.power(-np.log(u), p.temperature)
                row0[:] = (np.exp(row0.astype(np.float64)).astype(np.float32) / noise).astype(np.float32)

            def row_for(pos: int) -> np.ndarray:
                if p.shift_logits:
                    return logits[0] if pos == 0 else logits[pos - 1]
                return logits[pos]

            n_transfer = _transfer_count(step, steps_per_block, int(mask_pos.size), p, schedule)
            committed: list[int] = []
            confs: list[float] = []
            if algorithm == "origin":
                p_transfer = np.float32(n_transfer) / np.float32(mask_pos.size)
                draws = rng.uniform_float(int(mask_pos.size))
                chosen = mask_pos[draws < p_transfer]
                rnds = chain_rng.uniform_double(int(chosen.size))
                for pos, rnd in zip(chosen, rnds):
                    tok, probs, sel = _sample_row(row_for(int(pos)), p, float(rnd))
                    out[pos] = tok
                    committed.append(int(pos))
                    confs.append(float(probs[sel]))
            else:
                rnds = chain_rng.uniform_double(int(mask_pos.size))
                sampled = np.empty(mask_pos.size, dtype=np.int32)
                conf = np.empty(mask_pos.size, dtype=np.float32)
                for i, pos in enumerate(mask_pos):
                    tok, probs, sel = _sample_row(row_for(int(pos)), p, float(rnds[i]))
                    sampled[i] = tok
                    conf[i] = _confidence(probs, sel, algorithm, rng)
                if n_transfer > 0:
                    n = min(n_transfer, int(mask_pos.size))
                    if p.alg_temp == 0.0:
                        # partial_sort by (confidence desc, index asc)
                        order = np.lexsort((np.arange(conf.size), -conf))[:n]
                    else:
                        conf_logits = (conf / np.float32(p.alg_temp)).astype(np.float32)
                        order = []
                        for rnd in select_rng.uniform_double(n):
                            if conf_logits.shape[0] == 1:
                                order.append(0)
                                continue
                            unnorm, cum = _dist_probs(conf_logits, False)
                            order.append(min(int(np.searchsorted(cum, cum[-1] * rnd, side="left")),
                                             conf_logits.shape[0] - 1))
                    for idx in order:
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
