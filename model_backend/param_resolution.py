"""Where each sampler value comes from: one precedence for the CLI, the app, the server and NPCs.

A run's settings are layered, lowest first:

    family default  <  model file  <  config  <  chat / card  <  request / flag

- "family default": the architecture family's published settings (model_info) and the engine's
  built-in fallbacks (a 128-token canvas for masked models, 256 for DiffusionGemma, ...);
- "model file": the GGUF's `dgchat.*` / `dgchat.diffusion.*` keys (`ModelInfo.file_defaults`);
- "config": config.toml ([sampler], [engine]); the caller reads it and passes the values in
  (model_backend never imports dgchat.config);
- "chat", "card": a chat's own settings in the app, an NPC card's or line's settings;
- "request", "flag": an API request's fields, command-line flags.

Two more sources name values no layer chose: "derived" (computed from others: max_tokens from the
canvas, `cache = auto` turned into prefix or none, a server's canvas fitted to max_tokens) and
"default" (DiffusionParams' own field defaults: seed 0, cfg_scale 0, ...). A remote server that
fills settings by rules of its own reports "server".

Every rule that derives settings from other settings for one kind of run is a named function here
("derived settings" below): dgchat serve's canvas fitted to max_tokens (`canvas_for_answer`) and its
infill (`infill_layer`), the setup wizard's test answer (`short_answer`), the drafting screen's
proposals (`rewrite_layer`, `drafting_steps`, `one_canvas_answer`) and NPC lines (`npc_line_layers`);
each returns its values as a Layer with their source.

Everything here is a pure function of its arguments: `Layer`s in, `ResolvedParams` out.
`DiffusionEngine.resolve` (and DiffusionGemma's) delegate to `resolve_params`, so the values that
win are the engine's; `resolved_for` adds the sources to any engine's own resolve.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
import secrets
from typing import Any

from dgchat.model_backend.errors import InvalidParameterError
from dgchat.model_backend.params import DiffusionParams

FAMILY_DEFAULT = "family default"
MODEL_FILE = "model file"
CONFIG = "config"
CHAT = "chat"
CARD = "card"
REQUEST = "request"
FLAG = "flag"
DERIVED = "derived"
DEFAULT = "default"
SERVER = "server"
# a feature's own settings: the drafting screen's proposals, NPC lines (their place in the order is the
# caller's: a default below the config, or fixed above everything, e.g. a proposal's seed)
DRAFTING = "drafting"
NPC = "npc"
# a seed drawn afresh for one run because no user layer chose one (`with_fresh_seed`)
RANDOM = "random"
# the caller's layers, lowest first (a later layer overrides an earlier one)
USER_SOURCES = (CONFIG, CHAT, CARD, REQUEST, FLAG)

# engine fallbacks for values neither the family nor the file names (part of the family layer)
MASKED_FALLBACK: dict[str, Any] = {"gen_length": 128, "steps": 128, "algorithm": "confidence", "temperature": 0.0,
                                   "top_k": 0, "top_p": 1.0}
MASKED_EPS = 1e-3  # Dream-style schedule end when no block schedule is in force
UNIFORM_FALLBACK: dict[str, Any] = {"gen_length": 256, "steps": 48, "temperature": 0.0, "top_k": 0, "top_p": 1.0}
UNIFORM_MIN_MAX_TOKENS = 256  # DiffusionGemma: an answer may continue past a short canvas
BLOCK_FALLBACK: dict[str, Any] = {"max_tokens": 512, "temperature": 0.0, "top_k": 0, "top_p": 1.0,
                                  "algorithm": "confidence"}

_PLAIN = DiffusionParams()
_FIELDS = tuple(f.name for f in fields(DiffusionParams))
_MISSING = object()  # a layer that does not set a field (None is a value a layer may hold)


@dataclass(frozen=True)
class Layer:
    """The values one source sets (only those: an unset field is absent, not None)."""

    source: str
    values: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, source: str, values: DiffusionParams | Mapping[str, Any] | None) -> Layer:
        """A layer from DiffusionParams (its fields that differ from the unset DiffusionParams(): a
        flag left at its default sets nothing) or from a mapping (every key whose value is not None:
        a chat's stored `seed = 0` is a choice)."""
        if values is None:
            return cls(source, {})
        if isinstance(values, DiffusionParams):
            return cls(source, {n: getattr(values, n) for n in _FIELDS
                                if getattr(values, n) is not None and getattr(values, n) != getattr(_PLAIN, n)})
        unknown = [k for k in values if k not in _FIELDS]
        if unknown:
            raise InvalidParameterError(f"unknown sampler setting {unknown[0]!r} ({source})")
        return cls(source, {k: v for k, v in values.items() if v is not None})


@dataclass(frozen=True)
class ResolvedParams:
    """The parameters a run uses and, per setting in effect, which layer chose it."""

    params: DiffusionParams
    sources: Mapping[str, str]  # field name -> source, for every field that is not None
    precise: bool | None = None  # exact mode (f32 KV cache, no flash attention); None: not known here
    precise_source: str = DEFAULT

    def source(self, name: str) -> str:
        return self.precise_source if name == "precise" else self.sources[name]

    def table(self) -> dict[str, dict[str, Any]]:
        """name -> {"value", "source"} for every setting in effect (JSON-ready: tuples become lists)."""
        out: dict[str, dict[str, Any]] = {}
        for name in _FIELDS:
            value = getattr(self.params, name)
            if value is None:
                continue
            if isinstance(value, tuple):
                value = [list(v) if isinstance(v, tuple) else v for v in value]
            out[name] = {"value": value, "source": self.sources.get(name, DEFAULT)}
        if self.precise is not None:
            out["precise"] = {"value": self.precise, "source": self.precise_source}
        return out


# -- the layers ------------------------------------------------------------------------------------

def model_layers(info: Any) -> tuple[Layer, Layer]:
    """The model's two layers from its ModelInfo: the family's published settings and the file's own."""
    from_file = set(getattr(info, "file_defaults", ()) or ())
    defaults = dict(info.defaults)
    return (Layer(FAMILY_DEFAULT, {k: v for k, v in defaults.items() if k not in from_file}),
            Layer(MODEL_FILE, {k: v for k, v in defaults.items() if k in from_file}))


def merge(layers: Iterable[Layer]) -> tuple[DiffusionParams, dict[str, str]]:
    """The caller's layers (lowest first) as one DiffusionParams and the source of each set field:
    what every caller passed to `engine.resolve` before (`config.updated(**chat)`, flags)."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for layer in layers:
        for name, value in layer.values.items():
            values[name] = value
            sources[name] = layer.source
    return DiffusionParams(**values), sources


def precise_setting(*choices: tuple[str, bool | None]) -> tuple[bool, str]:
    """Exact mode from (source, value) pairs, lowest first; a None value is not a choice. Off by default."""
    value, source = False, DEFAULT
    for where, choice in choices:
        if choice is not None:
            value, source = bool(choice), where
    return value, source


# -- resolution ------------------------------------------------------------------------------------

class _Filling:
    """DiffusionParams being filled in, with the source of each value."""

    def __init__(self, params: DiffusionParams, sources: Mapping[str, str]) -> None:
        self.params = params
        self.sources = dict(sources)

    def fill(self, values: Mapping[str, Any], source: str) -> None:
        """Fields still None take `values`."""
        for name, value in values.items():
            if name in _FIELDS and getattr(self.params, name) is None and value is not None:
                self.set(name, value, source)

    def set(self, name: str, value: Any, source: str) -> None:
        self.params = replace(self.params, **{name: value})
        if value is None:
            self.sources.pop(name, None)
        else:
            self.sources[name] = source

    def done(self) -> dict[str, str]:
        return {n: self.sources.get(n, DEFAULT) for n in _FIELDS if getattr(self.params, n) is not None}


def resolve_params(info: Any, layers: Sequence[Layer] | DiffusionParams | None = None, *,
                   precise: tuple[bool, str] | None = None) -> ResolvedParams:
    """The settings a run on the model `info` (a ModelInfo) uses, given the caller's layers (lowest
    first; a bare DiffusionParams is one "request" layer), with the source of every value. Raises
    InvalidParameterError as the engine does for settings that do not apply or do not validate."""
    if isinstance(layers, DiffusionParams) or layers is None:
        layers = [Layer.of(REQUEST, layers)]
    params, sources = merge(layers)
    filling = _Filling(params, sources)
    family, from_file = model_layers(info)
    if info.family == "diffusion_gemma":
        _resolve_uniform(filling, family, from_file)
    elif info.family == "block_diffusion":
        _resolve_block(filling, family, from_file, int(info.attention_block))
    else:
        _resolve_masked(filling, family, from_file, has_kv_memory=bool(info.has_kv_memory))
    filling.params.validate()
    value, where = precise if precise is not None else (None, DEFAULT)
    return ResolvedParams(filling.params, filling.done(), value, where)


def _resolve_masked(f: _Filling, family: Layer, from_file: Layer, *, has_kv_memory: bool) -> None:
    user = f.params
    drop: set[str] = set()
    # the two schedules are alternatives: a user's choice of one drops the model's default of the other
    if user.eps is not None and user.block_length is None:
        drop.add("block_length")
    if user.block_length is not None and user.eps is None:
        drop.add("eps")
    # the file's value of a field wins over the family's (fill the file's first)
    f.fill({k: v for k, v in from_file.values.items() if k not in drop}, MODEL_FILE)
    f.fill({k: v for k, v in family.values.items() if k not in drop}, FAMILY_DEFAULT)
    f.fill(MASKED_FALLBACK, FAMILY_DEFAULT)
    p = f.params
    if p.block_length is None and p.eps is None:
        f.set("eps", MASKED_EPS, FAMILY_DEFAULT)
    p = f.params
    if p.block_length is not None and p.block_length >= p.gen_length:
        # one block covers the canvas: no block schedule, the timestep schedule instead
        f.set("block_length", None, DERIVED)
        f.fill({"eps": MASKED_EPS}, FAMILY_DEFAULT)
    if f.params.max_tokens is None:
        f.set("max_tokens", f.params.gen_length, DERIVED)
    if f.params.cache == "auto":
        # prefix caching where the GGUF has KV memory (--cache-capable conversions): 2.4x the
        # tokens/s of full recompute at 256 tokens (README, "Fast decoding"); Fast-dLLM
        # (Wu et al. 2025) reports about a point of accuracy for it on LLaDA. Reference mode
        # and models without KV memory recompute everything.
        use_prefix = has_kv_memory and f.params.mode != "reference"
        f.set("cache", "prefix" if use_prefix else "none", DERIVED)


def _resolve_uniform(f: _Filling, family: Layer, from_file: Layer) -> None:
    f.fill(from_file.values, MODEL_FILE)
    f.fill(family.values, FAMILY_DEFAULT)
    f.fill(UNIFORM_FALLBACK, FAMILY_DEFAULT)
    if f.params.max_tokens is None:
        f.set("max_tokens", max(int(f.params.gen_length), UNIFORM_MIN_MAX_TOKENS), DERIVED)
    p = f.params
    _refuse_masked_modes(p, "DiffusionGemma is uniform-state diffusion",
                         "DiffusionGemma always caches its encoder exactly")
    if p.cache != "none":
        f.set("cache", "none", DERIVED)  # no masked-diffusion cache: the encoder cache is exact
    if p.block_length is not None or p.threshold is not None or p.factor is not None:
        raise InvalidParameterError("--block-length/--threshold/--factor are masked-diffusion options; "
                                    "DiffusionGemma uses --entropy-bound")


def _refuse_masked_modes(p: DiffusionParams, why_not_reference: str, how_it_caches: str) -> None:
    """Reference mode (llama.cpp's masked-diffusion example) and the masked-diffusion cache modes
    belong to masked models: another family refuses them, saying what it is and how it caches."""
    if p.mode == "reference":
        raise InvalidParameterError(f"reference mode reproduces llama.cpp's masked-diffusion example; {why_not_reference}")
    if p.cache not in ("none", "auto"):
        raise InvalidParameterError(f"{how_it_caches}; --cache does not apply")


def check_block_flags(block: int, params: DiffusionParams, sources: Mapping[str, str]) -> None:
    """Refuse a canvas or block length that a command-line flag sets to anything but the model's block."""
    for name in ("gen_length", "block_length"):
        value = getattr(params, name)
        if value is not None and value != block and sources.get(name) == FLAG:
            raise InvalidParameterError(f"--{name.replace('_', '-')} {value}: this model denoises blocks of {block} "
                                        "tokens, fixed by its training; set the answer length with --max-tokens")


# masked-diffusion and DiffusionGemma settings a block-diffusion run has no use for (unset = None or the field default)
_NOT_BLOCK = ("eps", "factor", "entropy_bound", "t_min", "t_max", "stability_threshold", "confidence_threshold",
              "pad_bias")


def _resolve_block(f: _Filling, family: Layer, from_file: Layer, block: int) -> None:
    """Block diffusion (SDAR, BD3LM; docs/BLOCK_DIFFUSION.md): steps are per block, the canvas is one
    block of the file's size. A canvas or block length of another size from a command-line flag is
    refused; one from any other layer (config, a chat, a card, a caller fitting a canvas model's
    canvas to an answer) is replaced by the block size ("derived")."""
    check_block_flags(block, f.params, f.sources)
    for name in ("gen_length", "block_length"):
        value = getattr(f.params, name)
        if value is not None and value != block:
            f.set(name, block, DERIVED)
    p = f.params
    _refuse_masked_modes(p, "this is a block-diffusion model", "block diffusion always caches finished blocks exactly")
    if p.cfg_scale or p.alg_temp or (p.algorithm not in (None, "confidence")):
        raise InvalidParameterError("--cfg-scale, --alg-temp and --algorithm are masked-diffusion options; "
                                    "block diffusion commits its most confident positions")
    unused = [n for n in _NOT_BLOCK if getattr(p, n) is not None]
    if unused:
        raise InvalidParameterError(f"--{unused[0].replace('_', '-')} does not apply to block diffusion "
                                    "(its settings: --steps per block, --threshold, --temperature, --max-tokens)")
    f.fill(from_file.values, MODEL_FILE)
    f.fill(family.values, FAMILY_DEFAULT)
    f.fill(BLOCK_FALLBACK, FAMILY_DEFAULT)
    f.set("cache", "none", DERIVED)  # no masked-diffusion cache: finished blocks are cached exactly


# -- sources for values an engine or a server decided ----------------------------------------------

def explain(final: DiffusionParams, layers: Sequence[Layer], info: Any = None, *,
            precise: tuple[bool, str] | None = None, unknown: str = DERIVED) -> ResolvedParams:
    """Sources for parameters resolved elsewhere (a remote server's rules, a canvas fitted to the
    answer): each value is credited to the highest layer that set that very value, else to the
    model's layers (with `info`: the file's, then the family's), else to `unknown` ("default" for
    DiffusionParams' own default values)."""
    candidates = list(reversed(list(layers)))  # the highest layer first
    if info is not None and getattr(info, "defaults", None) is not None:
        family, from_file = model_layers(info)
        fallback = family_fallback(str(getattr(info, "family", "")))
        candidates += [from_file, Layer(FAMILY_DEFAULT, {**fallback, **family.values})]
    sources: dict[str, str] = {}
    for name in _FIELDS:
        value = getattr(final, name)
        if value is None:
            continue
        where = next((layer.source for layer in candidates if layer.values.get(name, _MISSING) == value), None)
        if where is None:
            where = DEFAULT if value == getattr(_PLAIN, name) else unknown
        sources[name] = where
    value, src = precise if precise is not None else (None, DEFAULT)
    return ResolvedParams(final, sources, value, src)


def resolved_for(engine: Any, layers: Sequence[Layer], *, precise: tuple[bool, str] | None = None,
                 unknown: str = DERIVED, remote: bool = False) -> ResolvedParams:
    """`engine.resolve` on the merged layers (the values are the engine's, with its own checks) and
    the source of each. A local engine resolves by `resolve_params`, whose sources are exact; for
    other engines the sources are credited by `explain`. remote: a server's model, whose settings
    no layer chose are the server's ("server")."""
    merged, merged_sources = merge(layers)
    info = getattr(engine, "info", None)
    if getattr(info, "family", None) == "block_diffusion" and not remote:
        check_block_flags(int(info.attention_block), merged, merged_sources)  # engine.resolve replaces them
    final = engine.resolve(merged)
    if remote:
        return explain(final, layers, precise=precise, unknown=SERVER)
    if info is not None and getattr(info, "defaults", None) is not None:
        try:
            tracked = resolve_params(info, layers, precise=precise)
        except (InvalidParameterError, TypeError, ValueError):  # not a model these rules know
            tracked = None
        if tracked is not None and tracked.params == final:
            return tracked
    return explain(final, layers, info, precise=precise, unknown=unknown)


# -- derived settings ------------------------------------------------------------------------------
# Every rule that computes settings from other settings for one kind of run lives here, each in a
# named function. Each returns what it derives as a Layer whose source is DERIVED (an NPC line's
# defaults: NPC), so that the caller applies it (`replace(params, **layer.values)`) or merges it, and
# a run's settings can be explained (`explain`) down to the rule that chose them.

def family_fallback(family: str) -> Mapping[str, Any]:
    """The engine's fallbacks of a family (ModelInfo.family: "diffusion_gemma", "block_diffusion";
    anything else is masked diffusion) for the values its published settings and file leave unset."""
    return {"diffusion_gemma": UNIFORM_FALLBACK, "block_diffusion": BLOCK_FALLBACK}.get(family, MASKED_FALLBACK)


def proportional_steps(steps: int, canvas: int, model_canvas: int, n_blocks: int = 1, *, round_up: bool) -> int:
    """The steps for a canvas of `canvas` positions cut from the model's canvas of `model_canvas`
    positions with `steps` steps: a shorter canvas takes proportionally fewer steps, so each
    position keeps the share of steps the model's settings give it (the published settings tie the
    steps to the canvas: LLaDA's generate.py 128 steps for 128 tokens, Dream's steps =
    max_new_tokens). The share is at least one step and at most the model's.

    With `n_blocks` blocks the count is then a whole multiple of the blocks, at least one a block:
    LLaDA's semi-autoregressive schedule gives every block steps // num_blocks (generate.py), and
    `validate` refuses any other count. `round_up`: up to the next multiple (dgchat serve's fitted
    canvas: an answer keeps at least the model's steps a token); else down (the setup wizard's test
    answer: at most them, it is meant to be quick)."""
    share = max(1, min(steps, round(steps * canvas / model_canvas)))
    if n_blocks <= 1:
        return share
    if round_up:
        return max(n_blocks, -(-share // n_blocks) * n_blocks)
    share = max(n_blocks, share)
    return share - share % n_blocks


def canvas_for_answer(model: DiffusionParams, max_tokens: int, steps: int | None = None) -> Layer:
    """A canvas model's canvas fitted to an answer of at most `max_tokens` tokens (dgchat serve's
    chat and text completions; `model`: the model's resolved canvas, blocks and steps): no longer
    than needed, rounded up to whole blocks (one block when the answer fits in one: the canvas is
    just the answer), with proportionally fewer steps rounded up per block (`proportional_steps`)
    unless `steps` were chosen. Nothing when the answer fills the model's canvas."""
    canvas = int(model.gen_length)
    if max_tokens >= canvas:
        return Layer(DERIVED, {})
    block = model.block_length if model.block_length and model.block_length < canvas else None
    if block is not None and max_tokens <= block:
        block = None  # one block: the canvas is just the answer
    gen = max_tokens if block is None else min(canvas, -(-max_tokens // block) * block)
    values: dict[str, Any] = {"gen_length": gen}
    if steps is None and model.steps:
        n_blocks = max(1, gen // block) if block else 1
        values["steps"] = proportional_steps(int(model.steps), gen, canvas, n_blocks, round_up=True)
    return Layer(DERIVED, values)


def short_answer(full: DiffusionParams, tokens: int, *, block_diffusion: bool) -> Layer:
    """A run's settings (`full`, resolved) cut to an answer of at most `tokens` tokens: the setup
    wizard's test answer (app/trial.py). Block diffusion writes block after block, its canvas one
    block already: only the answer's length (max_tokens) is cut. A canvas model's canvas becomes
    `tokens` positions, its blocks kept where they divide it (else one block), with proportionally
    fewer steps rounded down per block (`proportional_steps`), and the answer that one canvas.
    Nothing when the run is that short already."""
    if block_diffusion:
        if full.max_tokens is None or full.max_tokens <= tokens:
            return Layer(DERIVED, {})
        return Layer(DERIVED, {"max_tokens": tokens})
    if int(full.gen_length) <= tokens:
        return Layer(DERIVED, {})
    block = full.block_length if full.block_length and tokens % full.block_length == 0 else None
    n_blocks = tokens // block if block else 1
    steps = proportional_steps(int(full.steps), tokens, int(full.gen_length), n_blocks, round_up=False)
    return Layer(DERIVED, {"gen_length": tokens, "block_length": block, "steps": steps, "max_tokens": tokens})


def one_block(canvas: int, eps: float | None = None) -> dict[str, Any]:
    """A canvas of `canvas` positions denoised as one block that is the whole answer: a template's
    canvas (infill, an NPC line's holes), a rewritten span or a chosen length, none of which need be
    a multiple of the model's blocks. Without a block schedule the timestep schedule runs from 1 to
    `eps` (Dream's; MASKED_EPS unless one was chosen), as `_resolve_masked` does for a block as long
    as the canvas."""
    return {"block_length": None, "eps": eps if eps is not None else MASKED_EPS, "gen_length": canvas,
            "max_tokens": canvas}


def steps_per_position(positions: int) -> int:
    """Steps for `positions` positions to fill when none were chosen: one a position, every step
    committing one token (the published settings' ratio: LLaDA 128 steps for 128 tokens, Dream
    steps = max_new_tokens). dgchat serve's infill and NPC lines."""
    return max(1, positions)


def infill_layer(base: DiffusionParams, canvas: int, to_fill: int, *, uniform_state: bool) -> Layer:
    """dgchat serve's infill (a completion with a suffix): the template's canvas of `canvas`
    positions is one block (`one_block`) and, unless steps were chosen, takes one step per position
    to fill (`steps_per_position`). A uniform-state model (DiffusionGemma) keeps its own steps:
    its canvas has no masked positions to count, every position is a token from the start."""
    values = one_block(canvas, base.eps)
    if base.steps is None and not uniform_state:
        values["steps"] = steps_per_position(to_fill)
    return Layer(DERIVED, values)


def drafting_steps(span: int, steps: int | None) -> int:
    """The steps of a drafting proposal over `span` positions: the steps in effect (`steps`: the
    config's, or a server's model's) but at most one a position, else one a position."""
    return min(int(steps or span), span)


def rewrite_layer(params: DiffusionParams, canvas: int, span: int, *, uniform_state: bool) -> Layer:
    """The drafting screen's rewrite of a span of `span` positions on a template canvas of `canvas`
    positions (the span, then the fixed text after it): one block (`one_block`) and, on a masked
    model, `drafting_steps` of the steps in `params`."""
    values = one_block(canvas, params.eps)
    if not uniform_state:
        values["steps"] = drafting_steps(span, params.steps)
    return Layer(DERIVED, values)


def one_canvas_answer(resolved: DiffusionParams) -> Layer:
    """An answer kept to one canvas (a drafting proposal is shown whole): max_tokens cut to the
    canvas length where it is longer."""
    if resolved.max_tokens and resolved.gen_length and resolved.max_tokens > resolved.gen_length:
        return Layer(DERIVED, {"max_tokens": resolved.gen_length})
    return Layer(DERIVED, {})


def npc_line_layers(info: Any, card: DiffusionParams, *, canvas: int, to_fill: int, template: bool, seed: int,
                    bias: tuple[tuple[int, float], ...], temperature: float) -> list[Layer]:
    """An NPC line's settings as layers, lowest first (the model's own lie below them): NPC
    defaults under the card's and line's settings (`card`), the canvas, seed and bias over them.
    `canvas`: the line's canvas (a template's whole canvas), `to_fill`: its positions to generate,
    `temperature`: the NPC default (greedy decoding would give every variant the same line).

    Masked models: the line is one canvas (one block unless the card sets a block length, then
    whole blocks), by default one step per position to fill (`steps_per_position`). Uniform-state
    models (DiffusionGemma) keep their own steps and temperature schedule. Block diffusion (`info`
    of that family): the canvas is one block of the model's size and the steps are the model's per
    block, so neither is set; the line's budget is `max_tokens`."""
    own = Layer.of(CARD, card)
    if info.block_diffusion:
        return [Layer(NPC, {"temperature": temperature}), own,
                Layer(NPC, {"max_tokens": canvas, "seed": seed, "logit_bias": bias})]
    below: dict[str, Any] = {}  # NPC defaults: the card's own values win
    above: dict[str, Any] = {}
    if not info.uniform_state:
        below["temperature"] = temperature
        if template or card.block_length is None:
            # one block over the line: a template's canvas has any length
            above["block_length"] = None
            below["eps"] = MASKED_EPS
        elif canvas % card.block_length:
            canvas += card.block_length - canvas % card.block_length
        below["steps"] = steps_per_position(to_fill if template else canvas)
    above.update(gen_length=canvas, max_tokens=canvas, seed=seed, logit_bias=bias)
    return [Layer(NPC, below), own, Layer(NPC, above)]


# -- seeds -----------------------------------------------------------------------------------------

SEED_BOUND = 1_000_000  # a drawn seed has at most six digits: short enough to read off a message line


def draw_seed() -> int:
    """A new seed for a run whose seed nobody chose (tests replace this to make runs repeatable)."""
    return secrets.randbelow(SEED_BOUND)


def seed_chosen(resolved: ResolvedParams) -> bool:
    """Whether a person chose the seed (config, chat, card, request or flag), as opposed to the
    model's or DiffusionParams' default."""
    return resolved.sources.get("seed") in USER_SOURCES


def with_fresh_seed(resolved: ResolvedParams) -> ResolvedParams:
    """The same run with a newly drawn seed (source "random") unless a person chose one: asking again
    (regenerate, more NPC lines, another proposal) is meant to give something else, and the seed used
    is kept with the result so that it can be reproduced."""
    if seed_chosen(resolved):
        return resolved
    seed = draw_seed()
    return replace(resolved, params=replace(resolved.params, seed=seed), sources={**resolved.sources, "seed": RANDOM})


def uses_seed(params: DiffusionParams, info: Any = None) -> bool:
    """Whether the seed changes anything in a run: a sampled token (temperature, DiffusionGemma's
    temperature schedule), a random commit order, or a canvas of random tokens. A greedy run gives
    the same answer for every seed."""
    if params.autoregressive:
        return bool(params.temperature)
    if info is not None and getattr(info, "uniform_state", False):
        return True  # the canvas starts as random tokens and every step draws
    return bool(params.temperature) or (params.alg_temp or 0) > 0 or params.algorithm in ("random", "origin")
