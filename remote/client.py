"""An HTTP client for one OpenAI-compatible server: JSON calls and server-sent event streams.

- **Retries**: a connection that cannot be made (refused, unknown host, reset before an answer), a
  429 and a 5xx are tried again after 0.5, 1, 2, ... seconds (`backoff`, doubling, capped at
  `max_backoff`, or the server's `Retry-After` when it says so), up to `retries` more times. Other
  4xx answers are final: the request itself is wrong and would fail again. A stream that broke
  after it started is never retried here (its caller has already shown part of the answer), nor
  a request that timed out (it would double the wait; dgchat.remote.pool tries another server).
- **Timeouts**: `connect_timeout` to open a connection; `timeout` for each read, so a streamed
  answer may take any time as long as the server keeps sending (dgchat serve sends every
  denoising step) and a server that goes silent fails within `timeout`.
- **Errors** name the server and what to do (dgchat.remote.errors).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx2

from dgchat.model_backend.errors import InvalidParameterError
from dgchat.remote import wire
from dgchat.remote.errors import (
    AuthRejected,
    NoInfillEndpoint,
    RemoteApiError,
    RemoteError,
    RemoteTimeout,
    ServerUnreachable,
    StreamBroken,
)

API_KEY_ENV = "DGCHAT_API_KEY"
DEFAULT_TIMEOUT = 300.0  # seconds without a byte from the server
DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_RETRIES = 3
MAX_RETRY_AFTER = 30.0  # a server's Retry-After above this is capped


def normalize_url(url: str) -> str:
    """`http://host:port` from what a user types: a trailing `/` or `/v1` is dropped (the paths
    used are /v1/...); the scheme is required (dgchat never guesses between http and https)."""
    text = (url or "").strip()
    scheme, sep, rest = text.partition("://")
    if not sep or scheme.lower() not in ("http", "https") or not rest.strip("/"):
        raise InvalidParameterError(f"--server takes a URL such as http://127.0.0.1:8765 (got {url!r})")
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
    return text.removeprefix("[Errno 111] ")


class RemoteClient:
    """One server. Thread-safe: httpx2's connection pool serves concurrent calls."""

    def __init__(self, url: str, *, api_key: str | None = None, timeout: float = DEFAULT_TIMEOUT,
                 connect_timeout: float = DEFAULT_CONNECT_TIMEOUT, retries: int = DEFAULT_RETRIES,
                 backoff: float = 0.5, max_backoff: float = 8.0,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if timeout <= 0 or connect_timeout <= 0:
            raise InvalidParameterError("timeouts must be positive")
        if retries < 0:
            raise InvalidParameterError("retries must be >= 0")
        self.url = normalize_url(url)
        self.api_key = api_key or None
        self.timeout = float(timeout)
        self.connect_timeout = float(connect_timeout)
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

    def _status_error(self, response: httpx2.Response, path: str) -> RemoteError:
        status = response.status_code
        try:
            body: Any = response.json()
        except (ValueError, UnicodeDecodeError):
            body = None
        message, code, param = wire.error_message(body)
        if not message:
            message = (response.text or "").strip()[:200] or response.reason_phrase or "no details"
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
            after = response.headers.get("retry-after", "")
            if after.strip().isdigit():
                return min(float(after), MAX_RETRY_AFTER)
        return min(self.backoff * (2 ** attempt), self.max_backoff)

    # -- requests -------------------------------------------------------------------------------
    def _send(self, method: str, path: str, body: Any = None, *, stream: bool = False) -> httpx2.Response:
        """A response with a 2xx status, after the retries described in the module docstring."""
        attempt = 0
        while True:
            response = None
            try:
                request = self._http.build_request(method, path, json=body)
                response = self._http.send(request, stream=stream)
            except httpx2.TransportError as exc:
                error = self._transport_error(exc, path)
            else:
                if response.status_code < 400:
                    return response
                with contextlib.suppress(httpx2.HTTPError):
                    response.read()
                response.close()
                error = self._status_error(response, path)
            retry_here = isinstance(error, ServerUnreachable) or (
                isinstance(error, RemoteApiError) and error.retryable)
            if not retry_here or attempt >= self.retries:
                raise error
            self._sleep(self._delay(attempt, response))
            attempt += 1

    def get_json(self, path: str) -> Any:
        return self._json(self._send("GET", path), path)

    def post_json(self, path: str, body: dict[str, Any]) -> Any:
        return self._json(self._send("POST", path, body), path)

    def _json(self, response: httpx2.Response, path: str) -> Any:
        try:
            return response.json()
        except httpx2.TimeoutException:
            raise RemoteTimeout(f"{self.url} did not finish answering {path} within {self.timeout:g} s",
                                url=self.url) from None
        except httpx2.TransportError as exc:
            raise ServerUnreachable(f"cannot reach {self.url}: the connection broke during the answer "
                                    f"({_reason(exc)})", url=self.url) from None
        except (ValueError, UnicodeDecodeError):
            raise RemoteApiError(f"{self.url}{path} answered something that is not JSON", url=self.url,
                                 status=502) from None

    def models(self) -> list[wire.ServerModel]:
        body = self.get_json("/v1/models")
        try:
            models = wire.parse_models(body)
        except ValueError:
            raise RemoteApiError(f"{self.url}/v1/models is not an OpenAI model list: is this an OpenAI-compatible "
                                 "server?", url=self.url, status=502) from None
        if not models:
            raise RemoteApiError(f"{self.url} serves no model (/v1/models is empty)", url=self.url, status=502)
        return models

    def stream(self, path: str, body: dict[str, Any], *, cancel: threading.Event | None = None) -> Iterator[Any]:
        """The JSON objects of a server-sent event stream, up to `data: [DONE]`. An error event
        raises RemoteApiError; a connection that breaks mid-stream raises StreamBroken (or
        RemoteTimeout when the server went silent). Setting `cancel` closes the connection (the
        server stops generating) and ends the iteration."""
        response = self._send("POST", path, {**body, "stream": True}, stream=True)
        stop_watch = threading.Event()
        if cancel is not None:
            def watch() -> None:
                while not stop_watch.wait(0.05):
                    if cancel.is_set():
                        with contextlib.suppress(Exception):
                            response.close()
                        return

            threading.Thread(target=watch, name="dgchat-remote-cancel", daemon=True).start()
        try:
            done = False
            for event in httpx2.EventSource(response):
                if event.data == "[DONE]":
                    done = True
                    break
                if not event.data:
                    continue
                try:
                    obj = json.loads(event.data)
                except ValueError:
                    raise RemoteApiError(f"{self.url} sent an event that is not JSON", url=self.url,
                                         status=502) from None
                if wire.is_error(obj):
                    raise wire.stream_error(obj, self.url)
                yield obj
            if not done and not (cancel is not None and cancel.is_set()):
                raise StreamBroken(f"{self.url} ended the answer early (no [DONE])", url=self.url)
        except httpx2.TimeoutException:
            raise RemoteTimeout(f"{self.url} sent nothing for {self.timeout:g} s mid-answer (--timeout)",
                                url=self.url) from None
        except (httpx2.TransportError, httpx2.StreamError) as exc:
            if cancel is not None and cancel.is_set():
                return  # we closed it
            raise StreamBroken(f"the connection to {self.url} broke mid-answer ({_reason(exc)})",
                               url=self.url) from None
        finally:
            stop_watch.set()
            response.close()
