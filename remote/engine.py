"""`RemoteEngine`: an OpenAI-compatible server standing in for a loaded model.

It offers what the app's `Engine` Protocol (model_backend/engine_protocol.py) asks of a local
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
  /v1/models) by the rules of the model's family (masked, DiffusionGemma, block diffusion: the
  server reports a block model's `attention_block` and `variant`, and the block rules apply: the
  canvas is one block, steps are per block); other servers, and dgchat models of a family this
  client does not know, report none it can use, so only `max_tokens` is filled. The server has the last
  word: the settings it used come back in `FinalEvent.extra["settings"]`.
  Settings the server cannot take (`unsupported()`: vLLM's diffusion settings, the local-only
  ones) are dropped by `resolve()` and refused by `generate()`.
- `path` is not a file: it is `Path(model id)`; `url` says where the model is. `precise` is None:
  exact mode is the server's choice.

The text and vocabulary methods (and `RemotePrompt`, `ShownTokens`) are in remote/vocabulary.py,
which settings go on the wire and the request body in remote/request_body.py; this module reads the
server's stream back into events.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from dgchat.model_backend.canvas import CanvasSnapshot
from dgchat.model_backend.errors import ContextOverflowError, InvalidParameterError
from dgchat.model_backend.events import FinalEvent, GenerationStats, StepEvent, StepTiming
from dgchat.model_backend.model_info import BLOCK_VARIANTS, ModelInfo
from dgchat.model_backend.param_resolution import resolve_params
from dgchat.model_backend.params import DiffusionParams
from dgchat.remote import wire
from dgchat.remote.client import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_DEADLINE,
    DEFAULT_RETRIES,
    DEFAULT_TIMEOUT,
    RemoteClient,
)
from dgchat.remote.errors import RemoteApiError
from dgchat.remote.limits import AnswerBudget
from dgchat.remote.request_body import body_for, flag, unsupported_settings
from dgchat.remote.vocabulary import RemotePrompt, RemoteVocabulary, ShownTokens

SYNTHETIC_BASE = 1 << 30  # ids of text-only progress pieces: far above any vocabulary
DEFAULT_CONTEXT = 8192  # a server that does not say its context length
DEFAULT_CONCURRENCY = 4  # vLLM's DiffusionGemma recipe serves --max-num-seqs 4


def model_family(details: wire.DgchatDetails, context: int) -> tuple[str, str, int | None]:
    """(family, preset, attention_block) of the ModelInfo standing in for a server's model: the
    families whose rules the client knows (model_backend/param_resolution), else "remote" (the
    server's rules decide). Block diffusion needs the block size and a known variant from the
    server (`attention_block`, `variant` in /v1/models), a block no larger than the context; a
    server that claims the family without them is "remote"."""
    if details.family in ("masked", "diffusion_gemma"):
        return details.family, details.family, None
    block = details.attention_block
    if (details.family == "block_diffusion" and block is not None and 1 <= block <= context
            and details.variant in BLOCK_VARIANTS):
        return "block_diffusion", details.variant, int(block)
    return "remote", "remote", None


@dataclass
class _Choice:
    """The running state of one choice of a stream."""

    text: str = ""
    finish: str | None = None
    answer: np.ndarray | None = None  # answer_tokens of the current canvas (canvas extension)
    synthetic: list[int] | None = None  # text-only progress ids
    final: wire.FinalRecord | None = None  # the canvas extension's final record
    steps: int = 0
    text_bytes: int = 0  # UTF-8 bytes of `text` (bounded by the request's budget)
    deltas: int = 0  # text deltas received: each carries at least one token


class RemoteEngine(RemoteVocabulary):
    """One model on an OpenAI-compatible server (see the module docstring). Its text and vocabulary
    methods are RemoteVocabulary's (remote/vocabulary.py), its request bodies request_body.py's."""

    def __init__(self, client: RemoteClient, model: wire.ServerModel, *, live_canvas: bool = True,
                 max_concurrency: int = DEFAULT_CONCURRENCY) -> None:
        self.client = client
        self.server_model = model
        self.live_canvas = live_canvas  # ask dgchat serve for canvas snapshots
        self.max_concurrency = max(1, max_concurrency)
        # every value read here was checked by remote.wire.parse_models (types, ranges)
        d = model.details or wire.DgchatDetails()
        self.is_dgchat = model.is_dgchat
        self.shown = ShownTokens(d.n_vocab, d.end_tokens or (), url=client.url)
        mask = d.mask_token
        if mask is not None:
            self.shown.special.add(mask)
        self._defaults = dict(d.defaults)
        context = int(model.context_length or DEFAULT_CONTEXT)
        family, preset, block = model_family(d, context)
        self.info = ModelInfo(
            architecture=d.architecture or "remote", family=family, preset=preset,
            has_kv_memory=False, mask_token=mask, shift_logits=False, chat_template=None,
            name=d.name or model.id, context_length=context,
            defaults=dict(self._defaults), attention_block=block)
        self._synthetic_next = SYNTHETIC_BASE
        self._lock = threading.Lock()

    @classmethod
    def connect(cls, url: str, *, api_key: str | None = None, model: str | None = None,
                timeout: float = DEFAULT_TIMEOUT, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
                retries: int = DEFAULT_RETRIES, live_canvas: bool = True,
                deadline: float = DEFAULT_DEADLINE) -> RemoteEngine:
        """Ask the server for its models (this is where a wrong URL, a dead server or a wrong key
        shows) and stand in for `model` (default: the server's first)."""
        client = RemoteClient(url, api_key=api_key, timeout=timeout, connect_timeout=connect_timeout, retries=retries,
                              deadline=deadline)
        try:
            models = client.models()
            if model is None:
                chosen = models[0]
            else:
                chosen = next((m for m in models if m.id == model), None)
                if chosen is None:
                    listed = ", ".join(wire.quote(m.id, 80) for m in models[:10])
                    more = f" and {len(models) - 10} more" if len(models) > 10 else ""
                    raise InvalidParameterError(f"{client.url} has no model '{wire.quote(model, 80)}' (it has: "
                                                f"{listed}{more})")
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
        kind = self.server_model.details.engine if self.is_dgchat and self.server_model.details else None
        # the server's own words, shown in status lines: one short line
        return f"remote ({wire.quote(kind, 60)} on {self.url})" if kind else f"remote ({self.url})"

    @property
    def path(self) -> Path:
        return Path(self.model_id)

    @property
    def n_ctx_max(self) -> int:
        return self.info.context_length

    @property
    def counts_tokens(self) -> bool:
        """A server's prompts are messages: it counts them and reports the count with each answer."""
        return False

    @property
    def text_only(self) -> bool:
        """Not a dgchat serve server: it samples with its own settings and sends text only."""
        return not self.is_dgchat

    @property
    def placement(self) -> None:
        """Where the server put the weights is the server's (its `dgchat serve` log says)."""
        return None

    @property
    def precise(self) -> None:
        """Exact mode is the server's to choose (dgchat serve --precise); it does not say which."""
        return None

    # -- parameters -----------------------------------------------------------------------------
    def resolve(self, params: DiffusionParams | None = None) -> DiffusionParams:
        """Unset settings filled as the server's engine fills them. A dgchat server reports its model's
        recommended settings, so this runs the engines' own rules on them (model_backend/
        param_resolution: they read only the model's header facts; the server has the last word on
        placement, --sampler-on); other servers fill their own defaults, so only max_tokens is set here.
        Settings this server cannot take (`unsupported`) are left at DiffusionParams' defaults, so
        callers can pass settings meant for any model (the config's [sampler] table) as they are;
        `generate` refuses them instead, and a caller whose user chose them (a chat's own settings)
        asks `unsupported` first to say which."""
        params = self.without_unsupported(params or DiffusionParams())
        d = self.server_model.details
        if self.is_dgchat and d is not None and d.model_defaults is not None and self.info.family != "remote":
            info = replace(self.info, defaults=dict(d.model_defaults), has_kv_memory=d.has_kv_memory)
            params = resolve_params(info, params).params
            params.check_vocabulary(self.n_vocab)
            return params
        if params.max_tokens is None:
            # a dgchat server's model of a family this client does not know: the answer length it reports
            reported = self._defaults.get("max_tokens") if self.is_dgchat else None
            params = params.updated(max_tokens=params.gen_length or reported or min(1024, self.n_ctx_max // 2))
        params.validate()
        return params

    def without_unsupported(self, params: DiffusionParams) -> DiffusionParams:
        """`params` with what this server cannot take back at DiffusionParams' defaults."""
        bad = self.unsupported(params)
        if not bad:
            return params
        plain = DiffusionParams()
        return replace(params, **{name: getattr(plain, name) for name in bad})

    def refuse_unsupported(self, params: DiffusionParams) -> None:
        """Refuse settings this server cannot take, naming their flags (resolve would drop them: an
        answer asked for with them must not silently run without)."""
        bad = self.unsupported(params)
        if bad:
            where = "dgchat serve has no setting for" if self.is_dgchat else "this server is not a dgchat server; it " \
                                                                             "has no setting for"
            raise InvalidParameterError(f"{where} {', '.join(flag(b) for b in bad)} "
                                        f"({self.url})")

    def unsupported(self, params: DiffusionParams) -> list[str]:
        """Settings in `params` that this server cannot take (compared with the defaults)."""
        return unsupported_settings(params, dgchat=self.is_dgchat, defaults=self._defaults)

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
        self.refuse_unsupported(params)
        return body_for(prompt, params, model=self.model_id, n=n, dgchat=self.is_dgchat, live_canvas=self.live_canvas)

    # -- generation -----------------------------------------------------------------------------
    def generate(self, prompt_tokens: np.ndarray, params: DiffusionParams | None = None, *,
                 cancel: threading.Event | None = None, template: Any = None) -> Iterator[StepEvent | FinalEvent]:
        if template is not None:
            raise InvalidParameterError("a token-level canvas template cannot be sent to a server; use infill() "
                                        "(POST /v1/infill) for line templates")
        if params is not None:
            self.refuse_unsupported(params)  # before resolve, which would drop them
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
        for p in params:
            self.refuse_unsupported(p)  # before resolve, which would drop them
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
        """The events of one streamed request of `n` choices. What the server sends is held to the
        request's budget (limits.AnswerBudget): max_tokens per choice is enforced here too, and a
        server that sends more text, tokens or canvas than was asked for fails with one line."""
        budget = AnswerBudget.of(body)
        choices = [_Choice() for _ in range(n)]
        usage: wire.Usage | None = None
        settings: dict[str, Any] = {}
        started = time.perf_counter()
        read_ext = self.is_dgchat  # dgchat serve's extension (canvas frames, final records, settings)
        vocab = self.shown.vocab_limit
        for obj in self.client.stream(path, body, cancel=cancel, budget=budget):
            try:
                chunk = wire.parse_chunk(obj, dgchat=read_ext, vocab=vocab)
            except wire.WireError as exc:
                raise RemoteApiError(f"{self.url} sent an invalid event: {exc}", url=self.url, status=502) from None
            usage = chunk.usage or usage
            if chunk.settings is not None:
                settings = chunk.settings
            frame = chunk.canvas
            if frame is not None and frame.choice < n:
                yield frame.choice, self._canvas_step(choices[frame.choice], frame, budget)
            if chunk.final is not None and chunk.final.choice < n:
                if chunk.final.tokens.size > budget.max_tokens:
                    raise self._over_budget(f"{chunk.final.tokens.size} answer tokens", budget)
                choices[chunk.final.choice].final = chunk.final
            for c in chunk.choices:
                if not 0 <= c.index < n:
                    continue
                state = choices[c.index]
                if c.text:
                    state.text_bytes += len(c.text.encode("utf-8"))
                    state.deltas += 1
                    if state.text_bytes > budget.text_bytes:
                        raise self._over_budget(f"more than {budget.text_bytes} bytes of text", budget)
                    # each delta carries at least one token (a server may send several at once), but
                    # one: dgchat serve's last delta may be the UTF-8 decoder's flush of an answer that
                    # ends inside a character (U+FFFD), after the delta of that answer's last token
                    if state.deltas > budget.max_tokens + 1:
                        raise self._over_budget(f"more than {budget.max_tokens} pieces of text", budget)
                    state.text += c.text
                    if not (self.is_dgchat and self.live_canvas):
                        yield c.index, self._text_step(state, c.text, started)
                if c.finish_reason:
                    state.finish = c.finish_reason
        cancelled = cancel is not None and cancel.is_set()
        for i, state in enumerate(choices):
            yield i, self._final(state, usage, settings, cancelled, n, started)

    def _over_budget(self, what: str, budget: AnswerBudget) -> RemoteApiError:
        return RemoteApiError(f"{self.url} sent {what} for an answer of at most {budget.max_tokens} tokens "
                              "(max_tokens); stopped reading", url=self.url, status=502)

    def _canvas_step(self, state: _Choice, frame: wire.CanvasFrame, budget: AnswerBudget) -> StepEvent:
        tokens = frame.tokens
        if tokens.size > budget.canvas:
            raise self._over_budget(f"a canvas of {tokens.size} positions", budget)
        if frame.answer_tokens is not None and frame.answer_tokens.size > budget.answer_tokens:
            raise self._over_budget(f"{frame.answer_tokens.size} answer tokens", budget)
        with self._lock:
            self.shown.remember(tokens.tolist(), frame.pieces, frame.special)
            if frame.answer_tokens is not None:
                if frame.answer_pieces is not None:
                    self.shown.remember(frame.answer_tokens.tolist(), frame.answer_pieces)
                state.answer = frame.answer_tokens
        if state.answer is None:
            state.answer = np.zeros(0, dtype=np.int32)
        status = frame.state
        state.steps += 1
        event = StepEvent(
            step=frame.step or state.steps, total_steps=frame.total_steps, canvas_index=frame.canvas_index,
            canvas_step=frame.canvas_step or state.steps,
            canvas=CanvasSnapshot(tokens, status, np.full(tokens.size, np.nan, dtype=np.float32)),
            answer_tokens=state.answer, committed=frame.committed or int(np.count_nonzero(status)),
            canvas_length=int(tokens.size), timing=StepTiming(frame.model_ms, frame.sampler_ms),
            elapsed_s=frame.elapsed_s, uniform_state=frame.uniform_state)
        return event

    def _text_step(self, state: _Choice, delta: str, started: float) -> StepEvent:
        with self._lock:
            token = self._synthetic_next
            self._synthetic_next += 1
            self.shown.pieces[token] = delta
        if state.synthetic is None:
            state.synthetic = []
        state.synthetic.append(token)  # in place: an answer of many deltas stays linear
        state.steps += 1
        empty = np.zeros(0, dtype=np.int32)
        event = StepEvent(step=state.steps, total_steps=state.steps, canvas_index=0, canvas_step=state.steps,
                          canvas=CanvasSnapshot(empty, np.zeros(0, dtype=np.int8), np.zeros(0, dtype=np.float32)),
                          answer_tokens=np.asarray(state.synthetic, dtype=np.int32), committed=0, canvas_length=0,
                          timing=StepTiming(0.0, 0.0), elapsed_s=time.perf_counter() - started)
        return event

    def _final(self, state: _Choice, usage: wire.Usage | None, settings: dict[str, Any], cancelled: bool, n: int,
               started: float) -> FinalEvent:
        final = state.final
        stats = GenerationStats()
        raw_stats = final.stats if final is not None else {}  # checked fields of GenerationStats
        for name, value in raw_stats.items():
            setattr(stats, name, value)
        if not raw_stats:
            stats.steps = state.steps
            stats.elapsed_s = time.perf_counter() - started
        if usage is not None:
            stats.prompt_tokens = usage.prompt_tokens
            if not raw_stats:
                stats.tokens = usage.completion_tokens if n == 1 else stats.tokens
        if final is not None:
            tokens = final.tokens
        else:
            tokens = np.asarray(state.synthetic or [], dtype=np.int32)
        if not stats.tokens and not raw_stats:
            stats.tokens = int(tokens.size)
        if cancelled:
            stop = "cancelled"
        elif final is not None:
            stop = final.stop_reason
        else:
            stop = {"stop": "eos", "length": "max_tokens"}.get(state.finish or "", state.finish or "eos")
        extra = {"server": self.url, "model": self.model_id, "finish_reason": state.finish, "settings": settings}
        return FinalEvent(text=state.text, tokens=tokens, stop_reason=stop, stats=stats, engine_label=self.label,
                          extra=extra)

    # -- NPC lines ------------------------------------------------------------------------------
    def infill(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST /v1/infill (dgchat serve): an NPC line template filled, or a free line written."""
        return self.client.post_json("/v1/infill", body)
