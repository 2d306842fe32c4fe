"""Minimal HTTP/1.1 on asyncio streams: requests with a Content-Length body, JSON responses,
chunked server-sent events. Keep-alive, Expect: 100-continue, and limits on every read."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote, urlsplit

MAX_REQUEST_LINE = 8 * 1024
MAX_HEADERS = 100
MAX_HEADER_BYTES = 32 * 1024
STREAM_LIMIT = 64 * 1024  # asyncio StreamReader line limit


class HttpError(Exception):
    """An error answered as JSON in OpenAI's error shape."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None, close: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}
        self.close = close  # the request body may be unread: the connection cannot be reused

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass
class Request:
    method: str
    target: str
    path: str
    query: str
    version: str
    headers: dict[str, str]
    body: bytes = b""
    client: str = ""
    keep_alive: bool = True
    extras: dict[str, Any] = field(default_factory=dict)

    def header(self, name: str, default: str = "") -> str:
        return self.headers.get(name.lower(), default)

    def json(self) -> Any:
        if not self.body:
            raise HttpError(400, "the request has no body; send a JSON object")
        ctype = self.header("content-type", "application/json").split(";")[0].strip().lower()
        if ctype not in ("application/json", "text/json", ""):
            raise HttpError(415, f"Content-Type must be application/json (got {ctype})", code="unsupported_media_type")
        try:
            return json.loads(self.body.decode("utf-8"))
        except UnicodeDecodeError:
            raise HttpError(400, "the request body is not UTF-8") from None
        except json.JSONDecodeError as exc:
            raise HttpError(400, f"the request body is not valid JSON: {exc.msg} at line {exc.lineno} "
                                 f"column {exc.colno}", code="invalid_json") from None
        except RecursionError:
            raise HttpError(400, "the request body is nested too deeply", code="invalid_json") from None


async def _readline(reader: asyncio.StreamReader, limit: int, what: str) -> bytes:
    try:
        line = await reader.readuntil(b"\n")
    except asyncio.LimitOverrunError:
        raise HttpError(431, f"{what} too long", code="header_too_large", close=True) from None
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            raise EOFError from None
        raise HttpError(400, "the connection closed in the middle of the request", close=True) from None
    if len(line) > limit:
        raise HttpError(431, f"{what} too long", code="header_too_large", close=True)
    return line


async def read_head(reader: asyncio.StreamReader) -> Request:
    """The request line and headers. Raises EOFError on a clean close before any byte."""
    line = await _readline(reader, MAX_REQUEST_LINE, "request line")
    while line in (b"\r\n", b"\n"):  # tolerate stray blank lines between requests (RFC 9112 2.2)
        line = await _readline(reader, MAX_REQUEST_LINE, "request line")
    try:
        method, target, version = line.decode("ascii").strip().split(" ")
    except (UnicodeDecodeError, ValueError):
        raise HttpError(400, "malformed request line", close=True) from None
    if not version.startswith("HTTP/1."):
        raise HttpError(505, f"unsupported protocol {version}", close=True)
    headers: dict[str, str] = {}
    total = 0
    while True:
        raw = await _readline(reader, MAX_HEADER_BYTES, "header line")
        total += len(raw)
        if total > MAX_HEADER_BYTES or len(headers) >= MAX_HEADERS:
            raise HttpError(431, "request headers too large", code="header_too_large", close=True)
        if raw in (b"\r\n", b"\n"):
            break
        try:
            name, sep, value = raw.decode("latin-1").partition(":")
        except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes everything
            raise HttpError(400, "malformed header", close=True) from None
        if not sep or not name or name != name.strip():
            raise HttpError(400, "malformed header line", close=True)
        key = name.lower()
        value = value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers and key != "content-length" else value
    split = urlsplit(target)
    conn = headers.get("connection", "").lower()
    keep_alive = "close" not in conn if version == "HTTP/1.1" else "keep-alive" in conn
    return Request(method.upper(), target, unquote(split.path), split.query, version, headers, keep_alive=keep_alive)


def content_length(request: Request) -> int:
    if "transfer-encoding" in request.headers:
        raise HttpError(411, "chunked request bodies are not supported; send a Content-Length", close=True)
    raw = request.header("content-length", "0") or "0"
    if not raw.isdigit():
        raise HttpError(400, "bad Content-Length", close=True)
    return int(raw)


async def read_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: Request, length: int) -> None:
    if length == 0:
        return
    if request.header("expect").lower() == "100-continue":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await writer.drain()
    try:
        request.body = await reader.readexactly(length)
    except asyncio.IncompleteReadError:
        raise HttpError(400, "the request body is shorter than its Content-Length", close=True) from None


def _status_line(status: int) -> bytes:
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Status"
    return f"HTTP/1.1 {status} {phrase}\r\n".encode("ascii")


def head_bytes(status: int, headers: dict[str, str]) -> bytes:
    lines = [_status_line(status)]
    for k, v in headers.items():
        lines.append(f"{k}: {v}\r\n".encode("latin-1"))
    lines.append(b"\r\n")
    return b"".join(lines)


def json_response(status: int, obj: Any, *, keep_alive: bool, headers: dict[str, str] | None = None) -> bytes:
    body = json.dumps(obj, ensure_ascii=False).encode("utf-8")
    h = {"Content-Type": "application/json", "Content-Length": str(len(body)),
         "Connection": "keep-alive" if keep_alive else "close", "Cache-Control": "no-store"}
    h.update(headers or {})
    return head_bytes(status, h) + body


class EventStream:
    """Server-sent events: `data: {...}` lines, ended by `data: [DONE]`. Chunked over HTTP/1.1;
    an HTTP/1.0 client gets a body that ends when the connection closes."""

    def __init__(self, writer: asyncio.StreamWriter, keep_alive: bool, version: str = "HTTP/1.1") -> None:
        self.writer = writer
        self.chunked = version != "HTTP/1.0"
        self.keep_alive = keep_alive and self.chunked
        self.started = False

    async def start(self, headers: dict[str, str] | None = None) -> None:
        h = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache",
             "Connection": "keep-alive" if self.keep_alive else "close", "X-Accel-Buffering": "no"}
        if self.chunked:
            h["Transfer-Encoding"] = "chunked"
        h.update(headers or {})
        self.writer.write(head_bytes(200, h))
        self.started = True
        await self.writer.drain()

    async def _chunk(self, data: bytes) -> None:
        if self.chunked:
            data = f"{len(data):x}\r\n".encode("ascii") + data + b"\r\n"
        self.writer.write(data)
        await self.writer.drain()

    async def send(self, obj: Any) -> None:
        await self._chunk(b"data: " + json.dumps(obj, ensure_ascii=False).encode("utf-8") + b"\n\n")

    async def done(self) -> None:
        await self._chunk(b"data: [DONE]\n\n")
        if self.chunked:
            self.writer.write(b"0\r\n\r\n")
        await self.writer.drain()
