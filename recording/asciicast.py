"""A denoising history as an asciicast v2 file (asciinema's format; `asciinema play FILE.cast`, or
its web player).

The file is a JSON header line `{"version": 2, "width": W, "height": H, "timestamp": ...,
"title": ...}` followed by one `[time, "o", text]` line per frame. Each frame redraws the canvas
from the top-left corner (cursor home, each line cleared to its end, the rest of the screen cleared
below), so any player shows exactly the step; the last frame is the answer's final text, held for
HOLD_S seconds. Frames are drawn by recording.frame_text, the renderer of `generate --visual`;
model text in them has passed terminal_safe.

Pace: the real one (each step at the time it was shown while generating) or a fixed number of
seconds per step, for an answer that denoised too fast to watch.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from dgchat.model_backend.canvas_view import TokenText, terminal_safe
from dgchat.model_backend.errors import InvalidParameterError
from dgchat.recording.frame_text import ansi_lines, final_text, render_step
from dgchat.recording.history import DenoisingHistory

HOLD_S = 2.0  # the final text stays this long before the recording ends
MIN_WIDTH, MAX_WIDTH = 20, 400
MAX_HEIGHT = 60  # rows; a longer canvas shows its last lines (where the denoising is) under its progress line
FINAL_GAP_S = 0.2  # after the last step at the real pace, before the final text
HOME, CLEAR_LINE, CLEAR_BELOW = "\x1b[H", "\x1b[K", "\x1b[J"
HIDE_CURSOR, SHOW_CURSOR = "\x1b[?25l", "\x1b[?25h"


@dataclass(frozen=True)
class Pace:
    """`seconds_per_step` None: the real pace."""

    seconds_per_step: float | None = None

    @classmethod
    def parse(cls, text: str) -> Pace:
        """'real', or seconds per step ('0.1'); InvalidParameterError (one line) otherwise."""
        if text.strip().lower() == "real":
            return cls(None)
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not 0.001 <= value <= 60:  # also refuses nan and inf
            raise InvalidParameterError(f"--record-pace must be 'real' or seconds per step, 0.001-60 (got {text!r})")
        return cls(value)

    def label(self) -> str:
        return "real pace" if self.seconds_per_step is None else f"{self.seconds_per_step:g} s a step"


def check_target(path: Path) -> None:
    """Refuse, before anything runs, a recording path that cannot be a file (one line)."""
    if not path.name or path.is_dir():
        raise InvalidParameterError(f"--record {path}: a folder; give a file name such as answer.cast")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise InvalidParameterError(f"--record {path}: {parent} is a file, not a folder")
            break


def summary_line(tokens: int, steps: int, elapsed_s: float) -> str:
    return f"{tokens} tokens · {steps} steps · {elapsed_s:.1f} s"


def cast_title(*parts: str, limit: int = 100) -> str:
    """A one-line title from `parts` (the model, the prompt), safe to show."""
    text = " · ".join(" ".join(terminal_safe(p).split()) for p in parts if p)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def check_width(width: int) -> int:
    if not MIN_WIDTH <= width <= MAX_WIDTH:
        raise InvalidParameterError(f"a recording's width must be {MIN_WIDTH}-{MAX_WIDTH} columns (got {width})")
    return width


def _frame(lines: list[str], height: int) -> str:
    if len(lines) > height:  # keep the progress line and the canvas's last lines
        lines = lines[:1] + lines[len(lines) - height + 1:]
    return HOME + (CLEAR_LINE + "\r\n").join(lines) + CLEAR_LINE + CLEAR_BELOW


def asciicast(history: DenoisingHistory, final: str, *, summary: str, width: int = 80, pace: Pace = Pace(),
              title: str = "dgchat", vocab: TokenText | None = None, timestamp: int | None = None) -> str:
    """The recording as the text of a .cast file. `final` is the answer's text, `summary` the line
    over it ('41 tokens · 48 steps · 1.0 s')."""
    check_width(width)
    vocab = vocab if vocab is not None else history.vocab
    frames = [ansi_lines(render_step(vocab, event, timings=False, block_size=history.block_size), width)
              for event in history.events()]
    if history.truncated:
        summary += " · recording cut short"
    ending = ansi_lines(final_text(final, summary), width)
    height = max(1, min(MAX_HEIGHT, max([len(f) for f in frames] + [len(ending)])))
    if pace.seconds_per_step is None:
        times = history.elapsed_s()
        final_at = (times[-1] if times else 0.0) + FINAL_GAP_S
    else:
        times = [i * pace.seconds_per_step for i in range(len(frames))]
        final_at = len(frames) * pace.seconds_per_step
    header = {"version": 2, "width": width, "height": height,
              "timestamp": int(time.time()) if timestamp is None else timestamp, "title": title}
    events = [[0.0, "o", HIDE_CURSOR + "\x1b[2J"]]
    events += [[round(t, 6), "o", _frame(lines, height)] for t, lines in zip(times, frames)]
    # the final text is written as a whole: a longer one scrolls, as it would in a terminal
    events.append([round(final_at, 6), "o", HOME + CLEAR_BELOW + "\r\n".join(ending) + SHOW_CURSOR])
    events.append([round(final_at + HOLD_S, 6), "o", ""])
    return "\n".join(json.dumps(line, ensure_ascii=False) for line in [header, *events]) + "\n"
