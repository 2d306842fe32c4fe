"""An HTTP client for one OpenAI-compatible server: JSON calls and server-sent event streams.

- **Retries**: a connection that cannot be made (refused, unknown host, reset before an answer), a
  429 and a 5xx are tried again after 0.5, 1, 2, ... seconds (`backoff`, doubling, capped at
  `max_backoff`, or the server's `Retry-After` when it says so, capped at limits.MAX_RETRY_AFTER),
  up to `retries` more times and limits.MAX_RETRY_WAIT seconds of waiting in all. Other 4xx answers
  are final: the request itself is wrong and would fail again. A stream that broke after it started
  is never retried here (its caller has already shown part of the answer), nor a request that timed
  out (it would double the wait; dgchat.remote.pool tries another server).
- **Timeouts**: `connect_timeout` to open a connection; `timeout` for each read, so a streamed
  answer may take long as long as the server keeps sending (dgchat serve sends every denoising
  step) and a server that goes silent fails within `timeout`; and `deadline` for the whole request
  (every try, the waits between them and the whole answer), so a server that drip-feeds bytes or
  streams without end fails too (RemoteTimeout). GET requests (/v1/models) get at most
  limits.METADATA_DEADLINE seconds.
- **Bounds**: a body is read incrementally and counted after decompression (a gzip bomb stops at
  the bound, not in memory), each endpoint with its own bound; a streamed event is bounded by the
  request's size (limits.AnswerBudget); JSON is read strictly (remote.wire.loads). Every bound
  ends the request with one line naming the server (docs/SECURITY.md lists them).
- **Errors** name the server and what to do (dgchat.remote.errors); what they quote of the
  server's text is one short, escaped line (remote.wire.quote).
"""

from __future__ import annotations

import contextlib
import math
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx2

from dgchat.model_backend.errors import InvalidParameterError
from dgchat.remote import limits, wire
from dgchat.remote.errors import (
    AuthRejected,
    NoInfillEndpoint,
    RemoteApiError,
    RemoteError,
    RemoteTimeout,
    ServerUnreachable,
    StreamBroken,
)
from dgchat.remote.limits import AnswerBudget

API_KEY_ENV = "DGCHAT_API_KEY"
DEFAULT_TIMEOUT = 300.0  # seconds without a byte from the server
DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_RETRIES = 3
DEFAULT_DEADLINE = limits.DEFAULT_DEADLINE  # seconds for a whole request
MAX_RETRY_AFTER = limits.MAX_RETRY_AFTER  # a server's Retry-After above this is capped
MAX_SECONDS = 1e6  # a timeout or deadline above this (11 days) is a typo, and inf breaks socket timeouts
MAX_URL_CHARS = 2048


def normalize_url(url: str) -> str:
    """`http://host:port` from what a user types: a trailing `/` or `/v1` is dropped (the paths
    used are /v1/...); the scheme is required (dgchat never guesses between http and https). The
    whole URL is checked here (host, port, characters), so a malformed one is this one-line error
    rather than the HTTP library's exception later."""
    text = (url or "").strip() if isinstance(url, str) else ""

    def bad(why: str = "") -> InvalidParameterError:
        got = wire.quote(url if isinstance(url, str) else repr(url), 80)
        return InvalidParameterError(f"--server takes a URL such as http://127.0.0.1:8765 (got '{got}'"
                                     f"{': ' + why if why else ''})")

    scheme, sep, rest = text.partition("://")
    if not sep or scheme.lower() not in ("http", "https") or not rest.strip("/"):
        raise bad()
    if len(text) > MAX_URL_CHARS:
        raise bad(f"longer than {MAX_URL_CHARS} characters")
    try:
        parsed = httpx2.URL(text)
    except (httpx2.InvalidURL, ValueError, TypeError) as exc:
        raise bad(wire.quote(exc, 80)) from None
    if not parsed.host:
        raise bad("no host")
    if parsed.port is not None and not 1 <= parsed.port <= 65535:
        raise bad(f"port {parsed.port} is not in 1..65535")
    if parsed.query or parsed.fragment:
        raise bad("a server URL has no ?query or #fragment")
    text = text.rstrip("/")
    if text.endswith("/v1"):
        text = text[: -len("/v1")]
    return text


def _reason(exc: BaseException) -> str:
    """Why a connection failed, in words ("connection refused", "unknown host ...")."""
    text = str(exc) or type(exc).__name__
    low = text.lower()
    if "refused" in low:
        return "connection refused"
    if "name or service not known" in low or "nodename nor servname" in low or "getaddrinfo" in low:
        return "unknown host"
    if "reset" in low:
        return "connection reset"
    if "unreachable" in low:
        return "network unreachable"
    if "server disconnected" in low or "without sending" in low or "incomplete" in low:
        return "the connection closed before an answer"
    return wire.quote(text.removeprefix("[Errno 111] "), 120)


def _size(n: int) -> str:
    return f"{n / limits.MIB:g} MiB" if n >= limits.MIB else f"{n / limits.KIB:g} KiB"


def _seconds(value: float, what: str) -> float:
    value = float(value)
    if not (math.isfinite(value) and 0 < value <= MAX_SECONDS):
        raise InvalidParameterError(f"{what} must be a number of seconds in (0, {MAX_SECONDS:g}] (got {value:g})")
    return value


class _Watch:
    """Ends a response when its request's deadline passes or its caller cancels. It shuts the
    connection's socket down (a read blocked on a silent server returns at once; closing the socket
    from another thread would not wake it), then closes the response."""

    def __init__(self, cancel: threading.Event | None, deadline_at: float) -> None:
        self.cancel = cancel
        self.deadline_at = deadline_at
        self.expired = False
        self.cancelled = False
        self._response: httpx2.Response | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        threading.Thread(target=self._run, name="dgchat-remote-watch", daemon=True).start()

    def attach(self, response: httpx2.Response) -> None:
        with self._lock:
            self._response = response
            ended = self.expired or self.cancelled
        if ended:
            self._end()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while True:
            remaining = self.deadline_at - time.monotonic()
            if remaining <= 0:
                with self._lock:
                    self.expired = True
                self._end()
                return
            if self._stop.wait(min(remaining, 0.05) if self.cancel is not None else remaining):
                return
            if self.cancel is not None and self.cancel.is_set():
                with self._lock:
                    self.cancelled = True
                self._end()
                return

    def _end(self) -> None:
        with self._lock:
            response = self._response
        if response is None:
            return
        with contextlib.suppress(Exception):
            sock = response.extensions["network_stream"].get_extra_info("socket")
            sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(Exception):
            response.close()


class RemoteClient:
    """One server. Thread-safe: httpx2's connection pool serves concurrent calls."""

    def __init__(self, url: str, *, api_key: str | None = None, timeout: float = DEFAULT_TIMEOUT,
                 connect_timeout: float = DEFAULT_CONNECT_TIMEOUT, retries: int = DEFAULT_RETRIES,
                 backoff: float = 0.5, max_backoff: float = 8.0, deadline: float = DEFAULT_DEADLINE,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.timeout = _seconds(timeout, "the timeout (--timeout)")
        self.connect_timeout = _seconds(connect_timeout, "the connect timeout")
        self.deadline = _seconds(deadline, "the deadline (--deadline)")
        if retries < 0:
            raise InvalidParameterError("retries must be >= 0")
        self.url = normalize_url(url)
        self.api_key = api_key or None
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self._sleep = sleep
        headers = {"Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        self._http = httpx2.Client(base_url=self.url, headers=headers,
                                   timeout=httpx2.Timeout(self.timeout, connect=self.connect_timeout))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RemoteClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- errors ---------------------------------------------------------------------------------
    def _deadline_error(self, path: str, deadline: float) -> RemoteTimeout:
        return RemoteTimeout(f"{self.url} did not finish answering {path} within {deadline:g} s (--deadline)",
                             url=self.url)

    def _transport_error(self, exc: httpx2.TransportError, path: str) -> RemoteError:
        if isinstance(exc, httpx2.ConnectTimeout):
            return ServerUnreachable(f"cannot reach {self.url}: no connection within {self.connect_timeout:g} s",
                                     url=self.url)
        if isinstance(exc, httpx2.TimeoutException):
            return RemoteTimeout(f"{self.url} did not answer {path} within {self.timeout:g} s (--timeout)",
                                 url=self.url)
        if isinstance(exc, httpx2.ConnectError):
            return ServerUnreachable(f"cannot reach {self.url}: {_reason(exc)}", url=self.url)
        # sent, then the connection broke: the server died or restarted while it had the request
        return ServerUnreachable(f"lost the connection to {self.url} before its answer ({_reason(exc)})",
                                 url=self.url)

    def _status_error(self, response: httpx2.Response, raw: bytes, path: str) -> RemoteError:
        status = response.status_code
        try:
            body: Any = wire.loads(raw)
        except wire.WireError:
            body = None
        message, code, param = wire.error_message(body)
        if not message:
            text = raw.decode("utf-8", "replace").strip()
            message = wire.quote(text) if text else wire.quote(response.reason_phrase or "no details")
        if status in (401, 403) and code not in ("host_not_allowed", "origin_not_allowed"):
            hint = ("no key was sent: give --api-key, set $" + API_KEY_ENV + " or [server] api_key"
                    if not self.api_key else "check --api-key, $" + API_KEY_ENV + " or [server] api_key")
            return AuthRejected(f"the server rejected the API key ({status}) at {self.url}: {hint}", url=self.url)
        if status == 404 and path == "/v1/infill":
            return NoInfillEndpoint(
                f"the server at {self.url} has no infill endpoint (POST /v1/infill answered 404): infill and "
                "NPC lines need a `dgchat serve` server", url=self.url)
        return RemoteApiError(f"{self.url} answered {status}: {message}", url=self.url, status=status, code=code,
                              param=param)

    def _delay(self, attempt: int, response: httpx2.Response | None) -> float:
        if response is not None:
            after = response.headers.get("retry-after", "").strip()
            if after.isdigit():  # an HTTP date is not read: the backoff applies
                return min(float(after), limits.MAX_RETRY_AFTER)
        return min(self.backoff * (2 ** attempt), self.max_backoff)

    # -- requests -------------------------------------------------------------------------------
    def _send(self, method: str, path: str, body: Any, deadline_at: float, deadline: float) -> httpx2.Response:
        """A streamed response with a 2xx status, after the retries described in the module
        docstring; its body is the caller's to read (and close)."""
        attempt = 0
        waited = 0.0
        while True:
            remaining = deadline_at - time.monotonic()
            if remaining <= 0:
                raise self._deadline_error(path, deadline)
            # no single wait (connecting, the answer's head) may run past the deadline either
            timeout = httpx2.Timeout(min(self.timeout, remaining), connect=min(self.connect_timeout, remaining))
            response = None
            try:
                request = self._http.build_request(method, path, json=body, timeout=timeout)
                response = self._http.send(request, stream=True)
            except httpx2.TransportError as exc:
                if time.monotonic() >= deadline_at:
                    raise self._deadline_error(path, deadline) from None
                error = self._transport_error(exc, path)
            else:
                if response.status_code < 400:
                    return response
                try:
                    raw = self._read(response, path, limits.MAX_ERROR_BYTES, deadline_at, deadline, truncate=True)
                finally:
                    response.close()
                error = self._status_error(response, raw, path)
            retry_here = isinstance(error, ServerUnreachable) or (
                isinstance(error, RemoteApiError) and error.retryable)
            if not retry_here or attempt >= self.retries:
                raise error
            # a server's Retry-After (capped) or the backoff, within the total wait and the deadline
            delay = min(self._delay(attempt, response), limits.MAX_RETRY_WAIT - waited,
                        deadline_at - time.monotonic() - 0.1)
            if delay <= 0:
                raise error
            self._sleep(delay)
            waited += delay
            attempt += 1

    def _read(self, response: httpx2.Response, path: str, limit: int, deadline_at: float, deadline: float, *,
              truncate: bool = False, what: str = "an answer") -> bytes:
        """The body, decompressed, counted as it arrives: past `limit` bytes it is an error (or,
        with `truncate`, cut there: error bodies are read for their message only). The deadline is
        checked at every piece, so a body drip-fed a byte at a time ends there too."""
        buf = bytearray()
        try:
            for piece in response.iter_bytes():
                if time.monotonic() > deadline_at:
                    if truncate:
                        break
                    raise self._deadline_error(path, deadline)
                if len(buf) + len(piece) > limit:
                    if truncate:
                        buf += piece[: limit - len(buf)]
                        break
                    raise RemoteApiError(f"{self.url} sent more than {_size(limit)} for {path} (the bound for "
                                         f"{what}); stopped reading", url=self.url, status=502)
                buf += piece
        except httpx2.DecodingError as exc:
            if truncate:
                return bytes(buf)
            raise RemoteApiError(f"{self.url} sent a body for {path} that cannot be decoded "
                                 f"({wire.quote(exc, 80)})", url=self.url, status=502) from None
        except httpx2.TimeoutException:
            if truncate:
                return bytes(buf)
            raise RemoteTimeout(f"{self.url} did not finish answering {path}: nothing for {self.timeout:g} s "
                                "(--timeout)", url=self.url) from None
        except (httpx2.HTTPError, httpx2.StreamError) as exc:
            if truncate:
                return bytes(buf)
            raise ServerUnreachable(f"cannot reach {self.url}: the connection broke during the answer "
                                    f"({_reason(exc)})", url=self.url) from None
        return bytes(buf)

    def _call(self, method: str, path: str, body: Any, limit: int, deadline: float, what: str) -> Any:
        """One JSON request and its answer, parsed strictly, within `deadline` seconds in all."""
        deadline_at = time.monotonic() + deadline
        watch = _Watch(None, deadline_at)
        try:
            response = self._send(method, path, body, deadline_at, deadline)
            try:
                watch.attach(response)
                raw = self._read(response, path, limit, deadline_at, deadline, what=what)
            except RemoteError:
                if watch.expired:
                    raise self._deadline_error(path, deadline) from None
                raise
            finally:
                response.close()
        finally:
            watch.stop()
        if watch.expired:
            raise self._deadline_error(path, deadline)
        try:
            return wire.loads(raw)
        except wire.WireError as exc:
            raise RemoteApiError(f"{self.url}{path} answered something that is not valid JSON: {exc}", url=self.url,
                                 status=502) from None

    def get_json(self, path: str, *, max_bytes: int = limits.MAX_JSON_BYTES) -> Any:
        return self._call("GET", path, None, max_bytes, min(self.deadline, limits.METADATA_DEADLINE),
                          f"a GET answer ({_size(max_bytes)})")

    def post_json(self, path: str, body: dict[str, Any], *, max_bytes: int | None = None) -> Any:
        """A JSON answer, bounded by what was asked: /v1/infill by its `n` variants, a completion by
        its max_tokens and `n` (limits.AnswerBudget)."""
        if max_bytes is None:
            if path == "/v1/infill":
                n = body.get("n")
                n = n if isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= limits.MAX_CHOICES else 1
                max_bytes = limits.MAX_JSON_BYTES + n * limits.MAX_INFILL_BYTES_PER_LINE
            else:
                budget = AnswerBudget.of(body)
                max_bytes = limits.MAX_JSON_BYTES + budget.n * (budget.text_bytes + 16 * budget.answer_tokens)
        return self._call("POST", path, body, max_bytes, self.deadline, f"this request's answer ({_size(max_bytes)})")

    def models(self) -> list[wire.ServerModel]:
        body = self.get_json("/v1/models", max_bytes=limits.MAX_MODELS_BYTES)
        try:
            models = wire.parse_models(body)
        except wire.WireError as exc:
            if "not an OpenAI model list" in str(exc):
                raise RemoteApiError(f"{self.url}/v1/models is not an OpenAI model list: is this an OpenAI-compatible "
                                     "server?", url=self.url, status=502) from None
            raise RemoteApiError(f"{self.url} sent an invalid /v1/models answer: {exc}", url=self.url,
                                 status=502) from None
        if not models:
            raise RemoteApiError(f"{self.url} serves no model (/v1/models is empty)", url=self.url, status=502)
        return models

    def stream(self, path: str, body: dict[str, Any], *, cancel: threading.Event | None = None,
               budget: AnswerBudget | None = None) -> Iterator[Any]:
        """The JSON objects of a server-sent event stream, up to `data: [DONE]`. An error event
        raises RemoteApiError; a connection that breaks mid-stream raises StreamBroken (or
        RemoteTimeout when the server went silent or the deadline passed); an event larger than
        the request's budget (limits.AnswerBudget, from `body` unless given) or one that is not
        JSON raises RemoteApiError. Setting `cancel` closes the connection (the server stops
        generating) and ends the iteration."""
        budget = budget or AnswerBudget.of(body)
        deadline = self.deadline
        deadline_at = time.monotonic() + deadline
        watch = _Watch(cancel, deadline_at)
        response = None
        try:
            response = self._send("POST", path, {**body, "stream": True}, deadline_at, deadline)
            watch.attach(response)
            ctype = response.headers.get("content-type", "").partition(";")[0].strip().lower()
            if ctype != "text/event-stream":
                raise RemoteApiError(f"{self.url} answered {path} with {wire.quote(ctype or 'no content type', 60)}, "
                                     "not an event stream", url=self.url, status=502)
            done = False
            for data in self._events(response, path, budget.event_bytes, deadline_at, deadline):
                if data == b"[DONE]":
                    done = True
                    break
                try:
                    obj = wire.loads(data)
                except wire.WireError as exc:
                    raise RemoteApiError(f"{self.url} sent an event that is not valid JSON: {exc}", url=self.url,
                                         status=502) from None
                if wire.is_error(obj):
                    raise wire.stream_error(obj, self.url)
                yield obj
            if watch.expired:
                raise self._deadline_error(path, deadline)
            if not done and not watch.cancelled:
                raise StreamBroken(f"{self.url} ended the answer early (no [DONE])", url=self.url)
        except httpx2.TimeoutException:
            if watch.expired or time.monotonic() >= deadline_at:
                raise self._deadline_error(path, deadline) from None
            raise RemoteTimeout(f"{self.url} sent nothing for {self.timeout:g} s mid-answer (--timeout)",
                                url=self.url) from None
        except (httpx2.HTTPError, httpx2.StreamError) as exc:
            if watch.cancelled or (cancel is not None and cancel.is_set()):
                return  # we closed it
            if watch.expired:
                raise self._deadline_error(path, deadline) from None
            if isinstance(exc, httpx2.DecodingError):
                raise RemoteApiError(f"{self.url} sent a stream that cannot be decoded ({wire.quote(exc, 80)})",
                                     url=self.url, status=502) from None
            raise StreamBroken(f"the connection to {self.url} broke mid-answer ({_reason(exc)})",
                               url=self.url) from None
        finally:
            watch.stop()
            if response is not None:
                response.close()

    def _events(self, response: httpx2.Response, path: str, max_event: int, deadline_at: float,
                deadline: float) -> Iterator[bytes]:
        """The `data` of each server-sent event (the WHATWG rules: lines end in CRLF, LF or CR, `data:`
        lines of an event are joined by newlines, a blank line ends the event, `:` lines are
        comments, other fields are ignored). An event, or a line still open, longer than
        `max_event` bytes is a RemoteApiError: nothing grows without a bound here."""
        data: list[bytes] = []
        size = 0
        pending = bytearray()  # the line still open at the end of the last piece
        trailing_cr = False

        def too_big() -> RemoteApiError:
            return RemoteApiError(f"{self.url} sent an event larger than {_size(max_event)} (the bound for this "
                                  "request's answer); stopped reading", url=self.url, status=502)

        for piece in response.iter_bytes():
            if time.monotonic() > deadline_at:  # a drip-fed stream: bytes keep coming, too slowly
                raise self._deadline_error(path, deadline)
            if trailing_cr:
                piece = b"\r" + piece
                trailing_cr = False
            if piece.endswith(b"\r"):  # perhaps the first half of a CRLF
                trailing_cr = True
                piece = piece[:-1]
            if b"\r" in piece:
                piece = piece.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            *lines, rest = piece.split(b"\n")
            if lines:
                lines[0] = bytes(pending) + lines[0]
                pending = bytearray()
                for line in lines:
                    if not line:
                        if data:
                            yield b"\n".join(data)
                            data = []
                            size = 0
                        continue
                    name, _, value = line.partition(b":")
                    if name != b"data":
                        continue  # a comment (name b""), event, id or retry: not used
                    if value.startswith(b" "):
                        value = value[1:]
                    data.append(value)
                    size += len(value) + 1
                    if size > max_event:
                        raise too_big()
            pending += rest
            if size + len(pending) > max_event:
                raise too_big()
