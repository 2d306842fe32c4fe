"""The masked-diffusion generation loop (LLaDA, Dream, RND1, non-causal llama GGUFs).

Readable top to bottom, like llama.cpp's examples/diffusion: for each canvas of the answer, for each
block, for each step: get logits for the masked positions of the block, propose a token per position
(sampling.propose), choose which positions to commit (schedule count, threshold, or factor),
commit them, emit an event, and stop early once an end token has nothing undecided before it.
A canvas that fills up without an end token is appended to the context and a new canvas starts,
up to max_tokens.

The model is reached only through a `LogitsSource`, so the loop runs in tests on synthetic logits.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from dgchat.model_backend import sampling, schedules
from dgchat.model_backend.canvas import Canvas, Cell
from dgchat.model_backend.events import FinalEvent, GenerationStats, StepEvent, StepTiming
from dgchat.model_backend.params import DiffusionParams


class LogitsSource(Protocol):
    def logits(self, sequence: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Logits of `sequence` (a full non-causal pass) at sequence positions `rows`, shape (len(rows), V)."""


@dataclass(frozen=True)
class MaskedSetup:
    mask_token: int
    eog_tokens: np.ndarray  # ids that end an answer
    shift_logits: bool  # Dream: position i is predicted from row i - 1


def first_end(canvas: Canvas, is_eog: np.ndarray) -> int | None:
    """Index of the first decided end token whose prefix is fully decided, else None."""
    decided = canvas.state != Cell.MASKED
    ends = np.flatnonzero(decided & is_eog[canvas.tokens])
    if ends.size == 0:
        return None
    k = int(ends[0])
    return k if bool(decided[:k].all()) else None


def run_masked(
    source: LogitsSource,
    prompt: np.ndarray,
    params: DiffusionParams,
    setup: MaskedSetup,
    *,
    cancel: threading.Event | None = None,
    n_vocab: int,
) -> Iterator[StepEvent | FinalEvent]:
    """Generate an answer to `prompt` (token ids). `params` must be resolved (no None fields used)."""
    L = int(params.gen_length)
    max_tokens = int(params.max_tokens or L)
    rng = np.random.default_rng(params.seed)
    is_eog = np.zeros(n_vocab, dtype=bool)
    is_eog[setup.eog_tokens] = True
    stats = GenerationStats(prompt_tokens=int(prompt.size))
    t_start = time.perf_counter()
    context = prompt.astype(np.int32)
    answer: list[np.ndarray] = []
    stop = "max_tokens"
    block_list = schedules.blocks(L, params.block_length)
    adaptive = params.threshold is not None or params.factor is not None
    steps_per_block = max(1, int(params.steps) // len(block_list))
    cancelled = False

    for canvas_index in range((max_tokens + L - 1) // L):
        canvas = Canvas.blank(L, setup.mask_token)
        base = context.size  # sequence position of canvas position 0
        canvas_step = 0
        planned = steps_per_block * len(block_list)
        end_at: int | None = None
        for b_start, b_end in block_list:
            if end_at is not None or cancelled:
                break
            n_masked = int(np.count_nonzero(canvas.undecided[b_start:b_end]))
            counts = schedules.even_split(n_masked, steps_per_block) if params.block_length else None
            step_limit = (b_end - b_start) if adaptive else steps_per_block
            for step in range(step_limit):
                if cancel is not None and cancel.is_set():
                    cancelled = True
                    break
                candidates = b_start + np.flatnonzero(canvas.undecided[b_start:b_end])
                if candidates.size == 0:
                    break
                sequence = np.concatenate([context, canvas.tokens])
                rows = base + candidates - (1 if setup.shift_logits else 0)
                t0 = time.perf_counter()
                logits = source.logits(sequence, rows)
                if params.cfg_scale > 0:
                    logits = np.array(logits, copy=True)
                    uncond_seq = sequence.copy()
                    uncond_seq[: prompt.size] = setup.mask_token
                    uncond = source.logits(uncond_seq, rows)
                    logits = uncond + np.float32(params.cfg_scale + 1.0) * (logits - uncond)
                t1 = time.perf_counter()
                # never propose the mask token itself (the reference samplers can; it only wastes a step)
                logits = np.array(logits, copy=True) if not logits.flags.writeable else logits
                logits[:, setup.mask_token] = -np.inf
                proposal = sampling.propose(
                    logits,
                    temperature=float(params.temperature or 0.0),
                    top_k=params.top_k,
                    top_p=params.top_p,
                    algorithm=params.algorithm,
                    rng=rng,
                )
                if params.threshold is not None:
                    picked = sampling.choose_threshold(proposal.confidence, params.threshold)
                elif params.factor is not None:
                    picked = sampling.choose_factor(proposal.confidence, params.factor)
                else:
                    if counts is not None:
                        n = counts[step]
                    else:
                        n = schedules.timestep_transfer_count(step, steps_per_block, int(candidates.size), params.eps or 0.0)
                    if params.algorithm == "origin":
                        # random transfer: each masked position independently, with the scheduled rate
                        rate = n / candidates.size
                        picked = np.flatnonzero(rng.random(candidates.size) < rate)
                    else:
                        picked = sampling.choose_top(proposal.confidence, n, params.alg_temp, rng)
                stats.steps += 1
                canvas_step += 1
                canvas.commit(candidates[picked], proposal.tokens[picked], proposal.confidence[picked], stats.steps)
                t2 = time.perf_counter()
                stats.model_s += t1 - t0
                stats.sampler_s += t2 - t1
                if params.early_stop:
                    end_at = first_end(canvas, is_eog)
                yield StepEvent(
                    step=stats.steps,
                    total_steps=planned,
                    canvas_index=canvas_index,
                    canvas_step=canvas_step,
                    canvas=canvas.snapshot(),
                    answer_tokens=_joined(answer),
                    committed=canvas.n_decided,
                    canvas_length=L,
                    timing=StepTiming(1000 * (t1 - t0), 1000 * (t2 - t1)),
                    elapsed_s=time.perf_counter() - t_start,
                )
                if end_at is not None:
                    break
        canvas.settle()
        stats.canvases += 1
        if cancelled:
            decided = canvas.tokens[: _decided_prefix(canvas)]
            answer.append(decided[~is_eog[decided]] if decided.size else decided)
            stop = "cancelled"
            break
        if end_at is None and not params.early_stop:
            end_at = first_end(canvas, is_eog)
        if end_at is not None:
            answer.append(canvas.tokens[:end_at].copy())
            stop = "eos"
            break
        answer.append(canvas.tokens.copy())
        if sum(a.size for a in answer) >= max_tokens:
            break
        context = np.concatenate([context, canvas.tokens])

    tokens = _joined(answer)[:max_tokens]
    stats.tokens = int(tokens.size)
    stats.elapsed_s = time.perf_counter() - t_start
    yield FinalEvent(text="", tokens=tokens, stop_reason=stop, stats=stats)


def _decided_prefix(canvas: Canvas) -> int:
    undecided = np.flatnonzero(canvas.state == Cell.MASKED)
    return int(undecided[0]) if undecided.size else len(canvas)


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts).astype(np.int32) if parts else np.empty(0, dtype=np.int32)
