"""Chat-template rendering with bounded size, time and memory: the Jinja2 side, and the worker process.

A chat template is code from an untrusted model file. Jinja2's ImmutableSandboxedEnvironment keeps
it away from Python internals, but not from the machine: two nested `range(100000)` loops run for
hours, `{{ 'x' * 20000000000 }}` allocates until MemoryError. Two layers bound that:

1. `BoundedEnvironment` (below): every operator and call that can make a large object checks the
   size it is about to make (string/list repetition and concatenation, `%` and `format` widths,
   `replace`, `join`, filter arguments), every result is size-checked, and the rendered text is
   cut off at MAX_OUTPUT characters.
2. Rendering runs in a separate process (`chat_template.TemplateWorker` starts this file as a
   script): an address-space limit (RLIMIT_AS) turns any runaway allocation into MemoryError, a
   CPU-time deadline (ITIMER_PROF, SIGPROF) interrupts a long loop, and the parent kills the process
   outright if neither answers in time (wall clock). The app's UI and the server's event loop never wait on a template.

This module imports nothing from dgchat (the worker runs it with `python -I`), only Jinja2 and the
standard library. Protocol: length-prefixed JSON requests on stdin, answers on stdout.
"""

from __future__ import annotations

import hashlib
import json
import re
import signal
import struct
import sys
from datetime import datetime
from typing import Any

from jinja2 import TemplateError
from jinja2.compiler import CodeGenerator
from jinja2.sandbox import ImmutableSandboxedEnvironment

MAX_OUTPUT = 8 * 1024 * 1024  # characters of rendered text (a whole long chat is well under 1 MB)
MAX_SIZE = 8 * 1024 * 1024  # characters of any string, items of any list the template builds
MAX_INT_BITS = 4096  # integers the template computes (10 ** 10 ** 10 would take forever in C)
RENDER_SECONDS = 2.0  # the worker's own deadline per render, in CPU seconds (the parent's, wall clock, is longer)
MEMORY_LIMIT = 1024 * 1024 * 1024  # the worker's address space
_WIDTH = re.compile(r"%[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?[a-zA-Z%]")
_FORMAT_WIDTH = re.compile(r"\{[^{}]*?:[^{}]*?(\d{7,})")


class TemplateLimit(Exception):
    """The template asked for more than a chat prompt can need."""


class Deadline(BaseException):
    """Raised by the worker's alarm; a BaseException so that no `except Exception` in a template's
    path can swallow it."""


def _size(value: Any) -> int:
    if isinstance(value, (str, bytes, list, tuple, dict, set, frozenset)):
        return len(value)
    return 0


def _limit(value: Any, what: str) -> Any:
    if _size(value) > MAX_SIZE:
        raise TemplateLimit(f"{what} made a value of {_size(value):,} items (limit {MAX_SIZE:,})")
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > MAX_INT_BITS:
        raise TemplateLimit(f"{what} made a {value.bit_length():,}-bit number")
    return value


def _check_args(args: tuple, kwargs: dict, what: str) -> None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_SIZE:
            raise TemplateLimit(f"{what} was given the number {value} (limit {MAX_SIZE:,})")
        if isinstance(value, float) and abs(value) > MAX_SIZE and what.startswith("filter"):
            raise TemplateLimit(f"{what} was given the number {value:g}")


def _check_percent(fmt: str, what: str) -> None:
    """`'%99999999999s' % x` allocates its width: widths and precisions are bounded, `*` refused."""
    for match in _WIDTH.finditer(fmt):
        for part in match.groups():
            if part == "*" or (part and int(part) > MAX_SIZE):
                raise TemplateLimit(f"{what}: format width {part} is too large")


def _repeat_size(left: Any, right: Any) -> int | None:
    if isinstance(left, int) and not isinstance(left, bool) and _size(right):
        left, right = right, left
    if _size(left) and isinstance(right, int) and not isinstance(right, bool):
        return len(left) * max(right, 0)
    return None


class _BoundedCodeGenerator(CodeGenerator):
    """`a ~ b` (string concatenation) goes through the environment, which checks the size."""

    def visit_Concat(self, node, frame) -> None:  # type: ignore[override]
        self.write("environment.bounded_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    code_generator_class = _BoundedCodeGenerator
    intercepted_binops = frozenset(["*", "**", "+", "%", "//"])

    def __init__(self) -> None:
        super().__init__(trim_blocks=True, lstrip_blocks=True)
        self.globals.pop("lipsum", None)  # lipsum(n=...) writes n paragraphs: nothing a prompt needs
        self.globals["raise_exception"] = _raise
        self.globals["strftime_now"] = lambda fmt: datetime.now().strftime(str(fmt)[:256])
        self.filters["tojson"] = lambda value, indent=None: json.dumps(value, indent=indent, ensure_ascii=False)
        for name, fn in list(self.filters.items()):
            self.filters[name] = _bounded_filter(name, fn)

    def bounded_concat(self, parts: tuple) -> str:
        texts = [str(p) for p in parts]
        if sum(len(t) for t in texts) > MAX_SIZE:
            raise TemplateLimit(f"`~` made a string longer than {MAX_SIZE:,} characters")
        return "".join(texts)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            n = _repeat_size(left, right)
            if n is not None and n > MAX_SIZE:
                raise TemplateLimit(f"`*` would make {n:,} items (limit {MAX_SIZE:,})")
            if isinstance(left, int) and isinstance(right, int) and left.bit_length() + right.bit_length() > MAX_INT_BITS:
                raise TemplateLimit("`*` would make a number too large")
        elif operator == "**":
            if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0:
                if left.bit_length() * right > MAX_INT_BITS:
                    raise TemplateLimit("`**` would make a number too large")
        elif operator == "+":
            if _size(left) and _size(right) and _size(left) + _size(right) > MAX_SIZE:
                raise TemplateLimit(f"`+` would make {_size(left) + _size(right):,} items (limit {MAX_SIZE:,})")
        elif operator == "%" and isinstance(left, str):
            _check_percent(left, "`%`")
        return _limit(super().call_binop(context, operator, left, right), f"`{operator}`")

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        name = getattr(__obj, "__name__", "a function")
        _check_args(args, kwargs, f"{name}()")
        owner = getattr(__obj, "__self__", None)
        if isinstance(owner, str):
            if name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
                count = owner.count(args[0]) if args[0] else len(owner) + 1
                if len(owner) + count * len(args[1]) > MAX_SIZE:
                    raise TemplateLimit("str.replace would make a string too long")
            elif name == "join" and args:
                items = list(args[0]) if not isinstance(args[0], str) else args[0]
                total = sum(len(str(i)) for i in items) + len(owner) * max(len(items) - 1, 0)
                if total > MAX_SIZE:
                    raise TemplateLimit("str.join would make a string too long")
                args = (items, *args[1:])
            elif name in ("format", "format_map"):
                if _FORMAT_WIDTH.search(owner):
                    raise TemplateLimit("str.format width is too large")
        return _limit(super().call(__context, __obj, *args, **kwargs), f"{name}()")


def _bounded_filter(name: str, fn: Any) -> Any:
    def bounded(*args: Any, **kwargs: Any) -> Any:
        # Jinja passes the environment / context first for some filters: only plain values are checked
        plain = tuple(a for a in args if not isinstance(a, (ImmutableSandboxedEnvironment,)) and
                      type(a).__name__ not in ("Context", "EvalContext"))
        _check_args(plain[1:], kwargs, f"filter {name}")
        if name == "format" and plain and isinstance(plain[0], str):
            _check_percent(plain[0], "filter format")
        if name == "replace" and len(plain) >= 3 and all(isinstance(a, str) for a in plain[:3]):
            s, old, new = plain[:3]
            if len(s) + (s.count(old) if old else len(s) + 1) * len(new) > MAX_SIZE:
                raise TemplateLimit("filter replace would make a string too long")
        if name == "join" and plain:
            items = list(plain[0])
            sep = plain[1] if len(plain) > 1 and isinstance(plain[1], str) else kwargs.get("d", "")
            if sum(len(str(i)) for i in items) + len(str(sep)) * len(items) > MAX_SIZE:
                raise TemplateLimit("filter join would make a string too long")
        return _limit(fn(*args, **kwargs), f"filter {name}")

    for attr in ("jinja_pass_arg",):  # keep @pass_context / @pass_environment markers
        if hasattr(fn, attr):
            setattr(bounded, attr, getattr(fn, attr))
    bounded.__name__ = getattr(fn, "__name__", name)
    return bounded


class TemplateRaised(Exception):
    """The template called raise_exception(): it refuses this conversation."""


def _raise(message: Any) -> None:
    raise TemplateRaised(str(message)[:500])


_ENV: BoundedEnvironment | None = None
_COMPILED: dict[str, Any] = {}


def template_key(source: str) -> str:
    return hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest()


def render(source: str, variables: dict[str, Any]) -> str:
    """Compile (once per source) and render with every bound but the process-level ones."""
    global _ENV
    if _ENV is None:
        _ENV = BoundedEnvironment()
    key = template_key(source)
    compiled = _COMPILED.get(key)
    if compiled is None:
        compiled = _ENV.from_string(source)
        if len(_COMPILED) >= 16:
            _COMPILED.pop(next(iter(_COMPILED)))
        _COMPILED[key] = compiled
    out: list[str] = []
    total = 0
    for chunk in compiled.generate(**variables):
        total += len(chunk)
        if total > MAX_OUTPUT:
            raise TemplateLimit(f"the rendered prompt exceeds {MAX_OUTPUT:,} characters")
        out.append(chunk)
    return "".join(out)


def describe(exc: BaseException) -> tuple[str, str]:
    """(kind, one-line message) of a rendering failure."""
    if isinstance(exc, TemplateRaised):
        return "raised", str(exc)
    if isinstance(exc, TemplateLimit):
        return "limit", str(exc)
    if isinstance(exc, Deadline):
        return "timeout", f"rendering took longer than {RENDER_SECONDS:g} s"
    if isinstance(exc, MemoryError):
        return "memory", f"rendering needed more than {MEMORY_LIMIT // 2**20} MiB"
    if isinstance(exc, RecursionError):
        return "limit", "the template recursed too deeply"
    if isinstance(exc, TemplateError):
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return "error", text[:300]
    text = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return "error", text[:300]


# -- the worker process ---------------------------------------------------------------------------
def _read_exact(stream: Any, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = stream.read(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _serve() -> None:
    try:
        import resource  # POSIX only: elsewhere the worker runs without a memory limit

        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    except (ImportError, ValueError, OSError):
        pass

    def on_alarm(_sig: int, _frame: Any) -> None:
        raise Deadline()

    # CPU time, not wall time: a template that loops burns CPU, while a machine busy with other work
    # (a build, a test suite, the model itself) only stretches the wall clock; a wall-clock alarm
    # stopped an ordinary template's first render (compile included) on a loaded 2-core machine
    signal.signal(signal.SIGPROF, on_alarm)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    sys.setrecursionlimit(2000)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sources: dict[str, str] = {}
    while True:
        head = _read_exact(stdin, 4)
        if head is None:
            return
        body = _read_exact(stdin, struct.unpack("<I", head)[0])
        if body is None:
            return
        try:
            request = json.loads(body)
            if "source" in request:
                if len(sources) >= 32:  # the parent sends the source again if it asks for an evicted one
                    sources.pop(next(iter(sources)))
                sources[template_key(request["source"])] = request["source"]
            source = sources.get(request["key"])
            if source is None:
                answer = {"ok": False, "kind": "unknown", "message": "template not sent"}
            else:
                signal.setitimer(signal.ITIMER_PROF, RENDER_SECONDS)
                try:
                    text = render(source, request["variables"])
                finally:
                    signal.setitimer(signal.ITIMER_PROF, 0)
                answer = {"ok": True, "text": text}
        except BaseException as exc:  # noqa: BLE001 - every failure is an answer, never a dead worker
            kind, message = describe(exc)
            answer = {"ok": False, "kind": kind, "message": message}
        try:
            data = json.dumps(answer).encode("utf-8")  # ensure_ascii: lone surrogates travel as escapes
        except MemoryError:
            data = json.dumps({"ok": False, "kind": "memory", "message": "the answer was too large"}).encode()
        stdout.write(struct.pack("<I", len(data)) + data)
        stdout.flush()


if __name__ == "__main__":
    _serve()
