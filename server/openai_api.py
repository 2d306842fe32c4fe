"""OpenAI-compatible requests mapped onto the diffusion engine, and the answers mapped back.

Mapping (docs/SERVER.md): max_tokens (max_completion_tokens) -> the answer's token budget (the
canvas shrinks to fit a short answer, longer answers continue on new canvases); temperature, top_p,
seed, logit_bias -> DiffusionParams; stop -> cut after generation (and generation stops early once
every choice has hit a stop string); n -> n sequences in one batched decode, seeds seed..seed+n-1;
suffix (completions) -> infill: the completion is exactly max_tokens canvas positions between the
prompt and the fixed suffix. Diffusion-only settings go in an extension object `"dgchat": {...}`.
Block diffusion (SDAR, BD3LM) writes block after block: its canvas is one block of the model's size
(nothing to fit), `steps` are per block, a chat without max_tokens gets the model's answer length,
and `suffix` is refused (a block cannot see text to its right).

Streaming: a diffusion model decides positions in any order, so a chunk carries the newly decided
*left prefix* of the answer (every position up to the first undecided one), as text deltas; with
`"dgchat": {"canvas": true}` every step also sends the whole canvas in a `dgchat` field, and
`"dgchat": {"final": true}` (implied by canvas) puts each choice's tokens, engine stop reason and
statistics on its finishing chunk: what dgchat.remote needs to stand in for a local engine.

Each field of a request is parsed and checked in request_fields.py; this module plans the
generation from them (prepare_chat, prepare_completion) and runs it (run_plan).
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from dgchat.model_backend.engine_protocol import LocalEngine
from dgchat.model_backend.errors import ContextOverflowError, DgchatError, GenerationCancelled
from dgchat.model_backend.block_denoiser import NO_INFILL
from dgchat.model_backend.events import FinalEvent, StepEvent
from dgchat.model_backend.param_resolution import REQUEST, SERVER, Layer, canvas_for_answer, explain, infill_layer
from dgchat.model_backend.params import DiffusionParams
from dgchat.model_backend.requests import CanvasTemplate
from dgchat.server.errors import ApiError
from dgchat.server.request_fields import (
    COMPLETIONS_DEFAULT_MAX_TOKENS,
    MAX_N,
    REQUEST_FIELDS,  # noqa: F401 - re-exported: imported from here, as before request_fields.py
    STREAM_KEYS,
    bad,
    check_unsupported,
    float_field,
    int_field,
    parse_dgchat,
    parse_logit_bias,
    parse_messages,
    parse_seed,
    parse_stop,
    parse_top_p,
)


# -- parameters -----------------------------------------------------------------------------------

def fit_params(engine: LocalEngine, base: DiffusionParams, max_tokens: int) -> DiffusionParams:
    """Resolved parameters for an answer of at most `max_tokens` tokens: a canvas no longer than
    needed (rounded up to whole blocks) with the model's steps-per-token ratio. A block-diffusion
    model has nothing to fit: its canvas is one block of the model's size and its steps are per
    block, whatever the answer's length (the answer ends at max_tokens)."""
    if engine.info.block_diffusion:
        return engine.resolve(replace(base, max_tokens=max_tokens))
    model = engine.resolve(replace(base, steps=None))  # the model's canvas and blocks (steps are checked below)
    # a canvas the request chose stays; else param_resolution.canvas_for_answer fits the model's
    fitted = canvas_for_answer(model, max_tokens, base.steps).values if base.gen_length is None else {}
    return engine.resolve(replace(base, **fitted, max_tokens=max_tokens))


def default_max_tokens(engine: LocalEngine, base: DiffusionParams, prompt_tokens: int) -> int:
    """A chat answer's budget when the request names none: the model's canvas (masked diffusion,
    DiffusionGemma); for block diffusion, whose canvas is one block, the model's answer length
    (`max_tokens`: the file's, else the family's 512), cut to what fits in the context after the
    prompt (its padding and a block's overrun included)."""
    d = engine.resolve(base)
    if not engine.info.block_diffusion:
        return int(d.gen_length)
    room = int(engine.n_ctx_max) - prompt_tokens - 2 * int(d.gen_length)
    return max(1, min(int(d.max_tokens), room))


def infill_params(engine: LocalEngine, base: DiffusionParams, canvas: int, to_fill: int) -> DiffusionParams:
    """Resolved parameters for a template canvas (one block; by default one position per step:
    param_resolution.infill_layer)."""
    infill = infill_layer(base, canvas, to_fill, uniform_state=engine.info.uniform_state)
    return engine.resolve(replace(base, **infill.values))


def base_params(body: dict, ext: dict[str, Any], logit_bias: tuple) -> DiffusionParams:
    sampler = {k: v for k, v in ext.items() if k not in STREAM_KEYS}
    return DiffusionParams(
        temperature=float_field(body, "temperature", 0.0, 2.0),
        top_p=parse_top_p(body),
        logit_bias=logit_bias,
        **sampler,
    )


# -- streaming the decided prefix -----------------------------------------------------------------

class TextStreamer:
    """Turns a growing token prefix into text deltas: UTF-8 decoded incrementally (a character split
    over tokens waits for its last byte), cut at the first end token and at the first stop string;
    text that could be the start of a stop string is held back until it cannot."""

    def __init__(self, piece: Callable[[int], bytes], is_end: Callable[[int], bool], stop: Sequence[str]) -> None:
        self._piece = piece
        self._is_end = is_end
        self._stop = list(stop)
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._consumed = 0
        self.text = ""
        self._ends: list[int] = []  # len(text) after each token
        self.ended = False  # an end token was reached
        self.cut: int | None = None  # where a stop string begins
        self.sent = 0

    def _consume(self, tokens: Sequence[int] | np.ndarray) -> None:
        for t in tokens[self._consumed:]:
            if self.ended:
                break
            if self._is_end(int(t)):
                self.ended = True
                break
            self.text += self._decoder.decode(self._piece(int(t)))
            self._ends.append(len(self.text))
        self._consumed = max(self._consumed, len(tokens))
        if self.cut is None and self._stop:
            hits = [i for i in (self.text.find(s) for s in self._stop) if i >= 0]
            if hits:
                self.cut = min(hits)

    @property
    def stopped(self) -> bool:
        return self.cut is not None or self.ended

    def _visible(self) -> str:
        if self.cut is not None:
            return self.text[: self.cut]
        hold = 0
        for s in self._stop:
            for k in range(min(len(s) - 1, len(self.text)), 0, -1):
                if self.text.endswith(s[:k]):
                    hold = max(hold, k)
                    break
        return self.text[: len(self.text) - hold]

    def _delta(self, visible: str) -> str:
        delta = visible[self.sent:]
        self.sent = max(self.sent, len(visible))
        return delta

    def feed(self, prefix: Sequence[int] | np.ndarray) -> str:
        self._consume(prefix)
        return self._delta(self._visible())

    def finish(self, tokens: Sequence[int] | np.ndarray | None) -> str:
        """The last delta: the rest of the answer (`tokens`: the final answer, or None to end with
        what was decided, as after a cancel)."""
        if tokens is not None:
            self._consume(tokens)
        if self.cut is None:
            tail = self._decoder.decode(b"", final=True)
            if tail:
                self.text += tail
                self._ends.append(len(self.text))
            hits = [i for i in (self.text.find(s) for s in self._stop) if i >= 0]
            if hits:
                self.cut = min(hits)
        final = self.text if self.cut is None else self.text[: self.cut]
        return self._delta(final)

    @property
    def final_text(self) -> str:
        return self.text if self.cut is None else self.text[: self.cut]

    @property
    def completion_tokens(self) -> int:
        """Tokens it took to write the returned text (up to the stop string when one cut it)."""
        if self.cut is None:
            return len(self._ends)
        return next((i + 1 for i, end in enumerate(self._ends) if end >= self.cut), len(self._ends))


def decided_prefix(event: StepEvent, limit: int | None = None) -> np.ndarray:
    """The answer's tokens that will not change any more, at most `limit` of them (the canvas may
    be longer than max_tokens). Masked diffusion: up to the first undecided (still masked) position.
    Uniform-state diffusion (DiffusionGemma): only the answer's finished canvases, because its
    sampler may still revise a position it had accepted (its state goes back to undecided, or its
    token changes) until the canvas is done; text streamed from such a position could not be taken
    back, and the answer would not be the text of its own tokens."""
    if event.uniform_state:
        prefix = np.asarray(event.answer_tokens, dtype=np.int32)
    else:
        prefix = np.concatenate([event.answer_tokens, event.canvas.decided_prefix()]).astype(np.int32)
    return prefix if limit is None else prefix[:limit]


# -- a planned generation ---------------------------------------------------------------------------

@dataclass
class GenPlan:
    kind: str  # "chat" | "text"
    prompt: np.ndarray
    params: list[DiffusionParams]  # one per choice
    stop: list[str]
    stream: bool
    include_usage: bool
    canvas: bool  # stream the canvas in a `dgchat` field
    seed: int
    limit: int  # the answer's token budget (max_tokens; with a suffix, the canvas positions before it)
    template: CanvasTemplate | None = None  # completions with a suffix
    echo: str = ""
    final: bool = False  # the finishing chunk of each choice carries its tokens, stop reason and stats
    requested: DiffusionParams | None = None  # the request's own settings (the "request" layer)

    @property
    def n(self) -> int:
        return len(self.params)


def params_table(plan: GenPlan, engine: LocalEngine) -> dict[str, dict[str, Any]]:
    """The settings of the plan's choices, each with its source (model_backend/param_resolution):
    the request, the model's defaults, "derived" (a canvas fitted to max_tokens), and exact mode
    ("server": `dgchat serve --precise`). Seeds and logit biases differ per choice or are long:
    left out, as from `settings`."""
    layers = [Layer.of(REQUEST, plan.requested)] if plan.requested is not None else []
    table = explain(plan.params[0], layers, engine.info, precise=(engine.precise, SERVER)).table()
    table.pop("seed", None)
    table.pop("logit_bias", None)
    return table


@dataclass
class ChoiceResult:
    index: int
    text: str
    finish_reason: str
    completion_tokens: int
    stats: dict[str, Any] = field(default_factory=dict)
    tokens: list[int] = field(default_factory=list)  # the answer's tokens (cut at the end token)
    stop_reason: str = ""  # the engine's: "eos" | "max_tokens" | "complete" | "cancelled"


@dataclass(frozen=True)
class _Request:
    """What every generation route reads from its body alike (`_common`)."""

    body: dict
    base: DiffusionParams  # the request's sampler settings
    ext: dict[str, Any]  # the `dgchat` extension
    n: int
    max_tokens: int | None
    seed: int


def _common(body: dict, engine: LocalEngine, default_max: int | None) -> _Request:
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    check_unsupported(body)
    ext = parse_dgchat(body, engine)
    n = int_field(body, "n", 1, MAX_N, 1)
    ctx = int(engine.n_ctx_max)
    max_tokens = int_field(body, "max_completion_tokens", 1, ctx) or int_field(body, "max_tokens", 1, ctx)
    if max_tokens is None:
        max_tokens = default_max
    seed = parse_seed(body)
    base = base_params(body, ext, parse_logit_bias(body, engine.n_vocab))
    if not isinstance(body.get("stream", False), bool):
        raise bad("`stream` must be true or false", "stream")
    return _Request(body, base, ext, n, max_tokens, seed)


def _requested(body: dict, base: DiffusionParams) -> DiffusionParams:
    """The request's own settings (validated by `_common`): the sampler fields and max_tokens if given."""
    explicit = body.get("max_completion_tokens") or body.get("max_tokens")
    return replace(base, max_tokens=explicit) if isinstance(explicit, int) else base


def _stream_options(body: dict) -> bool:
    opts = body.get("stream_options")
    if opts is None:
        return False
    if not isinstance(opts, dict):
        raise bad("`stream_options` must be an object", "stream_options")
    return bool(opts.get("include_usage", False))


def _finish_plan(engine: LocalEngine, plan: GenPlan) -> GenPlan:
    try:
        for p in plan.params:
            p.validate()
        canvas = plan.template.tokens.size if plan.template is not None else None
        check = plan.params[0] if canvas is None else replace(plan.params[0], gen_length=canvas, max_tokens=canvas)
        engine.check_fits(int(plan.prompt.size), check)
    except ContextOverflowError as exc:
        raise bad(str(exc), "max_tokens", "context_length_exceeded") from None
    return plan


def _params_error(exc: DgchatError) -> ApiError:
    return bad(str(exc), code="invalid_parameter")


@contextmanager
def _settings_refusals() -> Iterator[None]:
    """The engine's refusal of a request's settings (a DgchatError) as a 400 invalid_parameter."""
    try:
        yield
    except ApiError:
        raise
    except DgchatError as exc:
        raise _params_error(exc) from None


def _plan(kind: str, request: _Request, engine: LocalEngine, prompt: np.ndarray, first: DiffusionParams,
          max_tokens: int, template: CanvasTemplate | None = None, echo: str = "") -> GenPlan:
    """The checked plan of a chat or text completion: the first choice's settings for each of the
    request's n choices, with seeds seed, seed + 1, ..."""
    body, ext = request.body, request.ext
    params = [replace(first, seed=request.seed + i) for i in range(request.n)]
    canvas = bool(ext.get("canvas", False))
    plan = GenPlan(kind, prompt, params, parse_stop(body), bool(body.get("stream", False)), _stream_options(body),
                   canvas, request.seed, max_tokens, template, echo, final=canvas or bool(ext.get("final", False)),
                   requested=_requested(body, request.base))
    return _finish_plan(engine, plan)


def prepare_chat(body: dict, engine: LocalEngine) -> GenPlan:
    """Validate a /v1/chat/completions body and plan its generation (runs off the event loop)."""
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    messages = parse_messages(body)
    request = _common(body, engine, None)
    max_tokens = request.max_tokens
    with _settings_refusals():
        prompt = engine.chat_prompt(messages)
        if max_tokens is None:
            max_tokens = default_max_tokens(engine, request.base, int(prompt.size))
        first = fit_params(engine, request.base, max_tokens)
    return _plan("chat", request, engine, prompt, first, max_tokens)


def _prompt_tokens(body: dict, engine: LocalEngine) -> tuple[np.ndarray, str]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise bad("`prompt` is empty", "prompt")
        return engine.encode(prompt), prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        if len(prompt) > int(engine.n_ctx_max):  # before detokenizing half a million ids
            raise bad(f"`prompt` has {len(prompt)} tokens; the model's context is {int(engine.n_ctx_max)}", "prompt",
                      "context_length_exceeded")
        n_vocab = engine.n_vocab
        if not all(0 <= t < n_vocab for t in prompt):
            raise bad(f"`prompt` token ids must be in 0..{n_vocab - 1}", "prompt")
        tokens = np.array(prompt, dtype=np.int32)
        return tokens, engine.detokenize(tokens)
    if isinstance(prompt, list) and len(prompt) > 1:
        raise bad("one prompt per request (send several requests, or use `n` for several completions)", "prompt")
    raise bad("`prompt` must be a string or a list of token ids", "prompt")


def prepare_completion(body: dict, engine: LocalEngine) -> GenPlan:
    """Validate a /v1/completions body and plan its generation (runs off the event loop)."""
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    request = _common(body, engine, COMPLETIONS_DEFAULT_MAX_TOKENS)
    base, max_tokens = request.base, int(request.max_tokens)  # never None here: 16 by default
    prompt, prompt_text = _prompt_tokens(body, engine)
    suffix = body.get("suffix")
    if suffix is not None and not isinstance(suffix, str):
        raise bad("`suffix` must be a string", "suffix")
    echo = body.get("echo", False)
    if not isinstance(echo, bool):
        raise bad("`echo` must be true or false", "echo")
    template = None
    if suffix and engine.info.block_diffusion:
        raise bad(f"`suffix` (infill) is not supported by this model, {engine.label}: {NO_INFILL}; send the "
                  "prompt alone to continue it", "suffix", "unsupported_parameter")
    with _settings_refusals():
        if suffix:
            # client text: control-token markers in it stay plain text
            suffix_tokens = engine.tokenize(suffix)
            tokens = np.concatenate([np.full(max_tokens, engine.info.mask_token if engine.info.mask_token is not None
                                             else 0, dtype=np.int32), suffix_tokens]).astype(np.int32)
            fixed = np.zeros(tokens.size, dtype=bool)
            fixed[max_tokens:] = True
            template = CanvasTemplate(tokens, fixed)
            # the completion sits between the prompt and the suffix: it never ends early
            eog = tuple((int(t), -100.0) for t in engine.eog_ids())
            first = infill_params(engine, replace(base, logit_bias=base.logit_bias + eog), int(tokens.size), max_tokens)
        else:
            first = fit_params(engine, base, max_tokens)
    return _plan("text", request, engine, prompt, first, max_tokens, template, prompt_text if echo else "")


def run_plan(plan: GenPlan, engine: LocalEngine, cancel: Any, emit: Callable[[Any], None] | None) -> list[ChoiceResult]:
    """Generate (in the worker thread). With `emit`, sends ("delta", index, text, canvas-or-None)
    for streaming. Raises GenerationCancelled when the client went away (cancel set from outside)."""
    eog = set(int(t) for t in engine.eog_ids())
    pieces: dict[int, bytes] = {}

    def piece(t: int) -> bytes:
        b = pieces.get(t)
        if b is None:
            b = pieces[t] = engine.token_bytes(t)
        return b

    streamers = [TextStreamer(piece, eog.__contains__, plan.stop) for _ in range(plan.n)]
    if emit is not None:
        emit(("start",))  # the server starts the response now, not while the request waits in the queue
    own_stop = [False]  # the cancel flag was raised by us: every choice hit a stop string
    if plan.n == 1:
        events = ((0, e) for e in engine.generate(plan.prompt, plan.params[0], cancel=cancel, template=plan.template))
    else:
        templates = [plan.template] * plan.n if plan.template is not None else None
        events = engine.generate_batch([plan.prompt] * plan.n, plan.params, cancel=cancel, templates=templates)
    finals: dict[int, FinalEvent] = {}
    for i, event in events:
        if isinstance(event, FinalEvent):
            finals[i] = event
            continue
        s = streamers[i]
        delta = s.feed(decided_prefix(event, plan.limit))
        if s.cut is not None and all(x.cut is not None or x.ended or j in finals for j, x in enumerate(streamers)):
            if not cancel.is_set():
                own_stop[0] = True
                cancel.set()  # nothing more is needed: stop denoising
        if emit is not None and (delta or plan.canvas):
            canvas = _canvas_payload(engine, event, i) if plan.canvas else None
            emit(("delta", i, delta, canvas))
    if cancel.is_set() and not own_stop[0]:
        raise GenerationCancelled("the request was cancelled")
    results = []
    for i in range(plan.n):
        final = finals[i]
        s = streamers[i]
        tokens = None if final.stop_reason == "cancelled" else final.tokens[: plan.limit]
        delta = s.finish(tokens)
        if emit is not None and delta:
            emit(("delta", i, delta, None))
        reason = "stop" if (s.cut is not None or final.stop_reason in ("eos", "complete") or s.ended) else "length"
        if plan.template is not None and s.cut is None:
            reason = "length"  # infill: the completion filled its span
        results.append(ChoiceResult(i, s.final_text, reason, s.completion_tokens, final.stats.as_dict(),
                                    [int(t) for t in final.tokens[: plan.limit]], final.stop_reason))
    return results


def _canvas_payload(engine: LocalEngine, event: StepEvent, index: int) -> dict[str, Any]:
    """One step of one choice, for `"dgchat": {"canvas": true}` streams: what a client needs to
    draw the canvas (model_backend.canvas_view) and to rebuild the StepEvent (dgchat.remote).
    `answer_tokens` (the answer's earlier canvases) comes with the first step of each canvas only;
    `answer_length` every step, so a client can tell it has them all."""
    mask = engine.info.mask_token
    tokens = [int(t) for t in event.canvas.tokens]
    special = getattr(engine, "is_special", None)
    payload: dict[str, Any] = {
        "choice": index,
        "step": event.step,
        "total_steps": event.total_steps,
        "canvas_index": event.canvas_index,
        "canvas": [None if (mask is not None and t == mask) else engine.piece(t) for t in tokens],
        "state": [int(x) for x in event.canvas.state],
        "tokens": tokens,
        "canvas_step": event.canvas_step,
        "committed": int(event.committed),
        "uniform_state": bool(event.uniform_state),
        "elapsed_s": round(float(event.elapsed_s), 4),
        "timing": {"model_ms": round(float(event.timing.model_ms), 3),
                   "sampler_ms": round(float(event.timing.sampler_ms), 3)},
        "answer_length": int(event.answer_tokens.size),
    }
    if event.canvas_step == 1:
        answer = [int(t) for t in event.answer_tokens]
        payload["answer_tokens"] = answer
        payload["answer_text"] = [engine.piece(t) for t in answer]
    seen = set(tokens) | set(payload.get("answer_tokens", ()))
    # which of the tokens shown are markup (never drawn as text): the client has no vocabulary
    payload["special"] = sorted(t for t in seen if special is not None and special(t))
    return payload
