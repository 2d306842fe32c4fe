"""`--ar`: a diffusion model's weights decoded left to right as a causal LM, one token a pass.

DiffusionGemma's causal encoder and block-diffusion models (SDAR, BD3LM) with causal attention are
ordinary causal LMs; their engines run this coroutine (driver.drive) with a source that answers its
`EncodeRequest`s causally. Its events show the answer in chunks of `gen_length` tokens.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from dgchat.model_backend import sampling
from dgchat.model_backend.canvas import Canvas
from dgchat.model_backend.driver import Denoiser
from dgchat.model_backend.errors import GenerationCancelled
from dgchat.model_backend.events import FinalEvent, GenerationStats, StepEvent, StepTiming
from dgchat.model_backend.masked_diffusion import logit_bias_arrays
from dgchat.model_backend.params import DiffusionParams
from dgchat.model_backend.requests import EncodeRequest
from dgchat.model_backend.sampling import SampleSpec


def ar_decoder(prompt: np.ndarray, params: DiffusionParams, eog: np.ndarray, n_vocab: int, *,
               cancel: threading.Event | None = None) -> Denoiser:
    """Left-to-right decoding: one token a pass. `eog`: the ids that end the answer."""
    max_tokens = int(params.max_tokens or params.gen_length or 256)
    rng = np.random.default_rng(params.seed)
    is_eog = np.zeros(n_vocab, dtype=bool)
    is_eog[eog] = True
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
        stats.prompt_s = time.perf_counter() - t0  # the prompt's pass, which also gives the first token
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
