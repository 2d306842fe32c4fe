"""The API's error: an HTTP status and OpenAI's error object, independent of the HTTP stack."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An error answered as JSON in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None, close: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}
        self.close = close  # the request body was not read: the connection must not be reused

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
