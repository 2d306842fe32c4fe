"""What the denoisers ask of a logits source, and how a generation is set up.

The denoisers (masked_diffusion, diffusion_gemma_denoiser, block_denoiser, ar_decoder) are
coroutines: they *yield* one of the requests below and are *sent* the answer (logits, or RowStats
where the source samples in llama.cpp's graph). A logits source (logits_source.LlamaLogits,
diffusion_gemma_source.DgLlamaSource, block_source.BlockLlamaSource) answers them; the driver
(driver.drive) passes them between the two. The setups are the model facts a denoiser needs, read
once from the engine. Events (what a generation yields to its caller) are in events.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dgchat.model_backend.sampling import SampleSpec


@dataclass(frozen=True)
class LogitsRequest:
    """Logits of `sequence` (one full non-causal view of it) at sequence positions `rows`, or with
    `sample` the RowStats of those rows (computed where the source computes them: in llama.cpp's
    graph with dgchat's engine, else from the logits on the host).

    `block` is the [start, end) range of sequence positions the sampler is working on and
    `block_start` says whether this is the block's first step: cache-reusing sources refresh their
    cache then, and may recompute only the block on later steps."""

    sequence: np.ndarray
    rows: np.ndarray
    block: tuple[int, int]
    block_start: bool
    sample: SampleSpec | None = None


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
    """One denoising step: a bidirectional pass over `canvas` (token ids) at `positions` that reads
    the sequence's cache and leaves it as it was (the canvas's cells are removed afterwards).

    DiffusionGemma: the input is mixed with the self-conditioning signal of this canvas's previous
    step unless `first_step`; answered with the RowStats of every canvas row under `sample`.
    Block diffusion (block_denoiser): `rows` are the canvas rows asked for (the masked positions;
    None: all), answered with their RowStats under `sample`, or their logits when `sample` is None;
    `commit` is a finished block (tokens, positions) appended to the cache for good in the same
    pass, before the canvas (its store pass merged with this step)."""

    canvas: np.ndarray
    positions: np.ndarray
    sample: SampleSpec | None
    first_step: bool
    rows: np.ndarray | None = None
    commit: tuple[np.ndarray, np.ndarray] | None = None


Request = LogitsRequest | EncodeRequest | DenoiseRequest
REQUEST_TYPES = (LogitsRequest, EncodeRequest, DenoiseRequest)  # for isinstance


@dataclass(frozen=True)
class CanvasTemplate:
    """A canvas with given text (infill): `tokens[i]` is kept where `fixed[i]`, masked elsewhere.
    The answer is exactly this canvas: no early stop, no continuation canvases.

    `initial` (uniform-state models only): the starting draft of the free positions instead of
    uniformly random tokens (tests use it to start two implementations from the same canvas)."""

    tokens: np.ndarray
    fixed: np.ndarray
    initial: np.ndarray | None = None


@dataclass(frozen=True)
class MaskedSetup:
    """What a masked-diffusion denoiser knows of the model."""

    mask_token: int
    eog_tokens: np.ndarray  # ids that end an answer
    shift_logits: bool  # Dream: position i is predicted from row i - 1


@dataclass(frozen=True)
class BlockSetup:
    """What a block-diffusion denoiser knows of the model (docs/BLOCK_DIFFUSION.md)."""

    block_size: int
    variant: str  # "sdar": blocks counted from position 0; "bd3lm": blocks end where the prompt ends
    mask_token: int
    eog: np.ndarray  # ids that end an answer
    n_vocab: int


@dataclass(frozen=True)
class DgSetup:
    """What a DiffusionGemma denoiser (or its AR decoder) knows of the model."""

    eog: np.ndarray
    n_vocab: int
    pad: int | None = None  # the pad token, which params.pad_bias biases
