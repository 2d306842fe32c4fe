"""The masked-diffusion generation loop (LLaDA, Dream, RND1, non-causal llama GGUFs).

Readable top to bottom, like llama.cpp's examples/diffusion: for each canvas of the answer, for each
block, for each step: ask for the logits of the block's masked positions, propose a token per
position (sampling.propose), choose which positions to commit (schedule count, threshold, factor,
or random transfer), commit them, emit an event, and stop early once an end token has nothing
undecided before it. A canvas that fills up without an end token is appended to the context and a
new canvas starts, up to max_tokens.

The loop is a coroutine: it *yields* a `LogitsRequest` and is *sent* the logits back. It never
touches the model, so it runs in tests on synthetic logits, and the driver (driver.drive) can batch
the requests of several sequences into one llama.cpp call.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence

import numpy as np

from dgchat.model_backend import sampling, schedules
from dgchat.model_backend.canvas import Canvas, Cell
from dgchat.model_backend.driver import Denoiser, LogitsSource, drive_one
from dgchat.model_backend.errors import GenerationCancelled
from dgchat.model_backend.events import FinalEvent, GenerationStats, StepEvent, StepTiming
from dgchat.model_backend.params import DiffusionParams
from dgchat.model_backend.requests import CanvasTemplate, LogitsRequest, MaskedSetup


def first_end(canvas: Canvas, is_eog: np.ndarray) -> int | None:
    """Index of the first decided end token whose prefix is fully decided, else None."""
    decided = canvas.state != Cell.MASKED
    ends = np.flatnonzero(decided & is_eog[canvas.tokens])
    if ends.size == 0:
        return None
    k = int(ends[0])
    return k if bool(decided[:k].all()) else None


def masked_denoiser(
    prompt: np.ndarray,
    params: DiffusionParams,
    setup: MaskedSetup,
    *,
    n_vocab: int,
    cancel: threading.Event | None = None,
    template: CanvasTemplate | None = None,
) -> Denoiser:
    """Generate an answer to `prompt` (token ids). `params` must be resolved (engine.resolve)."""
    L = int(template.tokens.size if template is not None else params.gen_length)
    max_tokens = L if template is not None else int(params.max_tokens or L)
    rng = np.random.default_rng(params.seed)
    is_eog = np.zeros(n_vocab, dtype=bool)
    is_eog[setup.eog_tokens] = True
    stats = GenerationStats(prompt_tokens=int(prompt.size))
    t_start = time.perf_counter()
    context = prompt.astype(np.int32)
    answer: list[np.ndarray] = []
    stop = "max_tokens"
    block_list = schedules.blocks(L, params.block_length if template is None else None)
    adaptive = params.threshold is not None or params.factor is not None
    steps_per_block = max(1, int(params.steps) // len(block_list))
    early_stop = params.early_stop and template is None
    cancelled = False
    bias_ids, bias_values = logit_bias_arrays(params.logit_bias)
    # never propose the mask token itself (the reference samplers can; it only wastes a step)
    bias_ids = np.append(bias_ids, setup.mask_token).astype(np.int64)
    bias_values = np.append(bias_values, np.float32(-np.inf)).astype(np.float32)
    temperature = float(params.temperature or 0.0)
    top_k, top_p = params.top_k or 0, 1.0 if params.top_p is None else params.top_p

    for canvas_index in range((max_tokens + L - 1) // L):
        canvas = Canvas.blank(L, setup.mask_token)
        if template is not None:
            canvas.tokens[template.fixed] = template.tokens[template.fixed]
            canvas.state[template.fixed] = Cell.FIXED
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
                block = (base + b_start, base + b_end)
                spec = sampling.SampleSpec(temperature, top_k, top_p,
                                           sampling.draw_uniform(candidates.size, temperature, rng),
                                           margin=params.algorithm == "margin", bias_ids=bias_ids,
                                           bias_values=bias_values)
                try:
                    if params.cfg_scale > 0:  # guidance mixes two passes' logits: sampled on the host
                        cond = yield LogitsRequest(sequence, rows, block, step == 0)
                        cond = np.array(cond, copy=True)
                        uncond_seq = sequence.copy()
                        uncond_seq[: prompt.size] = setup.mask_token
                        uncond = yield LogitsRequest(uncond_seq, rows, block, step == 0)
                        row_stats = spec.stats(uncond + np.float32(params.cfg_scale + 1.0) * (cond - uncond))
                    else:
                        # a source without the engine's head may answer with logits: sampled here then
                        row_stats = spec.stats((yield LogitsRequest(sequence, rows, block, step == 0, sample=spec)))
                except GenerationCancelled:  # the decode in flight was aborted
                    cancelled = True
                    break
                t1 = time.perf_counter()
                proposal = sampling.proposal(row_stats, greedy=spec.uniform is None, algorithm=params.algorithm,
                                             rng=rng)
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
                        # random transfer: each masked position independently, at the scheduled rate
                        rate = n / candidates.size
                        picked = np.flatnonzero(rng.random(candidates.size) < rate)
                    else:
                        picked = sampling.choose_top(proposal.confidence, n, params.alg_temp, rng)
                stats.steps += 1
                canvas_step += 1
                canvas.commit(candidates[picked], proposal.tokens[picked], proposal.confidence[picked], stats.steps)
                t2 = time.perf_counter()
                model_s = t1 - t0 - row_stats.host_s  # vocabulary-wide work done on the host counts as sampler time
                sampler_s = t2 - t1 + row_stats.host_s
                stats.model_s += model_s
                stats.sampler_s += sampler_s
                if early_stop:
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
                    timing=StepTiming(1000 * model_s, 1000 * sampler_s),
                    elapsed_s=time.perf_counter() - t_start,
                )
                if end_at is not None:
                    break
        canvas.settle()
        stats.canvases += 1
        if template is not None:
            answer.append(canvas.tokens.copy())
            stop = "cancelled" if cancelled else "complete"
            break
        if cancelled:
            decided = canvas.decided_prefix()
            answer.append(decided[~is_eog[decided]] if decided.size else decided)
            stop = "cancelled"
            break
        if end_at is None:
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


def logit_bias_arrays(logit_bias: Sequence[tuple[int, float]]) -> tuple[np.ndarray, np.ndarray]:
    """(token ids, float32 additive biases) of a params.logit_bias. A token listed twice gets its
    biases summed, except that any bias of -100 or below bans it (-inf) whatever else is listed."""
    if not logit_bias:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32)
    merged: dict[int, float] = {}
    for token, bias in logit_bias:
        t = int(token)
        merged[t] = -np.inf if float(bias) <= -100.0 else merged.get(t, 0.0) + float(bias)
    ids = np.fromiter(merged, dtype=np.int64, count=len(merged))
    values = np.array(list(merged.values()), dtype=np.float32)
    return ids, values


def run_masked(
    source: LogitsSource,
    prompt: np.ndarray,
    params: DiffusionParams,
    setup: MaskedSetup,
    *,
    cancel: threading.Event | None = None,
    n_vocab: int,
    template: CanvasTemplate | None = None,
) -> Iterator[StepEvent | FinalEvent]:
    return drive_one(masked_denoiser(prompt, params, setup, n_vocab=n_vocab, cancel=cancel, template=template), source)


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts).astype(np.int32) if parts else np.empty(0, dtype=np.int32)
