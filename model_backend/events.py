"""The streaming interface the CLI, the app and the API server share.

A generation yields one `StepEvent` per denoising step and ends with one `FinalEvent`.
Events are immutable snapshots: consumers may keep them and render them on another thread.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from dgchat.model_backend.canvas import CanvasSnapshot


@dataclass(frozen=True)
class StepTiming:
    model_ms: float  # inside llama.cpp (decode calls)
    sampler_ms: float  # Python/numpy sampler work


@dataclass(frozen=True)
class StepEvent:
    step: int  # 1-based step count over the whole answer
    total_steps: int  # planned steps for the current canvas (adaptive samplers may stop earlier)
    canvas_index: int  # 0 for the first canvas of the answer, 1 for the next, ...
    canvas_step: int  # 1-based step within the current canvas
    canvas: CanvasSnapshot  # the canvas being denoised
    answer_tokens: np.ndarray  # tokens of the answer's finished canvases (before this one)
    committed: int  # positions decided in this canvas
    canvas_length: int
    timing: StepTiming
    elapsed_s: float
    uniform_state: bool = False  # undecided positions hold draft tokens, not masks


@dataclass
class GenerationStats:
    steps: int = 0
    tokens: int = 0  # answer tokens (after cutting at the end token)
    canvases: int = 0
    elapsed_s: float = 0.0
    model_s: float = 0.0
    sampler_s: float = 0.0
    prompt_tokens: int = 0
    prompt_s: float = 0.0  # the prompt's own pass (block diffusion, DiffusionGemma: before the first step)
    prompt_reused: int = 0  # prompt tokens whose KV cells the previous generation left (block diffusion)
    decode_calls: int = 0
    sampler_on: str = ""  # "backend" (llama.cpp's graph) or "host" (numpy): where the vocabulary-wide work ran
    soft_embedding: str = ""  # DiffusionGemma diffusion: "exact" or "top-256"

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def ms_per_step(self) -> float:
        return 1000.0 * self.elapsed_s / self.steps if self.steps else 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.tokens / self.steps if self.steps else 0.0

    @property
    def sampler_share(self) -> float:
        busy = self.model_s + self.sampler_s
        return self.sampler_s / busy if busy > 0 else 0.0

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(
            tokens_per_s=round(self.tokens_per_s, 3),
            ms_per_step=round(self.ms_per_step, 3),
            tokens_per_step=round(self.tokens_per_step, 3),
            sampler_share=round(self.sampler_share, 4),
            model_ms_per_step=round(1000 * self.model_s / self.steps, 3) if self.steps else 0.0,
            sampler_ms_per_step=round(1000 * self.sampler_s / self.steps, 3) if self.steps else 0.0,
        )
        for k in ("elapsed_s", "model_s", "sampler_s", "prompt_s"):
            d[k] = round(d[k], 4)
        return d


@dataclass(frozen=True)
class FinalEvent:
    text: str
    tokens: np.ndarray
    stop_reason: str  # "eos" | "max_tokens" | "cancelled"
    stats: GenerationStats
    engine_label: str = ""  # e.g. "exact" / "approximate" for DiffusionGemma
    extra: dict = field(default_factory=dict)


Event = StepEvent | FinalEvent
