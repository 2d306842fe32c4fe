"""Block diffusion (SDAR, BD3LM): the answer written block after block, each block denoised in place.

Readable top to bottom (docs/BLOCK_DIFFUSION.md has the attention and the file layout):

1. the prompt's whole blocks go through the model once (one `EncodeRequest`; the engine's
   block-causal mask makes that exact) and stay cached;
2. each block starts as masks (SDAR's first block also holds the prompt's last, partial block,
   whose tokens are fixed); every step is one `DenoiseRequest` for the block's masked positions,
   which proposes a token per position (argmax, or a draw at temperature > 0) and commits the
   positions the variant's rule picks:
   - sdar (JetAstra/SDAR generate.py `block_diffusion_generate`, `low_confidence_dynamic`): k =
     `even_split(B, steps)[step]` tokens a step, and every masked position whose confidence (the
     chosen token's probability) is strictly above `threshold` when at least k are;
   - bd3lm (dllm's `BD3LMSampler.sample`, `low_confidence`): the k most confident, k from the
     linear schedule over the block's masks (`schedules.linear_transfer_counts`); its confidence is
     the token's probability under softmax(logits) at temperature 1;
3. a finished block is stored in the cache by decoding it once more with its final tokens; that
   pass rides along with the next block's first step (`DenoiseRequest.commit`);
4. the answer ends at an end token (cut there) or at max_tokens.

Where dgchat differs from the published loops, on purpose:
- the mask token is never proposed (a committed mask would leave the position masked: SDAR's loop
  then runs past its step list and fails);
- picks are restricted to masked positions (SDAR's torch.topk over confidences where decided
  positions are -inf could overwrite decided, even prompt, positions when fewer masks remain than k);
- the generation stops as soon as an end token is decided with everything before it decided; the
  published loops check at block ends and would spend more passes on positions after the end,
  which the answer cuts anyway, so the answer is the same;
- every id that ends a turn ends the answer (SDAR: generation_config's eos ids; dllm: the
  tokenizer's eos alone);
- a draw at temperature > 0 is an inverse-CDF draw from softmax(logits / T) (SDAR:
  torch.multinomial; dllm: Gumbel-max, the same distribution); top-p is applied before the
  temperature (the diffusion head's order; SDAR applies it after: the same at top_p = 1, SDAR's
  default).

The coroutine never touches the model: it yields requests (requests.py) and events (events.py), and
the driver (driver.drive) answers them with a logits source (block_source.BlockLlamaSource).
"""

from __future__ import annotations

import threading
import time

import numpy as np

from dgchat.model_backend import sampling, schedules
from dgchat.model_backend.answer_blocks import AnswerBlocks
from dgchat.model_backend.canvas import Canvas, decided_length
from dgchat.model_backend.driver import Denoiser
from dgchat.model_backend.errors import GenerationCancelled
from dgchat.model_backend.events import FinalEvent, GenerationStats, StepEvent, StepTiming
from dgchat.model_backend.masked_diffusion import first_end, logit_bias_arrays
from dgchat.model_backend.params import DiffusionParams
from dgchat.model_backend.requests import BlockSetup, DenoiseRequest, EncodeRequest
from dgchat.model_backend.sampling import Proposal, RowStats, SampleSpec

VARIANTS = ("sdar", "bd3lm")
NO_INFILL = ("block diffusion writes left to right, one block after another: a position cannot see text "
             "to the right of its block, so it cannot fill in a gap between given texts (infill)")


def prompt_offset(prompt_tokens: int, setup: BlockSetup) -> int:
    """Sequence position of the prompt's first token: 0 for SDAR (blocks counted from the start);
    BD3LM's left padding to a whole number of blocks, so the prompt ends on a block boundary (no pad
    token is written: RoPE sees only position differences, docs/BLOCK_DIFFUSION.md)."""
    return (-prompt_tokens) % setup.block_size if setup.variant == "bd3lm" else 0


def sequence_length(prompt_tokens: int, max_tokens: int, setup: BlockSetup) -> int:
    """Positions an answer of up to max_tokens may reach: offset, prompt, answer, a block's overrun."""
    return prompt_offset(prompt_tokens, setup) + prompt_tokens + max_tokens + setup.block_size


def step_counts(setup: BlockSetup, steps: int, masked: int) -> list[int]:
    """Tokens each step of a block commits (at least; SDAR's dynamic rule may commit more)."""
    if setup.variant == "bd3lm":
        return schedules.linear_transfer_counts(masked, steps)
    return schedules.even_split(setup.block_size, steps)


def pick(confidence: np.ndarray, k: int, threshold: float | None) -> np.ndarray:
    """Which of the masked positions (their `confidence`) a step commits."""
    k = max(1, min(int(k), confidence.size))
    if threshold is not None:  # SDAR's dynamic rule (dgchat applies it to BD3LM too when asked)
        return sampling.choose_dynamic(confidence, k, threshold)
    return np.argsort(-confidence, kind="stable")[:k]


def host_proposal(logits: np.ndarray, spec: SampleSpec) -> Proposal:
    """BD3LM at temperature > 0, from logits: the token drawn from softmax(logits / T) (top-k/top-p as
    SampleSpec), its confidence the token's probability under softmax(logits) at temperature 1."""
    stats = spec.stats(logits)
    x = np.array(logits, dtype=np.float32, copy=True)
    if spec.bias_ids.size:
        x[:, spec.bias_ids] += spec.bias_values
    probs, _ = sampling.softmax_and_entropy(x)
    conf = probs[np.arange(x.shape[0]), stats.drawn]
    return Proposal(stats.drawn.astype(np.int32), conf.astype(np.float32))


def block_denoiser(
    prompt: np.ndarray,
    params: DiffusionParams,
    setup: BlockSetup,
    *,
    cancel: threading.Event | None = None,
) -> Denoiser:
    """One answer by block diffusion. `params` must be resolved (the engine's resolve)."""
    B = setup.block_size
    P = int(prompt.size)
    offset = prompt_offset(P, setup)
    start = offset + P  # position of the first answer token
    first = (start // B) * B  # the first answer block's start; prompt tokens before it are whole blocks
    tail = prompt[first - offset:].astype(np.int32)  # the prompt's partial block (SDAR), fixed in the first block
    steps = int(params.steps)
    threshold = float(params.threshold) if params.threshold is not None else None
    temperature = float(params.temperature or 0.0)
    top_k, top_p = int(params.top_k or 0), 1.0 if params.top_p is None else float(params.top_p)
    # bd3lm's confidence at temperature > 0 is the untempered probability: sampled on the host
    host_rows = setup.variant == "bd3lm" and temperature > 0.0
    rng = np.random.default_rng(params.seed)
    is_eog = np.zeros(setup.n_vocab, dtype=bool)
    is_eog[setup.eog] = True
    bias_ids, bias_values = logit_bias_arrays(params.logit_bias)
    bias_ids = np.append(bias_ids, setup.mask_token).astype(np.int64)  # never propose the mask token
    bias_values = np.append(bias_values, np.float32(-np.inf)).astype(np.float32)
    answer = AnswerBlocks(int(params.max_tokens), is_eog, early_stop=params.early_stop)
    stats = GenerationStats(prompt_tokens=P)
    t_start = time.perf_counter()

    if first > offset:
        t0 = time.perf_counter()
        try:
            yield EncodeRequest(prompt[: first - offset].astype(np.int32), np.arange(offset, first, dtype=np.int32),
                                np.empty(0, np.int64))
        except GenerationCancelled:
            answer.stop = "cancelled"
        stats.prompt_s = time.perf_counter() - t0
        stats.model_s += stats.prompt_s

    commit: tuple[np.ndarray, np.ndarray] | None = None
    block_start = first
    block_index = 0
    while answer.stop != "cancelled":
        fixed = tail.size if block_index == 0 else 0
        room = answer.max_tokens - answer.n  # answer tokens still allowed
        # bd3lm writes a shorter last block (dllm: min(block_size, max_new_tokens - generated))
        length = min(B, fixed + room) if setup.variant == "bd3lm" else B
        canvas = np.full(length, setup.mask_token, dtype=np.int32)
        canvas[:fixed] = tail[:fixed]
        positions = np.arange(block_start, block_start + length, dtype=np.int32)
        shown = Canvas.blank(length - fixed, setup.mask_token)
        counts = step_counts(setup, steps, length - fixed)
        end_at: int | None = None
        step = 0
        while end_at is None:
            masked = np.flatnonzero(canvas == setup.mask_token)
            masked = masked[masked >= fixed]
            if masked.size == 0:
                break
            if cancel is not None and cancel.is_set():
                answer.stop = "cancelled"
                break
            t0 = time.perf_counter()
            spec = SampleSpec(temperature, top_k, top_p, sampling.draw_uniform(masked.size, temperature, rng),
                              bias_ids=bias_ids, bias_values=bias_values)
            t1 = time.perf_counter()
            try:
                got = yield DenoiseRequest(canvas.copy(), positions, None if host_rows else spec, step == 0,
                                           rows=masked, commit=commit)
            except GenerationCancelled:
                answer.stop = "cancelled"
                break
            t2 = time.perf_counter()
            commit = None
            # vocabulary-wide work a source did on the host inside the pass counts as sampler time
            host_s = got.host_s if isinstance(got, RowStats) else 0.0
            if host_rows:
                proposal = host_proposal(got, spec)
            else:
                proposal = sampling.proposal(spec.stats(got), greedy=spec.uniform is None, algorithm="confidence",
                                             rng=rng)
            k = counts[step] if step < len(counts) else masked.size
            chosen = pick(proposal.confidence, k, threshold)
            canvas[masked[chosen]] = proposal.tokens[chosen]
            stats.steps += 1
            step += 1
            shown.commit(masked[chosen] - fixed, proposal.tokens[chosen], proposal.confidence[chosen], stats.steps)
            if params.early_stop:
                end_at = first_end(shown, is_eog)
            t3 = time.perf_counter()
            model_s = t2 - t1 - host_s
            sampler_s = (t1 - t0) + (t3 - t2) + host_s
            stats.model_s += model_s
            stats.sampler_s += sampler_s
            yield StepEvent(
                step=stats.steps, total_steps=steps, canvas_index=block_index, canvas_step=step,
                canvas=shown.snapshot(), answer_tokens=answer.so_far(), committed=shown.n_decided,
                canvas_length=length - fixed, timing=StepTiming(1000 * model_s, 1000 * sampler_s),
                elapsed_s=time.perf_counter() - t_start,
            )
        stats.canvases += 1
        if answer.stop == "cancelled":
            shown.settle()
            answer.cancel(shown.tokens[: decided_length(shown.state)])
            break
        if end_at is not None:
            answer.finish(shown.tokens[: end_at + 1])
            break
        if answer.finish(canvas[fixed:]):
            break
        commit = (canvas, positions)
        block_start += length
        block_index += 1

    tokens = answer.tokens()
    stats.tokens = int(tokens.size)
    stats.elapsed_s = time.perf_counter() - t_start
    yield FinalEvent(text="", tokens=tokens, stop_reason=answer.stop, stats=stats)

