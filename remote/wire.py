"""OpenAI's wire format as servers actually send it, read tolerantly into small typed objects.

Shapes covered (tests/test_remote_wire.py checks each against the documented source):
- `/v1/models`: `{"object": "list", "data": [{"id", "object": "model", "owned_by", ...}]}`; vLLM adds
  `max_model_len`, dgchat serve a `dgchat` object (context length, mask and end tokens, defaults).
- streamed chunks: `chat.completion.chunk` (`choices[].delta.content`) and `text_completion`
  (`choices[].text`), `finish_reason` null until a choice ends, a last chunk with `choices: []` and
  `usage` when `stream_options.include_usage` is set (vLLM may also put `usage` on every chunk);
  unknown keys (vLLM's `stop_reason`, `token_ids`, `prompt_token_ids`, `metrics`, dgchat's `dgchat`)
  are ignored unless asked for.
- errors: OpenAI's `{"error": {"message", "type", "param", "code"}}` (dgchat: `code` a string;
  vLLM: the HTTP status as an integer), vLLM's older top-level `{"object": "error", "message", ...}`,
  and FastAPI's `{"detail": ...}` (a 404 from a route the server does not have).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dgchat.remote.errors import RemoteApiError


@dataclass(frozen=True)
class ServerModel:
    id: str
    owned_by: str = ""
    context_length: int | None = None  # dgchat: dgchat.context_length; vLLM: max_model_len
    details: dict[str, Any] | None = None  # dgchat serve's `dgchat` object; None for other servers

    @property
    def is_dgchat(self) -> bool:
        """A `dgchat serve` server recent enough for the canvas extension and remote NPC lines."""
        return self.details is not None and "end_tokens" in self.details


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


@dataclass(frozen=True)
class ChunkChoice:
    index: int
    text: str  # the delta's content (chat) or text (completions); "" when none
    finish_reason: str | None = None


@dataclass(frozen=True)
class Chunk:
    choices: tuple[ChunkChoice, ...] = ()
    usage: Usage | None = None
    dgchat: dict[str, Any] | None = None  # dgchat serve's extension object, when present
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def parse_models(body: Any) -> list[ServerModel]:
    if not isinstance(body, dict) or not isinstance(body.get("data"), list):
        raise ValueError("not a model list (`data` missing)")
    models = []
    for item in body["data"]:
        if not isinstance(item, dict) or not isinstance(item.get("id"), str):
            continue
        details = item.get("dgchat") if isinstance(item.get("dgchat"), dict) else None
        context = _int(details.get("context_length")) if details else None
        if context is None:
            context = _int(item.get("max_model_len"))
        models.append(ServerModel(item["id"], str(item.get("owned_by") or ""), context, details))
    return models


def parse_usage(value: Any) -> Usage | None:
    if not isinstance(value, dict):
        return None
    prompt = _int(value.get("prompt_tokens")) or 0
    completion = _int(value.get("completion_tokens")) or 0  # vLLM's may be null
    total = _int(value.get("total_tokens")) or prompt + completion
    return Usage(prompt, completion, total)


def error_message(body: Any) -> tuple[str, str | int | None, str | None]:
    """(message, code, param) from any of the error shapes above; ("", None, None) if none."""
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict):
            return str(err.get("message") or err.get("type") or "error"), err.get("code"), err.get("param")
        if isinstance(err, str):
            return err, None, None
        if body.get("object") == "error" and "message" in body:
            return str(body["message"]), body.get("code"), body.get("param")
        if "detail" in body:
            detail = body["detail"]
            return (detail if isinstance(detail, str) else str(detail)), None, None
    return "", None, None


def is_error(obj: Any) -> bool:
    """An error object in place of a chunk (streams report failures after the head this way)."""
    return isinstance(obj, dict) and "choices" not in obj and (
        "error" in obj or obj.get("object") == "error")


def stream_error(obj: dict[str, Any], url: str) -> RemoteApiError:
    message, code, param = error_message(obj)
    status = code if isinstance(code, int) and 400 <= code <= 599 else 500
    return RemoteApiError(f"{url} reported an error mid-answer: {message}", url=url, status=status,
                          code=code, param=param)


def parse_chunk(obj: Any) -> Chunk:
    """One streamed chunk (chat or completions). Raises ValueError on something that is not one."""
    if not isinstance(obj, dict) or not isinstance(obj.get("choices", []), list):
        raise ValueError("not a completion chunk")
    choices = []
    for c in obj.get("choices") or ():
        if not isinstance(c, dict):
            continue
        index = _int(c.get("index")) or 0
        delta = c.get("delta")
        if isinstance(delta, dict):
            text = delta.get("content")
        else:
            text = c.get("text")
        finish = c.get("finish_reason")
        choices.append(ChunkChoice(index, text if isinstance(text, str) else "",
                                   finish if isinstance(finish, str) else None))
    ext = obj.get("dgchat")
    return Chunk(tuple(choices), parse_usage(obj.get("usage")), ext if isinstance(ext, dict) else None, obj)
