"""LiveView: repaint a running job on screen at the frame rate, within a CPU budget.

The job's worker thread only stores its latest state; a timer on the UI thread asks `version()`
whether anything new arrived and, if so, calls `draw()`. Frame budget: the UI thread's CPU time
since the last frame (building it, Textual's compositor, terminal output) may be at most
UI_CPU_BUDGET of the wall time, so on a slow or busy machine the picture updates less often
instead of slowing the model down. One helper for the chat, the tools and the wizard's test.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from textual.message_pump import MessagePump
from textual.timer import Timer

UI_CPU_BUDGET = 0.1  # share of one core the UI may spend on live frames while a model runs


class LiveView:
    def __init__(self, node: MessagePump, draw: Callable[[], None], version: Callable[[], Any], *,
                 hz: int = 30) -> None:
        self._draw = draw
        self._version = version
        self._interval = 1.0 / max(1, int(hz))
        self._timer: Timer = node.set_interval(self._interval, self._tick, pause=True)
        self._shown: Any = object()
        self._next_frame_at = 0.0
        self._frame_cpu = 0.0

    def start(self) -> None:
        """A job started: draw its first state as soon as there is one."""
        self._shown = object()
        self._next_frame_at = 0.0
        self._frame_cpu = time.thread_time()
        self._timer.resume()

    def stop(self) -> None:
        self._timer.pause()

    def _tick(self) -> None:
        version = self._version()  # a counter, or the latest event itself (compared by identity)
        if version is None or version is self._shown or (isinstance(version, int) and version == self._shown):
            return
        now = time.monotonic()
        if now < self._next_frame_at:
            return
        cpu = time.thread_time()
        spent = cpu - self._frame_cpu
        self._frame_cpu = cpu
        self._next_frame_at = now + max(self._interval, spent / UI_CPU_BUDGET)
        self._shown = version
        self._draw()
