"""LiveView: repaint a running job on screen at the frame rate, within a CPU budget.

The job's worker thread only stores its latest state; a timer on the UI thread asks `version()`
whether anything new arrived and, if so, calls `draw()`.

Frame budget: on average the UI thread may spend at most UI_CPU_BUDGET of one core on live frames
(building a frame, then Textual's compositor writing it to the terminal), so on a slow or busy
machine the picture updates less often instead of slowing the model down. It is kept as a credit:
the wall time since the last tick earns UI_CPU_BUDGET of it, each frame pays what it cost (the UI
thread's CPU time from the draw until the screen has been refreshed); a frame is drawn while the
credit is not negative. The credit saves up at most UI_CPU_BURST_S, so one expensive frame (a
layout when the canvas grows) is paid back over the next frames at the budget's rate instead of
stopping the animation for ten times its cost, and cheap frames run at the full frame rate. Work
that is not a frame (mounting the canvas, the final answer's Markdown) is not charged to frames.

One helper for the chat, the tools and the wizard's test.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from textual.message_pump import MessagePump
from textual.timer import Timer

UI_CPU_BUDGET = 0.1  # share of one core the UI may spend on live frames while a model runs
UI_CPU_BURST_S = 0.1  # CPU seconds the UI may spend ahead of that share (one second's worth)


class LiveView:
    def __init__(self, node: MessagePump, draw: Callable[[], None], version: Callable[[], Any], *,
                 hz: int = 30) -> None:
        self._node = node
        self._draw = draw
        self._version = version
        self._interval = 1.0 / max(1, int(hz))
        self._timer: Timer = node.set_interval(self._interval, self._tick, pause=True)
        self._shown: Any = object()
        self._credit = UI_CPU_BURST_S
        self._last_wall = 0.0
        self.frames = 0  # draw() calls since start(), for the benchmarks
        self.frame_cpu_s = 0.0  # their cost (build + paint), for the benchmarks

    def start(self) -> None:
        """A job started: draw its first state as soon as there is one."""
        self._shown = object()
        self._credit = UI_CPU_BURST_S
        self._last_wall = time.monotonic()
        self.frames = 0
        self.frame_cpu_s = 0.0
        self._timer.resume()

    def stop(self) -> None:
        self._timer.pause()

    def _tick(self) -> None:
        now = time.monotonic()
        self._credit = min(UI_CPU_BURST_S, self._credit + (now - self._last_wall) * UI_CPU_BUDGET)
        self._last_wall = now
        version = self._version()  # a counter, or the latest event itself (compared by identity)
        if version is None or version is self._shown or (isinstance(version, int) and version == self._shown):
            return
        if self._credit < 0:
            return
        self._shown = version
        self.frames += 1
        started = time.thread_time()
        self._draw()
        self._node.call_after_refresh(self._painted, started)

    def _painted(self, started: float) -> None:
        """The frame is on screen: charge what it cost, from the draw to here."""
        cost = time.thread_time() - started
        self._credit -= cost
        self.frame_cpu_s += cost
