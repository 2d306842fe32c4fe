"""uvicorn's h11 protocol with the three limits uvicorn itself lacks.

h11 parses every request (its parser rejects bad or conflicting Content-Length, bad request lines,
over-long heads). uvicorn runs it but (as of 0.54) has no deadline for a request head: its
keep-alive timer starts only after a response and restarts on every byte, so a client sending a
byte a second holds a connection forever (a slow-loris), and a connection that never sends
anything is never closed. It also caps concurrency only once a request has arrived, and answers
every parser error with a bare 400 (h11's hint, 431 for an over-long head, is dropped).

`protocol_class` returns a subclass that adds, per connection:
- a deadline: whenever no request is being handled (a new connection, or after a response) the
  next request head must be complete within `head_timeout` seconds, however slowly it trickles;
  then the connection gets a 408 (or, if it sent nothing, is just closed);
- a cap on open connections, applied when a connection is accepted (503, closed);
- parser errors answered in OpenAI's JSON error shape with h11's status, and logged escaped.
Request bodies have their own deadline in the application (408).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from dgchat.server.errors import ApiError
from dgchat.server.logs import escape
from dgchat.strict_json import dumps


class _Connection(h11.Connection):
    """h11's connection, remembering the last parser error (uvicorn only logs a fixed message)."""

    last_error: h11.RemoteProtocolError | None = None

    def next_event(self) -> Any:
        try:
            return super().next_event()
        except h11.RemoteProtocolError as exc:
            self.last_error = exc
            raise


def raw_response(err: ApiError) -> bytes:
    """A complete response written outside h11's state machine (the connection closes after it)."""
    body = dumps(err.body())
    try:
        phrase = HTTPStatus(err.status).phrase
    except ValueError:
        phrase = "Error"
    head = [f"HTTP/1.1 {err.status} {phrase}", "Content-Type: application/json",
            f"Content-Length: {len(body)}", "Connection: close", "Cache-Control: no-store"]
    head += [f"{k}: {v}" for k, v in err.headers.items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def protocol_class(*, head_timeout: float, max_connections: int, max_head: int,
                   log: Callable[[str], None]) -> type[H11Protocol]:
    """The protocol uvicorn runs for each connection (pass as `uvicorn.Config(http=...)`)."""

    class DgchatH11Protocol(H11Protocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.conn = _Connection(h11.SERVER, max_incomplete_event_size=max_head)
            self._deadline: asyncio.TimerHandle | None = None
            self._idle_bytes = 0  # bytes received since the last response (a head in the making)
            self._refused = False

        def _peer(self) -> str:
            return self.client[0] if self.client else "?"

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                self._refused = True
                self.connections.discard(self)  # not counted against the cap while it closes
                transport.write(raw_response(ApiError(
                    503, "too many open connections; retry shortly", type="server_error",
                    code="too_many_connections", headers={"Retry-After": "1"})))
                transport.close()
                log(f"{self._peer()} - 503 too many open connections")
                return
            self._sync_deadline()

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return
            if self._deadline is not None:
                self._idle_bytes += len(data)
            super().data_received(data)
            self._sync_deadline()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._sync_deadline()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_deadline()
            super().connection_lost(exc)

        # -- the head deadline ----------------------------------------------------------------
        def _sync_deadline(self) -> None:
            """Armed while no request is being handled; disarmed when a request's head is in.
            Arming happens once per idle period, so trickled bytes never push the deadline back."""
            busy = self.cycle is not None and not self.cycle.response_complete
            if busy:
                self._cancel_deadline()
            elif self._deadline is None and not self.transport.is_closing():
                self._idle_bytes = 0
                self._deadline = self.loop.call_later(head_timeout, self._head_timed_out)

        def _cancel_deadline(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _head_timed_out(self) -> None:
            self._deadline = None
            if self.transport.is_closing():
                return
            if self._idle_bytes:  # a request was on its way: say why it is refused
                self.transport.write(raw_response(ApiError(
                    408, f"the request head did not arrive within {head_timeout:g} s", code="request_timeout")))
                log(f"{self._peer()} - 408 request head not complete within {head_timeout:g} s")
            self.transport.close()

        # -- parser errors --------------------------------------------------------------------
        def send_400_response(self, msg: str) -> None:
            err = self.conn.last_error
            status = err.error_status_hint if err is not None else 400
            detail = str(err) if err is not None else msg
            if status == 431:
                message = f"request line or headers over {max_head // 1024} KiB"
                code = "header_too_large"
            else:
                message = f"malformed HTTP request: {escape(detail, 200)}"
                code = "bad_request"
            self._cancel_deadline()
            if not self.transport.is_closing():
                self.transport.write(raw_response(ApiError(status, message, code=code)))
                self.transport.close()
            log(f"{self._peer()} - {status} {message}")

    return DgchatH11Protocol
