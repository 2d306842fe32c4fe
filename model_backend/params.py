"""Generation parameters shared by the CLI, the app, the API server and the benchmarks."""

from __future__ import annotations

import math
import numbers
import os
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, ClassVar

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
# Denoising steps per canvas (block diffusion: per block). The block schedule holds one entry per
# step. 8192 = MAX_GEN_LENGTH: one step per position of the longest canvas, the most any published
# schedule takes (Dream: steps = max_new_tokens; LLaDA: 1,024 steps for 1,024 tokens). `dgchat
# serve` bounds a request's steps with this same number: a client (the app over a server, dgchat
# .remote) checks its settings against it before sending them.
MAX_STEPS = 8192
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
class ParamField:
    """One DiffusionParams setting as every reader of settings checks it: `validate`, the config
    file's [sampler] (config.py), the model catalog (hub/catalog.py), a GGUF's recommended defaults
    (model_info), an API request's `dgchat` object (server/openai_api.py) and the settings form
    (app/settings_modal.py) all take its type and range from here. Rules between settings (a canvas
    divisible by its blocks, t_min below t_max, ...) are `DiffusionParams.validate`'s."""

    kind: type  # int, float, str or bool (logit_bias: tuple)
    help: str  # what the setting does, in a line
    lo: float | None = None  # the smallest value; None: bounded by `cap` only
    hi: float | None = None  # the largest value; None: bounded by `cap` only
    lo_open: bool = False  # `lo` itself is outside the range
    hi_open: bool = False
    cap: float | None = None  # a number's largest size |value|: far above any use (see the bounds above)
    choices: tuple[str, ...] = ()  # a text setting's values

    @property
    def lowest(self) -> float | None:
        """The lower end of the range (the cap's negative when only the size is bounded)."""
        return self.lo if self.lo is not None else (-self.cap if self.cap is not None else None)

    @property
    def highest(self) -> float | None:
        """The upper end of the range (the cap when only the size is bounded)."""
        return self.hi if self.hi is not None else self.cap

    @property
    def type_text(self) -> str:
        """The value's type in words: "an integer", "a number", "a string", "true or false"."""
        return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(
            self.kind, "a list of (token id, bias) pairs")

    def has_type(self, value: Any) -> bool:
        """Whether `value` is of this setting's type (an int is a number; a bool is neither)."""
        if self.kind is int:
            return _is_int(value)
        if self.kind is float:
            return isinstance(value, numbers.Real) and not isinstance(value, bool)
        return isinstance(value, self.kind)

    def range_text(self) -> str:
        """The range of a number in words, as validate's messages say it: ">= 0", "in (0, 1]"."""
        if self.lo is not None and self.hi is not None:
            return f"in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}{')' if self.hi_open else ']'}"
        if self.lo is not None:
            return f"{'>' if self.lo_open else '>='} {self.lo:g}"
        if self.hi is not None:
            return f"{'<' if self.hi_open else '<='} {self.hi:g}"
        return ""

    @property
    def what(self) -> str:
        """What the setting takes, for messages: "a positive integer", "a number in (0, 1]",
        "one of auto, none, prefix, dual"."""
        if self.choices:
            return "one of " + ", ".join(self.choices)
        if self.kind is int:
            return {1: "a positive integer", 0: "an integer >= 0"}.get(self.lo, f"an integer >= {self.lo}")
        if self.kind is float:
            return f"a number {self.range_text()}".rstrip()
        return self.type_text

    def in_range(self, value: Any) -> bool:
        """Whether a value of the right type lies in the range (choices, lo/hi, the cap)."""
        if self.choices:
            return value in self.choices
        if self.kind not in (int, float):
            return True
        if self.cap is not None and abs(value) > self.cap:
            return False
        if self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo):
            return False
        return self.hi is None or (value < self.hi if self.hi_open else value <= self.hi)


def _number_field(meaning: str, **bounds: Any) -> ParamField:
    return ParamField(float, meaning, **{"cap": MAX_SCALE, **bounds})


# Every DiffusionParams field, in the dataclass's order (checked below): its type, range and meaning.
PARAM_FIELDS: dict[str, ParamField] = {
    "steps": ParamField(int, "denoising steps per canvas (block diffusion: per block)", lo=1, hi=MAX_STEPS),
    "gen_length": ParamField(int, "canvas length: tokens denoised at once", lo=1, hi=MAX_GEN_LENGTH),
    "block_length": ParamField(int, "LLaDA-style semi-autoregressive blocks inside the canvas", lo=1,
                               hi=MAX_GEN_LENGTH),
    "algorithm": ParamField(str, "which positions are committed first", choices=ALGORITHMS),
    "eps": _number_field("end of Dream's timestep schedule (t runs from 1 to eps)", lo=0.0, hi=1.0, hi_open=True),
    "temperature": _number_field("sampling temperature; 0 is greedy", lo=0.0),
    "top_k": ParamField(int, "sample among the k most likely tokens; 0 is off", lo=0, hi=MAX_TOP_K),
    "top_p": _number_field("nucleus sampling: the most likely tokens up to this probability", lo=0.0,
                           lo_open=True, hi=1.0),
    "cfg_scale": _number_field("classifier-free guidance (an unconditional pass with the prompt masked)",
                               lo=0.0),
    "threshold": _number_field("Fast-dLLM: commit every position at least this sure", lo=0.0, lo_open=True,
                               hi=1.0),
    "factor": _number_field("Fast-dLLM factor parallel decoding", lo=0.0, lo_open=True),
    "alg_temp": _number_field("randomness of which positions are committed (Dream's alg_temp)", lo=0.0),
    "gumbel": ParamField(bool, "llama.cpp's add_gumbel_noise (reference mode)"),
    "seed": ParamField(int, "the random seed: the same seed repeats an answer", lo=0, hi=MAX_SEED),
    "max_tokens": ParamField(int, "the longest answer, over as many canvases as it takes", lo=1, hi=MAX_TOKENS),
    "early_stop": ParamField(bool, "stop at the end token instead of filling every canvas"),
    "mode": ParamField(str, "reference: token for token what llama.cpp's diffusion example does",
                       choices=MODES),
    "cache": ParamField(str, "KV reuse across steps (auto: prefix where the model has KV memory)",
                        choices=CACHE_MODES),
    "entropy_bound": _number_field("DiffusionGemma: the entropy a step may commit", lo=0.0, lo_open=True,
                                   cap=MAX_BUDGET),
    "t_min": _number_field("DiffusionGemma: the last step's temperature", lo=0.0),
    "t_max": _number_field("DiffusionGemma: the first step's temperature", lo=0.0, lo_open=True),
    "stability_threshold": ParamField(int, "DiffusionGemma: steps a position must stay the same to be kept",
                                      lo=0, hi=MAX_STEPS),
    # no lower bound: a negative threshold (the benches' -1) means no canvas ever stops early
    "confidence_threshold": _number_field("DiffusionGemma: the mean entropy below which a canvas is done "
                                          "(below 0: never)", cap=MAX_BUDGET),
    "autoregressive": ParamField(bool, "decode left to right with the causal encoder (DiffusionGemma --ar)"),
    "pad_bias": _number_field("DiffusionGemma: added to the pad token's logit at every step", cap=MAX_BIAS),
    "logit_bias": ParamField(tuple, "((token id, bias), ...) added to the logits; -100 bans a token"),
    "sampler_on": ParamField(str, "where each step's vocabulary-wide sampling runs", choices=SAMPLER_PLACES),
    "soft_embedding": ParamField(str, "DiffusionGemma's self-conditioning embedding", choices=SOFT_EMBEDDINGS),
}


@dataclass(frozen=True)
class DiffusionParams:
    """How to denoise. Fields left at None take the model's recommended default (GGUF `dgchat.*`
    keys, else the architecture's published defaults); see `ModelInfo.default_params`."""

    # each field's type, range and meaning: what every reader of settings checks (ParamField)
    FIELDS: ClassVar[dict[str, ParamField]] = PARAM_FIELDS

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
    # tokens ("top-k"); "auto": exact in exact mode (--precise), on a GPU or for vocabularies up to
    # 65,536, else top-k
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
        ints (not bools or floats), numbers must be finite. Each field's type and range are its row
        of PARAM_FIELDS; the rules between fields follow them."""

        def bad(msg: str) -> None:
            raise InvalidParameterError(msg)

        def unset(name: str, spec: ParamField, value: Any) -> bool:
            # None is "the model's default" for the optional fields; an integer field is never
            # required to be set (a seed of None is the caller's to fill)
            return value is None and (name in _OPTIONAL or spec.kind is int)

        # each field alone, its type and size first: a number from an untrusted source must be
        # finite and bounded before any rule compares it
        for name, spec in PARAM_FIELDS.items():
            value = getattr(self, name)
            if unset(name, spec, value):
                continue
            flag = "--" + name.replace("_", "-")
            if spec.kind is int:
                if not _is_int(value) or value < spec.lo:
                    bad(f"{flag} must be {spec.what} (got {value!r})")
                if value > spec.hi:
                    bad(f"{flag} must be at most {spec.hi} (got {value!r})")
            elif spec.kind is float:
                if not _is_number(value):
                    bad(f"{flag} must be a finite number (got {value!r})")
                if abs(value) > spec.cap:
                    bad(f"{flag} must be at most {spec.cap:g} in size (got {float(value)!r})")
            elif spec.kind is bool and not isinstance(value, bool):
                bad(f"{name} must be true or false (got {value!r})")
        if self.block_length is not None:
            if self.mode == "dgchat" and self.gen_length and self.gen_length % self.block_length:
                bad(
                    f"canvas length {self.gen_length} is not divisible by block length {self.block_length}"
                )
        # DiffusionGemma's schedule: temperatures run from t_max down to t_min + (t_max - t_min) / steps
        if self.t_min is not None and self.t_max is not None and not 0 <= self.t_min < self.t_max:
            bad(f"need 0 <= t_min < t_max (got t_min={self.t_min}, t_max={self.t_max})")
        if self.t_max is not None and 0 <= self.t_max < MIN_TEMPERATURE:
            bad(f"--t-max must be at least {MIN_TEMPERATURE:g} (got {self.t_max:g})")
        if self.t_min is not None and 0 < self.t_min < MIN_TEMPERATURE:
            bad(f"--t-min must be 0 or at least {MIN_TEMPERATURE:g} (got {self.t_min:g})")
        # each field's range or choices
        for name, spec in PARAM_FIELDS.items():
            value = getattr(self, name)
            if unset(name, spec, value) or spec.kind not in (int, float, str) or spec.in_range(value):
                continue
            flag = "--" + name.replace("_", "-")
            if spec.choices:
                bad(f"{flag} must be one of {', '.join(spec.choices)} (got {value!r})")
            bad(f"{flag} must be {spec.range_text()} (got {value})")
        if self.temperature is not None and 0 < self.temperature < MIN_TEMPERATURE:
            bad(f"--temperature must be 0 (greedy) or at least {MIN_TEMPERATURE:g} (got {self.temperature:g})")
        if self.threshold is not None and self.factor is not None:
            bad("--threshold and --factor are alternatives; give one")
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
_OPTIONAL = frozenset(f.name for f in fields(DiffusionParams) if f.default is None)
if list(PARAM_FIELDS) != [f.name for f in fields(DiffusionParams)]:  # a new field needs its row
    raise RuntimeError("PARAM_FIELDS must list every DiffusionParams field, in order")


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
