"""One worker thread owns the engine; requests wait in a bounded queue in front of it.

The event loop never runs a generation: it submits a job (a function of the engine), and reads the
job's messages (stream events, then a result or an error) from an asyncio queue that the worker
feeds with call_soon_threadsafe. A full queue refuses new jobs at once (the server answers 429), a
job whose client went away is cancelled (skipped if it has not started), and shutdown cancels the
running job and refuses the waiting ones.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from dgchat.model_backend.engine_protocol import LocalEngine
from dgchat.model_backend.errors import GenerationCancelled


class QueueFull(Exception):
    pass


class ShuttingDown(Exception):
    pass


Emit = Callable[[Any], None]
JobFn = Callable[[Any, threading.Event, Emit], Any]  # (engine, cancel, emit) -> result


@dataclass
class Job:
    fn: JobFn
    loop: asyncio.AbstractEventLoop
    cancel: threading.Event = field(default_factory=threading.Event)
    messages: asyncio.Queue = field(default_factory=asyncio.Queue)
    started: bool = False
    finished: bool = False

    def _post(self, kind: str, value: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.messages.put_nowait, (kind, value))
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    async def stream(self) -> AsyncIterator[Any]:
        """The job's events as they come; returns after its result (raises its error)."""
        while True:
            kind, value = await self.messages.get()
            if kind == "event":
                yield value
            elif kind == "result":
                self.result = value
                return
            else:
                raise value

    async def wait(self) -> Any:
        async for _ in self.stream():
            pass
        return self.result


class GenerationService:
    def __init__(self, engine: LocalEngine, *, max_queue: int = 8) -> None:
        self.engine = engine
        self.max_queue = max_queue
        self._waiting: collections.deque[Job] = collections.deque()
        self._cond = threading.Condition()
        self._running: Job | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._work, name="dgchat-generation", daemon=True)
        self._thread.start()

    # -- called on the event loop -------------------------------------------------------------
    def submit(self, fn: JobFn) -> Job:
        job = Job(fn, asyncio.get_running_loop())
        with self._cond:
            if self._closed:
                raise ShuttingDown
            if len(self._waiting) >= self.max_queue and (self._running is not None or self._waiting):
                raise QueueFull
            self._waiting.append(job)
            self._cond.notify()
        return job

    def cancel(self, job: Job) -> None:
        """Cancel a job: a waiting one leaves the queue at once (its place is free again)."""
        job.cancel.set()
        with self._cond:
            try:
                self._waiting.remove(job)
            except ValueError:
                return  # running or finished: the engine sees the cancel flag
        job.finished = True
        job._post("error", GenerationCancelled("the client went away"))

    def status(self) -> dict[str, int]:
        with self._cond:
            return {"running": int(self._running is not None), "queued": len(self._waiting),
                    "max_queue": self.max_queue}

    def close(self, *, cancel_running: bool = True) -> None:
        """Refuse new jobs; fail the waiting ones with ShuttingDown; cancel the running one."""
        with self._cond:
            self._closed = True
            waiting = list(self._waiting)
            self._waiting.clear()
            if cancel_running and self._running is not None:
                self._running.cancel.set()
            self._cond.notify_all()
        for job in waiting:
            job.finished = True
            job._post("error", ShuttingDown())

    def join(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # -- the worker thread ---------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._closed:
                    self._cond.wait()
                if not self._waiting:
                    return  # closed and drained
                job = self._waiting.popleft()
                self._running = job
            try:
                if job.cancel.is_set():
                    job._post("error", GenerationCancelled("the client went away"))
                    continue
                job.started = True
                result = job.fn(self.engine, job.cancel, lambda event, job=job: job._post("event", event))
                job._post("result", result)
            except Exception as exc:  # noqa: BLE001 - every failure goes back to its request
                job._post("error", exc)
            finally:
                job.finished = True
                with self._cond:
                    self._running = None
