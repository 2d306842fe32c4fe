"""What a person sees of the live canvas: the real chat app in a pseudo-terminal, driven by keys.

    python tests/bench/bench_canvas_seen.py [--model M.gguf] [--size 140x40] [--answers 3]
                                            [--new-chat] [--profile] [--cast OUT] [--steps N ...]

Starts `python -m dgchat --model M` (default: the bundled model, its default sampler settings) in a
pty of each size (default 140x40 and 80x24), types each prompt and presses Enter like a person (all
in one conversation, or with --new-chat each in a new chat), waits for the answer to be saved, and
keeps everything the app wrote to the terminal. The terminal answers the app's queries as a modern
terminal does (synchronized output, `?2026`, is reported as supported), so each frame the app draws
is delimited; the screen is read after every frame with a small terminal emulator
(tests/fixtures/terminal_screen.py). Per answer it counts:

  drawn     distinct denoising steps whose progress line (`step k/N`, per canvas) was on screen
            (`?` when the canvas is taller than the screen and that line scrolled away)
  blank     frames in which the answer, once shown, was on screen neither as its canvas (progress
            line, or undecided positions side by side) nor as any part of its text (16 letters
            and digits of it in a row) -- the swap from canvas to Markdown, or a view scrolled
            past the text -- and how long they lasted

`--profile` also times each live frame inside the app (the UI thread's CPU time: building the
canvas, then Textual's layout, compositor and the driver's write until the next frame), reported
as median / p90 ms per drawn frame, with the terminal bytes per frame. `--cast OUT` saves each raw
session as an asciicast v2 file (OUT.COLSxROWS.cast; asciinema play it) to look at what was drawn.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from fixtures.app_pty import Terminal  # noqa: E402
from fixtures.terminal_screen import TerminalScreen  # noqa: E402

PROMPTS = (
    "Halt, traveller! Who goes there?",
    "What news from the court, good sir?",
    "Speak, what says the king of France?",
    "Where is the prince tonight?",
    "Who guards the gate after dark?",
)
SYNC_END = b"\x1b[?2026l"
# "step 3/24 · canvas 2" (canvas models), "block 12 · step 3/4" (block diffusion: recording.blocks)
STEP_LINE = re.compile(r"(?:block (\d+) · )?step (\d+)/(\d+)(?: · canvas (\d+))?")
LOADED = re.compile(r"\.gguf · (?!not loaded|failed)")  # the status line once the model is loaded
PROBE = 16  # characters of the answer (letters and digits) that show it is on screen
UNDECIDED_RUN = re.compile("··")  # undecided positions side by side: only a live canvas draws these
CANVAS_SHOWN = re.compile(r"step \d+/\d+ · |waiting for the first step")


# -- the child: the app itself, optionally timing its frames ---------------------------------------
def install_profiler(out: str) -> None:
    """Time the UI thread's work per live frame: the canvas build (AnswerControl.draw_frame) and the
    screen updates that follow it (Textual's layout, compositor and the driver's write), until the
    next frame. Written to `out` as JSON when the app exits."""
    import atexit

    from dgchat.app.chat.answering import AnswerControl
    from dgchat.app.chat_screen import ChatScreen
    from textual.screen import Screen

    frames: list[dict] = []
    state = {"frame": None, "last_draw_cpu": None}

    draw = AnswerControl.draw_frame

    def timed_draw(self) -> None:
        canvas = self.canvas
        before = canvas.frames if canvas is not None else 0
        t0 = time.thread_time()
        draw(self)
        t1 = time.thread_time()
        if canvas is not None and canvas.frames != before:
            interval = t0 - state["last_draw_cpu"] if state["last_draw_cpu"] is not None else None
            state["last_draw_cpu"] = t0
            state["frame"] = {"build_ms": 1000 * (t1 - t0), "paint_ms": 0.0, "layout_ms": 0.0,
                              "ui_interval_ms": 1000 * interval if interval is not None else None,
                              "height": canvas.size.height}
            frames.append(state["frame"])

    update = Screen._on_timer_update

    def timed_update(self) -> None:
        t0 = time.thread_time()
        update(self)
        if state["frame"] is not None:
            state["frame"]["paint_ms"] += 1000 * (time.thread_time() - t0)

    layout = Screen._refresh_layout

    def timed_layout(self, *args, **kwargs) -> None:
        t0 = time.thread_time()
        layout(self, *args, **kwargs)
        if state["frame"] is not None:
            state["frame"]["layout_ms"] += 1000 * (time.thread_time() - t0)

    def job_done(self, message, _orig=ChatScreen.on_job_done) -> None:
        state["frame"] = None  # the answer's own frames end here
        state["last_draw_cpu"] = None
        _orig(self, message)

    AnswerControl.draw_frame = timed_draw
    ChatScreen.on_job_done = job_done
    Screen._on_timer_update = timed_update
    Screen._refresh_layout = timed_layout
    atexit.register(lambda: Path(out).write_text(json.dumps(frames)))


def child(argv: list[str], profile_out: str | None) -> int:
    if profile_out:
        install_profiler(profile_out)
    from dgchat.cli import main as dgchat_main

    return dgchat_main(argv)


# -- the parent: a person at a terminal (fixtures/app_pty.Terminal) ----------------------------------
def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def finished_answers(db: Path) -> list[dict]:
    if not db.exists():
        return []
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
            rows = conn.execute("SELECT id, content, status, meta FROM messages WHERE role = 'assistant' "
                                "AND status != 'generating' ORDER BY id").fetchall()
    except sqlite3.Error:
        return []
    return [{"id": r[0], "content": r[1], "status": r[2], "meta": json.loads(r[3] or "{}")} for r in rows]


def frames_of(chunks: list[tuple[float, bytes]], cols: int, rows: int) -> list[tuple[float, list[str], int]]:
    """(time, screen lines, bytes) after each frame the app drew: each synchronized update (or, from
    a program that does not use them, each read)."""
    screen = TerminalScreen(cols, rows)
    frames: list[tuple[float, list[str], int]] = []
    synced = any(SYNC_END in c for _, c in chunks)
    size = 0
    for t, chunk in chunks:
        if not synced:
            screen.feed(chunk)
            frames.append((t, screen.lines(), len(chunk)))
            continue
        parts = chunk.split(SYNC_END)
        for k, part in enumerate(parts):
            screen.feed(part)
            size += len(part)
            if k < len(parts) - 1:
                screen.feed(SYNC_END)
                frames.append((t, screen.lines(), size + len(SYNC_END)))
                size = 0
    return frames


def alnum(text: str) -> str:
    return re.sub(r"[^0-9A-Za-z]", "", text)


def analyse(frames, start: float, end: float, answer: dict) -> dict:
    """Steps drawn and blank frames of one answer, from the frames drawn between `start` (Enter)
    and `end` (saved + a moment). The answer is on screen while its canvas is (its progress line,
    or undecided positions side by side) or part of its final text is (any 16 letters and digits
    of it in a row; a canvas taller than the screen shows decided tokens only); once it has been
    on screen, a frame without it is blank. A step counts as drawn when its progress
    line was on screen: a canvas taller than the terminal scrolls that line away (then None)."""
    final = alnum(answer["content"])
    probes = {final[i:i + PROBE] for i in range(max(1, len(final) - PROBE + 1))} if final else set()
    drawn: set[tuple[int, int]] = set()
    seen = False
    marker_seen = False
    blank_frames = 0
    blank_s = 0.0
    blank_since: float | None = None
    for t, lines, _ in frames:
        if not start <= t <= end:
            continue
        text = "\n".join(lines)
        marker = bool(CANVAS_SHOWN.search(text))
        marker_seen = marker_seen or marker
        for m in STEP_LINE.finditer(text):
            drawn.add((int(m.group(1) or m.group(4) or 1), int(m.group(2))))
        shown = alnum(text)
        canvas = marker or bool(UNDECIDED_RUN.search(text))
        words = bool(probes) and any(shown[i:i + PROBE] in probes for i in range(max(0, len(shown) - PROBE + 1)))
        visible = canvas or words
        seen = seen or visible
        if seen and not visible:
            blank_frames += 1
            if blank_since is None:
                blank_since = t
        elif blank_since is not None:
            blank_s += t - blank_since
            blank_since = None
    steps = int((answer["meta"].get("stats") or {}).get("steps") or 0)
    return {"steps": steps, "drawn": len(drawn) if marker_seen or not seen else None, "blank_frames": blank_frames,
            "blank_ms": 1000 * blank_s}


def run(args: argparse.Namespace, cols: int, rows: int, folder: Path) -> dict:
    home = folder / f"home-{cols}x{rows}"
    (home / "config").mkdir(parents=True, exist_ok=True)
    sampler = "".join(f"{k} = {v}\n" for k, v in (("steps", args.steps), ("gen_length", args.gen_length),
                                                  ("max_tokens", args.max_tokens), ("seed", args.seed))
                      if v is not None)
    threads = f"n_threads = {args.threads}\n" if args.threads else ""
    (home / "config" / "config.toml").write_text(f"refresh_hz = {args.refresh_hz}\n{threads}[sampler]\n{sampler}")
    env = dict(os.environ, DGCHAT_HOME=str(home), TERM="xterm-256color", COLORTERM="truecolor")
    env.pop("NO_COLOR", None)
    profile = folder / f"profile-{cols}x{rows}.json" if args.profile else None
    cmd = [sys.executable, __file__, "--child"] + (["--profile-out", str(profile)] if profile else [])
    cmd += ["--", "--model", str(args.model)]
    session = Terminal(cmd, env, cols, rows)
    db = home / "data" / "chats.db"
    windows: list[tuple[float, float]] = []
    try:
        try:
            wait_until(lambda: LOADED.search(session.text()) is not None, 120, "the model to load")
        except RuntimeError:
            print(session.text())
            raise
        time.sleep(0.5)
        for i in range(args.answers):
            if args.new_chat and i:
                session.keys("\x0e")  # Ctrl+N: a new chat, so the prompt does not grow
                time.sleep(0.5)
            session.keys(PROMPTS[i % len(PROMPTS)])
            time.sleep(0.3)
            start = session.now()
            session.keys("\r")
            wait_until(lambda: len(finished_answers(db)) > i, 300, f"answer {i + 1}")
            time.sleep(args.settle)
            windows.append((start, session.now()))
        session.keys("\x11")  # Ctrl+Q
    finally:
        code = session.close()
    answers = finished_answers(db)
    chunks = session.chunks
    if args.cast:
        write_cast(Path(args.cast).with_suffix(f".{cols}x{rows}.cast"), chunks, cols, rows)
    frames = frames_of(chunks, cols, rows)
    per_answer = [analyse(frames, s, e, a) for (s, e), a in zip(windows, answers)]
    result = {"size": f"{cols}x{rows}", "exit": code, "answers": per_answer,
              "frame_bytes": [b for t, _, b in frames if any(s <= t <= e for s, e in windows)]}
    if profile is not None and profile.exists():
        result["profile"] = json.loads(profile.read_text())
    return result


def write_cast(path: Path, chunks: list[tuple[float, bytes]], cols: int, rows: int) -> None:
    header = {"version": 2, "width": cols, "height": rows, "timestamp": int(time.time()),
              "title": "dgchat in a pty (bench_canvas_seen.py)"}
    lines = [json.dumps(header)]
    lines += [json.dumps([round(t, 6), "o", c.decode("utf-8", "replace")]) for t, c in chunks]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"  recording: {path}")


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else 0.0


def report(result: dict) -> None:
    print(f"\n{result['size']} (exit {result['exit']})")
    total_steps = total_drawn = blanks = 0
    unseen = 0
    for i, a in enumerate(result["answers"], 1):
        blanks += a["blank_frames"]
        if a["drawn"] is None:
            unseen += 1
            drawn = "  ? (the canvas is taller than the screen: its progress line scrolled away)"
        else:
            total_steps += a["steps"]
            total_drawn += a["drawn"]
            drawn = f"{a['drawn']:3d}"
        print(f"  answer {i}: {drawn} of {a['steps']:3d} steps drawn · blank frames {a['blank_frames']}"
              f" ({a['blank_ms']:.0f} ms)")
    share = total_drawn / total_steps if total_steps else 0.0
    counted = f"{total_drawn} of {total_steps} steps drawn ({100 * share:.0f}%)" if total_steps else "steps drawn: ?"
    print(f"  all: {counted} · blank frames {blanks}")
    sizes = result["frame_bytes"]
    if sizes:
        print(f"  terminal bytes per frame: median {statistics.median(sizes):.0f} · p90 {pct(sizes, 0.9):.0f}")
    prof = result.get("profile")
    if prof:
        total = [f["build_ms"] + f["paint_ms"] for f in prof]
        build = [f["build_ms"] for f in prof]
        layout = [f["layout_ms"] for f in prof]
        intervals = [f["ui_interval_ms"] for f in prof if f["ui_interval_ms"] is not None]
        print(f"  frame CPU (UI thread) over {len(prof)} frames: median {statistics.median(total):.2f} ms · "
              f"p90 {pct(total, 0.9):.2f} · max {max(total):.1f} (build median {statistics.median(build):.2f}, "
              f"layout total {sum(layout):.0f} ms in {sum(1 for v in layout if v)} frames)")
        if intervals:
            print(f"  UI thread CPU between frames: median {statistics.median(intervals):.2f} ms · "
                  f"mean {statistics.mean(intervals):.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="GGUF (default: the bundled model)")
    parser.add_argument("--size", action="append", help="COLSxROWS (repeatable; default 140x40 and 80x24)")
    parser.add_argument("--answers", type=int, default=3)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--gen-length", type=int)
    parser.add_argument("--max-tokens", type=int)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--threads", type=int, help="llama.cpp threads (default: the app's default)")
    parser.add_argument("--refresh-hz", type=int, default=30)
    parser.add_argument("--new-chat", action="store_true",
                        help="each answer in a new chat (default: one conversation, as a person chats)")
    parser.add_argument("--settle", type=float, default=0.6, help="seconds to keep reading after an answer is saved")
    parser.add_argument("--profile", action="store_true", help="time each frame inside the app")
    parser.add_argument("--cast", help="save each session as an asciicast (OUT.COLSxROWS.cast)")
    parser.add_argument("--json", help="write the results to this file")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--profile-out", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.child:
        return child([a for a in rest if a != "--"], args.profile_out)
    if args.model is None:
        from dgchat.assets import bundled_model_path

        args.model = bundled_model_path()
    sizes = args.size or ["140x40", "80x24"]
    print(f"model {Path(args.model).name} · {args.answers} answers per size · refresh {args.refresh_hz} Hz · "
          f"{os.cpu_count()} CPUs · load {os.getloadavg()[0]:.2f}")
    results = []
    with tempfile.TemporaryDirectory(prefix="dgchat-seen-") as tmp:
        for size in sizes:
            cols, rows = (int(v) for v in size.lower().split("x"))
            result = run(args, cols, rows, Path(tmp))
            report(result)
            results.append(result)
    if args.json:
        Path(args.json).write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
