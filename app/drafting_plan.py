"""What the drafting screen asks the model: a span rewritten (or filled in) between the text before
and after it, or text continued from the cursor. No UI here; these run on the screen's worker thread.

The model sees the document as plain text (no chat template): the text before the span is the
prompt, and for a rewrite the canvas is `[span: N free positions][text after: fixed][end]`, a
CanvasTemplate as in dgchat.npc's line templates and the server's `suffix` completions. The text
after is tokenized on its own and checked to spell exactly its UTF-8 bytes (npc.templates.Tokenizer.
segment), so the model conditions on the real text; an end token is fixed after it when it is the
end of the document. The document itself is never rebuilt from tokens: the proposal is the span's
decoded bytes, and accepting it replaces only the selected range, so the text before and after
stays byte-identical by construction.

Long documents: the prompt keeps the last MAX_BEFORE_TOKENS tokens before the span, the canvas the
first MAX_AFTER_TOKENS after it, and both shrink further when the model's context is smaller.

On a server (plan_remote) there is no tokenizer here: the text goes over the wire as text. A rewrite
is /v1/completions with the text before as `prompt` and the text after as `suffix`, which dgchat
serve fills as the same kind of canvas (exactly `max_tokens` positions before the fixed suffix);
other servers have no such infill, so only continuing works there. The span's length is estimated
from the selection's characters (+/- adjust it), and the text around it is cut by characters.

Models that write left to right (block diffusion: SDAR, BD3LM; docs/BLOCK_DIFFUSION.md) cannot fill
a gap between two texts: a position sees its own block and the blocks before it, never the text
after it, and the engine refuses a canvas template (infill). For them a rewrite is planned as a
left-to-right regeneration of the selection's length from the text before it (no template,
max_tokens = the span, no end token inside it), and the screen says that the text after the
selection is not seen (`left_to_right_note`); a continuation runs over several blocks (the request's
length, or DEFAULT_CONTINUE_TOKENS), not one canvas, which is a single block of 4-32 tokens there.
On a dgchat serve server of such a model the rewrite is a plain completion of the text before it
(no suffix), for the same reason.
"""

from __future__ import annotations

from collections.abc import Mapping

import weakref
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from dgchat.model_backend.engine_protocol import Engine, ServedEngine, served
from dgchat.model_backend.errors import DgchatError
from dgchat.model_backend.events import FinalEvent
from dgchat.model_backend.model_info import BLOCK_DIFFUSION, VARIANT_NAMES
from dgchat.model_backend.param_resolution import (
    CONFIG,
    DRAFTING,
    Layer,
    drafting_steps,
    merge,
    one_block,
    one_canvas_answer,
    rewrite_layer,
)
from dgchat.model_backend.params import DiffusionParams
from dgchat.model_backend.requests import CanvasTemplate
from dgchat.npc.errors import TemplateError
from dgchat.npc.templates import Tokenizer
from dgchat.recording.blocks import block_size_of
from dgchat.remote import RemotePrompt

MAX_BEFORE_TOKENS = 1024
MAX_AFTER_TOKENS = 512
BEFORE_CHARS = 16_000  # text looked at before tokenizing (bounds the work on a long document)
AFTER_CHARS = 8_000
DEFAULT_FILL_TOKENS = 16  # a fill at the cursor (nothing selected)
MAX_SPAN_TOKENS = 512
DRAFT_TEMPERATURE = 0.8  # masked models: a retry with the next seed gives another proposal
# on a server: no tokenizer, so lengths in characters (a token is rarely under 2 characters of text)
REMOTE_BEFORE_CHARS = 2 * MAX_BEFORE_TOKENS
REMOTE_AFTER_CHARS = 2 * MAX_AFTER_TOKENS
CHARS_PER_TOKEN = 4  # a selection's span estimated from its length (English text: about 4 a token)
DEFAULT_CONTINUE_TOKENS = 64  # continuing on a server without diffusion settings, or with a left-to-right model


@dataclass(frozen=True)
class DraftRequest:
    kind: str  # "rewrite" (the span between before and after) | "continue" (from the cursor)
    before: str
    selected: str
    after: str
    seed: int
    length: int | None = None  # span / canvas tokens; None: the selection's length (rewrite), the settings' canvas


@dataclass(frozen=True)
class DraftPlan:
    kind: str
    prompt: np.ndarray
    params: DiffusionParams  # resolved
    template: CanvasTemplate | None
    span: int  # rewrite: the span's positions (canvas[:span]); continue: the canvas length
    # written left to right, block after block (block diffusion): a rewrite is a continuation of the
    # text before the span, `span` tokens long; a continuation is `span` tokens at most
    left_to_right: bool = False

    @property
    def on_server(self) -> bool:
        """Planned for a server's model (plan_remote): its prompt is text for the server, and the
        proposal's text is the server's."""
        return isinstance(self.prompt, RemotePrompt)


class _Vocab:
    """Per engine: the tokenizer, end tokens and control tokens (computed once)."""

    def __init__(self, engine: Engine) -> None:
        self.tokenizer = Tokenizer.for_engine(engine)
        self.eog = tuple(int(t) for t in engine.eog_ids())
        self.control = engine.control_tokens()
        self.end = engine.end_token
        self.bos = engine.added_bos


_vocabs: weakref.WeakKeyDictionary[Any, _Vocab] = weakref.WeakKeyDictionary()


def vocab_for(engine: Engine) -> _Vocab:
    vocab = _vocabs.get(engine)
    if vocab is None:
        vocab = _vocabs[engine] = _Vocab(engine)
    return vocab


def count_tokens(engine: Engine, text: str) -> int:
    return int(vocab_for(engine).tokenizer.tokenize(text).size) if text else 0


def _prompt(vocab: _Vocab, before: str, keep: int) -> np.ndarray:
    tokens = vocab.tokenizer.tokenize(before[-BEFORE_CHARS:])[-keep:] if keep > 0 and before else np.empty(0, np.int32)
    if vocab.bos is not None:
        tokens = np.concatenate([np.array([vocab.bos], dtype=np.int32), tokens])
    if tokens.size == 0:  # an empty document on a model without BOS: start from a line break
        tokens = vocab.tokenizer.tokenize("\n")
    return tokens.astype(np.int32)


def writes_left_to_right(engine: Engine | None) -> bool:
    """Whether `engine`'s model writes left to right, block after block, and so cannot fill a gap
    using the text after it (block diffusion; a dgchat serve server's model of that family too)."""
    if engine is None:
        return False
    if block_size_of(engine):
        return True
    server = served(engine)
    details = getattr(getattr(server, "server_model", None), "details", None) if server is not None else None
    return getattr(details, "family", None) == BLOCK_DIFFUSION


def model_name(engine: Engine | None) -> str:
    """The variant's name for the notes ("SDAR", "BD3LM"), or "This model"."""
    preset = getattr(getattr(engine, "info", None), "preset", None) if block_size_of(engine) else None
    return VARIANT_NAMES.get(str(preset), "This model")


def left_to_right_note(engine: Engine | None, kind: str, selected: str) -> str:
    """What the drafting screen says where a left-to-right model's proposal appears ("" for other
    models, and for a continuation, which is left to right anyway)."""
    if kind != "rewrite" or not writes_left_to_right(engine):
        return ""
    what, where = ("this rewrite", "the selection") if selected else ("this fill-in", "the cursor")
    return (f"{model_name(engine)} writes left to right: {what} continues from the text before {where} "
            "and does not see the text after it.")


def _sampling(engine: Engine, base: Mapping[str, Any], seed: int) -> DiffusionParams:
    """A proposal's settings (model_backend/param_resolution): drafting's temperature for masked
    models under the config's [sampler] table as written (`base`), the proposal's seed and the
    default mode over it."""
    below = {} if engine.info.uniform_state else {"temperature": DRAFT_TEMPERATURE}
    above = {"seed": seed, "mode": "dgchat"}
    return merge([Layer(DRAFTING, below), Layer.of(CONFIG, base), Layer(DRAFTING, above)])[0]


def _span(engine: Engine, request: DraftRequest) -> int:
    span = request.length or count_tokens(engine, request.selected) or DEFAULT_FILL_TOKENS
    return max(1, min(MAX_SPAN_TOKENS, span))


def _left_to_right(engine: Engine, request: DraftRequest, base: Mapping[str, Any], length: int,
                   bias_ids: set[int]) -> DraftPlan:
    """A block-diffusion model's proposal: `length` tokens written after the text before it (no
    template: it cannot see the text after), over as many blocks as that takes."""
    vocab = vocab_for(engine)
    p = _sampling(engine, base, request.seed)
    bias = tuple((t, -100.0) for t in sorted(bias_ids))
    # the canvas and block are the model's block (gen_length / block_length from the config are replaced)
    p = replace(p, max_tokens=length, logit_bias=p.logit_bias + bias)
    params = engine.resolve(p)
    block = int(block_size_of(engine) or params.gen_length or 0)
    room = engine.n_ctx_max - int(params.max_tokens) - 2 * block - 1  # an answer may overrun into a block
    if room < 1:
        raise DgchatError(f"{length} tokens do not fit the model's context of {engine.n_ctx_max}")
    prompt = _prompt(vocab, request.before, min(MAX_BEFORE_TOKENS, room))
    engine.check_fits(int(prompt.size), params)
    return DraftPlan(request.kind, prompt, params, None, int(params.max_tokens), left_to_right=True)


def plan_rewrite(engine: Engine, request: DraftRequest, base: Mapping[str, Any]) -> DraftPlan:
    """The span between `request.before` and `request.after`, `length` tokens (default: as many as
    the selected text has, or DEFAULT_FILL_TOKENS with nothing selected). A left-to-right model
    (block diffusion) writes the span after the text before it, without the text after."""
    vocab = vocab_for(engine)
    tok = vocab.tokenizer
    span = _span(engine, request)
    if writes_left_to_right(engine):
        # the span continues into the text after it: no end of turn, no control tokens inside it
        return _left_to_right(engine, request, base, span, set(vocab.eog) | set(vocab.control))
    window = request.after[:AFTER_CHARS]
    try:
        after = tok.segment(window) if window else np.empty(0, np.int32)
    except TemplateError:
        after = tok.tokenize(window)  # cannot spell it exactly: context only, the document is unaffected
    truncated = len(window) < len(request.after) or after.size > MAX_AFTER_TOKENS
    after = after[:MAX_AFTER_TOKENS]
    room = engine.n_ctx_max - span - 2  # 2: BOS and the end token
    if room < 1:
        raise DgchatError(f"a span of {span} tokens does not fit the model's context of {engine.n_ctx_max}")
    after = after[: max(0, min(after.size, room // 2 if request.before else room))]
    prompt = _prompt(vocab, request.before, min(MAX_BEFORE_TOKENS, room - int(after.size)))
    end = [] if truncated or vocab.end is None else [int(vocab.end)]
    fill = engine.info.mask_token if engine.info.mask_token is not None else (engine.eos or 0)
    tokens = np.concatenate([np.full(span, fill, dtype=np.int32), after.astype(np.int32),
                             np.array(end, dtype=np.int32)])
    fixed = np.zeros(tokens.size, dtype=bool)
    fixed[span:] = True
    # the span continues into the text after it: no end of turn, no control tokens inside it
    bias = tuple((t, -100.0) for t in sorted(set(vocab.eog) | set(vocab.control)))
    p = _sampling(engine, base, request.seed)
    rewrite = rewrite_layer(p, int(tokens.size), span, uniform_state=engine.info.uniform_state)
    params = engine.resolve(replace(p, **rewrite.values, logit_bias=p.logit_bias + bias))
    engine.check_fits(int(prompt.size), params)
    return DraftPlan("rewrite", prompt, params, CanvasTemplate(tokens, fixed), span)


def plan_continue(engine: Engine, request: DraftRequest, base: Mapping[str, Any]) -> DraftPlan:
    """Text after `request.before`, up to a canvas (`length`, or the settings' canvas length); the
    model may end it early with its end token. A left-to-right model (block diffusion, whose canvas
    is one small block): `length` or DEFAULT_CONTINUE_TOKENS tokens, block after block."""
    vocab = vocab_for(engine)
    if writes_left_to_right(engine):
        length = max(1, min(MAX_SPAN_TOKENS, request.length or DEFAULT_CONTINUE_TOKENS))
        return _left_to_right(engine, request, base, length, set(vocab.control))
    p = _sampling(engine, base, request.seed)
    if request.length:
        # a chosen length is one block (the model's block length need not divide it), as a rewrite's span
        p = replace(p, **one_block(request.length, p.eps))
    bias = tuple((t, -100.0) for t in vocab.control)
    p = replace(p, logit_bias=p.logit_bias + bias)
    params = engine.resolve(p)
    params = replace(params, **one_canvas_answer(params).values)  # one canvas: the proposal is shown whole
    room = engine.n_ctx_max - int(params.gen_length) - 1
    if room < 1:
        raise DgchatError(f"a canvas of {params.gen_length} tokens does not fit the model's context")
    prompt = _prompt(vocab, request.before, min(MAX_BEFORE_TOKENS, room))
    engine.check_fits(int(prompt.size), params)
    return DraftPlan("continue", prompt, params, None, int(params.gen_length))


def estimate_tokens(text: str) -> int:
    """About how many tokens `text` is, without a tokenizer (0 for no text)."""
    return -(-len(text) // CHARS_PER_TOKEN) if text else 0


def plan_remote(engine: Engine, request: DraftRequest, base: Mapping[str, Any]) -> DraftPlan:
    """The request for a server's model (see the module docstring): the prompt is a RemotePrompt
    carrying the text (and, for a rewrite, the text after as the completion's suffix)."""
    if not isinstance(engine, ServedEngine):  # plan() sends only a server's model here
        raise DgchatError("plan_remote needs a server's model")
    server: ServedEngine = engine
    before = request.before[-REMOTE_BEFORE_CHARS:] or "\n"  # a server refuses an empty prompt
    p = _sampling(engine, base, request.seed)
    if server.is_dgchat and writes_left_to_right(engine):
        # block diffusion on the server: no infill (the server's engine refuses a suffix); the span is
        # written after the text before it, a continuation over several blocks
        if request.kind == "rewrite":
            length = request.length or estimate_tokens(request.selected) or DEFAULT_FILL_TOKENS
        else:
            length = request.length or DEFAULT_CONTINUE_TOKENS
        p = replace(p, max_tokens=max(1, min(MAX_SPAN_TOKENS, length)))
        params = engine.resolve(p)  # what this server cannot take is left at its own default
        engine.check_fits(0, params)
        return DraftPlan(request.kind, RemotePrompt(text=before), params, None, int(params.max_tokens),
                         left_to_right=True)
    if request.kind == "rewrite":
        if not server.is_dgchat:
            raise DgchatError(no_infill_message(server.url))
        span = request.length or estimate_tokens(request.selected) or DEFAULT_FILL_TOKENS
        span = max(1, min(MAX_SPAN_TOKENS, span))
        # the server lays the canvas out (the span, then the suffix; one block): this is its span
        p = replace(p, **one_block(span, p.eps))
        resolved = engine.resolve(p)
        if not engine.info.uniform_state:  # as plan_rewrite: at most one step per position
            p = replace(p, steps=drafting_steps(span, resolved.steps))
        prompt = RemotePrompt(text=before, suffix=request.after[:REMOTE_AFTER_CHARS])
    else:
        if request.length:  # one block of that length (eps: no block length to fall back on)
            p = replace(p, **one_block(request.length, p.eps))
        elif not server.is_dgchat:
            p = replace(p, max_tokens=p.max_tokens or p.gen_length or DEFAULT_CONTINUE_TOKENS)
        if server.is_dgchat:  # one canvas: the proposal is shown whole
            p = replace(p, **one_canvas_answer(engine.resolve(p)).values)
        prompt = RemotePrompt(text=before)
    params = engine.resolve(p)  # what this server cannot take is left at its own default
    engine.check_fits(0, params)
    span = int(params.max_tokens or params.gen_length or 0)
    return DraftPlan(request.kind, prompt, params, None, span)


def no_infill_message(url: str) -> str:
    return (f"{url} is not a dgchat serve server: it has no infill (/v1/infill, or /v1/completions with a "
            "suffix), so rewriting a selection needs a dgchat serve server. Ctrl+G (continue) works here.")


def plan(engine: Engine, request: DraftRequest, base: Mapping[str, Any]) -> DraftPlan:
    if served(engine) is not None:
        return plan_remote(engine, request, base)
    return (plan_rewrite if request.kind == "rewrite" else plan_continue)(engine, request, base)


_LINE_BREAKS = str.maketrans({c: "\n" for c in "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"})
_JUNK = str.maketrans({c: None for c in [*map(chr, range(32)), "\x7f"] if c not in "\t\n"})


def clean_text(text: str) -> str:
    """Generated text as a document holds it: every kind of line break a "\n" (the editor writes it
    with the document's own line ending), other control characters dropped, so what is shown is
    exactly what is inserted."""
    return text.replace("\r\n", "\n").translate(_LINE_BREAKS).translate(_JUNK)


def proposal_text(engine: Engine, plan: DraftPlan, final: FinalEvent) -> str:
    """The proposed text: the span's (or the continuation's) bytes, decoded (and cleaned). On a
    server, the server's text (it has cut it at the span, or at the end token)."""
    if plan.on_server:
        return clean_text(final.text)
    vocab = vocab_for(engine)
    tokens = np.asarray(final.tokens, dtype=np.int32)
    if plan.kind == "rewrite":
        tokens = tokens[: plan.span]
        if plan.left_to_right:  # its end tokens were biased away; should one come, the text ends there
            ends = np.flatnonzero(np.isin(tokens, np.array(vocab.eog, dtype=np.int32)))
            tokens = tokens[: int(ends[0])] if ends.size else tokens
    else:
        ends = np.flatnonzero(np.isin(tokens, np.array(vocab.eog, dtype=np.int32)))
        if ends.size:
            tokens = tokens[: int(ends[0])]
    return clean_text(vocab.tokenizer.bytes_of(tokens).decode("utf-8", errors="replace"))
