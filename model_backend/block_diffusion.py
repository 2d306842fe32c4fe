"""Block diffusion (SDAR, BD3LM) on llama.cpp's qwen3/qwen2 graphs: the engine.

The answer is written block after block: inside a block the positions are denoised in parallel
with bidirectional attention, finished blocks are cached like an autoregressive model's tokens, so
a step costs about one decode of a block against the cache (docs/BLOCK_DIFFUSION.md). The parts:
block_denoiser (the loop, a coroutine), block_source (its requests answered by llama.cpp with the
block-causal mask of engine/patches/0017), this module (the engine: parameters, generation).

`--ar` decodes the same weights left to right with causal attention (ar_decoder): the autoregressive
twin a block-diffusion model was trained from, for comparisons.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from dgchat.model_backend import llamacpp
from dgchat.model_backend.ar_decoder import ar_decoder
from dgchat.model_backend.block_denoiser import NO_INFILL, block_denoiser, prompt_offset, sequence_length
from dgchat.model_backend.block_source import BlockLlamaSource
from dgchat.model_backend.driver import Denoiser, drive
from dgchat.model_backend.engine import DiffusionEngine
from dgchat.model_backend.errors import ContextOverflowError, EngineError, InvalidParameterError
from dgchat.model_backend.events import FinalEvent, StepEvent
from dgchat.model_backend.model_info import VARIANT_NAMES, ModelInfo
from dgchat.model_backend.params import DiffusionParams
from dgchat.model_backend.requests import BlockSetup, CanvasTemplate, EncodeRequest


class BlockDiffusionEngine(DiffusionEngine):
    """SDAR and BD3LM models (the `block_diffusion` family; see the module docstring)."""

    family = "block_diffusion"

    def __init__(self, model: llamacpp.LlamaModel, info: ModelInfo, *, n_threads: int | None = None,
                 precise: bool = False) -> None:
        if not llamacpp.engine_info().block_causal:
            raise EngineError(f"{model.path.name} is a block-diffusion model, which needs dgchat's engine (patch "
                              "level 7, block-causal attention): install with README's command")
        super().__init__(model, info, n_threads=n_threads, precise=precise)
        self.block_size = int(info.attention_block or 0)
        self.variant = info.preset
        # the context whose sequence 0 holds these tokens' cells at positions 0.. (block_source reuse)
        self._prefix: tuple[llamacpp.LlamaContext, np.ndarray] | None = None

    def kept_prefix(self, ctx: llamacpp.LlamaContext) -> np.ndarray | None:
        """The tokens whose cells the last generation left in `ctx` (None: nothing known)."""
        return self._prefix[1] if self._prefix is not None and self._prefix[0] is ctx else None

    def keep_prefix(self, ctx: llamacpp.LlamaContext, tokens: np.ndarray) -> None:
        self._prefix = (ctx, tokens)

    def forget_prefix(self) -> None:
        self._prefix = None

    @property
    def label(self) -> str:
        name = VARIANT_NAMES.get(self.variant, self.variant)
        return f"block diffusion ({name}, blocks of {self.block_size})"

    def _setup(self) -> BlockSetup:
        return BlockSetup(self.block_size, self.variant, int(self.info.mask_token), self._eog, self.model.n_vocab)

    def check_fits(self, prompt_tokens: int, params: DiffusionParams) -> None:
        need = sequence_length(prompt_tokens, int(params.max_tokens or 0), self._setup())
        if prompt_tokens + prompt_offset(prompt_tokens, self._setup()) + self.block_size > self.n_ctx_max:
            raise ContextOverflowError(f"the prompt is {prompt_tokens} tokens; with a block of {self.block_size} "
                                       f"it exceeds the model's context of {self.n_ctx_max} tokens")
        if need > self.n_ctx_max:
            raise ContextOverflowError(f"prompt ({prompt_tokens}) + max tokens ({params.max_tokens}) exceed the "
                                       f"model's context of {self.n_ctx_max} tokens; lower --max-tokens")

    def _check_prompt(self, prompt_tokens, params: DiffusionParams, template: CanvasTemplate | None) -> np.ndarray:
        if template is not None:
            raise InvalidParameterError(NO_INFILL)
        return super()._check_prompt(prompt_tokens, params, None)

    # -- generation ---------------------------------------------------------------------------
    def _coroutine(self, prompt: np.ndarray, params: DiffusionParams, cancel) -> Denoiser:
        if params.autoregressive:
            return ar_decoder(prompt, params, self._eog, self.model.n_vocab, cancel=cancel)
        return block_denoiser(prompt, params, self._setup(), cancel=cancel)

    def _source(self, params: Sequence[DiffusionParams], per_seq: int) -> BlockLlamaSource:
        modes = {self.on_backend(p) for p in params}
        causal = {bool(p.autoregressive) for p in params}
        if len(modes) > 1 or len(causal) > 1:
            raise InvalidParameterError("sequences decoded together must share --sampler-on and --ar")
        # a chat's next turn reuses the cells of the conversation so far (SDAR: blocks from position 0)
        return BlockLlamaSource(self, len(params), per_seq, on_backend=modes.pop(), causal=causal.pop(),
                                reuse=self.variant == "sdar")

    def _run(self, coroutines: list[Denoiser], source: BlockLlamaSource) -> Iterator[tuple[int, StepEvent | FinalEvent]]:
        for i, event in drive(coroutines, source):
            if isinstance(event, FinalEvent):
                event.stats.prompt_reused = source.reused_tokens
                event = self._finish(event, source.on_backend)
            yield i, event
        source.finish()

    def generate(self, prompt_tokens, params=None, *, cancel=None, template=None):
        params = self.resolve(params)
        prompt_tokens = self._check_prompt(prompt_tokens, params, template)
        with self._lock:
            source = self._source([params], sequence_length(int(prompt_tokens.size), int(params.max_tokens),
                                                           self._setup()))
            events = (event for _, event in self._run([self._coroutine(prompt_tokens, params, cancel)], source))
            yield from self._with_cancel(events, cancel)

    def generate_batch(self, prompts, params, *, cancel=None, templates=None):
        if len(prompts) != len(params):
            raise InvalidParameterError("one parameter set per prompt")
        if templates is not None and any(t is not None for t in templates):
            raise InvalidParameterError(NO_INFILL)
        resolved = [self.resolve(p) for p in params]
        prompts = [self._check_prompt(t, p, None) for t, p in zip(prompts, resolved)]
        with self._lock:
            per_seq = max(sequence_length(int(t.size), int(p.max_tokens), self._setup())
                          for t, p in zip(prompts, resolved))
            source = self._source(resolved, per_seq)
            coroutines = [self._coroutine(t, p, cancel) for t, p in zip(prompts, resolved)]
            yield from self._with_cancel(self._run(coroutines, source), cancel)

    def _masked_logits(self, n_context: int, n_tokens: int):
        """pseudo_log_likelihood's passes under the block-causal mask: a position sees its own block
        and earlier ones, so a token's score is conditioned on the text before it and on its block's
        unmasked neighbours (not on later blocks)."""
        start = prompt_offset(n_context, self._setup())
        positions = np.arange(start, start + n_tokens, dtype=np.int32)
        source = BlockLlamaSource(self, 1, start + n_tokens, on_backend=False)

        def logits_at(seq: np.ndarray, rows: np.ndarray) -> np.ndarray:
            (logits,) = source.answer([(0, EncodeRequest(seq, positions, rows))])
            source.ctx.clear()
            return logits

        return logits_at
