"""DiffusionGemma on llama.cpp's gemma4 graph: block diffusion with an exact encoder cache.

The loop (transformers' `DiffusionGemmaGenerationMixin.generate`, read top to bottom):
1. the causal encoder runs over the prompt and writes the KV cache;
2. a canvas of uniformly random tokens starts; each step the decoder runs bidirectionally over
   the canvas (input: token embeddings mixed with the previous step's soft prediction by the
   self-conditioning MLP), reading the cache and leaving it as it was (the canvas cells are
   removed after the pass);
3. the entropy-bound sampler accepts the most certain positions and re-randomises the rest, until
   the draft is stable and confident or the steps run out;
4. the draft (argmax canvas) is committed through the causal encoder, which appends it to the
   cache; the next canvas starts after it, until an end token.

`--ar` decodes left to right with the causal encoder instead: the same weights as a causal LM.

Where each step's vocabulary-wide work runs: with dgchat's engine (patch level 3) on the backend
that computes the logits, inside llama.cpp's graph (the diffusion head: temperature, softmax,
entropy, argmax and the draw per canvas row, and the self-conditioning signal, which stays on the
device from one step to the next); only O(canvas) numbers reach Python. Otherwise (a stock
engine, or `sampler_on="host"`) in numpy: `SelfConditioning` builds the decoder input
embeddings and `sampling.row_stats` reads the logits. The numpy path is the specification the
backend path is tested against (same tokens for the same random draws).

llama.cpp's stock gemma4 graph runs the decoder pass approximately (global layers stay causal,
one set of layer scalars, per-row sliding window); dgchat's patched engine (engine/patches) is
exact. `label` says which one is running.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np

from dgchat.model_backend import llamacpp, sampling
from dgchat.model_backend.canvas import Canvas, Cell, decided_length
from dgchat.model_backend.diffusion_gemma_embed import SelfConditioning
from dgchat.model_backend.engine import DiffusionEngine
from dgchat.model_backend.entropy_bound import (
    EntropyBoundConfig,
    StabilityTracker,
    StepDraws,
    entropy_bound_update,
    temperature,
)
from dgchat.model_backend.errors import GenerationCancelled, InvalidParameterError
from dgchat.model_backend.events import FinalEvent, GenerationStats, StepEvent, StepTiming
from dgchat.model_backend.gguf_file import read_tensor
from dgchat.model_backend.logits_source import head_request
from dgchat.model_backend.masked_diffusion import CanvasTemplate, logit_bias_arrays
from dgchat.model_backend.param_resolution import resolve_params
from dgchat.model_backend.params import DiffusionParams
from dgchat.model_backend.sampling import RowStats, SampleSpec

# On a CPU backend above this vocabulary size the self-conditioning soft embedding uses each row's
# top-k tokens (softmax @ E is 256 x 262144 x d per step, ~190 GFLOP, for the 26B model); below
# it, and on a GPU, the exact product over the whole vocabulary.
EXACT_SOFT_EMBEDDING_VOCAB = 65536
SOFT_EMBEDDING_TOP_K = 256
# the backend keeps the transposed token embedding of the exact product in f32 up to this size, f16 above
EMBD_T_F32_BYTES = 512 << 20
# self-conditioning slots: 0 reads zero (a canvas's first step), 1 is unused; then one per canvas row
_FIRST_SLOT = 2


@dataclass(frozen=True)
class EncodeRequest:
    """Causal pass appending `tokens` at `positions` to the sequence's cache. Answered with the
    logits at `outputs` (indices into tokens), or with `sample` their RowStats."""

    tokens: np.ndarray
    positions: np.ndarray
    outputs: np.ndarray
    sample: SampleSpec | None = None


@dataclass(frozen=True)
class DenoiseRequest:
    """One denoising step: a bidirectional pass over `canvas` (token ids) at `positions`, its input
    mixed with the self-conditioning signal of this canvas's previous step unless `first_step`.
    Answered with the RowStats of every canvas row under `sample`; the cells are removed afterwards."""

    canvas: np.ndarray
    positions: np.ndarray
    sample: SampleSpec
    first_step: bool


Request = EncodeRequest | DenoiseRequest


class DgLlamaSource:
    """Answers the requests of one or several sequences (one sequence id each), batching the
    requests of a round into at most two llama.cpp calls (one causal, one bidirectional).

    On the backend (`on_backend`) the decoder reads token ids and the context's diffusion head
    computes the statistics and keeps each canvas row's self-conditioning signal in a device slot;
    on the host the decoder reads embeddings built in numpy from the sequence's previous processed
    logits, kept here."""

    def __init__(self, engine: DiffusionGemmaEngine, n_seq: int, per_seq_tokens: int, canvas: int, *,
                 on_backend: bool, soft_top_k: int | None) -> None:
        self.engine = engine
        self.n_seq = n_seq
        self.canvas = canvas
        self.on_backend = on_backend
        self.soft_top_k = soft_top_k
        self.ctx = engine._context_for(per_seq_tokens, n_seq=n_seq, batch_tokens=max(n_seq * canvas, 512))
        self.ctx.clear()
        self._processed: dict[int, np.ndarray] = {}  # host path: each sequence's last processed logits
        # tests: called as check(source, items, stats, logits) after every backend denoising decode,
        # which then also returns its logits
        self.check = engine.step_check
        if on_backend:
            self.ctx.configure_head(engine.head_setup(_FIRST_SLOT + n_seq * canvas, soft_top_k))

    def answer(self, requests: Sequence[tuple[int, Request]]) -> list[np.ndarray | RowStats]:
        results: list[np.ndarray | RowStats | None] = [None] * len(requests)
        enc = [(k, s, r) for k, (s, r) in enumerate(requests) if isinstance(r, EncodeRequest)]
        den = [(k, s, r) for k, (s, r) in enumerate(requests) if isinstance(r, DenoiseRequest)]
        if enc:
            self._encode(enc, results)
        if den:
            (self._denoise_backend if self.on_backend else self._denoise_host)(den, results)
        return results  # type: ignore[return-value]

    def _encode(self, items, results) -> None:
        ctx = self.ctx
        ctx.set_causal(True)
        limit = ctx.max_tokens
        sampled = self.on_backend and all(r.sample is not None for _, _, r in items)
        by_k = {k: r for k, _, r in items}
        # chunk long prompts; every chunk may carry tokens of several sequences
        flat = []
        for k, s, r in items:
            want = {int(i): j for j, i in enumerate(r.outputs)}  # token index -> output number
            for i in range(r.tokens.size):
                flat.append((k, s, int(r.tokens[i]), int(r.positions[i]), want.get(i, -1)))
        out_rows: dict[int, list] = {k: [] for k, _, _ in items}
        for a in range(0, len(flat), limit):
            chunk = flat[a : a + limit]
            tokens = np.array([c[2] for c in chunk], np.int32)
            pos = np.array([c[3] for c in chunk], np.int32)
            seqs = np.array([c[1] for c in chunk], np.int32)
            outs = np.array([i for i, c in enumerate(chunk) if c[4] >= 0], np.int64)
            if sampled and outs.size:
                specs = [by_k[chunk[i][0]].sample for i in outs]
                head = head_request(ctx, specs, np.arange(len(specs)), np.array([chunk[i][4] for i in outs]))
                stats = ctx.decode_tokens(tokens, pos, seq_ids=seqs, outputs=outs, head=head)
                for row, i in enumerate(outs):
                    out_rows[chunk[i][0]].append(stats.take(slice(row, row + 1)))
                continue
            logits = ctx.decode_tokens(tokens, pos, seq_ids=seqs, outputs=outs)
            for row, i in enumerate(outs):
                out_rows[chunk[i][0]].append(np.array(logits[row], copy=True))
        for k, _, r in items:
            rows = out_rows[k]
            if sampled:
                results[k] = RowStats.concat(rows)
                continue
            logits = np.stack(rows) if rows else np.empty((0, self.engine.model.n_vocab), np.float32)
            results[k] = logits if r.sample is None else r.sample.stats(logits)

    def slots(self, seq: int, n: int) -> np.ndarray:
        """The head's self-conditioning slots of a sequence's first n canvas rows."""
        return _FIRST_SLOT + seq * self.canvas + np.arange(n)

    @staticmethod
    def _positions(items) -> tuple[np.ndarray, np.ndarray]:
        """Positions and sequence ids of a round's canvases, concatenated."""
        pos = np.concatenate([r.positions for _, _, r in items]).astype(np.int32)
        seqs = np.concatenate([np.full(r.positions.size, s, np.int32) for _, s, r in items])
        return pos, seqs

    def _denoise_backend(self, items, results) -> None:
        ctx = self.ctx
        ctx.set_causal(False)
        tokens = np.concatenate([r.canvas for _, _, r in items]).astype(np.int32)
        pos, seqs = self._positions(items)
        sizes = [r.canvas.size for _, _, r in items]
        writes = np.concatenate([self.slots(s, r.canvas.size) for _, s, r in items])
        reads = np.concatenate([np.zeros(r.canvas.size, np.int64) if r.first_step else self.slots(s, r.canvas.size)
                                for _, s, r in items])
        head = head_request(ctx, [r.sample for _, _, r in items], np.repeat(np.arange(len(items)), sizes),
                            sc_write=writes.astype(np.int32), sc_read=reads.astype(np.int32),
                            keep_logits=self.check is not None)
        stats = ctx.decode_tokens(tokens, pos, seq_ids=seqs, head=head)
        if self.check is not None:
            self.check(self, items, *stats)
            stats = stats[0]
        for (k, _, _), part in zip(items, stats.split(sizes)):
            results[k] = part
        for _, s, r in items:
            ctx.seq_rm(s, int(r.positions[0]))  # the decoder reads the cache, never writes it

    def _denoise_host(self, items, results) -> None:
        ctx = self.ctx
        ctx.set_causal(False)
        engine = self.engine
        t0 = time.perf_counter()
        emb = np.concatenate([
            engine.selfcond.decoder_inputs(engine.embedding, r.canvas, None if r.first_step else self._processed[s],
                                           top_k=self.soft_top_k)
            for _, s, r in items
        ])
        host_s = time.perf_counter() - t0
        pos, seqs = self._positions(items)
        logits = ctx.decode_embeddings(emb, pos, seq_ids=seqs)
        t0 = time.perf_counter()
        start = 0
        stats: list[tuple[int, RowStats]] = []
        for k, s, r in items:
            n = r.positions.size
            x = np.array(logits[start : start + n], copy=True)
            start += n
            if r.sample.bias_ids.size:
                x[:, r.sample.bias_ids] += r.sample.bias_values
            processed = (x * np.float32(r.sample.inv_temp)).astype(np.float32)  # as the backend scales
            self._processed[s] = processed
            stats.append((k, sampling.row_stats(processed, inv_temp=1.0, uniform=r.sample.uniform)))
        host_s += time.perf_counter() - t0
        for k, st in stats:
            results[k] = replace(st, host_s=host_s)
        for _, s, r in items:
            ctx.seq_rm(s, int(r.positions[0]))  # the decoder reads the cache, never writes it


@dataclass(frozen=True)
class DgSetup:
    eog: np.ndarray
    n_vocab: int
    pad: int | None = None  # the pad token, which params.pad_bias biases


Coroutine = Generator["Request | StepEvent | FinalEvent", "np.ndarray | RowStats | None", None]


def dg_denoiser(
    prompt: np.ndarray,
    params: DiffusionParams,
    setup: DgSetup,
    *,
    cancel: threading.Event | None = None,
    template: CanvasTemplate | None = None,
) -> Coroutine:
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
               cancel: threading.Event | None = None) -> Coroutine:
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


def drive_dg(coroutines: list[Coroutine], source: DgLlamaSource) -> Iterator[tuple[int, StepEvent | FinalEvent]]:
    """Run one or several coroutines in lock-step, one batched round of requests at a time."""
    pending: dict[int, object] = {i: next(c) for i, c in enumerate(coroutines)}
    while pending:
        for i in list(pending):
            message = pending[i]
            while not isinstance(message, (EncodeRequest, DenoiseRequest)):
                yield i, message
                if isinstance(message, FinalEvent):
                    del pending[i]
                    break
                message = next(coroutines[i])
            else:
                pending[i] = message
        if not pending:
            return
        order = list(pending)
        try:
            results = source.answer([(i, pending[i]) for i in order])
        except GenerationCancelled as exc:
            for i in order:
                pending[i] = coroutines[i].throw(exc)
            continue
        for i, logits in zip(order, results):
            pending[i] = coroutines[i].send(logits)


class DiffusionGemmaEngine(DiffusionEngine):
    def __init__(self, model: llamacpp.LlamaModel, info, *, n_threads: int | None = None, precise: bool = False) -> None:
        super().__init__(model, info, n_threads=n_threads, precise=precise)
        self.selfcond = SelfConditioning.from_gguf(model.header)
        self._embedding: np.ndarray | None = None
        extra = model.header.get("dgchat.diffusion.eos_token_ids") or []
        self._eog = np.unique(np.concatenate([self._eog, np.asarray(extra, dtype=np.int32)])).astype(np.int32)
        self.exact = llamacpp.engine_info().exact_diffusion_gemma
        self._head_setups: dict[int | None, llamacpp.HeadSetup] = {}
        llamacpp.set_blas_threads(self._sampler_blas_threads())

    @property
    def embedding(self) -> np.ndarray:
        """token_embd as float32 [V, d], for the host path only: read from the file on first use
        (2.95 GB for the 26B model; the backend path never needs it)."""
        if self._embedding is None:
            self._embedding = read_tensor(self.model.header, "token_embd.weight").astype(np.float32, copy=False)
        return self._embedding

    def _sampler_blas_threads(self) -> int:
        """One BLAS thread unless a host step's numpy products are big enough to gain from more (the
        26B model's self-conditioning MLP is ~9 GFLOP a step; the bundled model's ~0.2)."""
        canvas = int(self.info.defaults.get("gen_length") or 256)
        vocab, d = self.model.n_vocab, self.model.n_embd
        inter = self.selfcond.gate.shape[0]
        soft = 0 if vocab > EXACT_SOFT_EMBEDDING_VOCAB else 2 * canvas * vocab * d  # above it: top-k, no BLAS
        flops = soft + 6 * canvas * d * inter
        if flops < 2e9:
            return 1
        return self.n_threads or os.cpu_count() or 1

    @property
    def label(self) -> str:
        if self.exact:
            return "DiffusionGemma, exact engine"
        return "DiffusionGemma, APPROXIMATE (stock llama.cpp: install with README's command for the exact engine)"

    def resolve(self, params: DiffusionParams | None = None) -> DiffusionParams:
        params = resolve_params(self.info, params or DiffusionParams()).params  # model_backend/param_resolution
        if params.sampler_on == "backend" and not self.backend_sampler:
            raise InvalidParameterError("--sampler-on backend needs dgchat's engine (patch level 3: README's "
                                        "install command); this llama-cpp-python samples on the host only")
        return params

    def soft_top_k(self, params: DiffusionParams, on_backend: bool) -> int | None:
        """How the self-conditioning soft embedding is computed: None for the exact product over
        the whole vocabulary, k for each row's k most likely tokens. Auto: exact where the logits
        are computed on a GPU or the vocabulary is small; top-k on a CPU for large vocabularies."""
        if params.soft_embedding == "exact":
            return None
        if params.soft_embedding == "top-k":
            return SOFT_EMBEDDING_TOP_K
        if (on_backend and self.model.output_on_gpu) or self.model.n_vocab <= EXACT_SOFT_EMBEDDING_VOCAB:
            return None
        return SOFT_EMBEDDING_TOP_K

    def head_setup(self, n_slots: int, soft_top_k: int | None) -> llamacpp.HeadSetup:
        """The diffusion head's configuration, one per soft-embedding form, grown as needed (a new
        one re-uploads the weights, and for the exact form the transposed embedding)."""
        setup = self._head_setups.get(soft_top_k)
        if setup is None or setup.n_slots < n_slots or setup.self_conditioning.source is not self.selfcond:
            sc = self.selfcond
            weights = llamacpp.SelfConditioningWeights(sc.pre_norm, sc.gate, sc.up, sc.down, sc.embed_scale, sc.eps,
                                                       source=sc)
            big = self.model.n_vocab * self.model.n_embd * 4 > EMBD_T_F32_BYTES
            n = max(n_slots, _FIRST_SLOT + 1024, 2 * setup.n_slots if setup is not None else 0)
            setup = llamacpp.HeadSetup(weights, n_slots=n, soft_top_k=soft_top_k or 0, embd_t_f16=big)
            self._head_setups[soft_top_k] = setup
        return setup

    def check_fits(self, prompt_tokens: int, params: DiffusionParams) -> None:
        # the last canvas is decoded after the committed ones: prompt + answer + one canvas
        super().check_fits(prompt_tokens, params.updated(max_tokens=int(params.max_tokens) + int(params.gen_length)))

    def _setup(self) -> DgSetup:
        return DgSetup(self._eog, self.model.n_vocab, self.model.pad)

    def _coroutine(self, prompt, params, cancel, template) -> Coroutine:
        if params.autoregressive:
            if template is not None:
                raise InvalidParameterError("infill needs diffusion; it cannot run with --ar")
            return ar_decoder(prompt, params, self._setup(), cancel=cancel)
        return dg_denoiser(prompt, params, self._setup(), cancel=cancel, template=template)

    def _source(self, params: Sequence[DiffusionParams], per_seq: int, canvas: int) -> DgLlamaSource:
        modes = {self.on_backend(p) for p in params}
        forms = {self.soft_top_k(p, self.on_backend(p)) for p in params}
        if len(modes) > 1 or len(forms) > 1:
            raise InvalidParameterError("sequences decoded together must share --sampler-on and --soft-embedding")
        return DgLlamaSource(self, len(params), per_seq, canvas, on_backend=modes.pop(), soft_top_k=forms.pop())

    def _run(self, coroutines: list[Coroutine], source: DgLlamaSource, params: Sequence[DiffusionParams]):
        for i, event in drive_dg(coroutines, source):
            if isinstance(event, FinalEvent):
                if not params[i].autoregressive:
                    event.stats.soft_embedding = "exact" if source.soft_top_k is None else f"top-{source.soft_top_k}"
                event = self._finish(event, source.on_backend)
            yield i, event

    def generate(self, prompt_tokens, params=None, *, cancel=None, template=None):
        params = self.resolve(params)
        prompt_tokens = self._check_prompt(prompt_tokens, params, template)
        with self._lock:
            per_seq = int(prompt_tokens.size + params.max_tokens + params.gen_length)
            source = self._source([params], per_seq, int(params.gen_length))
            coroutine = self._coroutine(prompt_tokens, params, cancel, template)
            events = (event for _, event in self._run([coroutine], source, [params]))
            yield from self._with_cancel(events, cancel)

    def generate_batch(self, prompts, params, *, cancel=None, templates=None):
        if len(prompts) != len(params):
            raise InvalidParameterError("one parameter set per prompt")
        templates = list(templates) if templates is not None else [None] * len(prompts)
        resolved = [self.resolve(p) for p in params]
        prompts = [self._check_prompt(t, p, tpl) for t, p, tpl in zip(prompts, resolved, templates)]
        with self._lock:
            per_seq = max(int(t.size + p.max_tokens + p.gen_length) for t, p in zip(prompts, resolved))
            canvas = max(int(p.gen_length) for p in resolved)
            source = self._source(resolved, per_seq, canvas)
            coroutines = [self._coroutine(t, p, cancel, tpl) for t, p, tpl in zip(prompts, resolved, templates)]
            yield from self._with_cancel(self._run(coroutines, source, resolved), cancel)

    def pseudo_log_likelihood(self, context: np.ndarray, answer: np.ndarray, *, groups: int = 4) -> np.ndarray:
        """Per-token log p(answer_i | context, answer_<i) under the causal encoder: the model read as
        the causal LM its encoder is (`groups` is ignored)."""
        context = np.asarray(context, dtype=np.int32)
        answer = np.asarray(answer, dtype=np.int32)
        if answer.size == 0:
            return np.zeros(0)
        seq = np.concatenate([context, answer])
        with self._lock:
            source = DgLlamaSource(self, 1, int(seq.size), 64, on_backend=False, soft_top_k=None)
            outputs = np.arange(context.size - 1, seq.size - 1)
            (logits,) = source.answer([(0, EncodeRequest(seq, np.arange(seq.size, dtype=np.int32), outputs))])
            source.ctx.clear()
        logits = logits.astype(np.float64)
        m = logits.max(axis=1, keepdims=True)
        logz = m[:, 0] + np.log(np.exp(logits - m).sum(axis=1))
        return logits[np.arange(answer.size), answer] - logz


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts).astype(np.int32) if parts else np.empty(0, dtype=np.int32)
