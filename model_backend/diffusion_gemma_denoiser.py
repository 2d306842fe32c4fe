"""DiffusionGemma's denoiser (block diffusion with the entropy-bound sampler) and its AR decoder.

Both are coroutines run by driver.drive: they yield requests (requests.EncodeRequest for the causal
encoder, requests.DenoiseRequest for a denoising step) and events, and never touch the model. The
loop is described in diffusion_gemma.py.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from dgchat.model_backend import sampling
from dgchat.model_backend.canvas import Canvas, Cell, decided_length
from dgchat.model_backend.driver import Denoiser
from dgchat.model_backend.entropy_bound import (
    EntropyBoundConfig,
    StabilityTracker,
    StepDraws,
    entropy_bound_update,
    temperature,
)
from dgchat.model_backend.errors import GenerationCancelled
from dgchat.model_backend.events import FinalEvent, GenerationStats, StepEvent, StepTiming
from dgchat.model_backend.masked_diffusion import logit_bias_arrays
from dgchat.model_backend.params import DiffusionParams
from dgchat.model_backend.requests import CanvasTemplate, DenoiseRequest, DgSetup, EncodeRequest
from dgchat.model_backend.sampling import SampleSpec


def dg_denoiser(
    prompt: np.ndarray,
    params: DiffusionParams,
    setup: DgSetup,
    *,
    cancel: threading.Event | None = None,
    template: CanvasTemplate | None = None,
) -> Denoiser:
    """One answer by block diffusion. Yields requests (sent back RowStats, or logits for the
    prompt and commits, which it ignores), StepEvents, a FinalEvent."""
    L = int(template.tokens.size if template is not None else params.gen_length)
    max_tokens = L if template is not None else int(params.max_tokens or L)
    cfg = EntropyBoundConfig(int(params.steps), float(params.entropy_bound), float(params.t_min),
                             float(params.t_max), int(params.stability_threshold), float(params.confidence_threshold))
    rng = np.random.default_rng(params.seed)
    V = setup.n_vocab
    is_eog = np.zeros(V, dtype=bool)
    is_eog[setup.eog] = True
    pad_bias = float(params.pad_bias or 0.0)
    bias_ids, bias_values = logit_bias_arrays(
        tuple(params.logit_bias) + (((setup.pad, pad_bias),) if pad_bias and setup.pad is not None else ()))
    fixed = template.fixed.astype(bool) if template is not None else None
    stats = GenerationStats(prompt_tokens=int(prompt.size))
    t_start = time.perf_counter()
    answer: list[np.ndarray] = []
    stop = "max_tokens"
    cancelled = False
    try:
        t0 = time.perf_counter()
        yield EncodeRequest(prompt.astype(np.int32), np.arange(prompt.size, dtype=np.int32), np.empty(0, np.int64))
        stats.model_s += time.perf_counter() - t0
    except GenerationCancelled:
        cancelled = True
    base = int(prompt.size)
    n_canvases = 0 if cancelled else (max_tokens + L - 1) // L
    for canvas_index in range(n_canvases):
        current = rng.integers(0, V, L, dtype=np.int64).astype(np.int32)
        if template is not None:
            start = template.initial if template.initial is not None else current
            current = np.where(template.fixed, template.tokens, start).astype(np.int32)
        draft = current.copy()
        tracker = StabilityTracker(cfg.stability_threshold, cfg.confidence_threshold)
        shown = Canvas.blank(L, 0)
        positions = np.arange(base, base + L, dtype=np.int32)
        canvas_step = 0
        for cur_step in range(cfg.steps, 0, -1):
            if cancel is not None and cancel.is_set():
                cancelled = True
                break
            t0 = time.perf_counter()
            draws = StepDraws.draw(rng, L, V)
            sample = SampleSpec(temperature(cur_step, cfg), 0, 1.0, draws.uniform, bias_ids=bias_ids,
                                bias_values=bias_values)
            t1 = time.perf_counter()
            try:
                row = yield DenoiseRequest(current, positions, sample, first_step=canvas_step == 0)
            except GenerationCancelled:
                cancelled = True
                break
            t2 = time.perf_counter()
            result = entropy_bound_update(current, row, cfg, draws.renoise, fixed)
            current, draft = result.canvas, result.argmax
            done = tracker.update(result.argmax, result.mean_entropy)
            t3 = time.perf_counter()
            stats.steps += 1
            canvas_step += 1
            model_s = t2 - t1 - row.host_s  # vocabulary-wide work done on the host counts as sampler time
            stats.model_s += model_s
            stats.sampler_s += (t1 - t0) + row.host_s + (t3 - t2)
            _show(shown, draft, result.accepted, fixed, stats.steps)
            yield StepEvent(
                step=stats.steps, total_steps=cfg.steps, canvas_index=canvas_index, canvas_step=canvas_step,
                canvas=shown.snapshot(), answer_tokens=_joined(answer),
                committed=int(np.count_nonzero(shown.state != Cell.MASKED)), canvas_length=L,
                timing=StepTiming(1000 * model_s, 1000 * ((t1 - t0) + row.host_s + (t3 - t2))),
                elapsed_s=time.perf_counter() - t_start, uniform_state=True,
            )
            if done:
                break
        stats.canvases += 1
        if cancelled:
            kept = draft[: decided_length(shown.state)]
            answer.append(kept[~is_eog[kept]])
            stop = "cancelled"
            break
        if template is not None:
            answer.append(draft.copy())
            stop = "complete"
            break
        # early_stop off (benchmarks: answers of exactly max_tokens): end tokens do not end it
        ends = np.flatnonzero(is_eog[draft]) if params.early_stop else np.empty(0, np.int64)
        if ends.size:
            answer.append(draft[: ends[0]].copy())
            stop = "eos"
            break
        answer.append(draft.copy())
        if sum(a.size for a in answer) >= max_tokens:
            break
        try:
            t0 = time.perf_counter()
            yield EncodeRequest(draft.astype(np.int32), positions, np.empty(0, np.int64))  # commit the canvas
            stats.model_s += time.perf_counter() - t0
        except GenerationCancelled:
            stop = "cancelled"
            break
        base += L
    tokens = _joined(answer)[:max_tokens]
    stats.tokens = int(tokens.size)
    stats.elapsed_s = time.perf_counter() - t_start
    yield FinalEvent(text="", tokens=tokens, stop_reason=stop, stats=stats)


def _show(shown: Canvas, draft: np.ndarray, accepted: np.ndarray, fixed: np.ndarray | None, step: int) -> None:
    """The canvas as the UI shows it: the draft tokens; accepted positions decided (NEW when they
    changed since the last step), the rest undecided."""
    was = shown.state.copy()
    same = (shown.tokens == draft) & (was != Cell.MASKED)
    shown.tokens[:] = draft
    shown.state[:] = np.where(accepted, np.where(same, Cell.DONE, Cell.NEW), Cell.MASKED)
    newly = accepted & ~same
    shown.committed_at[newly] = step
    if fixed is not None:
        shown.state[fixed] = Cell.FIXED


def ar_decoder(prompt: np.ndarray, params: DiffusionParams, setup: DgSetup, *,
               cancel: threading.Event | None = None) -> Denoiser:
    """Left-to-right decoding with the causal encoder (the same weights as a causal LM)."""
    max_tokens = int(params.max_tokens or params.gen_length or 256)
    rng = np.random.default_rng(params.seed)
    is_eog = np.zeros(setup.n_vocab, dtype=bool)
    is_eog[setup.eog] = True
    bias_ids, bias_values = logit_bias_arrays(params.logit_bias)
    temp = float(params.temperature or 0.0)
    top_k, top_p = int(params.top_k or 0), 1.0 if params.top_p is None else float(params.top_p)
    stats = GenerationStats(prompt_tokens=int(prompt.size))
    t_start = time.perf_counter()
    out: list[int] = []
    stop = "max_tokens"
    chunk = int(params.gen_length or 64)
    shown = Canvas.blank(chunk, 0)

    def next_token(tokens: np.ndarray, positions: np.ndarray) -> EncodeRequest:
        """Append `tokens` and sample the token after the last one."""
        sample = SampleSpec(temp, top_k, top_p, sampling.draw_uniform(1, temp, rng), bias_ids=bias_ids,
                            bias_values=bias_values)
        return EncodeRequest(tokens.astype(np.int32), positions.astype(np.int32), np.array([tokens.size - 1]), sample)

    try:
        t0 = time.perf_counter()
        row = yield next_token(prompt, np.arange(prompt.size))
        while len(out) < max_tokens:
            if cancel is not None and cancel.is_set():
                stop = "cancelled"
                break
            t1 = time.perf_counter()
            prop = sampling.proposal(row, greedy=temp == 0.0, algorithm="confidence", rng=rng)
            tok = int(prop.tokens[0])
            t2 = time.perf_counter()
            stats.model_s += t1 - t0 - row.host_s
            stats.sampler_s += t2 - t1 + row.host_s
            stats.steps += 1
            if is_eog[tok] and params.early_stop:
                stop = "eos"
                break
            out.append(tok)
            i = (len(out) - 1) % chunk
            if i == 0:
                shown = Canvas.blank(chunk, 0)
            shown.commit(np.array([i]), np.array([tok]), prop.confidence, stats.steps)
            yield StepEvent(
                step=stats.steps, total_steps=max_tokens, canvas_index=(len(out) - 1) // chunk, canvas_step=i + 1,
                canvas=shown.snapshot(), answer_tokens=np.array(out[: len(out) - 1 - i], np.int32), committed=i + 1,
                canvas_length=chunk, timing=StepTiming(1000 * (t1 - t0 - row.host_s), 1000 * (t2 - t1 + row.host_s)),
                elapsed_s=time.perf_counter() - t_start,
            )
            if len(out) >= max_tokens:
                break
            t0 = time.perf_counter()
            row = yield next_token(np.array([tok]), np.array([prompt.size + len(out) - 1]))
    except GenerationCancelled:
        stop = "cancelled"
    tokens = np.array(out, dtype=np.int32)
    stats.tokens = int(tokens.size)
    stats.canvases = 1
    stats.elapsed_s = time.perf_counter() - t_start
    yield FinalEvent(text="", tokens=tokens, stop_reason=stop, stats=stats)


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts).astype(np.int32) if parts else np.empty(0, dtype=np.int32)
