"""The API server: routes, the engine worker and its queue, cancellation, graceful shutdown.

HTTP is uvicorn (h11's parser, protocol.py's deadlines) running the Starlette app of asgi.py; this
module holds what the routes do (/v1/infill's handler is infill.py's, on the job helpers here). One
worker thread owns the engine (service.py): the event loop never generates, one request generates
at a time, `max_queue` wait, the rest get 429.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from dgchat import __version__
from dgchat.model_backend.engine_protocol import LocalEngine
from dgchat.model_backend.errors import DgchatError, EngineError, GenerationCancelled, InvalidParameterError
from dgchat.npc.generator import ModelMeta
from dgchat.server import DEFAULT_PORT, openai_api
from dgchat.server.asgi import (
    SSE_DONE,
    EventStream,
    build_app,
    error_response,
    is_loopback,
    json_response,
    read_json,
    set_log_status,
    sse,
    wait_for_disconnect,
)
from dgchat.server.errors import ApiError
from dgchat.server.infill import InfillRoute
from dgchat.server.logs import escape, quiet_uvicorn, write_stderr
from dgchat.server.protocol import protocol_class
from dgchat.server.service import GenerationService, Job, QueueFull, ShuttingDown

MAX_HEAD = 32 * 1024  # request line + headers; more is answered 431


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
    allow_hosts: tuple[str, ...] = ()  # Host names accepted besides loopback and the bound address ("*": any)
    allow_origins: tuple[str, ...] = ()  # browser Origins allowed to call the API ("*": any page)

    def validate(self) -> None:
        if not is_loopback(self.host) and not self.token:
            raise InvalidParameterError(
                f"--host {self.host} is not a loopback address: anyone who can reach it could use the model; "
                "give --token (every request must then send `Authorization: Bearer TOKEN`)"
            )
        if self.token is not None:
            if len(self.token) < 8:
                raise InvalidParameterError("--token must be at least 8 characters")
            if not all("!" <= c <= "~" for c in self.token):
                raise InvalidParameterError("the token must be printable ASCII without spaces")
        if "*" in self.allow_origins and not self.token:
            raise InvalidParameterError("--allow-origin '*' lets every web page you open use the model; give --token")
        for origin in self.allow_origins:
            scheme, sep, rest = origin.partition("://")
            if origin not in ("*", "null") and not (sep and scheme in ("http", "https") and rest
                                                     and "/" not in rest.rstrip("/")):
                raise InvalidParameterError(f"--allow-origin takes an origin such as http://localhost:3000 "
                                            f"(got {origin!r})")
        if not 0 <= self.port <= 65535:
            raise InvalidParameterError(f"--port must be 0..65535 (got {self.port})")
        if self.max_body < 1024:
            raise InvalidParameterError("--max-body must be at least 1024 bytes")
        if self.max_queue < 0:
            raise InvalidParameterError("--max-queue must be >= 0")


def _bind(host: str, port: int) -> list[socket.socket]:
    """Listening sockets for every address `host` resolves to (one port for all of them). Bound here,
    not by uvicorn, so a busy port is an OSError for the caller (uvicorn would sys.exit) and port 0
    is known before the server starts."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    socks: list[socket.socket] = []
    seen = set()
    try:
        for family, kind, proto, _name, addr in infos:
            if (family, addr[:2]) in seen:
                continue
            seen.add((family, addr[:2]))
            s = socket.socket(family, kind, proto)
            socks.append(s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(socks) > 1:
                addr = (addr[0], socks[0].getsockname()[1], *addr[2:])
            s.bind(addr)
            s.listen(128)
            s.setblocking(False)
    except BaseException:
        for s in socks:
            s.close()
        raise
    return socks


class _Uvicorn(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # dgchat handles SIGINT/SIGTERM itself (`serve`): the first stops gracefully, the second at
        # once, and nothing is re-raised afterwards; ServerThread runs without signals at all
        yield


class ApiServer:
    def __init__(self, engine: LocalEngine, config: ServeConfig) -> None:
        config.validate()
        self.engine = engine
        self.config = config
        self.model_id = config.model_id or Path(engine.path).stem
        self.created = int(Path(engine.path).stat().st_mtime)
        self.service = GenerationService(engine, max_queue=config.max_queue)
        self._uvicorn: _Uvicorn | None = None
        self._serving: asyncio.Task | None = None
        self._stopping = False
        self._stopped = asyncio.Event()
        self._details: dict[str, Any] | None = None
        self.address: tuple[str, int] | None = None
        self.max_head = MAX_HEAD
        self.infill = InfillRoute(self)
        self.app = build_app(self, [
            Route("/v1/models", self._models, methods=["GET"]),
            Route("/v1/models/{model_id:path}", self._model, methods=["GET"]),
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/v1/completions", self._completions, methods=["POST"]),
            Route("/v1/infill", self.infill.handle, methods=["POST"]),
            Route("/health", self._health, methods=["GET"]),
        ])

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> tuple[str, int]:
        c = self.config
        sockets = _bind(c.host, c.port)
        quiet_uvicorn()
        uv_config = uvicorn.Config(
            self.app, http=protocol_class(head_timeout=c.header_timeout, max_connections=c.max_connections,
                                          max_head=MAX_HEAD, log=self.log),
            ws="none", lifespan="off", interface="asgi3", log_config=None, access_log=False,
            proxy_headers=False, server_header=False,  # X-Forwarded-For is not trusted; no banner
            timeout_keep_alive=c.header_timeout,  # type: ignore[arg-type]  (a float works)
            timeout_graceful_shutdown=c.grace,  # type: ignore[arg-type]
            h11_max_incomplete_event_size=MAX_HEAD,
            # a backstop: protocol.py refuses connections over the cap when they open
            limit_concurrency=c.max_connections + 1,
        )
        self._uvicorn = _Uvicorn(uv_config)
        sock = sockets[0].getsockname()
        self.address = (sock[0], sock[1])
        self._serving = asyncio.create_task(self._uvicorn.serve(sockets=sockets))
        while not self._uvicorn.started:  # startup is quick: the sockets are already bound
            if self._serving.done():
                self._serving.result()  # raises what went wrong
                raise RuntimeError("uvicorn stopped while starting")
            await asyncio.sleep(0.01)
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
            await self._stopped.wait()
            return
        self._stopping = True
        self.service.close(cancel_running=True)
        if self._uvicorn is not None and self._serving is not None:
            self._uvicorn.should_exit = True
            done, _ = await asyncio.wait({self._serving}, timeout=self.config.grace + 5.0)
            if not done:
                self.force_stop()
                await asyncio.wait({self._serving}, timeout=2.0)
            if self._serving.done() and not self._serving.cancelled() and self._serving.exception() is not None:
                exc = self._serving.exception()
                self.log(f"the HTTP server failed: {type(exc).__name__}: {exc}")
        self._stopped.set()

    def force_stop(self) -> None:
        """Stop at once (a second Ctrl-C): cancel every request still being answered."""
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
            self._uvicorn.force_exit = True
            for task in list(self._uvicorn.server_state.tasks):
                task.cancel()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    def log(self, message: str) -> None:
        if not self.config.quiet:
            write_stderr(f"dgchat serve: {escape(message)}")

    # -- simple routes ------------------------------------------------------------------------
    def _model_object(self) -> dict[str, Any]:
        return {"id": self.model_id, "object": "model", "created": self.created, "owned_by": "dgchat",
                "dgchat": {"architecture": self.engine.info.architecture, "context_length": int(self.engine.n_ctx_max),
                           "engine": self.engine.label, **self._model_details()}}

    def _model_details(self) -> dict[str, Any]:
        """What a remote client (dgchat.remote) needs to stand in for the engine: the model's
        resolved default settings, its mask and end tokens, and the identity NPC exports record."""
        if self._details is None:
            engine = self.engine
            try:
                defaults = engine.resolve().as_dict()
            except DgchatError:  # a model whose defaults do not resolve still lists (its requests will say why)
                defaults = {}
            for key in ("seed", "logit_bias"):
                defaults.pop(key, None)
            mask = engine.info.mask_token
            self._details = {
                "name": engine.info.name, "family": engine.info.family,
                "uniform_state": bool(engine.info.uniform_state),
                "mask_token": None if mask is None else int(mask),
                "end_tokens": sorted(int(t) for t in engine.eog_ids()),
                "n_vocab": int(engine.n_vocab), "defaults": defaults,
                # the model's own recommended settings and KV memory: a client resolves settings as the
                # engine does (dgchat.remote.engine.RemoteEngine.resolve)
                "model_defaults": dict(engine.info.defaults), "has_kv_memory": bool(engine.info.has_kv_memory),
                # block diffusion: the block size B (the canvas, fixed by the model) and the variant
                # ("sdar", "bd3lm"), which the client's resolution of settings needs; null otherwise
                **block_details(engine),
                "file": ModelMeta.from_engine(engine).as_dict(),
            }
        return self._details

    async def _models(self, request: Request) -> Response:
        if self._details is None:  # reads the model file's ends once: off the event loop
            await asyncio.get_running_loop().run_in_executor(None, self._model_details)
        return json_response({"object": "list", "data": [self._model_object()]})

    async def _model(self, request: Request) -> Response:
        wanted = request.path_params["model_id"]
        if wanted != self.model_id:
            raise ApiError(404, f"no model {escape(wanted, 200)!r}; this server has {self.model_id!r}",
                           code="model_not_found")
        if self._details is None:
            await asyncio.get_running_loop().run_in_executor(None, self._model_details)
        return json_response(self._model_object())

    async def _health(self, request: Request) -> Response:
        return json_response({"status": "ok", "model": self.model_id, **self.service.status()})

    # -- generation routes --------------------------------------------------------------------
    # read_body, off_loop, submit and run_job are every generating route's steps, infill.py's too
    async def read_body(self, request: Request) -> Any:
        return await read_json(request, self.config.max_body, self.config.body_timeout)

    async def off_loop(self, fn: Callable[[], Any]) -> Any:
        """Run request preparation (tokenization, validation) on a helper thread."""
        try:
            return await asyncio.get_running_loop().run_in_executor(None, fn)
        except ApiError:
            raise
        except DgchatError as exc:
            raise ApiError(400, str(exc), code="invalid_parameter") from None

    def submit(self, fn) -> Job:
        if self._stopping:
            raise ApiError(503, "the server is shutting down", type="server_error", code="shutting_down")
        try:
            return self.service.submit(fn)
        except QueueFull:
            raise ApiError(429, f"the server is busy: {self.config.max_queue} requests are already waiting; "
                                "retry shortly", type="rate_limit_error", code="queue_full",
                           headers={"Retry-After": "1"}) from None
        except ShuttingDown:
            raise ApiError(503, "the server is shutting down", type="server_error", code="shutting_down") from None

    def _job_error(self, exc: BaseException) -> ApiError:
        if isinstance(exc, ApiError):
            return exc
        if isinstance(exc, ShuttingDown) or (isinstance(exc, GenerationCancelled) and self._stopping):
            return ApiError(503, "the server is shutting down", type="server_error", code="shutting_down")
        if isinstance(exc, GenerationCancelled):
            return ApiError(499, "the request was cancelled", type="server_error", code="cancelled")
        if isinstance(exc, EngineError):
            return ApiError(500, str(exc), type="server_error", code="engine_error")
        if isinstance(exc, DgchatError):
            return ApiError(400, str(exc), code="invalid_parameter")
        self.log(f"internal error in a generation: {type(exc).__name__}: {exc}")
        return ApiError(500, f"internal error: {type(exc).__name__}", type="server_error")

    @contextlib.asynccontextmanager
    async def _cancel_on_disconnect(self, request: Request, job: Job) -> AsyncIterator[None]:
        """While the body is waited for, a client that hangs up cancels its job: a queued one leaves
        the queue at once, a running one stops within a denoising step."""
        async def watch() -> None:
            await wait_for_disconnect(request.receive)
            set_log_status(request, 499)
            self.service.cancel(job)

        watcher = asyncio.create_task(watch())
        try:
            yield
        finally:
            watcher.cancel()

    async def run_job(self, request: Request, job: Job) -> Any:
        try:
            async with self._cancel_on_disconnect(request, job):
                return await job.wait()
        except Exception as exc:  # noqa: BLE001 - every failure of the job becomes an API error
            raise self._job_error(exc) from None
        finally:
            if not job.finished:
                self.service.cancel(job)

    async def _chat(self, request: Request) -> Response:
        body = await self.read_body(request)
        plan = await self.off_loop(lambda: openai_api.prepare_chat(body, self.engine))
        return await self._generate(request, plan, "chat.completion", "chatcmpl")

    async def _completions(self, request: Request) -> Response:
        body = await self.read_body(request)
        plan = await self.off_loop(lambda: openai_api.prepare_completion(body, self.engine))
        return await self._generate(request, plan, "text_completion", "cmpl")

    def _usage(self, plan, results) -> dict[str, int]:
        completion = sum(r.completion_tokens for r in results)
        return {"prompt_tokens": int(plan.prompt.size), "completion_tokens": completion,
                "total_tokens": int(plan.prompt.size) + completion}

    def _extension(self, plan) -> dict[str, Any]:
        settings = plan.params[0].as_dict()
        settings.pop("logit_bias", None)
        settings.pop("seed", None)
        return {"seed": plan.seed, "settings": settings, "params": openai_api.params_table(plan, self.engine)}

    async def _generate(self, request: Request, plan, obj: str, prefix: str) -> Response:
        cid = f"{prefix}-{secrets.token_hex(12)}"
        head = {"id": cid, "created": int(time.time()), "model": self.model_id,
                "system_fingerprint": f"dgchat-{__version__}"}
        chat = plan.kind == "chat"
        if not plan.stream:
            job = self.submit(lambda engine, cancel, emit: openai_api.run_plan(plan, engine, cancel, None))
            results = await self.run_job(request, job)
            if chat:
                choices = [{"index": r.index, "message": {"role": "assistant", "content": r.text},
                            "finish_reason": r.finish_reason, "logprobs": None} for r in results]
            else:
                choices = [{"index": r.index, "text": plan.echo + r.text, "finish_reason": r.finish_reason,
                            "logprobs": None} for r in results]
            return json_response({**head, "object": obj, "choices": choices, "usage": self._usage(plan, results),
                                  "dgchat": self._extension(plan) | {"stats": [r.stats for r in results]}})

        # streaming: the response starts when the job does, so a full queue is still a 429 and a
        # request refused at shutdown still a 503
        job = self.submit(lambda engine, cancel, emit: openai_api.run_plan(plan, engine, cancel, emit))
        events = job.stream()
        try:
            async with self._cancel_on_disconnect(request, job):
                await anext(events)  # ("start",): the worker has begun this job
        except Exception as exc:  # noqa: BLE001
            if not job.finished:
                self.service.cancel(job)
            return error_response(self._job_error(exc), request.scope)
        chunk_obj = obj + ".chunk" if chat else obj

        def chunk(index: int, delta: str | None, finish: str | None = None, role: bool = False) -> dict[str, Any]:
            if chat:
                d: dict[str, Any] = {"role": "assistant", "content": ""} if role else (
                    {} if delta is None else {"content": delta})
                choice = {"index": index, "delta": d, "finish_reason": finish, "logprobs": None}
            else:
                choice = {"index": index, "text": delta or "", "finish_reason": finish, "logprobs": None}
            return {**head, "object": chunk_obj, "choices": [choice]}

        async def stream() -> AsyncIterator[bytes]:
            for i in range(plan.n):
                if not chat and not plan.echo:
                    continue
                first = chunk(i, None, role=True) if chat else chunk(i, plan.echo)
                if i == 0:
                    first["dgchat"] = self._extension(plan)
                yield sse(first)
            try:
                async for event in events:
                    if event[0] != "delta":
                        continue
                    _kind, index, delta, canvas = event
                    c = chunk(index, delta)
                    if canvas is not None:
                        c["dgchat"] = canvas
                    yield sse(c)
                results = job.result
            except Exception as exc:  # noqa: BLE001 - once the head is sent, errors go in the stream
                err = self._job_error(exc)
                set_log_status(request, err.status)
                yield sse(err.body())
                yield SSE_DONE
                return
            for r in results:
                last = chunk(r.index, None, r.finish_reason)
                if plan.final:  # dgchat.remote rebuilds the engine's FinalEvent from this
                    last["dgchat"] = {"choice": r.index, "final": True, "tokens": r.tokens,
                                      "stop_reason": r.stop_reason, "stats": r.stats}
                yield sse(last)
            if plan.include_usage:
                yield sse({**head, "object": chunk_obj, "choices": [], "usage": self._usage(plan, results)})
            yield SSE_DONE

        def on_close(complete: bool) -> None:
            if not job.finished:
                self.service.cancel(job)  # the client went away: stop denoising within a step

        return EventStream(stream(), on_close)


def block_details(engine: LocalEngine) -> dict[str, Any]:
    """/v1/models' `attention_block` and `variant`: a block-diffusion model's block size and variant,
    None for the other families."""
    info = engine.info
    block = getattr(info, "attention_block", None)
    if not engine.info.block_diffusion or not block:
        return {"attention_block": None, "variant": None}
    return {"attention_block": int(block), "variant": str(info.preset)}


# -- running ----------------------------------------------------------------------------------------

async def serve(engine: LocalEngine, config: ServeConfig, *, ready: Callable[[ApiServer], None] | None = None,
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
    await loop.run_in_executor(None, server.infill.generator)  # scan the vocabulary once, before the first request
    stop = stop or asyncio.Event()
    signals = 0

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        # act first, then say so: writing to a closed stderr must not keep the server running
        if signals == 1:
            stop.set()
            write_stderr("dgchat serve: shutting down (Ctrl-C again to stop at once)")
        else:
            server.force_stop()

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
            write_stderr("dgchat serve: the generation did not stop within 10 s")
        if install_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                try:
                    loop.remove_signal_handler(sig)
                except (NotImplementedError, RuntimeError):
                    pass
    return stopped


class ServerThread:
    """A server on its own event loop in a background thread (tests, embedding in other programs)."""

    def __init__(self, engine: LocalEngine, config: ServeConfig) -> None:
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
            try:
                await self.server.start()
            except BaseException:
                self.server.service.close()
                raise
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
