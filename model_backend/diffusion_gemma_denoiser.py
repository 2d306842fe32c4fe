"""DiffusionGemma's denoiser (block diffusion with the entropy-bound sampler).

It is a coroutine run by driver.drive: they yield requests (requests.EncodeRequest for the causal
encoder, requests.DenoiseRequest for a denoising step) and events, and never touch the model. The
loop is described in diffusion_gemma.py.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from dgchat.model_backend.answer_blocks import AnswerBlocks
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
    answer = AnswerBlocks(max_tokens, is_eog, early_stop=params.early_stop)
    cancelled = False
    try:
        t0 = time.perf_counter()
        yield EncodeRequest(prompt.astype(np.int32), np.arange(prompt.size, dtype=np.int32), np.empty(0, np.int64))
        stats.prompt_s = time.perf_counter() - t0
        stats.model_s += stats.prompt_s
    except GenerationCancelled:
        cancelled = True
        answer.stop = "cancelled"
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
                canvas=shown.snapshot(), answer_tokens=answer.so_far(),
                committed=int(np.count_nonzero(shown.state != Cell.MASKED)), canvas_length=L,
                timing=StepTiming(1000 * model_s, 1000 * ((t1 - t0) + row.host_s + (t3 - t2))),
                elapsed_s=time.perf_counter() - t_start, uniform_state=True,
            )
            if done:
                break
        stats.canvases += 1
        if cancelled:
            answer.cancel(draft[: decided_length(shown.state)])
            break
        if template is not None:
            answer.complete(draft)
            break
        if answer.finish(draft):
            break
        try:
            t0 = time.perf_counter()
            yield EncodeRequest(draft.astype(np.int32), positions, np.empty(0, np.int64))  # commit the canvas
            stats.model_s += time.perf_counter() - t0
        except GenerationCancelled:
            answer.stop = "cancelled"
            break
        base += L
    tokens = answer.tokens()
    stats.tokens = int(tokens.size)
    stats.elapsed_s = time.perf_counter() - t_start
    yield FinalEvent(text="", tokens=tokens, stop_reason=answer.stop, stats=stats)


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
