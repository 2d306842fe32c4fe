"""One hub call (pull, import, verify, storing a token, measuring the machine) in a thread worker, with
its progress, result or error handed to the UI thread.

The calls block and may take minutes. Their progress callback is called in the worker thread;
`start_hub_task` throttles it to ten reports a second (plus every phase change) and hands each to
the UI thread with `App.call_from_thread`. The task's cancel event pauses a download (the partial
file is kept and the next pull resumes it); closing the task (the screen goes away) also stops the
hand-over, so a worker never waits on a UI that is shutting down.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dgchat.hub import Progress
from textual.widget import Widget

PROGRESS_EVERY = 0.1  # seconds between progress hand-overs to the UI (phase changes always go through)


@dataclass
class HubTask:
    """A running hub call: `stop()` pauses it (cancel event), `close()` also stops UI hand-overs."""

    name: str
    cancel: threading.Event = field(default_factory=threading.Event)
    closing: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    last: Progress | None = None

    @property
    def running(self) -> bool:
        return not self.done.is_set()

    def stop(self) -> None:
        self.cancel.set()

    def close(self) -> None:
        self.closing.set()
        self.cancel.set()


def start_hub_task(
    node: Widget,
    name: str,
    call: Callable[[Callable[[Progress], None], threading.Event], Any],
    *,
    progress: Callable[[Progress], None],
    done: Callable[[Any], None],
    failed: Callable[[BaseException], None],
) -> HubTask:
    """Run `call(on_progress, cancel)` in a thread worker of `node`; its progress, result or error
    reach `progress` / `done` / `failed` on the UI thread."""
    task = HubTask(name)
    app = node.app
    last_sent = [0.0, ""]

    def hand_over(callback: Callable[..., Any], *args: Any) -> None:
        if task.closing.is_set():
            return
        try:
            app.call_from_thread(callback, *args)
        except RuntimeError:  # the app is not running any more
            pass

    def on_progress(p: Progress) -> None:
        task.last = p
        now = time.monotonic()
        if p.phase != last_sent[1] or now - last_sent[0] >= PROGRESS_EVERY or (p.total and p.done >= p.total):
            last_sent[0], last_sent[1] = now, p.phase
            hand_over(progress, p)

    def work() -> None:
        try:
            result = call(on_progress, task.cancel)
        except BaseException as exc:  # noqa: BLE001 - shown to the user, never lost in a thread
            task.done.set()
            hand_over(failed, exc)
        else:
            task.done.set()
            hand_over(done, result)

    node.run_worker(work, thread=True, group="hub", exit_on_error=False, name=name)
    return task
