"""The HTTP face of the API: a Starlette app (routes and middleware) for uvicorn.

Everything HTTP lives here and in protocol.py; app.py holds the routes' logic (the engine worker,
the queue, cancellation; /v1/infill's in infill.py) and openai_api.py and request_fields.py the
request parsing, none of which knows about the stack. Middleware, outermost first:

1. `Guard`: the one-line access log (escaped, the path as sent) and the last line of defence: an
   exception nothing else handled becomes a JSON 500 and one log line, never a traceback.
2. `HostOriginCheck`: DNS rebinding and cross-site pages (docs/SERVER.md, *Host and Origin*).
3. Starlette's `CORSMiddleware`, only with `--allow-origin`: preflights and CORS headers for the
   allowed pages (a preflight carries no token, so it comes before the token check).
4. `TokenCheck`: `Authorization: Bearer TOKEN`, compared in constant time, before any routing so
   that unknown routes cannot be probed without the token.
Errors are OpenAI's JSON shape throughout.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dgchat import strict_json
from dgchat.server.errors import ApiError
from dgchat.server.logs import escape

if TYPE_CHECKING:
    from dgchat.server.app import ApiServer


# -- responses --------------------------------------------------------------------------------------

def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(strict_json.dumps(obj), status, {"Cache-Control": "no-store", **(headers or {})},
                    media_type="application/json")


def _unread_body(scope: Scope) -> bool:
    """The request announced a body that the app has not read: answering without reading it and
    keeping the connection would make the server receive (and discard) it, however large."""
    if scope.get("state", {}).get("body_read"):
        return False
    for name, value in scope["headers"]:
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() not in (b"", b"0")):
            return True
    return False


def error_response(err: ApiError, scope: Scope) -> Response:
    headers = dict(err.headers)
    if err.close or _unread_body(scope):
        headers["Connection"] = "close"
    return json_response(err.body(), err.status, headers)


def set_log_status(request: Request, status: int) -> None:
    """The status the access log shows when it is not the response's (499: the client went away)."""
    request.scope.setdefault("state", {})["log_status"] = status


# -- request bodies ---------------------------------------------------------------------------------

async def read_json(request: Request, max_body: int, timeout: float) -> Any:
    """The request's JSON body, checked before any byte of it is read: no chunked bodies (411), a
    Content-Length within `max_body` (413), Content-Type application/json (415); then read within
    `timeout` seconds (408) and parsed strictly (400)."""
    headers = request.headers
    if "transfer-encoding" in headers:
        raise ApiError(411, "chunked request bodies are not supported; send a Content-Length",
                       code="length_required", close=True)
    # h11 has already refused a Content-Length that is not ASCII digits, or two that disagree
    length = int(headers.get("content-length") or 0)
    if length > max_body:
        raise ApiError(413, f"request body of {length} bytes is over the limit of {max_body}",
                       code="request_too_large", close=True)
    ctype = headers.get("content-type")
    media = (ctype or "").split(";")[0].strip().lower()
    if media != "application/json":
        # a page can send a type-less or text/plain body cross-site without a CORS preflight
        got = f"got {escape(ctype, 100)!r}" if ctype is not None else "none given"
        raise ApiError(415, f"Content-Type must be application/json ({got})", code="unsupported_media_type")
    if length == 0:
        raise ApiError(400, "the request has no body; send a JSON object", code="invalid_json")
    try:
        async with asyncio.timeout(timeout):
            raw = await request.body()
    except TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {timeout:g} s", code="request_timeout",
                       close=True) from None
    except ClientDisconnect:  # hung up in the middle of its body: nobody to answer
        raise ApiError(499, "the client went away", code="client_closed_request", close=True) from None
    request.scope.setdefault("state", {})["body_read"] = True
    return strict_json.loads(raw, _invalid_json, subject="the request body")


def _invalid_json(message: str) -> ApiError:
    """A body that is not JSON the API accepts: a 400 whose message says why."""
    return ApiError(400, message, code="invalid_json")


async def wait_for_disconnect(receive: Receive) -> None:
    """Returns when the client has gone away (call once the body has been read)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


# -- server-sent events -----------------------------------------------------------------------------

def sse(obj: Any) -> bytes:
    return b"data: " + strict_json.dumps(obj) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


class EventStream(StreamingResponse):
    """Server-sent events through Starlette's streaming response (uvicorn chunks them over HTTP/1.1;
    an HTTP/1.0 client gets a body that ends when the connection closes). Starlette stops the
    iterator when the client disconnects; `on_close` runs however the response ends, and is told
    whether the whole stream was sent, so the generation is cancelled within a step."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[bytes], on_close: Callable[[bool], None]) -> None:
        self._complete = False

        async def body() -> AsyncIterator[bytes]:
            async for chunk in events:
                yield chunk
            self._complete = True

        super().__init__(body(), headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close(self._complete)
            if not self._complete:
                scope.setdefault("state", {})["log_status"] = 499


# -- middleware -------------------------------------------------------------------------------------

class Guard:
    """Access log and last-resort error handling (outermost)."""

    def __init__(self, app: ASGIApp, server: ApiServer) -> None:
        self.app = app
        self.server = server

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan is off and websockets are not served
            return
        t0 = time.perf_counter()
        status = [0]
        started = [False]

        async def send_logged(message: Message) -> None:
            if message["type"] == "http.response.start":
                started[0] = True
                status[0] = message["status"]
            await send(message)

        path = scope["path"]
        if len(path) > 1 and path.endswith("/"):  # `/v1/models/` is `/v1/models`
            scope = {**scope, "path": path.rstrip("/") or "/"}
        try:
            await self.app(scope, receive, send_logged)
        except Exception as exc:  # noqa: BLE001 - a bug must not become a traceback or a dead connection
            status[0] = 500
            self.server.log(f"internal error: {type(exc).__name__}: {exc}")
            if not started[0]:
                err = ApiError(500, f"internal error: {type(exc).__name__}", type="server_error", close=True)
                await error_response(err, scope)(scope, receive, send)
        finally:
            shown = scope.get("state", {}).get("log_status", status[0])
            client = scope["client"][0] if scope.get("client") else "?"
            # the path as sent (percent-encoded; h11 allows only visible ASCII in it), no query string
            raw = scope.get("raw_path") or scope["path"].encode("utf-8", "replace")
            target = raw.decode("ascii", "replace")
            self.server.log(f"{client} {scope['method']} {target} {shown} {time.perf_counter() - t0:.2f}s")


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def split_host(value: str) -> str | None:
    """The name in a Host header (`name`, `name:port`, `[v6]:port`), lowercased; None if malformed."""
    value = value.strip().lower()
    if value.startswith("["):
        name, sep, rest = value[1:].partition("]")
        if not sep or (rest and not (rest.startswith(":") and rest[1:].isascii() and rest[1:].isdigit())):
            return None
        return name
    name, sep, port = value.partition(":")
    if not name or (sep and not (port.isascii() and port.isdigit())):
        return None
    return name


class HostOriginCheck:
    """The request head's size, then its Host and Origin. A browser page can reach a loopback
    server in two ways, both refused here (403):
    - DNS rebinding: the page's own host name re-resolved to 127.0.0.1, so its requests are
      "same-origin" and carry no Origin; they do carry `Host: evil.example`. Only a loopback name,
      the address the server is bound to, the address the connection came in on, or a name given
      with `--allow-host` is accepted.
    - cross-origin requests: browsers send `Origin`; programs (curl, the OpenAI libraries, game
      engines) do not. An Origin is refused unless given with `--allow-origin`."""

    def __init__(self, app: ASGIApp, server: ApiServer) -> None:
        self.app = app
        config = server.config
        self.bound = config.host.strip("[]").lower()
        self.hosts = {h.lower() for h in config.allow_hosts}
        self.origins = {o.lower().rstrip("/") for o in config.allow_origins}
        self.max_head = server.max_head

    def _check(self, scope: Scope) -> ApiError | None:
        # h11 bounds a head that arrives in pieces (431); one that arrives whole in a single read is
        # parsed whatever its size, so the same limit is applied to the parsed head here
        size = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"") + sum(
            len(k) + len(v) + 4 for k, v in scope["headers"])
        if size > self.max_head:
            return ApiError(431, f"request line or headers over {self.max_head // 1024} KiB", code="header_too_large",
                            close=True)
        hosts = [v for k, v in scope["headers"] if k == b"host"]
        if hosts:  # h11: exactly one on HTTP/1.1; none is allowed on HTTP/1.0 (no browser sends that)
            name = split_host(hosts[0].decode("latin-1"))
            local = (scope.get("server") or ("",))[0] or ""
            if name is None:
                return ApiError(400, "malformed Host header", code="bad_host")
            if not ("*" in self.hosts or name in self.hosts or is_loopback(name) or name == self.bound
                    or name == local.lower()):
                return ApiError(403, f"Host {escape(name, 100)!r} is not this server's name; start the server "
                                     "with --allow-host NAME to accept it", type="permission_error",
                                code="host_not_allowed")
        for k, v in scope["headers"]:
            if k == b"origin":
                origin = v.decode("latin-1").strip().lower().rstrip("/")
                if "*" not in self.origins and origin not in self.origins:
                    return ApiError(403, f"requests from web pages (Origin {escape(origin, 100)!r}) are refused; "
                                         "start the server with --allow-origin ORIGIN to allow a page",
                                    type="permission_error", code="origin_not_allowed")
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        err = self._check(scope)
        if err is not None:
            await error_response(err, scope)(scope, receive, send)
            return
        await self.app(scope, receive, send)


class TokenCheck:
    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token.encode("ascii") if token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.token is not None:
            given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            scheme, _, value = given.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(value.strip(), self.token):
                err = ApiError(401, "missing or wrong API token: send `Authorization: Bearer TOKEN`",
                               type="authentication_error", code="invalid_api_key",
                               headers={"WWW-Authenticate": 'Bearer realm="dgchat"'})
                await error_response(err, scope)(scope, receive, send)
                return
        await self.app(scope, receive, send)


# -- the app ----------------------------------------------------------------------------------------

async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc, request.scope)


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's routing errors (no route, wrong method) in OpenAI's shape."""
    assert isinstance(exc, HTTPException)
    method, path = request.method, escape(request.url.path, 200)
    if exc.status_code == 404:
        err = ApiError(404, f"no route {method} {path}", code="not_found")
    elif exc.status_code == 405:
        allow = (exc.headers or {}).get("Allow", "")
        err = ApiError(405, f"{path} takes {allow}, not {method}", code="method_not_allowed", headers={"Allow": allow})
    else:
        err = ApiError(exc.status_code, exc.detail, code="http_error", headers=dict(exc.headers or {}))
    return error_response(err, request.scope)


def build_app(server: ApiServer, routes: list[Route]) -> Starlette:
    middleware = [Middleware(Guard, server=server), Middleware(HostOriginCheck, server=server)]
    if server.config.allow_origins:
        middleware.append(Middleware(CORSMiddleware, allow_origins=list(server.config.allow_origins),
                                     allow_methods=["GET", "POST"], allow_headers=["Authorization", "Content-Type"],
                                     allow_private_network=True))
    middleware.append(Middleware(TokenCheck, token=server.config.token))
    return Starlette(routes=routes, middleware=middleware,
                     exception_handlers={ApiError: _api_error, HTTPException: _http_error})
