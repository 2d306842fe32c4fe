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

The parts: diffusion_gemma_denoiser (the loop above and the AR decoder, as coroutines),
diffusion_gemma_source (their requests answered by llama.cpp), diffusion_gemma_embed (the numpy
self-conditioning), this module (the engine: parameters, the diffusion head's setup, generation).

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
from collections.abc import Sequence

import numpy as np

from dgchat.model_backend import llamacpp, sampling
from dgchat.model_backend.ar_decoder import ar_decoder
from dgchat.model_backend.diffusion_gemma_denoiser import dg_denoiser
from dgchat.model_backend.diffusion_gemma_embed import SelfConditioning
from dgchat.model_backend.diffusion_gemma_source import FIRST_SLOT, DgLlamaSource
from dgchat.model_backend.driver import Denoiser, drive
from dgchat.model_backend.engine import DiffusionEngine
from dgchat.model_backend.errors import InvalidParameterError
from dgchat.model_backend.events import FinalEvent
from dgchat.model_backend.gguf_file import read_tensor
from dgchat.model_backend.model_info import ModelInfo
from dgchat.model_backend.param_resolution import resolve_params
from dgchat.model_backend.params import DiffusionParams
from dgchat.model_backend.requests import DgSetup, EncodeRequest

# On a CPU backend above this vocabulary size the self-conditioning soft embedding uses each row's
# top-k tokens (softmax @ E is 256 x 262144 x d per step, ~190 GFLOP, for the 26B model); below
# it, and on a GPU, the exact product over the whole vocabulary.
EXACT_SOFT_EMBEDDING_VOCAB = 65536
SOFT_EMBEDDING_TOP_K = 256
# the backend keeps the transposed token embedding of the exact product in f32 up to this size, f16 above
EMBD_T_F32_BYTES = 512 << 20


class DiffusionGemmaEngine(DiffusionEngine):
    """DiffusionGemma (gemma4 graph, uniform-state block diffusion; see the module docstring)."""

    family = "diffusion_gemma"

    def __init__(self, model: llamacpp.LlamaModel, info: ModelInfo, *, n_threads: int | None = None,
                 precise: bool = False) -> None:
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
            return "DiffusionGemma, patched engine"
        return "DiffusionGemma, APPROXIMATE (stock llama.cpp: install with README's command for the patched engine)"

    def resolve(self, params: DiffusionParams | None = None) -> DiffusionParams:
        params = resolve_params(self.info, params or DiffusionParams()).params  # model_backend/param_resolution
        if params.sampler_on == "backend" and not self.backend_sampler:
            raise InvalidParameterError("--sampler-on backend needs dgchat's engine (patch level 3: README's "
                                        "install command); this llama-cpp-python samples on the host only")
        return params

    def soft_top_k(self, params: DiffusionParams, on_backend: bool) -> int | None:
        """How the self-conditioning soft embedding is computed: None for the exact product over
        the whole vocabulary, k for each row's k most likely tokens. Auto: exact in exact mode
        (`--precise` promises transformers' numbers at every vocabulary size), where the logits are
        computed on a GPU, or where the vocabulary is small; top-k on a CPU for large vocabularies."""
        if params.soft_embedding == "exact":
            return None
        if params.soft_embedding == "top-k":
            return SOFT_EMBEDDING_TOP_K
        if self.precise:
            return None
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
            n = max(n_slots, FIRST_SLOT + 1024, 2 * setup.n_slots if setup is not None else 0)
            setup = llamacpp.HeadSetup(weights, n_slots=n, soft_top_k=soft_top_k or 0, embd_t_f16=big)
            self._head_setups[soft_top_k] = setup
        return setup

    def check_fits(self, prompt_tokens: int, params: DiffusionParams) -> None:
        # the last canvas is decoded after the committed ones: prompt + answer + one canvas
        super().check_fits(prompt_tokens, params.updated(max_tokens=int(params.max_tokens) + int(params.gen_length)))

    def _setup(self) -> DgSetup:
        return DgSetup(self._eog, self.model.n_vocab, self.model.pad)

    def _coroutine(self, prompt, params, cancel, template) -> Denoiser:
        if params.autoregressive:
            if template is not None:
                raise InvalidParameterError("infill needs diffusion; it cannot run with --ar")
            return ar_decoder(prompt, params, self._eog, self.model.n_vocab, cancel=cancel)
        return dg_denoiser(prompt, params, self._setup(), cancel=cancel, template=template)

    def _source(self, params: Sequence[DiffusionParams], per_seq: int, canvas: int) -> DgLlamaSource:
        modes = {self.on_backend(p) for p in params}
        forms = {self.soft_top_k(p, self.on_backend(p)) for p in params}
        if len(modes) > 1 or len(forms) > 1:
            raise InvalidParameterError("sequences decoded together must share --sampler-on and --soft-embedding")
        return DgLlamaSource(self, len(params), per_seq, canvas, on_backend=modes.pop(), soft_top_k=forms.pop())

    def _run(self, coroutines: list[Denoiser], source: DgLlamaSource, params: Sequence[DiffusionParams]):
        for i, event in drive(coroutines, source):
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
        return sampling.log_prob_of(logits, answer)
