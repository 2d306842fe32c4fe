"""The HTTP server: routes, authentication, limits, the queue, streaming, graceful shutdown."""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import secrets
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dgchat import __version__
from dgchat.model_backend.errors import DgchatError, EngineError, GenerationCancelled, InvalidParameterError
from dgchat.model_backend.params import DiffusionParams
from dgchat.server import openai_api
from dgchat.server.http import (
    STREAM_LIMIT,
    EventStream,
    HttpError,
    Request,
    content_length,
    json_response,
    read_body,
    read_head,
)
from dgchat.server.service import GenerationService, Job, QueueFull, ShuttingDown

from dgchat.server import DEFAULT_PORT


@dataclass(frozen=True)
class ServeConfig:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    token: str | None = None
    max_body: int = 1 << 20  # bytes per request body
    max_queue: int = 8  # requests waiting behind the running one
    header_timeout: float = 30.0  # to receive a request's head (also the keep-alive idle time)
    body_timeout: float = 30.0
    model_id: str | None = None
    cards: tuple[str, ...] | None = None  # character card files/folders for /v1/infill (None: the data folder)
    quiet: bool = False
    grace: float = 5.0  # seconds in-flight requests get at shutdown
    max_connections: int = 64  # open connections; more are answered 503 and closed

    def validate(self) -> None:
        if not is_loopback(self.host) and not self.token:
            raise InvalidParameterError(
                f"--host {self.host} is not a loopback address: anyone who can reach it could use the model; "
                "give --token (every request must then send `Authorization: Bearer TOKEN`)"
            )
        if self.token is not None and len(self.token) < 8:
            raise InvalidParameterError("--token must be at least 8 characters")
        if not 0 <= self.port <= 65535:
            raise InvalidParameterError(f"--port must be 0..65535 (got {self.port})")
        if self.max_body < 1024:
            raise InvalidParameterError("--max-body must be at least 1024 bytes")
        if self.max_queue < 0:
            raise InvalidParameterError("--max-queue must be >= 0")


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


Handler = Callable[[Request, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[bool]]


class ApiServer:
    def __init__(self, engine: Any, config: ServeConfig) -> None:
        config.validate()
        self.engine = engine
        self.config = config
        self.model_id = config.model_id or Path(engine.path).stem
        self.created = int(Path(engine.path).stat().st_mtime)
        self.service = GenerationService(engine, max_queue=config.max_queue)
        self._server: asyncio.base_events.Server | None = None
        self._connections: dict[asyncio.Task, bool] = {}  # task -> busy (handling a request)
        self._stopping = False
        self._stopped = asyncio.Event()
        self._npc = None
        self._npc_lock = threading.Lock()
        self.address: tuple[str, int] | None = None
        self._routes: dict[str, dict[str, Handler]] = {
            "/v1/models": {"GET": self._models},
            "/v1/chat/completions": {"POST": self._chat},
            "/v1/completions": {"POST": self._completions},
            "/v1/infill": {"POST": self._infill},
            "/health": {"GET": self._health},
        }

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> tuple[str, int]:
        self._server = await asyncio.start_server(self._connection, self.config.host, self.config.port,
                                                  limit=STREAM_LIMIT)
        sock = self._server.sockets[0].getsockname()
        self.address = (sock[0], sock[1])
        return self.address

    @property
    def url(self) -> str:
        assert self.address is not None
        host = self.address[0]
        return f"http://{'[' + host + ']' if ':' in host else host}:{self.address[1]}"

    async def shutdown(self) -> None:
        """Stop accepting, refuse queued requests (503), cancel the running generation, give
        in-flight responses `grace` seconds to finish, then close every connection."""
        if self._stopping:
            return
        self._stopping = True
        if self._server is not None:
            self._server.close()
        self.service.close(cancel_running=True)
        for task, busy in list(self._connections.items()):
            if not busy:
                task.cancel()  # idle keep-alive connections: nothing to finish
        pending = [t for t in self._connections]
        if pending:
            _done, still = await asyncio.wait(pending, timeout=self.config.grace)
            for task in still:
                task.cancel()
            if still:
                await asyncio.wait(still, timeout=1.0)
        if self._server is not None:
            await self._server.wait_closed()
        self._stopped.set()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    def log(self, message: str) -> None:
        if not self.config.quiet:
            sys.stderr.write(f"dgchat serve: {message}\n")
            sys.stderr.flush()

    # -- connections --------------------------------------------------------------------------
    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self._connections) >= self.config.max_connections:
            await self._send_error(writer, HttpError(503, "too many open connections; retry shortly",
                                                     type="server_error", code="too_many_connections",
                                                     headers={"Retry-After": "1"}), keep_alive=False)
            writer.close()
            return
        self._connections[task] = False
        peer = writer.get_extra_info("peername")
        client = peer[0] if isinstance(peer, tuple) else "?"
        try:
            while not self._stopping:
                try:
                    request = await asyncio.wait_for(read_head(reader), self.config.header_timeout)
                except (EOFError, TimeoutError, ConnectionError):
                    break
                except HttpError as exc:
                    await self._send_error(writer, exc, keep_alive=False)
                    self.log(f"{client} - {exc.status} {exc.message}")
                    break
                request.client = client
                self._connections[task] = True
                try:
                    keep = await self._handle(request, reader, writer)
                finally:
                    self._connections[task] = False
                if not keep or not request.keep_alive:
                    break
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._connections.pop(task, None)
            try:
                writer.close()
                await asyncio.wait_for(writer.wait_closed(), 2.0)
            except (ConnectionError, TimeoutError, asyncio.CancelledError, OSError):
                pass

    async def _send_error(self, writer: asyncio.StreamWriter, exc: HttpError, *, keep_alive: bool) -> None:
        try:
            writer.write(json_response(exc.status, exc.body(), keep_alive=keep_alive and not exc.close,
                                       headers=exc.headers))
            await writer.drain()
        except (ConnectionError, OSError):
            pass

    async def _handle(self, request: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        t0 = time.perf_counter()
        status = 200
        try:
            self._authorize(request)
            methods = self._routes.get(request.path.rstrip("/") or "/")
            handler = methods.get(request.method) if methods else None
            if methods is None and request.path.startswith("/v1/models/"):
                methods, handler = {"GET": self._model}, self._model if request.method == "GET" else None
            if methods is None:
                raise HttpError(404, f"no route {request.method} {request.path}", code="not_found")
            if handler is None:
                raise HttpError(405, f"{request.path} takes {', '.join(methods)}, not {request.method}",
                                code="method_not_allowed", headers={"Allow": ", ".join(methods)})
            length = content_length(request)
            if length > self.config.max_body:
                raise HttpError(413, f"request body of {length} bytes is over the limit of {self.config.max_body}",
                                code="request_too_large", close=True)
            try:
                await asyncio.wait_for(read_body(reader, writer, request, length), self.config.body_timeout)
            except TimeoutError:
                raise HttpError(408, "the request body did not arrive in time", close=True) from None
            request.extras["body_read"] = True
            keep = await handler(request, reader, writer)
            status = request.extras.get("status", 200)
            return keep and not self._stopping
        except (ConnectionError, asyncio.CancelledError):
            status = 499
            raise
        except HttpError as exc:
            status = exc.status
            # a body left unread would be taken for the next request: close instead
            unread = not request.extras.get("body_read") and request.header("content-length", "0") not in ("", "0")
            if unread or "transfer-encoding" in request.headers:
                exc.close = True
            await self._send_error(writer, exc, keep_alive=request.keep_alive and not self._stopping)
            return not exc.close
        except Exception as exc:  # noqa: BLE001 - a bug must not kill the connection silently
            status = 500
            self.log(f"internal error: {type(exc).__name__}: {exc}")
            err = HttpError(500, f"internal error: {type(exc).__name__}", type="server_error", close=True)
            await self._send_error(writer, err, keep_alive=False)
            return False
        finally:
            self.log(f"{request.client} {request.method} {request.path} {status} {time.perf_counter() - t0:.2f}s")

    def _authorize(self, request: Request) -> None:
        token = self.config.token
        if not token:
            return
        scheme, _, given = request.header("authorization").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
            raise HttpError(401, "missing or wrong API token: send `Authorization: Bearer TOKEN`",
                            type="authentication_error", code="invalid_api_key",
                            headers={"WWW-Authenticate": 'Bearer realm="dgchat"'}, close=True)

    # -- simple routes ------------------------------------------------------------------------
    def _model_object(self) -> dict[str, Any]:
        return {"id": self.model_id, "object": "model", "created": self.created, "owned_by": "dgchat",
                "dgchat": {"architecture": self.engine.info.architecture, "context_length": int(self.engine.n_ctx_max),
                           "engine": self.engine.label}}

    async def _models(self, request: Request, reader, writer) -> bool:
        return await self._json(writer, request, {"object": "list", "data": [self._model_object()]})

    async def _model(self, request: Request, reader, writer) -> bool:
        wanted = request.path[len("/v1/models/"):]
        if wanted != self.model_id:
            raise HttpError(404, f"no model {wanted!r}; this server has {self.model_id!r}", code="model_not_found")
        return await self._json(writer, request, self._model_object())

    async def _health(self, request: Request, reader, writer) -> bool:
        return await self._json(writer, request, {"status": "ok", "model": self.model_id, **self.service.status()})

    async def _json(self, writer: asyncio.StreamWriter, request: Request, obj: Any, status: int = 200) -> bool:
        request.extras["status"] = status
        writer.write(json_response(status, obj, keep_alive=request.keep_alive and not self._stopping))
        await writer.drain()
        return True

    # -- generation routes --------------------------------------------------------------------
    async def _off_loop(self, fn: Callable[[], Any]) -> Any:
        """Run request preparation (tokenization, validation) on a helper thread."""
        try:
            return await asyncio.get_running_loop().run_in_executor(None, fn)
        except HttpError:
            raise
        except DgchatError as exc:
            raise HttpError(400, str(exc), code="invalid_parameter") from None

    def _submit(self, fn) -> Job:
        if self._stopping:
            raise HttpError(503, "the server is shutting down", type="server_error", code="shutting_down")
        try:
            return self.service.submit(fn)
        except QueueFull:
            raise HttpError(429, f"the server is busy: {self.config.max_queue} requests are already waiting; "
                                 "retry shortly", type="rate_limit_error", code="queue_full",
                            headers={"Retry-After": "1"}) from None
        except ShuttingDown:
            raise HttpError(503, "the server is shutting down", type="server_error", code="shutting_down") from None

    def _job_error(self, exc: BaseException) -> HttpError:
        if isinstance(exc, ShuttingDown) or (isinstance(exc, GenerationCancelled) and self._stopping):
            return HttpError(503, "the server is shutting down", type="server_error", code="shutting_down")
        if isinstance(exc, GenerationCancelled):
            return HttpError(499, "the request was cancelled", type="server_error", code="cancelled")
        if isinstance(exc, EngineError):
            return HttpError(500, str(exc), type="server_error", code="engine_error")
        if isinstance(exc, DgchatError):
            return HttpError(400, str(exc), code="invalid_parameter")
        return HttpError(500, f"internal error: {type(exc).__name__}: {exc}", type="server_error")

    async def _watch_disconnect(self, reader: asyncio.StreamReader, job: Job, request: Request) -> None:
        """Cancel the job when the client closes its connection while waiting for the answer."""
        try:
            data = await reader.read(1)
        except (ConnectionError, OSError):
            data = b""
        if not data:
            self.service.cancel(job)
        else:
            request.keep_alive = False  # a pipelined request: we took a byte of it; close after answering

    async def _run_job(self, request: Request, reader, job: Job, on_event=None) -> Any:
        watcher = asyncio.create_task(self._watch_disconnect(reader, job, request))
        try:
            async for event in job.stream():
                if on_event is not None:
                    await on_event(event)
            return job.result
        finally:
            watcher.cancel()
            if not job.finished:
                self.service.cancel(job)

    async def _chat(self, request: Request, reader, writer) -> bool:
        body = request.json()
        plan = await self._off_loop(lambda: openai_api.prepare_chat(body, self.engine))
        return await self._generate(request, reader, writer, plan, "chat.completion", "chatcmpl")

    async def _completions(self, request: Request, reader, writer) -> bool:
        body = request.json()
        plan = await self._off_loop(lambda: openai_api.prepare_completion(body, self.engine))
        return await self._generate(request, reader, writer, plan, "text_completion", "cmpl")

    def _usage(self, plan, results) -> dict[str, int]:
        completion = sum(r.completion_tokens for r in results)
        return {"prompt_tokens": int(plan.prompt.size), "completion_tokens": completion,
                "total_tokens": int(plan.prompt.size) + completion}

    def _extension(self, plan) -> dict[str, Any]:
        settings = plan.params[0].as_dict()
        settings.pop("logit_bias", None)
        settings.pop("seed", None)
        return {"seed": plan.seed, "settings": settings}

    async def _generate(self, request: Request, reader, writer, plan, obj: str, prefix: str) -> bool:
        cid = f"{prefix}-{secrets.token_hex(12)}"
        created = int(time.time())
        head = {"id": cid, "created": created, "model": self.model_id, "system_fingerprint": f"dgchat-{__version__}"}
        chat = plan.kind == "chat"
        if not plan.stream:
            job = self._submit(lambda engine, cancel, emit: openai_api.run_plan(plan, engine, cancel, None))
            try:
                results = await self._run_job(request, reader, job)
            except Exception as exc:  # noqa: BLE001
                raise self._job_error(exc) from None
            if chat:
                choices = [{"index": r.index, "message": {"role": "assistant", "content": r.text},
                            "finish_reason": r.finish_reason, "logprobs": None} for r in results]
            else:
                choices = [{"index": r.index, "text": plan.echo + r.text, "finish_reason": r.finish_reason,
                            "logprobs": None} for r in results]
            body = {**head, "object": obj, "choices": choices, "usage": self._usage(plan, results),
                    "dgchat": self._extension(plan) | {"stats": [r.stats for r in results]}}
            return await self._json(writer, request, body)

        # streaming: the response starts when the job does, so a full queue is still a 429 and a
        # request refused at shutdown still a 503
        job = self._submit(lambda engine, cancel, emit: openai_api.run_plan(plan, engine, cancel, emit))
        stream = EventStream(writer, request.keep_alive and not self._stopping, request.version)
        chunk_obj = obj + ".chunk" if chat else obj

        def chunk(index: int, delta: str | None, finish: str | None = None, role: bool = False) -> dict[str, Any]:
            if chat:
                d: dict[str, Any] = {"role": "assistant", "content": ""} if role else (
                    {} if delta is None else {"content": delta})
                choice = {"index": index, "delta": d, "finish_reason": finish, "logprobs": None}
            else:
                choice = {"index": index, "text": delta or "", "finish_reason": finish, "logprobs": None}
            return {**head, "object": chunk_obj, "choices": [choice]}

        async def begin() -> None:
            await stream.start()
            for i in range(plan.n):
                if not chat and not plan.echo:
                    continue
                first = chunk(i, None, role=True) if chat else chunk(i, plan.echo)
                if i == 0:
                    first["dgchat"] = self._extension(plan)
                await stream.send(first)

        async def on_event(event) -> None:
            if not stream.started:
                await begin()
            if event[0] != "delta":
                return
            _kind, index, delta, canvas = event
            c = chunk(index, delta)
            if canvas is not None:
                c["dgchat"] = canvas
            await stream.send(c)

        try:
            results = await self._run_job(request, reader, job, on_event)
            if not stream.started:
                await begin()
            for r in results:
                await stream.send(chunk(r.index, None, r.finish_reason))
            if plan.include_usage:
                await stream.send({**head, "object": chunk_obj, "choices": [], "usage": self._usage(plan, results)})
            await stream.done()
            request.extras["status"] = 200
            return stream.keep_alive
        except (ConnectionError, OSError):
            self.service.cancel(job)
            request.extras["status"] = 499
            return False
        except Exception as exc:  # noqa: BLE001 - once the head is sent, errors go in the stream
            err = exc if isinstance(exc, HttpError) else self._job_error(exc)
            request.extras["status"] = err.status
            if not stream.started:
                raise err from None
            try:
                await stream.send(err.body())
                await stream.done()
            except (ConnectionError, OSError):
                pass
            return False

    # -- /v1/infill ---------------------------------------------------------------------------
    def _generator(self):
        with self._npc_lock:
            if self._npc is None:
                from dgchat.npc.generator import NpcGenerator

                self._npc = NpcGenerator(self.engine)
            return self._npc

    def _prepare_infill(self, body: Any):
        from dgchat.npc.cards import find_card, load_cards, parse_card
        from dgchat.npc.generator import LineSpec
        from dgchat.npc.templates import parse_template

        if not isinstance(body, dict):
            raise openai_api.bad("the request body must be a JSON object")
        known = {"template", "variables", "character", "context", "situation", "n", "seed", "temperature", "top_p",
                 "model", "max_attempts", "dgchat", "user"}
        unknown = [k for k in body if k not in known]
        if unknown:
            raise openai_api.bad(f"unknown field `{unknown[0]}` (known: {', '.join(sorted(known))})", unknown[0])
        template = body.get("template")
        if not isinstance(template, str) or not template:
            raise openai_api.bad("`template` must be a non-empty string, e.g. \"Halt, {player}! None may pass the "
                                 "{___} after dark.\"", "template")
        variables = body.get("variables", {})
        if not isinstance(variables, dict) or not all(
                isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in variables.values()):
            raise openai_api.bad("`variables` must be an object of name -> string or number", "variables")
        character = body.get("character")
        if character is None:
            card = parse_card({"name": "NPC"})
        elif isinstance(character, str):
            card = find_card(load_cards(self.config.cards), character)
        elif isinstance(character, dict):
            card = parse_card(character, "character")
        else:
            raise openai_api.bad("`character` must be a card id, a card object, or absent", "character")
        for key in ("context", "situation"):
            if not isinstance(body.get(key, ""), str):
                raise openai_api.bad(f"`{key}` must be a string", key)
        n = openai_api._int(body, "n", 1, 16, 1)
        max_attempts = openai_api._int(body, "max_attempts", 1, 8, 4)
        ext = openai_api.parse_dgchat(body)
        ext.pop("canvas", None)
        params = DiffusionParams(temperature=openai_api._float(body, "temperature", 0.0, 2.0),
                                 top_p=openai_api._float(body, "top_p", 0.0, 1.0), **ext)
        params.validate()
        spec = LineSpec(card=card, context=body.get("context", ""), situation=body.get("situation", ""),
                        template=template, variables={str(k): str(v) for k, v in variables.items()}, count=n,
                        seed=openai_api.parse_seed(body), params=params)
        spec.validate()
        generator = self._generator()
        filled = parse_template(template).fill(spec.variables)
        if not filled.holes:
            raise openai_api.bad("`template` has no hole ({___}): nothing for the model to fill", "template")
        prompt = generator.prompt(spec, filled)
        # lay the line out once now: a template the tokenizer cannot keep byte-identical fails here
        from dgchat.npc.templates import plan_canvas

        plan_canvas(filled, [h.default_length for h in filled.holes], generator.tokenizer, fill_token=0)
        return spec, int(prompt.size), max_attempts

    async def _infill(self, request: Request, reader, writer) -> bool:
        body = request.json()
        spec, prompt_tokens, max_attempts = await self._off_loop(lambda: self._prepare_infill(body))
        generator = self._generator()

        def work(engine, cancel, emit):
            g = replace_attempts(generator, max_attempts)
            return g.generate(spec, cancel=cancel)

        job = self._submit(work)
        try:
            batch = await self._run_job(request, reader, job)
        except Exception as exc:  # noqa: BLE001
            raise self._job_error(exc) from None
        choices = []
        completion = 0
        for v in batch.variants:
            completion += sum(h.tokens for h in v.holes)
            choices.append({"index": v.index, "text": v.text, "holes": [{"text": h.text, "tokens": h.tokens}
                                                                       for h in v.holes],
                            "seed": v.seed, "attempt": v.attempt, "score": v.score,
                            "finish_reason": "rejected" if v.problem else "stop", "problem": v.problem})
        body_out = {"id": f"infill-{secrets.token_hex(12)}", "object": "dgchat.infill", "created": int(time.time()),
                    "model": self.model_id, "character": spec.card.id, "choices": choices,
                    "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                              "total_tokens": prompt_tokens + completion}}
        return await self._json(writer, request, body_out)


def replace_attempts(generator, max_attempts: int):
    """The shared generator with another max_attempts (a shallow copy shares its caches)."""
    if generator.max_attempts == max_attempts:
        return generator
    import copy

    g = copy.copy(generator)
    g.max_attempts = max_attempts
    return g


# -- running ----------------------------------------------------------------------------------------

async def serve(engine: Any, config: ServeConfig, *, ready: Callable[[ApiServer], None] | None = None,
                install_signals: bool = True, stop: asyncio.Event | None = None) -> bool:
    """Serve until SIGINT/SIGTERM or `stop` (first signal: graceful shutdown; second: stop at once).
    Returns whether the generation worker has stopped (only then may the engine be closed)."""
    import signal

    server = ApiServer(engine, config)
    try:
        await server.start()
    except OSError:
        server.service.close()
        server.service.join(2.0)
        raise
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, server._generator)  # scan the vocabulary once, before the first request
    stop = stop or asyncio.Event()
    signals = 0

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            server.log("shutting down (Ctrl-C again to stop at once)")
            stop.set()
        else:
            for task in list(server._connections):
                task.cancel()

    if install_signals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, on_signal)
            except (NotImplementedError, RuntimeError):  # not the main thread, or not supported here
                pass
    if ready is not None:
        ready(server)
    try:
        await stop.wait()
    finally:
        await server.shutdown()
        # the worker must be out of llama.cpp before the caller closes the engine
        stopped = await loop.run_in_executor(None, server.service.join, 10.0)
        if not stopped:
            server.log("the generation did not stop within 10 s")
        if install_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                try:
                    loop.remove_signal_handler(sig)
                except (NotImplementedError, RuntimeError):
                    pass
    return stopped


class ServerThread:
    """A server on its own event loop in a background thread (tests, embedding in other programs)."""

    def __init__(self, engine: Any, config: ServeConfig) -> None:
        self.engine = engine
        self.config = config
        self.server: ApiServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="dgchat-serve", daemon=True)

    def _main(self) -> None:
        async def main() -> None:
            self.server = ApiServer(self.engine, self.config)
            self._loop = asyncio.get_running_loop()
            await self.server.start()
            self._ready.set()
            await self.server.wait_stopped()

        try:
            asyncio.run(main())
        except BaseException as exc:  # noqa: BLE001 - reported to the starting thread
            self._error = exc
            self._ready.set()

    def start(self, timeout: float = 30.0) -> ServerThread:
        self._thread.start()
        if not self._ready.wait(timeout) or self._error is not None:
            raise RuntimeError(f"server did not start: {self._error!r}")
        return self

    @property
    def url(self) -> str:
        assert self.server is not None
        return self.server.url

    def stop(self, timeout: float = 15.0) -> None:
        if self._loop is not None and self.server is not None and self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self.server.shutdown(), self._loop).result(timeout)
        self._thread.join(timeout)
        if self.server is not None:
            self.server.service.join(timeout)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
