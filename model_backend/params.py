"""Generation parameters shared by the CLI, the app, the API server and the benchmarks."""

from __future__ import annotations

import math
import numbers
import os
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from dgchat.model_backend.errors import InvalidParameterError

ALGORITHMS = ("confidence", "entropy", "margin", "random", "origin")
MODES = ("dgchat", "reference")
CACHE_MODES = ("auto", "none", "prefix", "dual")  # auto: prefix where the model has KV memory
# where a step's vocabulary-wide sampler work runs: auto = the backend with dgchat's engine, else the host
SAMPLER_PLACES = ("auto", "backend", "host")
SOFT_EMBEDDINGS = ("auto", "exact", "top-k")  # DiffusionGemma's self-conditioning soft embedding

# Upper bounds shared by the CLI, the app, the API and model files' defaults. They are far above any
# published setting (LLaDA: 1,024 steps for 1,024 tokens; DiffusionGemma: 48 steps, canvas 256) and
# exist so that a number from an untrusted source cannot make a loop or a schedule list run for hours
# or allocate gigabytes (a GGUF with dgchat.steps = 4e9 did exactly that).
MAX_STEPS = 8192  # denoising steps per canvas: the block schedule holds one entry per step
MAX_GEN_LENGTH = 8192  # canvas length: tokens decoded in one non-causal batch
MAX_TOKENS = 1 << 20  # longest answer over all canvases (the context bounds it further)
MAX_TOP_K = 1 << 22  # larger than any vocabulary llama.cpp loads
MAX_SCALE = 1000.0  # temperature, cfg scale, alg_temp, factor, t_min / t_max
# The samplers multiply float32 logits by 1 / temperature: below about 3e-39 that reciprocal is inf
# (and 1e-320 is inf even in double), the logits become inf and NaN (numpy's "overflow encountered
# in cast" / "invalid value encountered in multiply", the engine's head silently draws garbage).
# Far above that edge, and far below any useful setting; 0 is greedy decoding.
MIN_TEMPERATURE = 1e-6
MAX_BUDGET = 1e12  # entropy bound, confidence threshold (finite, else unbounded in meaning only)
MAX_SEED = (1 << 64) - 1
MAX_LOGIT_BIAS = 65536  # entries (banned words expand to every token form of the word)
# CPU threads for llama.cpp (--threads, config n_threads): llama.cpp starts every thread it is
# asked for and keeps per-thread state in arrays of GGML_MAX_N_THREADS (512) entries, so
# `--threads 100000` segfaulted. More than a few threads per core only wait on each other.
GGML_MAX_N_THREADS = 512
THREADS_PER_CORE = 4
MAX_BIAS = 100.0  # size of one logit bias (logit_bias values, pad_bias), as OpenAI's; -100 bans a token


@dataclass(frozen=True)
class DiffusionParams:
    """How to denoise. Fields left at None take the model's recommended default (GGUF `dgchat.*`
    keys, else the architecture's published defaults); see `ModelInfo.default_params`."""

    steps: int | None = None
    gen_length: int | None = None  # canvas length (tokens decoded in parallel)
    block_length: int | None = None  # LLaDA-style semi-autoregressive blocks inside the canvas
    algorithm: str | None = None
    eps: float | None = None  # Dream-style timestep schedule: t runs from 1 to eps
    temperature: float | None = None
    top_k: int | None = None  # unset: the model's default, else 0 (off)
    top_p: float | None = None  # unset: the model's default, else 1.0 (off)
    cfg_scale: float = 0.0  # classifier-free guidance (unconditional pass with the prompt masked)
    threshold: float | None = None  # Fast-dLLM: commit every position with confidence >= threshold
    factor: float | None = None  # Fast-dLLM "factor" parallel decoding
    alg_temp: float = 0.0  # stochastic choice of which positions to commit (Dream's alg_temp)
    gumbel: bool = False  # llama.cpp's add_gumbel_noise (reference mode)
    seed: int = 0
    max_tokens: int | None = None  # answers longer than one canvas continue on new canvases up to this
    early_stop: bool = True
    mode: str = "dgchat"  # "reference": token-for-token what llama.cpp's examples/diffusion does
    cache: str = "auto"
    # uniform-state (DiffusionGemma) sampler
    entropy_bound: float | None = None
    t_min: float | None = None
    t_max: float | None = None
    stability_threshold: int | None = None
    confidence_threshold: float | None = None
    autoregressive: bool = False  # decode left to right with the causal encoder (DiffusionGemma --ar)
    # DiffusionGemma: added to the pad token's logit at every denoising step (not with --ar). A model
    # trained with pads after each answer's end accepts them first, from the canvas's end backwards,
    # each sure given the pad to its right, until the answer is a few tokens long (the "<eos> overflow"
    # of Kim et al., "Rainbow Padding", arXiv:2510.03680); a negative bias breaks that chain (the
    # bundled model's default, measured in its model card). 0: off.
    pad_bias: float | None = None
    # additive biases on token logits, ((token id, bias), ...), like OpenAI's logit_bias: a bias of
    # -100 or lower bans the token outright (banned words of NPC cards, the API's logit_bias)
    logit_bias: tuple[tuple[int, float], ...] = ()
    # where the vocabulary-wide part of each step runs: "backend" (in llama.cpp's graph on the device
    # that computed the logits; dgchat's engine) or "host" (numpy); "auto" picks the backend if it can
    sampler_on: str = "auto"
    # DiffusionGemma: softmax @ E over the whole vocabulary ("exact") or each row's 256 most likely
    # tokens ("top-k"); "auto": exact on a GPU or for vocabularies up to 65,536, else top-k
    soft_embedding: str = "auto"

    def with_defaults(self, defaults: dict[str, Any]) -> DiffusionParams:
        """Fill every None field from `defaults`."""
        updates = {k: v for k, v in defaults.items() if k in _FIELD_NAMES and getattr(self, k) is None}
        return replace(self, **updates)

    def updated(self, **changes: Any) -> DiffusionParams:
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def check_vocabulary(self, n_vocab: int) -> None:
        """Raise InvalidParameterError when a logit_bias token id is not below `n_vocab` (0: the size
        is not known, nothing to check)."""
        bad = [t for t, _ in self.logit_bias if n_vocab and t >= n_vocab]
        if bad:
            raise InvalidParameterError(f"logit_bias token id {bad[0]} is outside the vocabulary ({n_vocab} tokens)")

    def validate(self) -> None:
        """Raise InvalidParameterError naming the first bad value (the field as its CLI flag).

        Types are checked too (a value may come from JSON, TOML or a model file): integers must be
        ints (not bools or floats), numbers must be finite."""

        def bad(msg: str) -> None:
            raise InvalidParameterError(msg)

        def whole(name: str, value: Any, lo: int, hi: int, what: str) -> None:
            if value is None:
                return
            if not _is_int(value) or value < lo:
                bad(f"--{name} must be {what} (got {value!r})")
            if value > hi:
                bad(f"--{name} must be at most {hi} (got {value!r})")

        def number(name: str, value: Any, *, optional: bool = True) -> float | None:
            if value is None and optional:
                return None
            if not _is_number(value):
                bad(f"--{name} must be a finite number (got {value!r})")
            return float(value)

        whole("steps", self.steps, 1, MAX_STEPS, "a positive integer")
        whole("gen-length", self.gen_length, 1, MAX_GEN_LENGTH, "a positive integer")
        whole("block-length", self.block_length, 1, MAX_GEN_LENGTH, "a positive integer")
        whole("max-tokens", self.max_tokens, 1, MAX_TOKENS, "a positive integer")
        whole("top-k", self.top_k, 0, MAX_TOP_K, "an integer >= 0")
        whole("stability-threshold", self.stability_threshold, 0, MAX_STEPS, "an integer >= 0")
        whole("seed", self.seed, 0, MAX_SEED, "an integer >= 0")
        for name in ("eps", "temperature", "top_p", "threshold", "factor", "entropy_bound", "t_min", "t_max",
                     "confidence_threshold", "pad_bias"):
            value = number(name.replace("_", "-"), getattr(self, name))
            # the entropy bound and confidence threshold are budgets summed over the canvas: 1e6 is a
            # legitimate "no bound"; no loop or allocation grows with either
            limit = (MAX_BUDGET if name in ("entropy_bound", "confidence_threshold") else
                     MAX_BIAS if name == "pad_bias" else MAX_SCALE)
            if value is not None and abs(value) > limit:
                bad(f"--{name.replace('_', '-')} must be at most {limit:g} in size (got {value!r})")
        for name in ("cfg_scale", "alg_temp"):
            value = number(name.replace("_", "-"), getattr(self, name), optional=False)
            if abs(value) > MAX_SCALE:
                bad(f"--{name.replace('_', '-')} must be at most {MAX_SCALE:g} (got {value!r})")
        for name in ("gumbel", "early_stop", "autoregressive"):
            if not isinstance(getattr(self, name), bool):
                bad(f"{name} must be true or false (got {getattr(self, name)!r})")
        if self.block_length is not None:
            if self.mode == "dgchat" and self.gen_length and self.gen_length % self.block_length:
                bad(
                    f"canvas length {self.gen_length} is not divisible by block length {self.block_length}"
                )
        if self.algorithm is not None and self.algorithm not in ALGORITHMS:
            bad(f"--algorithm must be one of {', '.join(ALGORITHMS)} (got {self.algorithm!r})")
        if self.eps is not None and not 0.0 <= self.eps < 1.0:
            bad(f"--eps must be in [0, 1) (got {self.eps})")
        if self.temperature is not None and self.temperature < 0:
            bad(f"--temperature must be >= 0 (got {self.temperature})")
        if self.temperature is not None and 0 < self.temperature < MIN_TEMPERATURE:
            bad(f"--temperature must be 0 (greedy) or at least {MIN_TEMPERATURE:g} (got {self.temperature:g})")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            bad(f"--top-p must be in (0, 1] (got {self.top_p})")
        if self.cfg_scale < 0:
            bad(f"--cfg-scale must be >= 0 (got {self.cfg_scale})")
        if self.threshold is not None and not 0.0 < self.threshold <= 1.0:
            bad(f"--threshold must be in (0, 1] (got {self.threshold})")
        if self.factor is not None and self.factor <= 0:
            bad(f"--factor must be > 0 (got {self.factor})")
        if self.threshold is not None and self.factor is not None:
            bad("--threshold and --factor are alternatives; give one")
        if self.alg_temp < 0:
            bad(f"--alg-temp must be >= 0 (got {self.alg_temp})")
        if self.mode not in MODES:
            bad(f"--mode must be one of {', '.join(MODES)} (got {self.mode!r})")
        if self.cache not in CACHE_MODES:
            bad(f"--cache must be one of {', '.join(CACHE_MODES)} (got {self.cache!r})")
        if self.sampler_on not in SAMPLER_PLACES:
            bad(f"--sampler-on must be one of {', '.join(SAMPLER_PLACES)} (got {self.sampler_on!r})")
        if self.soft_embedding not in SOFT_EMBEDDINGS:
            bad(f"--soft-embedding must be one of {', '.join(SOFT_EMBEDDINGS)} (got {self.soft_embedding!r})")
        if self.mode == "reference" and (self.threshold is not None or self.factor is not None):
            bad("reference mode reproduces llama.cpp's example, which has no --threshold/--factor")
        if self.mode == "reference" and self.cache not in ("none", "auto"):
            bad("reference mode recomputes every step; it cannot be combined with --cache")
        if self.mode == "reference" and self.logit_bias:
            bad("reference mode reproduces llama.cpp's example, which has no logit bias")
        if not isinstance(self.logit_bias, (tuple, list)):
            bad(f"logit_bias must be a list of (token id, bias) pairs (got {type(self.logit_bias).__name__})")
        if len(self.logit_bias) > MAX_LOGIT_BIAS:
            bad(f"logit_bias has {len(self.logit_bias)} entries; at most {MAX_LOGIT_BIAS} are allowed")
        for entry in self.logit_bias:
            if not isinstance(entry, (tuple, list)) or len(entry) != 2 or not _is_int(entry[0]) or entry[0] < 0:
                bad(f"logit_bias keys must be token ids >= 0 (got {entry!r})")
            if not _is_number(entry[1]) or not -MAX_BIAS <= float(entry[1]) <= MAX_BIAS:
                bad(f"logit_bias values must be numbers in [-{MAX_BIAS:g}, {MAX_BIAS:g}] "
                    f"(got {entry[1]!r} for token {entry[0]})")
        if self.entropy_bound is not None and self.entropy_bound <= 0:
            bad(f"--entropy-bound must be > 0 (got {self.entropy_bound})")
        if self.t_min is not None and self.t_max is not None and not 0 <= self.t_min < self.t_max:
            bad(f"need 0 <= t_min < t_max (got t_min={self.t_min}, t_max={self.t_max})")
        # the schedule's temperatures run from t_max down to t_min + (t_max - t_min) / steps
        if self.t_max is not None and 0 <= self.t_max < MIN_TEMPERATURE:
            bad(f"--t-max must be at least {MIN_TEMPERATURE:g} (got {self.t_max:g})")
        if self.t_min is not None and 0 < self.t_min < MIN_TEMPERATURE:
            bad(f"--t-min must be 0 or at least {MIN_TEMPERATURE:g} (got {self.t_min:g})")
        if self.steps is not None and self.block_length and self.gen_length and self.mode == "dgchat":
            n_blocks = self.gen_length // self.block_length
            if self.threshold is None and self.factor is None and self.steps % n_blocks:
                bad(
                    f"--steps {self.steps} must be a multiple of the number of blocks "
                    f"({self.gen_length} / {self.block_length} = {n_blocks})"
                )


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


_FIELD_NAMES = {f.name for f in fields(DiffusionParams)}


def max_threads() -> int:
    """The most CPU threads dgchat gives llama.cpp: 4 per core, at most llama.cpp's 512."""
    return max(1, min(GGML_MAX_N_THREADS, THREADS_PER_CORE * (os.cpu_count() or 1)))


def threads_problem(value: Any) -> str | None:
    """Why `value` is no thread count ("must be a whole number from 1 to 8 ...; got 0"), or None."""
    top = max_threads()
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
        return f"must be a whole number from 1 to {top} (4 per core on this machine; got {value!r})"
    return None


def check_threads(value: Any, name: str = "--threads") -> int | None:
    """`value` as a thread count: None (all cores) or a whole number from 1 to max_threads().
    InvalidParameterError names `name` (the flag or config key) and the allowed range."""
    if value is None:
        return None
    problem = threads_problem(value)
    if problem:
        raise InvalidParameterError(f"{name} {problem}")
    return value
