"""OpenAI's wire format as servers actually send it, read into small typed, validated objects.

Shapes covered (tests/remote/test_wire.py checks each against the documented source):
- `/v1/models`: `{"object": "list", "data": [{"id", "object": "model", "owned_by", ...}]}`; vLLM adds
  `max_model_len`, dgchat serve a `dgchat` object (context length, mask and end tokens, defaults; a
  block-diffusion model's block size and variant, read leniently: see `optional_block`).
- streamed chunks: `chat.completion.chunk` (`choices[].delta.content`) and `text_completion`
  (`choices[].text`), `finish_reason` null until a choice ends, a last chunk with `choices: []` and
  `usage` when `stream_options.include_usage` is set (vLLM may also put `usage` on every chunk);
  unknown keys (vLLM's `stop_reason`, `token_ids`, `prompt_token_ids`, `metrics`) are ignored, and
  so is dgchat serve's `dgchat` object unless the caller reads it (`parse_chunk(dgchat=True)`).
- errors: OpenAI's `{"error": {"message", "type", "param", "code"}}` (dgchat: `code` a string;
  vLLM: the HTTP status as an integer), vLLM's older top-level `{"object": "error", "message", ...}`,
  and FastAPI's `{"detail": ...}` (a 404 from a route the server does not have).

**A server is not trusted** (docs/SECURITY.md). `loads` reads JSON strictly (bounded nesting and
integer digits, finite numbers, valid UTF-8), and every field dgchat reads is checked for its type
and range here, once, so the rest of dgchat.remote works on typed values: anything else raises
WireError naming the field (`dgchat.state[3] must be an integer in 0..3 (got 1000)`), which the
client reports as one line (RemoteApiError "<server> sent an invalid ..."). Unknown fields stay
ignored: newer servers may add some. Text quoted from a server in a message goes through `quote`
(one line, control characters visible, at most limits.QUOTE_CHARS characters).
"""

from __future__ import annotations

import re
import reprlib
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from dgchat import strict_json
from dgchat.model_backend.architectures import MAX_ATTENTION_BLOCK
from dgchat.model_backend.canvas_view import terminal_safe
from dgchat.model_backend.errors import InvalidParameterError
from dgchat.model_backend.events import GenerationStats
from dgchat.model_backend.params import DiffusionParams
from dgchat.remote import limits
from dgchat.remote.errors import RemoteApiError


class WireError(ValueError):
    """What a server sent is not what dgchat reads; the message names the field and says why."""


# -- text from a server in a message ---------------------------------------------------------------

def quote(text: Any, limit: int = limits.QUOTE_CHARS) -> str:
    """Text from a server as one bounded line for an error message: control characters and escape
    sequences made visible (the project's one rule, canvas_view.terminal_safe), line breaks as
    spaces, at most `limit` characters (cut with "…")."""
    if isinstance(text, BaseException):
        text = str(text) or type(text).__name__
    elif not isinstance(text, str):
        text = show(text, limit)
    cut = text[: limit * 2]  # bound the work on a long text before translating it
    line = " ".join(terminal_safe(cut).split())
    if len(line) > limit or len(cut) < len(text):
        line = line[: limit - 1].rstrip() + "…"
    return line


_SHORT = reprlib.Repr()
_SHORT.maxstring = 40
_SHORT.maxother = 40
_SHORT.maxlist = _SHORT.maxdict = _SHORT.maxtuple = 4
_SHORT.maxlevel = 2
_SHORT.maxlong = 24


def show(value: Any, limit: int = 60) -> str:
    """A JSON value, briefly (for "got ..." in a message): long strings, lists and numbers cut."""
    return terminal_safe(_SHORT.repr(value))[:limit].replace("\n", " ")


# -- strict JSON -----------------------------------------------------------------------------------

def loads(raw: bytes | str) -> Any:
    """JSON from a server, strictly (dgchat.strict_json: UTF-8, nesting, integer digits, finite numbers,
    no lone surrogates); anything else is a WireError."""
    return strict_json.loads(raw, WireError)


# -- checked fields -------------------------------------------------------------------------------

_REQUIRED: Any = object()
_WORD = re.compile(r"[A-Za-z0-9_.:-]{1,%d}" % limits.MAX_WORD_CHARS)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(value: Any, path: str, lo: int, hi: int) -> int:
    if not _is_int(value) or not lo <= value <= hi:
        raise WireError(f"`{path}` must be an integer in {lo}..{hi} (got {show(value)})")
    return value


def check_number(value: Any, path: str, lo: float = -1e15, hi: float = 1e15) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not lo <= value <= hi:
        raise WireError(f"`{path}` must be a number in {lo:g}..{hi:g} (got {show(value)})")
    return float(value)


def check_str(value: Any, path: str, max_chars: int) -> str:
    if not isinstance(value, str):
        raise WireError(f"`{path}` must be a string (got {show(value)})")
    if len(value) > max_chars:
        raise WireError(f"`{path}` is {len(value)} characters long (at most {max_chars})")
    return value


def check_word(value: Any, path: str) -> str:
    """A short identifier: a stop or finish reason, a family, an error code."""
    if not isinstance(value, str) or not _WORD.fullmatch(value):
        raise WireError(f"`{path}` must be a word of at most {limits.MAX_WORD_CHARS} letters, digits or _.:- "
                        f"(got {show(value)})")
    return value


def check_list(value: Any, path: str, max_items: int) -> list:
    if not isinstance(value, list):
        raise WireError(f"`{path}` must be a list (got {show(value)})")
    if len(value) > max_items:
        raise WireError(f"`{path}` has {len(value)} entries (at most {max_items})")
    return value


def int_array(value: Any, path: str, lo: int, hi: int, what: str, max_items: int = limits.MAX_COUNT) -> np.ndarray:
    """A list of integers, each in lo..hi (a canvas's thousands per step: checked in bulk), as int64."""
    items = check_list(value, path, max_items)
    if items and set(map(type, items)) == {int}:  # bool is its own type: refused below
        array = np.asarray(items, dtype=np.int64)  # integers have at most 20 digits (loads): may not fit
        if int(array.min()) >= lo and int(array.max()) <= hi:
            return array
    elif not items:
        return np.zeros(0, dtype=np.int64)
    for k, t in enumerate(items):  # the first one out of range, for the message
        if not _is_int(t) or not lo <= t <= hi:
            raise WireError(f"`{path}[{k}]` must be {what} (got {show(t)})")
    raise WireError(f"`{path}` must hold {what}s")  # not reached: some item failed above


def token_ids(value: Any, path: str, vocab: int, max_items: int = limits.MAX_COUNT) -> np.ndarray:
    """A list of token ids, each in 0..vocab-1, as int32."""
    try:
        array = int_array(value, path, 0, vocab - 1, f"a token id in 0..{vocab - 1}", max_items)
    except OverflowError:  # an id beyond int64
        raise WireError(f"`{path}` holds a token id beyond 0..{vocab - 1}") from None
    return array.astype(np.int32)


class Obj:
    """A JSON object read field by field; a missing (or null) field takes `default`, a field that
    is required (no default) and missing, or present with a wrong type or range, raises WireError
    naming it by its path in the answer."""

    __slots__ = ("path", "value")

    def __init__(self, value: Any, path: str) -> None:
        if not isinstance(value, dict):
            raise WireError(f"`{path}` must be an object (got {show(value)})")
        self.value = value
        self.path = path

    def at(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def _get(self, key: str, default: Any) -> tuple[bool, Any]:
        value = self.value.get(key)
        if value is None:
            if default is _REQUIRED:
                raise WireError(f"`{self.at(key)}` is missing")
            return False, default
        return True, value

    def has(self, key: str) -> bool:
        return self.value.get(key) is not None

    def int(self, key: str, lo: int, hi: int, default: Any = _REQUIRED) -> Any:
        there, value = self._get(key, default)
        return check_int(value, self.at(key), lo, hi) if there else value

    def number(self, key: str, default: Any = _REQUIRED, lo: float = -1e15, hi: float = 1e15) -> Any:
        there, value = self._get(key, default)
        return check_number(value, self.at(key), lo, hi) if there else value

    def str(self, key: str, max_chars: int = limits.MAX_NAME_CHARS, default: Any = _REQUIRED) -> Any:
        there, value = self._get(key, default)
        return check_str(value, self.at(key), max_chars) if there else value

    def word(self, key: str, default: Any = _REQUIRED) -> Any:
        there, value = self._get(key, default)
        return check_word(value, self.at(key)) if there else value

    def bool(self, key: str, default: Any = _REQUIRED) -> Any:
        there, value = self._get(key, default)
        if there and not isinstance(value, bool):
            raise WireError(f"`{self.at(key)}` must be true or false (got {show(value)})")
        return value

    def list(self, key: str, max_items: int = limits.MAX_COUNT, default: Any = _REQUIRED) -> Any:
        there, value = self._get(key, default)
        return check_list(value, self.at(key), max_items) if there else value

    def obj(self, key: str, default: Any = _REQUIRED) -> Any:
        there, value = self._get(key, default)
        return Obj(value, self.at(key)) if there else value

    def tokens(self, key: str, vocab: int, default: Any = _REQUIRED) -> Any:
        there, value = self._get(key, default)
        return token_ids(value, self.at(key), vocab) if there else value


_PARAM_FIELDS = {f.name for f in fields(DiffusionParams)}


def check_params(obj: Obj, *, keep_none: bool = False) -> dict[str, Any]:
    """Sampler settings as a server reports them (defaults, resolved settings): DiffusionParams
    fields only (others are ignored), each of the type and range DiffusionParams.validate allows."""
    out: dict[str, Any] = {}
    for name, value in obj.value.items():
        if name not in _PARAM_FIELDS:
            continue
        if value is None:
            if keep_none:
                out[name] = None
            continue
        path = obj.at(name)
        if name == "logit_bias":
            pairs = check_list(value, path, 65536)
            if not all(isinstance(p, list) and len(p) == 2 for p in pairs):
                raise WireError(f"`{path}` must be a list of [token id, bias] pairs (got {show(value)})")
            value = tuple((p[0], p[1]) for p in pairs)
        try:
            DiffusionParams(**{name: value}).validate()  # one field at a time: pairs are the engine's to check
        except (InvalidParameterError, TypeError, ValueError) as exc:
            raise WireError(f"`{path}`: {quote(exc, 120)}") from None
        out[name] = value
    return out


# -- /v1/models -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class DgchatDetails:
    """dgchat serve's `dgchat` object of a /v1/models entry (server/app.py `_model_details`)."""

    name: str = ""
    family: str = ""
    architecture: str = ""
    engine: str = ""  # the engine's label on the server ("dgchat (CPU)", ...)
    uniform_state: bool = False
    mask_token: int | None = None
    end_tokens: tuple[int, ...] | None = None  # None: an older dgchat serve (no canvas extension)
    n_vocab: int = 0  # 0: not said
    context_length: int | None = None
    defaults: dict[str, Any] = field(default_factory=dict)  # resolved settings (DiffusionParams fields)
    model_defaults: dict[str, Any] | None = None  # the model's own recommended settings
    has_kv_memory: bool = False
    file: dict[str, Any] | None = None  # the model file's identity (npc.generator.ModelMeta fields)
    # block diffusion: the block size (1..MAX_ATTENTION_BLOCK) and the variant ("sdar", "bd3lm");
    # None / "" when not said, or said in a form dgchat cannot use (see parse_details)
    attention_block: int | None = None
    variant: str = ""


@dataclass(frozen=True)
class ServerModel:
    id: str
    owned_by: str = ""
    context_length: int | None = None  # dgchat: dgchat.context_length; vLLM: max_model_len
    details: DgchatDetails | None = None  # dgchat serve's `dgchat` object; None for other servers

    @property
    def is_dgchat(self) -> bool:
        """A `dgchat serve` server recent enough for the canvas extension and remote NPC lines."""
        return self.details is not None and self.details.end_tokens is not None


def model_file(obj: Obj) -> dict[str, Any]:
    """An NPC export's model record (npc.generator.ModelMeta.as_dict)."""
    return {"file": obj.str("file"), "name": obj.str("name"), "architecture": obj.str("architecture"),
            "size_bytes": obj.int("size_bytes", 0, (1 << 63) - 1), "fingerprint": obj.str("fingerprint", 256)}


def optional_block(obj: Obj) -> tuple[int | None, str]:
    """`attention_block` and `variant` of a block-diffusion model, when both are usable: an integer
    in 1..MAX_ATTENTION_BLOCK and a short word. Anything else (absent, null, another type,
    out of range) is dropped rather than refused: they only let the client resolve settings as the
    server's engine does, and without them it leaves that to the server (RemoteEngine's "remote"
    family), so a server that gets them wrong can still be used."""
    block = obj.value.get("attention_block")
    variant = obj.value.get("variant")
    if not (_is_int(block) and 1 <= block <= MAX_ATTENTION_BLOCK):
        block = None
    if not (isinstance(variant, str) and _WORD.fullmatch(variant)):
        variant = ""
    return block, variant


def parse_details(obj: Obj) -> DgchatDetails:
    n_vocab = obj.int("n_vocab", 1, limits.MAX_VOCAB, 0)
    vocab = n_vocab or limits.MAX_VOCAB
    end_tokens = None
    if obj.has("end_tokens"):
        end_tokens = tuple(int(t) for t in token_ids(obj.list("end_tokens", limits.MAX_END_TOKENS),
                                                     obj.at("end_tokens"), vocab))
    mask = obj.int("mask_token", 0, vocab - 1, None)
    defaults = obj.obj("defaults", None)
    model_defaults = obj.obj("model_defaults", None)
    file = obj.obj("file", None)
    block, variant = optional_block(obj)
    return DgchatDetails(
        name=obj.str("name", default=""), family=obj.str("family", limits.MAX_WORD_CHARS, ""),
        architecture=obj.str("architecture", default=""), engine=obj.str("engine", default=""),
        uniform_state=obj.bool("uniform_state", False), mask_token=mask, end_tokens=end_tokens, n_vocab=n_vocab,
        context_length=obj.int("context_length", 1, limits.MAX_CONTEXT, None),
        defaults=check_params(defaults) if defaults is not None else {},
        model_defaults=check_params(model_defaults) if model_defaults is not None else None,
        has_kv_memory=obj.bool("has_kv_memory", False), file=model_file(file) if file is not None else None,
        attention_block=block, variant=variant)


def parse_models(body: Any) -> list[ServerModel]:
    """The models of a /v1/models answer. Raises WireError on one that is not an OpenAI model list
    or whose fields are out of range; entries without a string id are skipped (as OpenAI clients do)."""
    if not isinstance(body, dict) or not isinstance(body.get("data"), list):
        raise WireError("it is not an OpenAI model list (`data` missing)")
    data = check_list(body["data"], "data", limits.MAX_MODELS)
    models = []
    for k, item in enumerate(data):
        if not isinstance(item, dict) or not isinstance(item.get("id"), str):
            continue
        obj = Obj(item, f"data[{k}]")
        model_id = obj.str("id")
        details = parse_details(Obj(item["dgchat"], obj.at("dgchat"))) if isinstance(item.get("dgchat"), dict) \
            else None
        context = details.context_length if details is not None else None
        if context is None:
            context = obj.int("max_model_len", 1, limits.MAX_CONTEXT, None)
        owned = item.get("owned_by")
        models.append(ServerModel(model_id, owned[: limits.MAX_NAME_CHARS] if isinstance(owned, str) else "", context,
                                  details))
    return models


# -- streamed chunks ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


@dataclass(frozen=True)
class ChunkChoice:
    index: int
    text: str  # the delta's content (chat) or text (completions); "" when none
    finish_reason: str | None = None


@dataclass(frozen=True)
class CanvasFrame:
    """One denoising step of one choice (dgchat serve's `"dgchat": {"canvas": true}` streams;
    server/openai_api.py `_canvas_payload`). Zero counts mean "not said"."""

    choice: int
    tokens: np.ndarray  # int32, each below the vocabulary size
    pieces: list[str | None]  # the text of each canvas position (None: a mask)
    state: np.ndarray  # int8, model_backend.canvas.Cell values (0..3)
    step: int = 0
    total_steps: int = 0
    canvas_index: int = 0
    canvas_step: int = 0
    committed: int | None = None
    uniform_state: bool = False
    elapsed_s: float = 0.0
    model_ms: float = 0.0
    sampler_ms: float = 0.0
    answer_tokens: np.ndarray | None = None  # the answer's finished canvases (a canvas's first step only)
    answer_pieces: list[str | None] | None = None
    special: tuple[int, ...] = ()


@dataclass(frozen=True)
class FinalRecord:
    """A choice's end (`"final": true`): its tokens, the engine's stop reason, its statistics."""

    choice: int
    tokens: np.ndarray
    stop_reason: str
    stats: dict[str, Any]  # GenerationStats fields, each of its type


@dataclass(frozen=True)
class Chunk:
    choices: tuple[ChunkChoice, ...] = ()
    usage: Usage | None = None
    dgchat: dict[str, Any] | None = None  # dgchat serve's extension object as sent
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    canvas: CanvasFrame | None = None  # read only with parse_chunk(dgchat=True)
    final: FinalRecord | None = None
    settings: dict[str, Any] | None = None  # the settings the server ran (first chunk)


def parse_usage(value: Any, path: str = "usage") -> Usage | None:
    if value is None:
        return None
    obj = Obj(value, path)
    prompt = obj.int("prompt_tokens", 0, limits.MAX_COUNT, 0)
    completion = obj.int("completion_tokens", 0, limits.MAX_COUNT, 0)  # vLLM's may be null
    total = obj.int("total_tokens", 0, 2 * limits.MAX_COUNT, prompt + completion)
    return Usage(prompt, completion, total)


def _pieces(value: Any, path: str, count: int) -> list[str | None]:
    items = check_list(value, path, count)
    if len(items) != count:
        raise WireError(f"`{path}` has {len(items)} entries for {count} tokens")
    if set(map(type, items)) <= {str, type(None)} and max(map(len, filter(None, items)), default=0) \
            <= limits.MAX_PIECE_CHARS:
        return items  # the usual case, checked in bulk
    for k, text in enumerate(items):
        if text is not None:
            check_str(text, f"{path}[{k}]", limits.MAX_PIECE_CHARS)
    return items


def parse_canvas(obj: Obj, vocab: int) -> CanvasFrame:
    tokens = obj.tokens("tokens", vocab)
    n = int(tokens.size)
    state_list = obj.list("state", n, None)
    if state_list is None:
        state = np.zeros(n, dtype=np.int8)
    else:
        if len(state_list) != n:
            raise WireError(f"`{obj.at('state')}` has {len(state_list)} entries for {n} tokens")
        try:
            state = int_array(state_list, obj.at("state"), 0, 3, "an integer in 0..3").astype(np.int8)
        except OverflowError:
            raise WireError(f"`{obj.at('state')}` holds a number beyond 0..3") from None
    answer = obj.tokens("answer_tokens", vocab, None)
    answer_pieces = None
    if answer is not None and obj.has("answer_text"):
        answer_pieces = _pieces(obj.value["answer_text"], obj.at("answer_text"), int(answer.size))
    timing = obj.obj("timing", None)
    special = obj.tokens("special", vocab, None)
    count = limits.MAX_COUNT
    return CanvasFrame(
        choice=obj.int("choice", 0, limits.MAX_CHOICES - 1), tokens=tokens,
        pieces=_pieces(obj.list("canvas", n, []), obj.at("canvas"), n),
        state=state, step=obj.int("step", 0, count, 0), total_steps=obj.int("total_steps", 0, count, 0),
        canvas_index=obj.int("canvas_index", 0, count, 0), canvas_step=obj.int("canvas_step", 0, count, 0),
        committed=obj.int("committed", 0, count, None), uniform_state=obj.bool("uniform_state", False),
        elapsed_s=obj.number("elapsed_s", 0.0), model_ms=timing.number("model_ms", 0.0) if timing else 0.0,
        sampler_ms=timing.number("sampler_ms", 0.0) if timing else 0.0, answer_tokens=answer,
        answer_pieces=answer_pieces, special=tuple(int(t) for t in special) if special is not None else ())


_STATS = {f.name: f.type for f in fields(GenerationStats)}


def parse_stats(obj: Obj) -> dict[str, Any]:
    """GenerationStats fields of a server's statistics (others are ignored)."""
    out: dict[str, Any] = {}
    for name, kind in _STATS.items():
        if not obj.has(name):
            continue
        if kind in ("int", int):
            out[name] = obj.int(name, 0, 1 << 53)
        elif kind in ("float", float):
            out[name] = obj.number(name)
        else:
            out[name] = obj.str(name, limits.MAX_WORD_CHARS)
    return out


def parse_final(obj: Obj, vocab: int) -> FinalRecord:
    stats = obj.obj("stats", None)
    return FinalRecord(choice=obj.int("choice", 0, limits.MAX_CHOICES - 1), tokens=obj.tokens("tokens", vocab),
                       stop_reason=obj.word("stop_reason"), stats=parse_stats(stats) if stats is not None else {})


def parse_chunk(obj: Any, *, dgchat: bool = False, vocab: int = limits.MAX_VOCAB) -> Chunk:
    """One streamed chunk (chat or completions). Raises WireError on something that is not one or
    holds a field out of range. With `dgchat`, dgchat serve's extension object is read too (canvas
    frames, final records, settings), token ids below `vocab`."""
    if not isinstance(obj, dict):
        raise WireError("it is not a completion chunk (not an object)")
    chunk = Obj(obj, "")
    choices = []
    for k, item in enumerate(chunk.list("choices", limits.MAX_CHOICES, [])):
        c = Obj(item, f"choices[{k}]")
        delta = c.obj("delta", None)
        if delta is not None:
            text = delta.str("content", 1 << 62, "")
        else:
            text = c.str("text", 1 << 62, "")
        choices.append(ChunkChoice(c.int("index", 0, limits.MAX_CHOICES - 1, 0), text, c.word("finish_reason", None)))
    ext_value = obj.get("dgchat")
    canvas = final = settings = None
    if dgchat and ext_value is not None:
        ext = Obj(ext_value, "dgchat")
        if "canvas" in ext.value:
            canvas = parse_canvas(ext, vocab)
        if ext.bool("final", False):
            final = parse_final(ext, vocab)
        settings_obj = ext.obj("settings", None)
        if settings_obj is not None:
            settings = check_params(settings_obj, keep_none=True)
    return Chunk(tuple(choices), parse_usage(obj.get("usage")), ext_value if isinstance(ext_value, dict) else None,
                 obj, canvas, final, settings)


# -- errors ---------------------------------------------------------------------------------------

def error_message(body: Any) -> tuple[str, str | int | None, str | None]:
    """(message, code, param) from any of the error shapes above; ("", None, None) if none. The
    message is one quoted line (`quote`); a code is a short word or an HTTP status, a param a word."""
    message: Any = ""
    code: Any = None
    param: Any = None
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict):
            message, code, param = err.get("message") or err.get("type") or "error", err.get("code"), err.get("param")
        elif isinstance(err, str):
            message = err
        elif body.get("object") == "error" and "message" in body:
            message, code, param = body["message"], body.get("code"), body.get("param")
        elif "detail" in body:
            message = body["detail"]
    if _is_int(code):
        code = code if 0 <= code <= 999 else None
    elif isinstance(code, str):
        code = code if _WORD.fullmatch(code) else quote(code, limits.MAX_WORD_CHARS)
    else:
        code = None
    param = quote(param, limits.MAX_WORD_CHARS) if isinstance(param, str) else None
    return (quote(message) if message != "" else ""), code, param


def is_error(obj: Any) -> bool:
    """An error object in place of a chunk (streams report failures after the head this way)."""
    return isinstance(obj, dict) and "choices" not in obj and (
        "error" in obj or obj.get("object") == "error")


def stream_error(obj: dict[str, Any], url: str) -> RemoteApiError:
    message, code, param = error_message(obj)
    status = code if isinstance(code, int) and 400 <= code <= 599 else 500
    return RemoteApiError(f"{url} reported an error mid-answer: {message or 'no details'}", url=url, status=status,
                          code=code, param=param)
