"""`RemoteEngine`: an OpenAI-compatible server standing in for a loaded model.

It offers what the app's `Engine` Protocol (app/engine_protocol.py) asks of a local
DiffusionEngine, as far as a server can:

- `generate()` yields the same StepEvent/FinalEvent stream. Against `dgchat serve` it asks for the
  canvas extension (`"dgchat": {"canvas": true}`) and rebuilds every denoising step from it, so a
  live canvas draws exactly what the server's canvas holds; the FinalEvent carries the server's
  tokens, stop reason and statistics. Against any other server (vLLM, ...) the answer arrives as
  text deltas: each delta becomes a StepEvent whose `answer_tokens` are *synthetic* ids (one per
  delta, `SYNTHETIC_BASE` and up) that `piece()`/`detokenize()` turn back into the text. A canvas
  view then shows the text growing; nothing else about it is real.
- `generate_batch()` runs several answers: one request with `n` when they share a prompt and
  settings with consecutive seeds (dgchat serve gives choice i seed `seed + i`, as a local batch),
  otherwise concurrent requests (at most `max_concurrency` at once).
- `infill()` fills an NPC line template (or writes a free line) through `/v1/infill`; a server
  without that endpoint gets NoInfillEndpoint.

What a server cannot give, and what the app must do instead:
- **No tokenizer.** `chat_prompt()`/`encode()` return a `RemotePrompt`: an *empty* int32 array that
  carries the messages (or text). Its `.size` is 0, so token counts before an answer are unknown:
  use `FinalEvent.stats.prompt_tokens` (the server's `usage`) afterwards. `encode(special=True)`
  (raw prompts with control tokens) is refused.
- **Pieces** are known only for tokens the server has shown (canvas snapshots); `piece()` of any
  other id is "". `detokenize()` joins pieces, so partial text of a multi-byte character split over
  tokens may show U+FFFD until the final text (the server's) replaces it.
- **Templates** (`generate(..., template=...)`, a token-level canvas) are refused. Text between a
  prompt and a fixed suffix (the drafting screen's rewrite) is a `RemotePrompt(text=..., suffix=...)`:
  /v1/completions with `suffix`, which dgchat serve fills as a canvas (exactly `max_tokens` positions
  before the suffix); other servers have no such infill.
- `resolve()` fills unset settings from the server's resolved defaults (dgchat serve reports them in
  /v1/models); other servers report none, so only `max_tokens` is filled. The server has the last
  word: the settings it used come back in `FinalEvent.extra["settings"]`.
- `path` is not a file: it is `Path(model id)`; `url` says where the model is.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from dgchat.model_backend.canvas import CanvasSnapshot
from dgchat.model_backend.errors import ContextOverflowError, InvalidParameterError
from dgchat.model_backend.events import FinalEvent, GenerationStats, StepEvent, StepTiming
from dgchat.model_backend.model_info import ModelInfo
from dgchat.model_backend.params import DiffusionParams
from dgchat.remote import wire
from dgchat.remote.client import DEFAULT_CONNECT_TIMEOUT, DEFAULT_RETRIES, DEFAULT_TIMEOUT, RemoteClient
from dgchat.remote.errors import RemoteApiError

SYNTHETIC_BASE = 1 << 30  # ids of text-only progress pieces: far above any vocabulary
DEFAULT_CONTEXT = 8192  # a server that does not say its context length
DEFAULT_CONCURRENCY = 4  # vLLM's DiffusionGemma recipe serves --max-num-seqs 4
# DiffusionParams fields dgchat serve takes in its `dgchat` extension object (server/openai_api.py)
DGCHAT_WIRE = ("steps", "gen_length", "block_length", "top_k", "algorithm", "cache", "alg_temp", "threshold",
               "factor", "cfg_scale", "eps", "entropy_bound", "t_min", "t_max", "pad_bias")
OPENAI_WIRE = ("temperature", "top_p", "seed", "max_tokens", "logit_bias")
VLLM_EXTRA = ("top_k",)  # vLLM's sampling extension
# what no server takes: a request with one of these set (and not at the server's default) is refused
_NOT_ON_THE_WIRE = ("gumbel", "mode", "early_stop", "stability_threshold", "confidence_threshold",
                    "autoregressive", "sampler_on", "soft_embedding")


def flag(name: str) -> str:
    """A DiffusionParams field as the command line spells it."""
    return {"early_stop": "--no-early-stop", "autoregressive": "--ar"}.get(name, "--" + name.replace("_", "-"))


@dataclass
class _ResolveShadow:
    """What DiffusionEngine.resolve reads of an engine: the model's header facts and vocabulary size.
    The server has the last word on placement (--sampler-on), so the backend is assumed present."""

    info: ModelInfo
    model: Any
    backend_sampler: bool = True


class RemotePrompt(np.ndarray):
    """What `chat_prompt()`/`encode()` return for a remote engine: no tokens (the server has the
    tokenizer), the messages or text to send instead."""

    messages: list[dict[str, Any]] | None
    text: str | None
    suffix: str | None  # completions only: the text after the answer (dgchat serve fills in between)

    def __new__(cls, messages: Sequence[dict[str, Any]] | None = None, text: str | None = None,
                suffix: str | None = None) -> RemotePrompt:
        obj = np.zeros(0, dtype=np.int32).view(cls)
        obj.messages = [dict(m) for m in messages] if messages is not None else None
        obj.text = text
        obj.suffix = suffix
        return obj

    def __array_finalize__(self, obj: Any) -> None:
        self.messages = getattr(obj, "messages", None)
        self.text = getattr(obj, "text", None)
        self.suffix = getattr(obj, "suffix", None)

    def same_input(self, other: RemotePrompt) -> bool:
        return self.messages == other.messages and self.text == other.text and self.suffix == other.suffix


class RemoteVocabulary:
    """`engine.model` for a remote engine: what the server said about its vocabulary and the
    pieces it has shown so far (see the module docstring)."""

    def __init__(self, n_vocab: int, end_tokens: Sequence[int]) -> None:
        self.n_vocab = n_vocab
        self._ends = np.array(sorted(set(int(t) for t in end_tokens)), dtype=np.int32)
        self.eos = int(self._ends[0]) if self._ends.size else None
        self.eot = None
        self.bos = None
        self.pieces: dict[int, str] = {}
        self.special: set[int] = set(int(t) for t in end_tokens)

    def eog_ids(self) -> np.ndarray:
        return self._ends.copy()

    def is_special(self, token: int) -> bool:
        return int(token) in self.special

    is_control = is_special

    def token_piece(self, token: int, special: bool = True) -> bytes:
        if not special and self.is_special(token):
            return b""
        return self.pieces.get(int(token), "").encode("utf-8")


@dataclass
class _Choice:
    """The running state of one choice of a stream."""

    text: str = ""
    finish: str | None = None
    answer: np.ndarray | None = None  # answer_tokens of the current canvas (canvas extension)
    synthetic: list[int] | None = None  # text-only progress ids
    final: dict[str, Any] | None = None  # the canvas extension's final record
    steps: int = 0


class RemoteEngine:
    """One model on an OpenAI-compatible server (see the module docstring)."""

    def __init__(self, client: RemoteClient, model: wire.ServerModel, *, live_canvas: bool = True,
                 max_concurrency: int = DEFAULT_CONCURRENCY) -> None:
        self.client = client
        self.server_model = model
        self.live_canvas = live_canvas  # ask dgchat serve for canvas snapshots
        self.max_concurrency = max(1, max_concurrency)
        d = model.details or {}
        self.is_dgchat = model.is_dgchat
        n_vocab = d.get("n_vocab") if isinstance(d.get("n_vocab"), int) else 0
        self.model = RemoteVocabulary(n_vocab, [t for t in d.get("end_tokens", []) if isinstance(t, int)])
        mask = d.get("mask_token") if isinstance(d.get("mask_token"), int) else None
        if mask is not None:
            self.model.special.add(mask)
        defaults = d.get("defaults") if isinstance(d.get("defaults"), dict) else {}
        known = {f.name for f in fields(DiffusionParams)}
        self._defaults = {k: (tuple(map(tuple, v)) if k == "logit_bias" else v) for k, v in defaults.items()
                          if k in known and v is not None}
        family = d.get("family") if d.get("family") in ("masked", "diffusion_gemma") else "remote"
        self.info = ModelInfo(
            architecture=str(d.get("architecture") or "remote"), family=family, preset=family,
            has_kv_memory=False, mask_token=mask, shift_logits=False, chat_template=None,
            name=str(d.get("name") or model.id), context_length=int(model.context_length or DEFAULT_CONTEXT),
            defaults=dict(self._defaults))
        self._synthetic_next = SYNTHETIC_BASE
        self._lock = threading.Lock()

    @classmethod
    def connect(cls, url: str, *, api_key: str | None = None, model: str | None = None,
                timeout: float = DEFAULT_TIMEOUT, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
                retries: int = DEFAULT_RETRIES, live_canvas: bool = True) -> RemoteEngine:
        """Ask the server for its models (this is where a wrong URL, a dead server or a wrong key
        shows) and stand in for `model` (default: the server's first)."""
        client = RemoteClient(url, api_key=api_key, timeout=timeout, connect_timeout=connect_timeout, retries=retries)
        try:
            models = client.models()
            if model is None:
                chosen = models[0]
            else:
                chosen = next((m for m in models if m.id == model), None)
                if chosen is None:
                    raise InvalidParameterError(f"{client.url} has no model {model!r} (it has: "
                                                f"{', '.join(m.id for m in models)})")
        except BaseException:
            client.close()
            raise
        return cls(client, chosen, live_canvas=live_canvas)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> RemoteEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what the app shows ---------------------------------------------------------------------
    @property
    def url(self) -> str:
        return self.client.url

    @property
    def model_id(self) -> str:
        return self.server_model.id

    @property
    def label(self) -> str:
        kind = (self.server_model.details or {}).get("engine") if self.is_dgchat else None
        return f"remote ({kind} on {self.url})" if kind else f"remote ({self.url})"

    @property
    def path(self) -> Path:
        return Path(self.model_id)

    @property
    def n_ctx_max(self) -> int:
        return self.info.context_length

    # -- text -----------------------------------------------------------------------------------
    def chat_prompt(self, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool = True) -> RemotePrompt:
        # add_generation_prompt=False is a context count's question: unknown remotely either way
        return RemotePrompt(messages=messages)

    def encode(self, text: str, *, special: bool = False) -> RemotePrompt:
        if special:
            raise InvalidParameterError("a raw prompt with control tokens (--raw) needs the model's tokenizer; "
                                        "it is not available over --server")
        return RemotePrompt(text=text)

    def piece(self, token: int) -> str:
        return self.model.pieces.get(int(token), "")

    def detokenize(self, tokens: np.ndarray | Sequence[int]) -> str:
        pieces = self.model.pieces
        special = self.model.special
        return "".join(pieces.get(int(t), "") for t in tokens if int(t) not in special)

    def is_end(self, token: int) -> bool:
        return int(token) in self.model._ends

    def is_special(self, token: int) -> bool:
        return int(token) in self.model.special

    # -- parameters -----------------------------------------------------------------------------
    def resolve(self, params: DiffusionParams | None = None) -> DiffusionParams:
        """Unset settings filled as the server's engine fills them. A dgchat server reports its model's
        recommended settings, so this runs the engine's own resolve on them (nothing is loaded: the
        rules read only the model's header facts); other servers fill their own defaults, so only
        max_tokens is set here."""
        params = params or DiffusionParams()
        d = self.server_model.details or {}
        if self.is_dgchat and isinstance(d.get("model_defaults"), dict):
            from dgchat.model_backend.engine import DiffusionEngine

            resolve = DiffusionEngine.resolve
            if self.info.family == "diffusion_gemma":
                from dgchat.model_backend.diffusion_gemma import DiffusionGemmaEngine

                resolve = DiffusionGemmaEngine.resolve
            shadow = _ResolveShadow(replace(self.info, defaults=dict(d["model_defaults"]),
                                            has_kv_memory=bool(d.get("has_kv_memory"))), self.model)
            return resolve(shadow, params)  # type: ignore[arg-type]
        if params.max_tokens is None:
            params = params.updated(max_tokens=params.gen_length or min(1024, self.n_ctx_max // 2))
        params.validate()
        return params

    def unsupported(self, params: DiffusionParams) -> list[str]:
        """Settings in `params` that this server cannot take (compared with the defaults)."""
        plain = DiffusionParams()
        wire_names = set(OPENAI_WIRE) | (set(DGCHAT_WIRE) if self.is_dgchat else set(VLLM_EXTRA))
        out = []
        for f in fields(DiffusionParams):
            value = getattr(params, f.name)
            if f.name in wire_names or value == getattr(plain, f.name) or value == self._defaults.get(f.name):
                continue
            out.append(f.name)
        return out

    def check_fits(self, prompt_tokens: int, params: DiffusionParams) -> None:
        """Only the answer's budget can be checked here (the prompt's length is the server's to
        know); the server refuses a prompt that does not fit (context_length_exceeded)."""
        need = prompt_tokens + int(params.max_tokens or params.gen_length or 0)
        if need > self.n_ctx_max:
            raise ContextOverflowError(f"max tokens ({params.max_tokens}) exceed the model's context of "
                                       f"{self.n_ctx_max} tokens on {self.url}; lower --max-tokens")

    def request_body(self, prompt: RemotePrompt, params: DiffusionParams, *, n: int = 1) -> tuple[str, dict[str, Any]]:
        """The endpoint and JSON body for one answer (or `n` with seeds seed..seed+n-1)."""
        if not isinstance(prompt, RemotePrompt):
            raise InvalidParameterError("a remote engine takes the prompt from its own chat_prompt()/encode() "
                                        "(token ids cannot be sent to a server)")
        bad = self.unsupported(params)
        if bad:
            where = "dgchat serve has no setting for" if self.is_dgchat else "this server is not a dgchat server; it " \
                                                                             "has no setting for"
            raise InvalidParameterError(f"{where} {', '.join(flag(b) for b in bad)} "
                                        f"({self.url})")
        body: dict[str, Any] = {"model": self.model_id, "n": n, "seed": int(params.seed),
                                "stream_options": {"include_usage": True}}
        if params.max_tokens is not None:
            body["max_tokens"] = int(params.max_tokens)
        for name in ("temperature", "top_p"):
            if getattr(params, name) is not None:
                body[name] = float(getattr(params, name))
        if params.logit_bias:
            body["logit_bias"] = {str(int(t)): float(b) for t, b in params.logit_bias}
        if self.is_dgchat:
            ext = {k: getattr(params, k) for k in DGCHAT_WIRE if getattr(params, k) is not None}
            ext["canvas" if self.live_canvas else "final"] = True  # the final record: tokens, stop reason, stats
            body["dgchat"] = ext
        elif params.top_k:
            body["top_k"] = int(params.top_k)
        if prompt.messages is not None:
            body["messages"] = prompt.messages
            return "/v1/chat/completions", body
        body["prompt"] = prompt.text or ""
        if prompt.suffix:
            body["suffix"] = prompt.suffix
        return "/v1/completions", body

    # -- generation -----------------------------------------------------------------------------
    def generate(self, prompt_tokens: np.ndarray, params: DiffusionParams | None = None, *,
                 cancel: threading.Event | None = None, template: Any = None) -> Iterator[StepEvent | FinalEvent]:
        if template is not None:
            raise InvalidParameterError("a token-level canvas template cannot be sent to a server; use infill() "
                                        "(POST /v1/infill) for line templates")
        params = self.resolve(params)
        path, body = self.request_body(prompt_tokens, params)  # type: ignore[arg-type]
        for _i, event in self._stream(path, body, 1, cancel):
            yield event

    def generate_batch(self, prompts: Sequence[np.ndarray], params: Sequence[DiffusionParams], *,
                       cancel: threading.Event | None = None,
                       templates: Sequence[Any] | None = None) -> Iterator[tuple[int, StepEvent | FinalEvent]]:
        """Several answers; yields (index, event) as they come, each index ending with a FinalEvent."""
        if len(prompts) != len(params):
            raise InvalidParameterError("one parameter set per prompt")
        if templates is not None and any(t is not None for t in templates):
            raise InvalidParameterError("a token-level canvas template cannot be sent to a server; use infill()")
        if not prompts:
            return
        resolved = [self.resolve(p) for p in params]
        first = resolved[0]
        same = all(isinstance(p, RemotePrompt) and p.same_input(prompts[0]) for p in prompts) and all(
            replace(p, seed=first.seed) == first and p.seed == first.seed + i for i, p in enumerate(resolved))
        if same:
            path, body = self.request_body(prompts[0], first, n=len(prompts))  # type: ignore[arg-type]
            yield from self._stream(path, body, len(prompts), cancel)
            return
        yield from self._concurrent(prompts, resolved, cancel)

    def _concurrent(self, prompts, resolved, cancel) -> Iterator[tuple[int, StepEvent | FinalEvent]]:
        bodies = [self.request_body(p, r) for p, r in zip(prompts, resolved)]  # refuse before sending anything
        events: queue.Queue = queue.Queue(maxsize=256)
        abandoned = threading.Event()  # the consumer stopped reading: workers just stop
        stop = threading.Event()  # every stream closes: the caller's cancel, or abandoned
        done = object()

        def follow() -> None:  # the caller's cancel event is only read, never set here
            while not stop.wait(0.05):
                if cancel is not None and cancel.is_set():
                    stop.set()

        threading.Thread(target=follow, name="dgchat-remote-cancel", daemon=True).start()

        def run(i: int) -> None:
            try:
                if stop.is_set():  # cancelled before its turn: no request at all
                    if not abandoned.is_set():
                        events.put((i, self._final(_Choice(), None, {}, True, 1, time.perf_counter())))
                    return
                for _j, event in self._stream(*bodies[i], 1, stop):
                    if abandoned.is_set():
                        return
                    events.put((i, event))
            except BaseException as exc:  # noqa: BLE001 - handed to the consumer
                events.put((i, exc))
            finally:
                events.put((i, done))

        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(bodies)),
                                thread_name_prefix="dgchat-remote") as pool:
            for i in range(len(bodies)):
                pool.submit(run, i)
            remaining = len(bodies)
            try:
                while remaining:
                    i, item = events.get()
                    if item is done:
                        remaining -= 1
                    elif isinstance(item, BaseException):
                        raise item
                    else:
                        yield i, item
            finally:
                abandoned.set()
                stop.set()
                while remaining:  # let the workers drain so none blocks on a full queue
                    try:
                        _i, item = events.get(timeout=0.1)
                    except queue.Empty:
                        continue
                    if item is done:
                        remaining -= 1

    def _stream(self, path: str, body: dict[str, Any], n: int,
                cancel: threading.Event | None) -> Iterator[tuple[int, StepEvent | FinalEvent]]:
        choices = [_Choice() for _ in range(n)]
        usage: wire.Usage | None = None
        settings: dict[str, Any] = {}
        started = time.perf_counter()
        for obj in self.client.stream(path, body, cancel=cancel):
            try:
                chunk = wire.parse_chunk(obj)
            except ValueError:
                raise RemoteApiError(f"{self.url} sent something that is not a completion chunk", url=self.url,
                                     status=502) from None
            usage = chunk.usage or usage
            ext = chunk.dgchat or {}
            if "settings" in ext and isinstance(ext["settings"], dict):
                settings = ext["settings"]
            if "canvas" in ext and isinstance(ext.get("choice"), int) and 0 <= ext["choice"] < n:
                yield ext["choice"], self._canvas_step(choices[ext["choice"]], ext)
            if ext.get("final") and isinstance(ext.get("choice"), int) and 0 <= ext["choice"] < n:
                choices[ext["choice"]].final = ext
            for c in chunk.choices:
                if not 0 <= c.index < n:
                    continue
                state = choices[c.index]
                if c.text:
                    state.text += c.text
                    if not (self.is_dgchat and self.live_canvas):
                        yield c.index, self._text_step(state, c.text, started)
                if c.finish_reason:
                    state.finish = c.finish_reason
        cancelled = cancel is not None and cancel.is_set()
        for i, state in enumerate(choices):
            yield i, self._final(state, usage, settings, cancelled, n, started)

    def _canvas_step(self, state: _Choice, ext: dict[str, Any]) -> StepEvent:
        tokens = np.asarray(ext.get("tokens") or [], dtype=np.int64).astype(np.int32)
        texts = ext.get("canvas") or []
        pieces = self.model.pieces
        with self._lock:
            for t, text in zip(tokens.tolist(), texts):
                if isinstance(text, str):
                    pieces[t] = text
            if isinstance(ext.get("answer_tokens"), list):
                answer = [int(t) for t in ext["answer_tokens"]]
                for t, text in zip(answer, ext.get("answer_text") or []):
                    if isinstance(text, str):
                        pieces[t] = text
                state.answer = np.asarray(answer, dtype=np.int32)
            self.model.special.update(int(t) for t in ext.get("special") or [] if isinstance(t, int))
        if state.answer is None:
            state.answer = np.zeros(0, dtype=np.int32)
        status = np.asarray(ext.get("state") or [0] * tokens.size, dtype=np.int8)
        timing = ext.get("timing") if isinstance(ext.get("timing"), dict) else {}
        state.steps += 1
        event = StepEvent(
            step=int(ext.get("step") or state.steps), total_steps=int(ext.get("total_steps") or 0),
            canvas_index=int(ext.get("canvas_index") or 0), canvas_step=int(ext.get("canvas_step") or state.steps),
            canvas=CanvasSnapshot(tokens, status, np.full(tokens.size, np.nan, dtype=np.float32)),
            answer_tokens=state.answer, committed=int(ext.get("committed") or int(np.count_nonzero(status))),
            canvas_length=int(tokens.size),
            timing=StepTiming(float(timing.get("model_ms") or 0.0), float(timing.get("sampler_ms") or 0.0)),
            elapsed_s=float(ext.get("elapsed_s") or 0.0), uniform_state=bool(ext.get("uniform_state")))
        return event

    def _text_step(self, state: _Choice, delta: str, started: float) -> StepEvent:
        with self._lock:
            token = self._synthetic_next
            self._synthetic_next += 1
            self.model.pieces[token] = delta
        state.synthetic = (state.synthetic or []) + [token]
        state.steps += 1
        empty = np.zeros(0, dtype=np.int32)
        event = StepEvent(step=state.steps, total_steps=state.steps, canvas_index=0, canvas_step=state.steps,
                          canvas=CanvasSnapshot(empty, np.zeros(0, dtype=np.int8), np.zeros(0, dtype=np.float32)),
                          answer_tokens=np.asarray(state.synthetic, dtype=np.int32), committed=0, canvas_length=0,
                          timing=StepTiming(0.0, 0.0), elapsed_s=time.perf_counter() - started)
        return event

    def _final(self, state: _Choice, usage: wire.Usage | None, settings: dict[str, Any], cancelled: bool, n: int,
               started: float) -> FinalEvent:
        final = state.final or {}
        stats = GenerationStats()
        raw_stats = final.get("stats") if isinstance(final.get("stats"), dict) else {}
        for f in fields(GenerationStats):
            value, default = raw_stats.get(f.name), getattr(stats, f.name)
            if isinstance(value, bool) or value is None:
                continue
            if isinstance(default, float) and isinstance(value, (int, float)):
                setattr(stats, f.name, float(value))
            elif isinstance(value, type(default)):
                setattr(stats, f.name, value)
        if not raw_stats:
            stats.steps = state.steps
            stats.elapsed_s = time.perf_counter() - started
        if usage is not None:
            stats.prompt_tokens = usage.prompt_tokens
            if not raw_stats:
                stats.tokens = usage.completion_tokens if n == 1 else stats.tokens
        if isinstance(final.get("tokens"), list):
            tokens = np.asarray(final["tokens"], dtype=np.int32)
        else:
            tokens = np.asarray(state.synthetic or [], dtype=np.int32)
        if not stats.tokens and not raw_stats:
            stats.tokens = int(tokens.size)
        if cancelled:
            stop = "cancelled"
        elif isinstance(final.get("stop_reason"), str):
            stop = final["stop_reason"]
        else:
            stop = {"stop": "eos", "length": "max_tokens"}.get(state.finish or "", state.finish or "eos")
        extra = {"server": self.url, "model": self.model_id, "finish_reason": state.finish, "settings": settings}
        return FinalEvent(text=state.text, tokens=tokens, stop_reason=stop, stats=stats, engine_label=self.label,
                          extra=extra)

    # -- NPC lines ------------------------------------------------------------------------------
    def infill(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST /v1/infill (dgchat serve): an NPC line template filled, or a free line written."""
        return self.client.post_json("/v1/infill", body)
