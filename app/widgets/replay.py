"""Replay of an answer's denoising from its recording (dgchat.recording.history), shown in place of
the answer's text: the live canvas again, every recorded step, at a chosen pace.

Keys (while the replay has focus): Space pauses and resumes, Left / Right step one step back or
forward (pausing), Home / End jump to the first / last step, - / + change the pace, x exports the
replay as an asciicast (.cast) at the pace shown, Esc (or p) closes it. The line under the canvas
reads `▶ step 12/48 · 10 steps/s` with a slider for the position (a click on it jumps there).

The pace is steps per second, or "real": each step when it came while the answer was generated (a
fast model's whole answer takes a fraction of a second at that pace).

An answer written block after block (block diffusion) replays as it was drawn live: the answer so
far with each block filling in at its end, the progress line counting blocks (its recording keeps
the block size).

The canvas's own line reads `step 24/24 · 16 tokens · 30/32 positions decided · 20.4 tok/s`: the
tokens are the answer's, counted as the answer's line under it counts them (the positions before
the end token: answer_tokens_at), so the last step says what the answer says; the positions decided
are the canvas's, which include the end token and what the model decided after it.
"""

from __future__ import annotations

import bisect
import time
from typing import Any

from dgchat.app.widgets.canvas import LiveCanvas
from dgchat.model_backend.canvas import Cell
from dgchat.model_backend.canvas_view import TokenKinds
from dgchat.model_backend.events import StepEvent
from dgchat.recording.blocks import block_label
from dgchat.recording.history import DenoisingHistory
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.timer import Timer
from textual.widget import Widget

REAL = 0  # the pace "real": as it happened
PACES = (1, 2, 5, 10, 20, 30, REAL)  # steps per second, slowest first
DEFAULT_PACE = 10
TICK_HZ = 30


def pace_label(pace: int) -> str:
    return "real pace" if pace == REAL else f"{pace} step{'s' if pace != 1 else ''}/s"


def answer_tokens_at(event: StepEvent, kinds: TokenKinds) -> int:
    """The answer's tokens at this step, counted as the finished answer counts them
    (GenerationStats.tokens): the earlier canvases' and this canvas's positions before its first
    end token, the positions after it not. A masked position is not a token yet; a uniform-state
    model's undecided position holds a draft token, which is the answer's if the canvas ends there
    (DiffusionGemma's answer is its last draft), so it counts."""
    count = 0
    for token in event.answer_tokens.tolist():
        if kinds.is_end(token):
            return count
        count += 1
    drafts = event.uniform_state
    for token, state in zip(event.canvas.tokens.tolist(), event.canvas.state.tolist()):
        if state == Cell.MASKED and not drafts:
            continue
        if kinds.is_end(token):
            break
        count += 1
    return count


def replay_progress_text(event: StepEvent, kinds: TokenKinds, *, block_size: int | None = None) -> str:
    """'step 24/24 · 16 tokens · 30/32 positions decided · 20.4 tok/s' (a block answer: 'block 12 ·
    step 3/4 · 47 tokens · 20.4 tok/s'): the answer's tokens and the canvas's positions, each named."""
    tokens = answer_tokens_at(event, kinds)
    rate = f"{tokens / event.elapsed_s if event.elapsed_s > 0 else 0.0:.1f} tok/s"
    if block_size:
        return f"{block_label(event)} · {tokens} tokens · {rate}"
    canvas = f" · canvas {event.canvas_index + 1}" if event.canvas_index else ""
    return (f"step {event.canvas_step}/{event.total_steps}{canvas} · {tokens} tokens · "
            f"{event.committed}/{event.canvas_length} positions decided · {rate}")


class ReplayCanvas(LiveCanvas):
    """The live canvas, with a progress line that names what it counts (replay_progress_text): the
    replay's last step stays on screen beside the answer's own count."""

    def progress_line(self, event: StepEvent) -> str:
        return replay_progress_text(event, self.vocab, block_size=self.block_size)


class ReplaySlider(Widget):
    """`▶ step 12/48 · 10 steps/s  ━━━━━━━●──────`; a click on the bar jumps to that step."""

    DEFAULT_CSS = """
    ReplaySlider { height: 1; }
    """

    class Seek(Message):
        def __init__(self, index: int) -> None:
            super().__init__()
            self.index = index

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.index = 0
        self.count = 1
        self.state = ""
        self._bar_at = 0  # where the bar starts (cells), for clicks

    def set_position(self, index: int, count: int, state: str) -> None:
        self.index, self.count, self.state = index, max(1, count), state
        self.refresh()

    def render(self) -> Text:
        head = f"{self.state} step {self.index + 1}/{self.count}  "
        width = self.content_size.width
        room = max(0, width - len(head))
        self._bar_at = len(head)
        text = Text(head)
        if room >= 4:
            knob = round(self.index / max(1, self.count - 1) * (room - 1))
            text.append("━" * knob, "bold")
            text.append("●", "bold")
            text.append("─" * (room - 1 - knob), "dim")
        return text

    def on_click(self, event: events.Click) -> None:
        room = self.content_size.width - self._bar_at
        if room >= 4 and event.x >= self._bar_at:
            fraction = (event.x - self._bar_at) / max(1, room - 1)
            self.post_message(self.Seek(round(min(1.0, fraction) * (self.count - 1))))


class ReplayView(Vertical, can_focus=True):
    """The recorded steps of one answer, drawn by a LiveCanvas from the recording's own vocabulary."""

    # first: the footer leaves out a focused widget's keys from the right when they do not fit
    # (app/widgets/fitting_footer.py), and the way out of a replay is the one to keep
    BINDINGS = [
        Binding("escape,p", "close", "Close replay", id="replay.close"),
        Binding("space", "toggle_pause", "Pause / play", id="replay.pause"),
        Binding("left,comma", "step(-1)", "Step back", id="replay.back"),
        Binding("right,full_stop", "step(1)", "Step forward", id="replay.forward"),
        Binding("home", "seek(0)", "First step", show=False, id="replay.first"),
        Binding("end", "seek(-1)", "Last step", show=False, id="replay.last"),
        Binding("minus", "pace(-1)", "Slower", id="replay.slower"),
        Binding("plus,equals_sign", "pace(1)", "Faster", id="replay.faster"),
        Binding("x", "export", "Export .cast", id="replay.export"),
    ]
    DEFAULT_CSS = """
    ReplayView { height: auto; }
    """

    class Closed(Message):
        def __init__(self, view: ReplayView) -> None:
            super().__init__()
            self.view = view

    class Export(Message):
        """Write this replay as a .cast file at its pace (seconds per step, or None: real)."""

        def __init__(self, view: ReplayView, seconds_per_step: float | None) -> None:
            super().__init__()
            self.view = view
            self.seconds_per_step = seconds_per_step

    def __init__(self, history: DenoisingHistory, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.history = history
        self.steps: list[StepEvent] = list(history.events())
        self._times = [e.elapsed_s for e in self.steps]
        self.index = 0
        self.pace = DEFAULT_PACE
        self.paused = False
        self.frames_shown: list[int] = []  # indexes drawn, in order (for tests)
        self._clock = 0.0  # the playback position: seconds (real pace) or steps (fixed pace)
        self._last = 0.0
        self._timer: Timer | None = None
        first = self.steps[0] if self.steps else None
        last = self.steps[-1] if self.steps else None
        # a block answer (many small canvases): room for the whole recorded answer, kept from the start
        self.canvas = ReplayCanvas(history.vocab, canvas_length=first.canvas_length if first else 0,
                                 block_size=history.block_size,
                                 answer_limit=int(last.answer_tokens.size) + last.canvas_length if last else None,
                                 classes="replay--canvas")
        self.slider = ReplaySlider(classes="replay--slider")

    def compose(self) -> ComposeResult:
        yield self.canvas
        yield self.slider

    def on_mount(self) -> None:
        self._last = time.monotonic()
        self._timer = self.set_interval(1 / TICK_HZ, self._tick)
        self._show(0)

    # -- playback -------------------------------------------------------------------------------
    @property
    def last(self) -> int:
        return max(0, len(self.steps) - 1)

    def _tick(self) -> None:
        now = time.monotonic()
        dt, self._last = now - self._last, now
        if self.paused or not self.steps:
            return
        if self.pace == REAL:
            self._clock += dt
            index = max(0, bisect.bisect_right(self._times, self._clock) - 1)
        else:
            self._clock += dt * self.pace
            index = int(self._clock)
        if index >= self.last:
            index = self.last
            self.paused = True  # stop at the end; Space plays it again from the start
        if index != self.index or self.paused:
            self._show(index)

    def _sync_clock(self) -> None:
        self._clock = self._times[self.index] if self.pace == REAL and self.steps else float(self.index)

    def _show(self, index: int) -> None:
        self.index = max(0, min(self.last, index))
        if self.steps:
            self.canvas.show(self.steps[self.index])
            self.frames_shown.append(self.index)
        self._update_slider()

    def _update_slider(self) -> None:
        if self.paused:
            state = "■ end" if self.index == self.last else "❚❚"
        else:
            state = "▶"
        truncated = " · recording cut short" if self.history.truncated else ""
        self.slider.set_position(self.index, len(self.steps), f"{state} {pace_label(self.pace)}{truncated} ·")

    # -- actions --------------------------------------------------------------------------------
    def action_toggle_pause(self) -> None:
        if self.paused and self.index >= self.last:
            self.index = 0  # at the end: play again from the start
            self._show(0)
        self.paused = not self.paused
        self._sync_clock()
        self._last = time.monotonic()
        self._update_slider()

    def action_step(self, delta: int) -> None:
        self.paused = True
        self._show(self.index + delta)
        self._sync_clock()

    def action_seek(self, index: int) -> None:
        self.paused = True
        self._show(self.last if index < 0 else index)
        self._sync_clock()

    def on_replay_slider_seek(self, message: ReplaySlider.Seek) -> None:
        message.stop()
        self.action_seek(message.index)

    def action_pace(self, delta: int) -> None:
        at = PACES.index(self.pace) if self.pace in PACES else PACES.index(DEFAULT_PACE)
        self.pace = PACES[max(0, min(len(PACES) - 1, at + delta))]
        self._sync_clock()
        self._update_slider()

    def action_export(self) -> None:
        self.post_message(self.Export(self, None if self.pace == REAL else 1.0 / self.pace))

    def action_close(self) -> None:
        if self._timer is not None:
            self._timer.stop()
        self.post_message(self.Closed(self))
