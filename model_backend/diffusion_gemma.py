"""DiffusionGemma on llama.cpp's gemma4 graph: block diffusion with an exact encoder cache.

The loop (transformers' `DiffusionGemmaGenerationMixin.generate`, read top to bottom):
1. the causal encoder runs over the prompt and writes the KV cache;
2. a canvas of uniformly random tokens starts; each step the decoder runs bidirectionally over
   the canvas (input: token embeddings mixed with the previous step's soft prediction by the
   self-conditioning MLP, computed here in numpy and passed as embeddings), reading the cache and
   leaving it as it was (the canvas cells are removed after the pass);
3. `entropy_bound_step` accepts the most certain positions and re-randomises the rest, until the
   draft is stable and confident or the steps run out;
4. the draft (argmax canvas) is committed through the causal encoder, which appends it to the
   cache; the next canvas starts after it, until an end token.

`--ar` decodes left to right with the causal encoder instead: the same weights as a causal LM.

llama.cpp's stock gemma4 graph runs the decoder pass approximately (global layers stay causal,
one set of layer scalars, per-row sliding window); dgchat's patched engine (engine/patches) is
exact. `label` says which one is running.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from dgchat.model_backend import llamacpp, sampling
from dgchat.model_backend.canvas import Canvas, Cell
from dgchat.model_backend.diffusion_gemma_embed import SelfConditioning
from dgchat.model_backend.engine import DiffusionEngine
from dgchat.model_backend.entropy_bound import (
    EntropyBoundConfig,
    StabilityTracker,
    StepDraws,
    entropy_bound_step,
)
from dgchat.model_backend.errors import GenerationCancelled, InvalidParameterError
from dgchat.model_backend.events import FinalEvent, GenerationStats, StepEvent, StepTiming
from dgchat.model_backend.gguf_file import read_tensor
from dgchat.model_backend.masked_diffusion import CanvasTemplate, logit_bias_arrays
from dgchat.model_backend.params import DiffusionParams

# Above this vocabulary size the self-conditioning soft embedding uses each row's top-k tokens
# (256 x 262144 x d per step is ~190 GFLOP for the 26B model); below it, the exact full softmax.
EXACT_SOFT_EMBEDDING_VOCAB = 65536
SOFT_EMBEDDING_TOP_K = 256


@dataclass(frozen=True)
class EncodeRequest:
    """Causal pass appending `tokens` at `positions` to the sequence's cache; logits at `outputs`
    (indices into tokens)."""

    tokens: np.ndarray
    positions: np.ndarray
    outputs: np.ndarray


@dataclass(frozen=True)
class DenoiseRequest:
    """Bidirectional pass over canvas embeddings at `positions`; the cells are removed afterwards."""

    embeddings: np.ndarray
    positions: np.ndarray


Request = EncodeRequest | DenoiseRequest


class DgLlamaSource:
    """Answers the requests of one or several sequences (one sequence id each), batching the
    requests of a round into at most two llama.cpp calls (one causal, one bidirectional)."""

    def __init__(self, engine: DiffusionGemmaEngine, n_seq: int, per_seq_tokens: int, canvas: int) -> None:
        self.engine = engine
        self.n_seq = n_seq
        self.ctx = engine._context_for(per_seq_tokens, n_seq=n_seq, batch_tokens=max(n_seq * canvas, 512))
        self.ctx.clear()

    def answer(self, requests: Sequence[tuple[int, Request]]) -> list[np.ndarray]:
        results: list[np.ndarray | None] = [None] * len(requests)
        enc = [(k, s, r) for k, (s, r) in enumerate(requests) if isinstance(r, EncodeRequest)]
        den = [(k, s, r) for k, (s, r) in enumerate(requests) if isinstance(r, DenoiseRequest)]
        if enc:
            self._encode(enc, results)
        if den:
            self._denoise(den, results)
        return results  # type: ignore[return-value]

    def _encode(self, items, results) -> None:
        ctx = self.ctx
        ctx.set_causal(True)
        limit = ctx.max_tokens
        # chunk long prompts; every chunk may carry tokens of several sequences
        flat = []
        for k, s, r in items:
            want = set(int(i) for i in r.outputs)
            for i in range(r.tokens.size):
                flat.append((k, s, int(r.tokens[i]), int(r.positions[i]), i in want))
        out_rows: dict[int, list[np.ndarray]] = {k: [] for k, _, _ in items}
        for a in range(0, len(flat), limit):
            chunk = flat[a : a + limit]
            tokens = np.array([c[2] for c in chunk], np.int32)
            pos = np.array([c[3] for c in chunk], np.int32)
            seqs = np.array([c[1] for c in chunk], np.int32)
            outs = np.array([i for i, c in enumerate(chunk) if c[4]], np.int64)
            logits = ctx.decode_tokens(tokens, pos, seq_ids=seqs, outputs=outs)
            for row, i in enumerate(outs):
                out_rows[chunk[i][0]].append(np.array(logits[row], copy=True))
        for k, _, _ in items:
            rows = out_rows[k]
            results[k] = np.stack(rows) if rows else np.empty((0, self.engine.model.n_vocab), np.float32)

    def _denoise(self, items, results) -> None:
        ctx = self.ctx
        ctx.set_causal(False)
        emb = np.concatenate([r.embeddings for _, _, r in items])
        pos = np.concatenate([r.positions for _, _, r in items]).astype(np.int32)
        seqs = np.concatenate([np.full(r.positions.size, s, np.int32) for _, s, r in items])
        logits = ctx.decode_embeddings(emb, pos, seq_ids=seqs)
        start = 0
        for k, s, r in items:
            n = r.positions.size
            results[k] = np.array(logits[start : start + n], copy=True)
            start += n
        for _, s, r in items:
            ctx.seq_rm(s, int(r.positions[0]))  # the decoder reads the cache, never writes it


@dataclass(frozen=True)
class DgSetup:
    selfcond: SelfConditioning
    embedding: np.ndarray  # token_embd as float32 [V, d]
    eog: np.ndarray
    n_vocab: int
    soft_top_k: int | None


Coroutine = Generator["Request | StepEvent | FinalEvent", "np.ndarray | None", None]


def dg_denoiser(
    prompt: np.ndarray,
    params: DiffusionParams,
    setup: DgSetup,
    *,
    cancel: threading.Event | None = None,
    template: CanvasTemplate | None = None,
) -> Coroutine:
    """One answer by block diffusion. Yields requests (sent back logits), StepEvents, a FinalEvent."""
    L = int(template.tokens.size if template is not None else params.gen_length)
    max_tokens = L if template is not None else int(params.max_tokens or L)
    cfg = EntropyBoundConfig(int(params.steps), float(params.entropy_bound), float(params.t_min),
                             float(params.t_max), int(params.stability_threshold), float(params.confidence_threshold))
    rng = np.random.default_rng(params.seed)
    V = setup.n_vocab
    is_eog = np.zeros(V, dtype=bool)
    is_eog[setup.eog] = True
    bias_ids, bias_values = logit_bias_arrays(params.logit_bias)
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
        sc_logits: np.ndarray | None = None
        tracker = StabilityTracker(cfg.stability_threshold, cfg.confidence_threshold)
        shown = Canvas.blank(L, 0)
        positions = np.arange(base, base + L, dtype=np.int32)
        canvas_step = 0
        for cur_step in range(cfg.steps, 0, -1):
            if cancel is not None and cancel.is_set():
                cancelled = True
                break
            t0 = time.perf_counter()
            emb = setup.selfcond.decoder_inputs(setup.embedding, current, sc_logits, top_k=setup.soft_top_k)
            t1 = time.perf_counter()
            try:
                logits = yield DenoiseRequest(emb, positions)
            except GenerationCancelled:
                cancelled = True
                break
            t2 = time.perf_counter()
            if bias_ids.size:
                logits[:, bias_ids] += bias_values
            result = entropy_bound_step(current, logits, cur_step, cfg, StepDraws.draw(rng, L, V), fixed)
            current, draft, sc_logits = result.canvas, result.argmax, result.processed
            done = tracker.update(result.argmax, result.mean_entropy)
            t3 = time.perf_counter()
            stats.steps += 1
            canvas_step += 1
            stats.model_s += t2 - t1
            stats.sampler_s += (t1 - t0) + (t3 - t2)
            _show(shown, draft, result.accepted, fixed, stats.steps)
            yield StepEvent(
                step=stats.steps, total_steps=cfg.steps, canvas_index=canvas_index, canvas_step=canvas_step,
                canvas=shown.snapshot(), answer_tokens=_joined(answer),
                committed=int(np.count_nonzero(shown.state != Cell.MASKED)), canvas_length=L,
                timing=StepTiming(1000 * (t2 - t1), 1000 * ((t1 - t0) + (t3 - t2))),
                elapsed_s=time.perf_counter() - t_start, uniform_state=True,
            )
            if done:
                break
        stats.canvases += 1
        if cancelled:
            undecided = np.flatnonzero(shown.state == Cell.MASKED)
            kept = draft[: undecided[0]] if undecided.size else draft
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
    stats = GenerationStats(prompt_tokens=int(prompt.size))
    t_start = time.perf_counter()
    out: list[int] = []
    stop = "max_tokens"
    chunk = int(params.gen_length or 64)
    shown = Canvas.blank(chunk, 0)
    try:
        t0 = time.perf_counter()
        logits = yield EncodeRequest(prompt.astype(np.int32), np.arange(prompt.size, dtype=np.int32),
                                     np.array([prompt.size - 1]))
        stats.model_s += time.perf_counter() - t0
        while len(out) < max_tokens:
            if cancel is not None and cancel.is_set():
                stop = "cancelled"
                break
            t1 = time.perf_counter()
            row = np.array(logits[-1:], dtype=np.float32)
            if bias_ids.size:
                row[:, bias_ids] += bias_values
            prop = sampling.propose(row, temperature=float(params.temperature or 0.0), top_k=params.top_k or 0,
                                    top_p=1.0 if params.top_p is None else params.top_p, algorithm="confidence", rng=rng)
            tok = int(prop.tokens[0])
            t2 = time.perf_counter()
            stats.sampler_s += t2 - t1
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
                canvas_length=chunk, timing=StepTiming(1000 * (t1 - t0), 1000 * (t2 - t1)),
                elapsed_s=time.perf_counter() - t_start,
            )
            if len(out) >= max_tokens:
                break
            t0 = time.perf_counter()
            pos = prompt.size + len(out) - 1
            logits = yield EncodeRequest(np.array([tok], np.int32), np.array([pos], np.int32), np.array([0]))
            stats.model_s += time.perf_counter() - t0
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
        self.embedding = read_tensor(model.header, "token_embd.weight").astype(np.float32, copy=False)
        extra = model.header.get("dgchat.diffusion.eos_token_ids") or []
        self._eog = np.unique(np.concatenate([self._eog, np.asarray(extra, dtype=np.int32)])).astype(np.int32)
        self.exact = llamacpp.engine_info().exact_diffusion_gemma
        llamacpp.set_blas_threads(self._sampler_blas_threads())

    def _sampler_blas_threads(self) -> int:
        """One BLAS thread unless a step's numpy products are big enough to gain from more (the
        26B model's self-conditioning MLP is ~9 GFLOP a step; the bundled model's ~0.2)."""
        canvas = int(self.info.defaults.get("gen_length") or 256)
        vocab, d = self.embedding.shape
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
        params = (params or DiffusionParams()).with_defaults(self.info.defaults)
        params = params.with_defaults({"gen_length": 256, "steps": 48, "temperature": 0.0, "top_k": 0, "top_p": 1.0})
        if params.max_tokens is None:
            params = params.updated(max_tokens=max(int(params.gen_length), 256))
        if params.mode == "reference":
            raise InvalidParameterError("reference mode reproduces llama.cpp's masked-diffusion example; "
                                        "DiffusionGemma is uniform-state diffusion")
        if params.cache not in ("none", "auto"):
            raise InvalidParameterError("DiffusionGemma always caches its encoder exactly; --cache does not apply")
        params = params.updated(cache="none")  # no masked-diffusion cache: the encoder cache is exact
        if params.block_length is not None or params.threshold is not None or params.factor is not None:
            raise InvalidParameterError("--block-length/--threshold/--factor are masked-diffusion options; "
                                        "DiffusionGemma uses --entropy-bound")
        params.validate()
        return params

    def check_fits(self, prompt_tokens: int, params: DiffusionParams) -> None:
        # the last canvas is decoded after the committed ones: prompt + answer + one canvas
        super().check_fits(prompt_tokens, params.updated(max_tokens=int(params.max_tokens) + int(params.gen_length)))

    def _setup(self) -> DgSetup:
        top_k = None if self.model.n_vocab <= EXACT_SOFT_EMBEDDING_VOCAB else SOFT_EMBEDDING_TOP_K
        return DgSetup(self.selfcond, self.embedding, self._eog, self.model.n_vocab, top_k)

    def _coroutine(self, prompt, params, cancel, template) -> Coroutine:
        if params.autoregressive:
            if template is not None:
                raise InvalidParameterError("infill needs diffusion; it cannot run with --ar")
            return ar_decoder(prompt, params, self._setup(), cancel=cancel)
        return dg_denoiser(prompt, params, self._setup(), cancel=cancel, template=template)

    def generate(self, prompt_tokens, params=None, *, cancel=None, template=None):
        params = self.resolve(params)
        prompt_tokens = self._check_prompt(prompt_tokens, params, template)
        with self._lock:
            per_seq = int(prompt_tokens.size + params.max_tokens + params.gen_length)
            source = DgLlamaSource(self, 1, per_seq, int(params.gen_length))

            def events():
                for _, event in drive_dg([self._coroutine(prompt_tokens, params, cancel, template)], source):
                    yield self._finish(event) if isinstance(event, FinalEvent) else event

            yield from self._with_cancel(events(), cancel)

    def generate_batch(self, prompts, params, *, cancel=None, templates=None):
        if len(prompts) != len(params):
            raise InvalidParameterError("one parameter set per prompt")
        templates = list(templates) if templates is not None else [None] * len(prompts)
        resolved = [self.resolve(p) for p in params]
        prompts = [self._check_prompt(t, p, tpl) for t, p, tpl in zip(prompts, resolved, templates)]
        with self._lock:
            per_seq = max(int(t.size + p.max_tokens + p.gen_length) for t, p in zip(prompts, resolved))
            canvas = max(int(p.gen_length) for p in resolved)
            source = DgLlamaSource(self, len(prompts), per_seq, canvas)
            coroutines = [self._coroutine(t, p, cancel, tpl) for t, p, tpl in zip(prompts, resolved, templates)]

            def events():
                for i, event in drive_dg(coroutines, source):
                    yield i, (self._finish(event) if isinstance(event, FinalEvent) else event)

            yield from self._with_cancel(events(), cancel)

    def pseudo_log_likelihood(self, context: np.ndarray, answer: np.ndarray, *, groups: int = 4) -> np.ndarray:
        """Per-token log p(answer_i | context, answer_<i) under the causal encoder: the model read as
        the causal LM its encoder is (`groups` is ignored)."""
        context = np.asarray(context, dtype=np.int32)
        answer = np.asarray(answer, dtype=np.int32)
        if answer.size == 0:
            return np.zeros(0)
        seq = np.concatenate([context, answer])
        with self._lock:
            source = DgLlamaSource(self, 1, int(seq.size), 64)
            outputs = np.arange(context.size - 1, seq.size - 1)
            (logits,) = source.answer([(0, EncodeRequest(seq, np.arange(seq.size, dtype=np.int32), outputs))])
            source.ctx.clear()
        logits = logits.astype(np.float64)
        m = logits.max(axis=1, keepdims=True)
        logz = m[:, 0] + np.log(np.exp(logits - m).sum(axis=1))
        return logits[np.arange(answer.size), answer] - logz


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts).astype(np.int32) if parts else np.empty(0, dtype=np.int32)
