"""`dgchat generate`: one answer from the command line, optionally with the canvas drawn live."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dgchat.commands.common import (
    add_common,
    add_model_args,
    add_precise_arg,
    add_sampler_args,
    ctrl_c_cancels,
    flag_layer,
    open_local_engine,
    params_from_args,
    placement_choice,
    precise_choice,
    resolve_model_path,
)
from dgchat.commands.server_args import add_server_args, server_choice
from dgchat.model_backend.engine_protocol import Engine
from dgchat.model_backend.errors import DgchatError, InvalidParameterError
from dgchat.model_backend.events import FinalEvent, StepEvent
from dgchat.model_backend.param_resolution import FLAG, SERVER, Layer, check_block_flags, explain, resolved_for
from dgchat.paths import atomic_write_text
from dgchat.recording.asciicast import Pace, asciicast, cast_title, check_target, check_width, summary_line
from dgchat.recording.frame_text import render_step
from dgchat.recording.history import HistoryRecorder
from dgchat.remote import RemoteEngine
from dgchat.remote.engine import flag
from dgchat.terminal_text import cli_line, for_stream


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate one answer (no UI)", description="Generate one answer.")
    add_common(p)
    add_model_args(p)
    p.add_argument("-p", "--prompt", help="the prompt (reads standard input when omitted or '-')")
    p.add_argument("--system", help="system prompt / persona for chat models")
    p.add_argument("--raw", action="store_true",
                   help="do not apply the chat template: the prompt is the model's input as written, and "
                        "control-token text in it (e.g. <|im_end|>) becomes control tokens")
    p.add_argument("--visual", action="store_true",
                   help="redraw the canvas every step, on a terminal (to a pipe or a file: ignored, the answer only)")
    p.add_argument("--record", metavar="FILE.cast",
                   help="also write the denoising as an asciicast v2 recording (asciinema play FILE.cast)")
    p.add_argument("--record-pace", metavar="PACE", default="real",
                   help="the recording's pace: 'real' (default) or seconds per step, e.g. 0.1")
    p.add_argument("--record-width", metavar="COLUMNS", type=int, default=80,
                   help="the recording's width in columns (default 80)")
    p.add_argument("--json", action="store_true",
                   help="print the answer and statistics as one JSON object (`params`: each setting's value and "
                        "where it came from; `settings`: the values alone)")
    add_precise_arg(p)
    add_sampler_args(p)
    add_server_args(p)


def _read_prompt(args: argparse.Namespace) -> str:
    if args.prompt is not None and args.prompt != "-":
        return args.prompt
    if sys.stdin is None or sys.stdin.isatty():
        raise InvalidParameterError("no prompt: pass -p PROMPT or pipe text on standard input")
    return sys.stdin.read()


def run(args: argparse.Namespace) -> int:
    urls, api_key = server_choice(args)
    if urls:
        return _run_remote(args, urls[0], api_key)
    # imported when a local model runs, so that `dgchat generate --help` and `--server` runs load no llama.cpp
    from dgchat.model_backend import llamacpp  # heavy: llama.cpp's shared library

    llamacpp.set_verbose(getattr(args, "verbose", False))
    flags = flag_layer(args)
    recording = Recording.from_args(args)
    visual = _visual(args)  # said before the model loads
    prompt_text = _read_prompt(args)
    model_path = resolve_model_path(args.model)
    precise = precise_choice(args)
    engine = open_local_engine(model_path, n_threads=args.threads, precise=precise[0], **placement_choice(args))
    try:
        prompt = _prompt(engine, args, prompt_text)
        # the config's [sampler] table is for the app's chats: generate's layers are the model's and the flags
        table = resolved_for(engine, [flags], precise=precise)
        resolved = table.params
        recorder = recording.recorder(engine) if recording else None
        with ctrl_c_cancels() as cancel:
            final = _drive(engine, prompt, resolved, cancel, visual=visual, recorder=recorder)
        code = _report(final, args, lambda: _as_json(final, engine, model_path, resolved) | {
            "params": table.table()})
        if recording and recorder is not None:
            recording.write(recorder, final, title=("dgchat", model_path.name, prompt_text))
        return code
    finally:
        engine.close()


class Recording:
    """--record FILE.cast: checked before the model loads (a bad path costs no generation), written
    after the answer is printed (a failed write loses no answer)."""

    def __init__(self, path: Path, pace: Any, width: int) -> None:
        self.path = path
        self.pace = pace
        self.width = width

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Recording | None:
        if not getattr(args, "record", None):
            return None

        path = Path(args.record).expanduser()
        check_target(path)
        return cls(path, Pace.parse(args.record_pace), check_width(args.record_width))

    def recorder(self, engine: Engine) -> Any:
        return HistoryRecorder(engine)

    def write(self, recorder: Any, final: FinalEvent, *, title: tuple[str, ...]) -> None:
        stats = final.stats
        text = asciicast(recorder.history(), final.text, summary=summary_line(stats.tokens, stats.steps, stats.elapsed_s),
                         width=self.width, pace=self.pace, title=cast_title(*title))
        try:
            atomic_write_text(self.path, text, mode=0o644)
        except OSError as exc:
            raise DgchatError(f"cannot write the recording {self.path}: {exc.strerror or exc}") from None
        sys.stderr.write(f"dgchat: recording written to {self.path} ({recorder.steps} steps, {self.pace.label()})\n")


def _prompt(engine: Engine, args: argparse.Namespace, prompt_text: str):
    """The prompt's tokens: the chat template around a user turn (and --system), or with --raw the
    text as written, its author writing the markers."""
    if args.raw:
        return engine.encode(prompt_text, special=True)
    messages = ([{"role": "system", "content": args.system}] if args.system else [])
    messages.append({"role": "user", "content": prompt_text})
    return engine.chat_prompt(messages)


def _report(final: FinalEvent, args: argparse.Namespace, as_json: Callable[[], dict[str, Any]]) -> int:
    """Print the answer (or its JSON); the exit status says whether Ctrl-C cut it short.

    The answer is the model's (or a server's) text: on a terminal it is printed by the rule of
    dgchat.terminal_text (an ESC shows as ␛, so an answer cannot set the title or clear the screen);
    to a pipe or a file, and always in --json, it is the exact text (docs/SECURITY.md)."""
    if args.json:
        print(json.dumps(as_json(), ensure_ascii=False))
    else:
        sys.stdout.write(for_stream(final.text.rstrip("\n"), sys.stdout) + "\n")
        if final.stop_reason == "cancelled":
            sys.stderr.write("dgchat: generation stopped (Ctrl-C); partial answer above\n")
    return 130 if final.stop_reason == "cancelled" else 0


def _visual(args: argparse.Namespace) -> bool:
    """Whether to draw the canvas live: --visual without --json, on a terminal. --visual redraws one
    frame in place; a pipe or a file would get every step as a new block of text (a page per step,
    wrapped at 80 columns), so there it is ignored, said once on stderr, and the output is the
    answer as without it (--record keeps every step in a file)."""
    if not args.visual or args.json:
        return False
    from rich.console import Console

    if Console().is_terminal:  # rich's rule: a tty, or FORCE_COLOR / TTY_COMPATIBLE=1 saying so
        return True
    cli_line("warning", "--visual ignored: the output is not a terminal, so only the answer is printed "
                     "(--record FILE.cast keeps every step)")
    return False


def _drive(engine: Engine, prompt, params, cancel: threading.Event, *, visual: bool, recorder: Any = None) -> FinalEvent:
    """Run the generation; `visual` (a terminal: see _visual) draws each step over the last one,
    `recorder` (a HistoryRecorder) keeps it."""
    final: FinalEvent | None = None
    show: Callable[[StepEvent], None] = lambda event: None  # noqa: E731
    live = None
    if visual:
        from rich.console import Console
        from rich.live import Live

        live = Live(console=Console(), refresh_per_second=30, transient=True)
        show = lambda event: live.update(render_step(engine, event))  # noqa: E731
    with live if live is not None else contextlib.nullcontext():
        for event in engine.generate(prompt, params, cancel=cancel):
            if isinstance(event, StepEvent):
                if recorder is not None:
                    recorder.add(event)
                show(event)
            else:
                final = event
    assert final is not None
    return final


def _as_json(final: FinalEvent, engine: Engine, model_path, params) -> dict[str, Any]:
    placement = engine.placement  # None for a server
    return {
        "text": final.text,
        "tokens": [int(t) for t in final.tokens],
        "stop_reason": final.stop_reason,
        "model": str(model_path),
        "architecture": engine.info.architecture,
        "engine": final.engine_label,
        "settings": params.as_dict(),  # the values alone; "params" (added by the caller): with their sources
        "stats": final.stats.as_dict(),
        # where the weights went (model_backend/placement.py): mode, n_gpu_layers, bytes per device
        "placement": placement.as_json() if placement is not None else None,
    }


def _run_remote(args: argparse.Namespace, url: str, api_key: str | None) -> int:
    """The same answer from a server (docs/SCALING.md): dgchat serve streams its canvas (--visual
    draws it as a local run does), other servers stream text."""
    params = params_from_args(args)
    flags = Layer.of(FLAG, params)  # the same flags, parsed once
    recording = Recording.from_args(args)
    prompt_text = _read_prompt(args)
    if args.n_gpu_layers is not None or args.experts_on is not None or args.threads is not None or \
            args.precise is not None:
        raise InvalidParameterError("--gpu-layers, --experts-on, --threads and --precise set up a local model; the "
                                    "server has its own (dgchat serve --precise)")
    visual = _visual(args)
    engine = RemoteEngine.connect(url, api_key=api_key, timeout=args.timeout, retries=args.retries,
                                  live_canvas=visual or recording is not None, deadline=args.deadline)
    try:
        unsupported = engine.unsupported(params)
        if unsupported:
            kind = "dgchat serve" if engine.is_dgchat else "this server (not a dgchat server)"
            raise InvalidParameterError(f"{kind} at {engine.url} takes no "
                                        f"{', '.join(flag(u) for u in unsupported)}")
        if recording is not None and not engine.is_dgchat:
            raise InvalidParameterError(f"--record needs the canvas of each step, which only dgchat serve sends; "
                                        f"{engine.url} is not a dgchat server")
        prompt = _prompt(engine, args, prompt_text)  # --raw is refused there: markers need the tokenizer
        if engine.info.block_diffusion:  # refused as locally: the client's resolve would replace them
            check_block_flags(int(engine.info.attention_block), params, {n: FLAG for n in flags.values})
        resolved = engine.resolve(params)
        # what no flag set, the server decided (its model's recommended settings, its own defaults)
        table = explain(resolved, [flags], unknown=SERVER)
        recorder = recording.recorder(engine) if recording else None
        with ctrl_c_cancels() as cancel:
            final = _drive(engine, prompt, resolved, cancel, visual=visual, recorder=recorder)
        code = _report(final, args, lambda: _remote_json(final, engine, resolved) | {
            "params": table.table()})
        if recording and recorder is not None:
            recording.write(recorder, final, title=("dgchat", engine.model_id, prompt_text))
        return code
    finally:
        engine.close()


def _remote_json(final: FinalEvent, engine: RemoteEngine, params) -> dict[str, Any]:
    settings = final.extra.get("settings") or {}
    return {
        "text": final.text,
        "tokens": [int(t) for t in final.tokens] if engine.is_dgchat else None,  # other servers send text only
        "stop_reason": final.stop_reason,
        "model": engine.model_id,
        "server": engine.url,
        "architecture": engine.info.architecture,
        "engine": final.engine_label,
        "settings": settings or params.as_dict(),
        "stats": final.stats.as_dict(),
    }
