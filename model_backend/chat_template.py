"""Chat templates from model files, rendered with a time, size and memory budget.

A template is code from an untrusted file. It renders in a Jinja2 sandbox whose operators and calls
refuse to build huge values (model_backend/template_sandbox.py), inside a separate worker process
with an address-space limit and a deadline, which this module kills and restarts when a template
runs too long. Every failure becomes a one-line TemplateRenderError; nothing here can hang the app's
UI or the server, or take the machine's memory.

The worker is started on the first render and shared by every engine in the process; a template is
compiled once in it (cached by its sha256) and re-rendered per conversation.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from dgchat.model_backend import template_sandbox
from dgchat.model_backend.errors import DgchatError

# Used when a diffusion GGUF carries no template (llama.cpp's diffusion example falls back to ChatML too).
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# the parent waits this long (wall clock) for an answer before it kills the worker. The worker's own
# alarm fires after template_sandbox.RENDER_SECONDS of CPU; this is the bound for what that alarm
# cannot interrupt (a long call inside C code), with room for starting a fresh worker (Python and
# Jinja2 imports: ~60 ms idle, seconds on a machine busy with other work)
HARD_DEADLINE_S = template_sandbox.RENDER_SECONDS + 8.0
MAX_REQUEST_BYTES = 256 * 1024 * 1024  # conversations larger than this are refused before sending


class TemplateRenderError(DgchatError):
    pass


class TemplateWorker:
    """One rendering process, restarted after a timeout or a crash. Thread-safe (one render at a time)."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._known: set[str] = set()  # template keys the current process has been sent
        self._lock = threading.Lock()

    def _start(self) -> subprocess.Popen[bytes]:
        script = Path(template_sandbox.__file__)
        # -I: no user site, no PYTHON* variables, not the current folder on sys.path; the script
        # imports only Jinja2 and the standard library
        self._proc = subprocess.Popen(
            [sys.executable, "-I", str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, close_fds=True, start_new_session=True,
        )
        self._known = set()
        return self._proc

    def close(self) -> None:
        with self._lock:
            self._kill()

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                proc.kill()
                proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
            for stream in (proc.stdin, proc.stdout):
                try:
                    stream.close()  # type: ignore[union-attr]
                except OSError:
                    pass
        self._known = set()

    def render(self, source: str, variables: dict[str, Any]) -> str:
        key = template_sandbox.template_key(source)
        with self._lock:
            for attempt in range(2):  # a worker that died between calls gets one fresh start
                proc = self._proc if self._proc is not None and self._proc.poll() is None else self._start()
                request: dict[str, Any] = {"key": key, "variables": variables}
                if key not in self._known:
                    request["source"] = source
                try:
                    data = json.dumps(request).encode("utf-8")
                except (TypeError, ValueError) as exc:
                    raise TemplateRenderError(f"the conversation cannot be passed to the chat template ({exc})") from None
                if len(data) > MAX_REQUEST_BYTES:
                    raise TemplateRenderError("the conversation is too large for the chat template")
                try:
                    answer = self._exchange(proc, data)
                except BrokenPipeError:
                    self._kill()
                    if attempt == 0:
                        continue
                    raise TemplateRenderError("the chat template worker could not be started") from None
                except _Timeout:
                    self._kill()
                    raise TemplateRenderError(
                        f"the model's chat template took longer than {template_sandbox.RENDER_SECONDS:g} s "
                        f"and was stopped") from None
                except _Died:
                    self._kill()
                    raise TemplateRenderError("the model's chat template crashed its worker process") from None
                if answer.get("kind") == "unknown" and "source" not in request:
                    self._known.discard(key)  # the worker evicted it: send it again
                    continue
                self._known.add(key)
                if answer.get("ok"):
                    return str(answer["text"])
                raise TemplateRenderError(_message(answer.get("kind", "error"), str(answer.get("message", ""))))
        raise TemplateRenderError("the chat template worker could not be started")  # pragma: no cover

    def _exchange(self, proc: subprocess.Popen[bytes], data: bytes) -> dict[str, Any]:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(struct.pack("<I", len(data)) + data)
        proc.stdin.flush()
        deadline = time.monotonic() + HARD_DEADLINE_S
        head = self._read(proc, 4, deadline)
        (n,) = struct.unpack("<I", head)
        if n > MAX_REQUEST_BYTES:
            raise _Died()
        return json.loads(self._read(proc, n, deadline))

    @staticmethod
    def _read(proc: subprocess.Popen[bytes], n: int, deadline: float) -> bytes:
        fd = proc.stdout.fileno()  # type: ignore[union-attr]
        chunks: list[bytes] = []
        got = 0
        while got < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _Timeout()
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                raise _Timeout()
            chunk = os.read(fd, min(n - got, 1 << 20))
            if not chunk:
                raise _Died()
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)


class _Timeout(Exception):
    pass


class _Died(Exception):
    pass


def _message(kind: str, text: str) -> str:
    text = " ".join(text.split())[:300]
    if kind == "raised":
        return f"the model's chat template refused the conversation: {text}"
    if kind == "timeout":
        return f"the model's chat template took longer than {template_sandbox.RENDER_SECONDS:g} s and was stopped"
    if kind == "memory":
        return f"the model's chat template needed more than {template_sandbox.MEMORY_LIMIT // 2**20} MiB and was stopped"
    if kind == "limit":
        return f"the model's chat template was stopped: {text}"
    return f"the model's chat template failed to render: {text}"


_WORKER: TemplateWorker | None = None
_WORKER_LOCK = threading.Lock()


def _shared_worker() -> TemplateWorker | None:
    """The process-wide worker; None where a worker cannot run (no select on pipes: Windows)."""
    global _WORKER
    if os.name == "nt":
        return None
    with _WORKER_LOCK:
        if _WORKER is None:
            _WORKER = TemplateWorker()
            atexit.register(_WORKER.close)
        return _WORKER


def render_chat(
    template: str,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
    extra: dict[str, Any] | None = None,
) -> str:
    """The template's text for `messages`, or TemplateRenderError with a one-line reason."""
    variables = {"messages": messages, "add_generation_prompt": add_generation_prompt, "bos_token": bos_token,
                 "eos_token": eos_token, **(extra or {})}
    worker = _shared_worker()
    if worker is not None:
        return worker.render(template, variables)
    try:  # in-process: the sandbox's size bounds hold, the time bound does not
        return template_sandbox.render(template, json.loads(json.dumps(variables)))
    except BaseException as exc:  # noqa: BLE001
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        kind, message = template_sandbox.describe(exc)
        raise TemplateRenderError(_message(kind, message)) from None
