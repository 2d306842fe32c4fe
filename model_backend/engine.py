"""DiffusionEngine: one loaded model, ready to turn prompts into streams of denoising events.

This is the object the CLI, the app and the server hold. It validates the file, classifies the
model (model_info), owns the llama.cpp context (sized for prompt + canvas, recreated when a longer
answer needs more room), and dispatches to the right sampler loop. Rendering chat templates and the
rest of the tokenizer and vocabulary are its base class's, EngineVocabulary (engine_vocabulary.py).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import replace
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

from dgchat.model_backend import llamacpp, rpc, sampling
from dgchat.model_backend.canvas import Canvas
from dgchat.model_backend.errors import ContextOverflowError, GenerationCancelled, InvalidParameterError
from dgchat.model_backend.events import FinalEvent, GenerationStats, StepEvent, StepTiming
from dgchat.model_backend.gguf_file import GgufHeader
from dgchat.model_backend.driver import drive, drive_one
from dgchat.model_backend.engine_vocabulary import EngineVocabulary
from dgchat.model_backend.logits_source import LlamaLogits
from dgchat.model_backend.masked_diffusion import masked_denoiser
from dgchat.model_backend.model_info import ModelInfo
from dgchat.model_backend.param_resolution import resolve_params
from dgchat.model_backend.placement import Placement
from dgchat.model_backend.params import DiffusionParams
from dgchat.model_backend.reference_sampler import ReferenceParams, reference_denoise
from dgchat.model_backend.requests import CanvasTemplate, LogitsRequest, MaskedSetup


class DiffusionEngine(EngineVocabulary):
    """The masked-diffusion engine (LLaDA, Dream, RND1, non-causal llama GGUFs); the base of the
    engines of other families (model_backend.loader picks one per file). Its tokenizer and
    vocabulary methods are EngineVocabulary's (model_backend/engine_vocabulary.py)."""

    family = "masked"  # the ModelInfo.family this class runs (`load` refuses other families)

    def __init__(self, model: llamacpp.LlamaModel, info: ModelInfo, *, n_threads: int | None = None,
                 precise: bool = False) -> None:
        self.model = model
        self.info = info
        self.n_threads = n_threads
        self.precise = precise  # f32 KV cache, no flash attention: for comparisons, slower
        self._ctx: llamacpp.LlamaContext | None = None
        self._ctx_shape = (0, 1, 0)  # tokens per sequence, sequences, tokens per decode
        self._init_vocabulary()
        self._lock = threading.Lock()  # one generation at a time per engine
        self._eog = model.eog_ids()
        # the engine's diffusion head: the samplers' vocabulary-wide work in llama.cpp's graph
        self.backend_sampler = llamacpp.engine_info().backend_sampler
        # tests: a callable that sees every backend-sampled decode with its logits (the sources' `check`)
        self.step_check = None

    # -- loading ------------------------------------------------------------------------------
    @classmethod
    def open(
        cls,
        path: str | Path,
        header: GgufHeader,
        info: ModelInfo,
        *,
        n_gpu_layers: int | None = None,
        n_threads: int | None = None,
        progress: Callable[[float], bool] | None = None,
        precise: bool = False,
        rpc_servers: str | Sequence[str] | None = None,
        experts_on: str = "auto",
    ) -> DiffusionEngine:
        """This class on the model at `path`, whose header the caller has read and inspected
        (model_info.inspect_header), and which must be of this class's `family`: model_backend.loader's
        `load_engine` does both and picks the class, load models with that. llama.cpp loads the model
        now. `n_threads` must have been checked (params.check_threads). Where the weights go is
        decided here, once (model_backend/placement.py): `n_gpu_layers` forces llama.cpp's count,
        `experts_on` (auto, cpu, gpu) where a mixture of experts' routed experts may go."""
        if info.family != cls.family:
            raise InvalidParameterError(f"{Path(path).name} is a {info.family} model, not one {cls.__name__} runs: "
                                        "load it with dgchat.model_backend.loader.load_engine")
        if rpc_servers:
            rpc.connect(rpc_servers)
        # the KV cache and canvas buffers the plan reserves: the model's canvas, f32 KV when precise
        placement = llamacpp.decide_placement(header, gpu_layers=n_gpu_layers, experts_on=experts_on,
                                              canvas=int(info.defaults.get("gen_length") or 256),
                                              kv_bytes_per_value=4 if precise else 2, kv_cache=info.has_kv_memory)
        model = llamacpp.LlamaModel(path, progress=progress, header=header, placement=placement)
        return cls(model, info, n_threads=n_threads, precise=precise)

    @property
    def placement(self) -> Placement:
        """Where the weights went (`dgchat generate --json`'s "placement", `model: info`)."""
        return self.model.placement

    def close(self) -> None:
        if self._ctx is not None:
            self._ctx.close()
            self._ctx = None
        self.model.close()

    def __enter__(self) -> DiffusionEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def label(self) -> str:
        """How this engine runs the model, shown by the CLI and the UI."""
        return "masked diffusion"

    @property
    def path(self) -> Path:
        return self.model.path

    @property
    def n_ctx_max(self) -> int:
        return self.model.n_ctx_train or 4096

    # -- parameters ---------------------------------------------------------------------------
    counts_tokens = True  # the tokenizer is here: contexts are counted before an answer
    text_only = False  # a live canvas, every diffusion setting, infill

    def unsupported(self, params: DiffusionParams) -> list[str]:
        """A local engine takes every setting (resolve checks their values)."""
        return []

    def resolve(self, params: DiffusionParams | None = None) -> DiffusionParams:
        """Fill unset fields from the model's defaults and validate (the precedence and its rules:
        model_backend/param_resolution)."""
        params = resolve_params(self.info, params or DiffusionParams()).params
        if params.sampler_on == "backend" and not self.backend_sampler:
            raise InvalidParameterError("--sampler-on backend needs dgchat's engine (patch level 3: README's "
                                        "install command); this llama-cpp-python samples on the host only")
        params.check_vocabulary(self.model.n_vocab)
        return params

    def on_backend(self, params: DiffusionParams) -> bool:
        """Whether a step's vocabulary-wide sampler work runs in llama.cpp's graph (the default with
        dgchat's engine) rather than in numpy. Reference mode samples on the host, as llama.cpp's
        example does."""
        return self.backend_sampler and params.sampler_on != "host" and params.mode != "reference"

    # -- contexts -----------------------------------------------------------------------------
    def context_for(self, n_tokens: int, *, n_seq: int = 1, batch_tokens: int | None = None) -> llamacpp.LlamaContext:
        """The engine's llama.cpp context, sized for sequences of up to `n_tokens` tokens, `n_seq` of
        them at once, and decode calls of up to `batch_tokens` tokens (non-causal attention needs a
        batch in one ubatch): recreated (larger) when the current one is too small, else reused as
        it is, cells included. For the logits sources, which run the decodes of a generation; call
        it with the engine's generation lock held (a new context closes the old one)."""
        if n_tokens > self.n_ctx_max:
            raise ContextOverflowError(
                f"the prompt and answer need {n_tokens} tokens but the model's context is {self.n_ctx_max}"
            )
        batch_tokens = max(batch_tokens or n_tokens, n_tokens)
        need = (n_tokens, n_seq, batch_tokens)
        if self._ctx is None or any(a > b for a, b in zip(need, self._ctx_shape)):
            if self._ctx is not None:
                self._ctx.close()
            per_seq = min(self.n_ctx_max, max(256, 1 << (int(n_tokens) - 1).bit_length()))
            max_tokens = max(per_seq, 1 << (int(batch_tokens) - 1).bit_length())
            n_seq = max(n_seq, self._ctx_shape[1])
            self._ctx = llamacpp.LlamaContext(self.model, n_ctx=per_seq * n_seq, max_tokens=max_tokens,
                                              n_seq_max=n_seq, n_threads=self.n_threads, per_seq_ctx=per_seq,
                                              exact_kv=self.precise)
            self._ctx.set_causal(False)
            self._ctx_shape = (per_seq, n_seq, max_tokens)
        return self._ctx

    @property
    def _ctx_tokens(self) -> int:
        return self._ctx_shape[0]

    def check_fits(self, prompt_tokens: int, params: DiffusionParams) -> None:
        need = prompt_tokens + int(params.max_tokens or params.gen_length)
        if prompt_tokens + int(params.gen_length) > self.n_ctx_max:
            raise ContextOverflowError(
                f"prompt is {prompt_tokens} tokens; with a canvas of {params.gen_length} it exceeds the model's "
                f"context of {self.n_ctx_max} tokens"
            )
        if need > self.n_ctx_max:
            raise ContextOverflowError(
                f"prompt ({prompt_tokens}) + max tokens ({params.max_tokens}) exceed the model's context of "
                f"{self.n_ctx_max} tokens; lower --max-tokens"
            )

    # -- generation ---------------------------------------------------------------------------
    def generate(
        self,
        prompt_tokens: np.ndarray,
        params: DiffusionParams | None = None,
        *,
        cancel: threading.Event | None = None,
        template: CanvasTemplate | None = None,
    ) -> Iterator[StepEvent | FinalEvent]:
        """Stream events for one answer. One generation at a time per engine.

        `template` (infill): the canvas is exactly these tokens, with the positions not marked
        fixed to be filled in (masked diffusion) or denoised (uniform-state)."""
        params = self.resolve(params)
        prompt_tokens = self._check_prompt(prompt_tokens, params, template)
        with self._lock:
            if params.mode == "reference":
                if template is not None:
                    raise InvalidParameterError("reference mode has no infill; use the default mode")
                inner = self._generate_reference(prompt_tokens, params, cancel)
            else:
                inner = self._generate_masked(prompt_tokens, params, cancel, template)
            yield from self._with_cancel(inner, cancel)

    def generate_batch(
        self,
        prompts: Sequence[np.ndarray],
        params: Sequence[DiffusionParams],
        *,
        cancel: threading.Event | None = None,
        templates: Sequence[CanvasTemplate | None] | None = None,
    ) -> Iterator[tuple[int, StepEvent | FinalEvent]]:
        """Several answers at once (variants of a prompt, different prompts): every step of every
        sequence is computed in one llama.cpp call. Yields (index, event); each index ends with a
        FinalEvent. Same result per sequence as `generate` with the same parameters and seed."""
        if len(prompts) != len(params):
            raise InvalidParameterError("one parameter set per prompt")
        templates = list(templates) if templates is not None else [None] * len(prompts)
        resolved = [self.resolve(p) for p in params]
        if any(p.mode == "reference" for p in resolved):
            raise InvalidParameterError("reference mode runs one sequence at a time")
        caches = {p.cache for p in resolved}
        if len(caches) > 1:
            raise InvalidParameterError("all sequences of a batch must use the same cache mode")
        prompts = [self._check_prompt(t, p, tpl) for t, p, tpl in zip(prompts, resolved, templates)]
        places = {self.on_backend(p) for p in resolved}
        if len(places) > 1:
            raise InvalidParameterError("all sequences of a batch must use the same --sampler-on")
        setup = MaskedSetup(self.info.mask_token, self._eog, self.info.shift_logits)
        with self._lock:
            source = LlamaLogits(self, cache=caches.pop(), n_seq=len(prompts), on_backend=places.pop())
            denoisers = [
                masked_denoiser(t, p, setup, n_vocab=self.model.n_vocab, cancel=cancel, template=tpl)
                for t, p, tpl in zip(prompts, resolved, templates)
            ]

            def events():
                for i, event in drive(denoisers, source):
                    yield i, (self._finish(event, source.on_backend) if isinstance(event, FinalEvent) else event)

            yield from self._with_cancel(events(), cancel)

    def _check_prompt(self, prompt_tokens, params: DiffusionParams, template: CanvasTemplate | None) -> np.ndarray:
        prompt_tokens = np.asarray(prompt_tokens, dtype=np.int32)
        if prompt_tokens.size == 0:
            raise InvalidParameterError("the prompt is empty")
        if template is not None:
            params = replace(params, gen_length=int(template.tokens.size), max_tokens=int(template.tokens.size))
        self.check_fits(int(prompt_tokens.size), params)
        return prompt_tokens

    def pseudo_log_likelihood(self, context: np.ndarray, answer: np.ndarray, *, groups: int = 4) -> np.ndarray:
        """Per-token log p(answer_i | context, the rest of the answer), the model's own score of a text.

        Exactly: the answer positions are split into `groups` interleaved groups (i mod groups);
        for each group one non-causal pass runs with that group's positions masked, and the
        log-softmax of the true token is read at each masked position. With groups == len(answer)
        this is the pseudo-log-likelihood of masked LMs; fewer groups trade accuracy for passes."""
        context = np.asarray(context, dtype=np.int32)
        answer = np.asarray(answer, dtype=np.int32)
        out = np.zeros(answer.size, dtype=np.float64)
        if answer.size == 0:
            return out
        seq = np.concatenate([context, answer])
        with self._lock:
            logits_at = self._masked_logits(int(context.size), int(seq.size))
            for g in range(min(groups, answer.size)):
                idx = np.arange(g, answer.size, groups)
                masked = seq.copy()
                masked[context.size + idx] = self.info.mask_token
                out[idx] = sampling.log_prob_of(logits_at(masked, context.size + idx), answer[idx])
        return out

    def _masked_logits(self, n_context: int, n_tokens: int) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
        """For pseudo_log_likelihood: (sequence with masks, positions) -> the logits predicting those
        positions, one full non-causal pass each (called with the generation lock held)."""
        source = LlamaLogits(self, cache="none")
        shift = 1 if self.info.shift_logits else 0
        return lambda seq, positions: source.logits(LogitsRequest(seq, positions - shift, (n_context, n_tokens), True))

    def _with_cancel(self, events: Iterator, cancel: threading.Event | None) -> Iterator:
        """Forward the cancel flag into llama.cpp so a long decode aborts mid-way."""
        if cancel is None:
            yield from events
            return
        watcher_stop = threading.Event()

        def watch() -> None:
            while not watcher_stop.wait(0.02):
                if cancel.is_set() and self._ctx is not None:
                    self._ctx.cancel_event.set()
                    return

        thread = threading.Thread(target=watch, daemon=True)
        thread.start()
        try:
            yield from events
        finally:
            watcher_stop.set()
            # A watcher that saw `cancel` just before the stop could still raise the flag after the
            # clear below, and the next generation would abort at its first decode (a spurious 499 of
            # `dgchat serve` after a request that stopped itself at a stop string): wait for it.
            thread.join()
            if self._ctx is not None:
                self._ctx.cancel_event.clear()

    def _finish(self, final: FinalEvent, on_backend: bool | None = None) -> FinalEvent:
        text = self.detokenize(final.tokens)
        final.stats.decode_calls = self._ctx.n_decodes if self._ctx is not None else 0
        if on_backend is not None:
            final.stats.sampler_on = "backend" if on_backend else "host"
        return FinalEvent(text=text, tokens=final.tokens, stop_reason=final.stop_reason, stats=final.stats,
                          engine_label=self.label, extra=final.extra)

    def _generate_masked(self, prompt: np.ndarray, params: DiffusionParams, cancel, template=None) -> Iterator:
        setup = MaskedSetup(self.info.mask_token, self._eog, self.info.shift_logits)
        source = LlamaLogits(self, cache=params.cache, on_backend=self.on_backend(params))
        denoiser = masked_denoiser(prompt, params, setup, n_vocab=self.model.n_vocab, cancel=cancel, template=template)
        for event in drive_one(denoiser, source):
            yield self._finish(event, source.on_backend) if isinstance(event, FinalEvent) else event

    def _generate_reference(self, prompt: np.ndarray, params: DiffusionParams, cancel) -> Iterator:
        """llama.cpp's examples/diffusion, token for token: one canvas, no early stop."""
        L = int(params.gen_length)
        max_length = int(prompt.size) + L
        ref = ReferenceParams(
            steps=int(params.steps),
            max_length=max_length,
            mask_token_id=int(self.info.mask_token),
            algorithm=params.algorithm,
            eps=float(params.eps or 0.0) if not params.block_length else 0.0,
            block_length=int(params.block_length or 0),
            temperature=float(params.temperature or 0.0),
            top_k=params.top_k,
            top_p=params.top_p,
            seed=params.seed,
            shift_logits=self.info.shift_logits,
            cfg_scale=params.cfg_scale,
            alg_temp=params.alg_temp,
            add_gumbel_noise=params.gumbel,
        )
        stats = GenerationStats(prompt_tokens=int(prompt.size))
        # the context is made before the clock starts, as llama-diffusion-cli makes its own before
        # diffusion_generate: creating one (buffers, graph reservation) is not a denoising step
        ctx = self.context_for(max_length)
        t_start = time.perf_counter()
        model_s = [0.0]
        positions = np.arange(max_length, dtype=np.int32)

        def logits_fn(tokens: np.ndarray, rows: np.ndarray) -> np.ndarray:
            t0 = time.perf_counter()
            ctx.clear()  # GGUFs with KV memory: drop the last pass's cells (a no-op without memory)
            # only the rows the sampler reads: the LM head of the others is most of a step's work
            out = ctx.decode_tokens(tokens, positions, outputs=rows)
            model_s[0] += time.perf_counter() - t0
            return out

        canvas = Canvas.blank(L, self.info.mask_token)
        stop = "max_tokens"
        last_model = 0.0

        try:
            # llama.cpp's sampler chain samples the masked positions on the decode's threads (the
            # cores are idle between decodes); the draws are the same on any number of threads
            threads = self.n_threads or os.cpu_count() or 1
            for step in reference_denoise(prompt, ref, logits_fn, time.perf_counter, sampler_threads=threads):
                canvas.commit(step.committed - prompt.size, step.tokens[step.committed], step.confidence, step.step + 1)
                stats.steps += 1
                stats.sampler_s += step.sampler_seconds
                step_model = model_s[0] - last_model
                last_model = model_s[0]
                yield StepEvent(
                    step=stats.steps, total_steps=ref.steps, canvas_index=0, canvas_step=stats.steps,
                    canvas=canvas.snapshot(), answer_tokens=np.empty(0, np.int32), committed=canvas.n_decided,
                    canvas_length=L, timing=StepTiming(1000 * step_model, 1000 * step.sampler_seconds),
                    elapsed_s=time.perf_counter() - t_start,
                )
                if cancel is not None and cancel.is_set():
                    stop = "cancelled"
                    break
        except GenerationCancelled:
            stop = "cancelled"
        stats.model_s = model_s[0]
        canvas.settle()
        tokens = canvas.tokens
        if stop != "cancelled":
            ends = np.flatnonzero(np.isin(tokens, self._eog))
            if ends.size:
                tokens, stop = tokens[: ends[0]], "eos"
        else:
            tokens = canvas.decided_prefix()
        stats.tokens = int(tokens.size)
        stats.canvases = 1
        stats.elapsed_s = time.perf_counter() - t_start
        # on the host: llama.cpp's own sampler chain, called row by row as the example does
        yield self._finish(FinalEvent("", tokens.copy(), stop, stats, extra={"sequence": canvas.tokens.copy()}),
                           on_backend=False)
