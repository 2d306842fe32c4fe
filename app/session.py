"""The one owner of the loaded model: `ModelSession`, held by the app as `app.session`.

Every screen that needs the model asks the session; screens never ask each other.

- **Loading.** One loader for the chat, the wizard, the Models screen and the tools: a thread
  worker, llama.cpp's progress callback feeding `load_fraction`, a failure kept per path for the
  status lines. One engine is loaded at a time; loading another closes the old one.
- **Lending.** The engine runs one `EngineJob` at a time (a chat answer, a batch of NPC lines, a
  drafting proposal, the wizard's test). `start()` lends it to a job and runs the job on a worker
  thread; `busy` and `busy_text()` say whether and for whom it is working; `stop_all()` stops
  whatever runs (quitting). A job's worker only *stores* its latest step events; the owner's
  `LiveView` picks them up at the frame rate (app/live_view.py).
- **Watching.** Screens `watch()` the session and get a `ModelChange` (loading, loaded, failed,
  busy, idle) on the UI thread whenever something changed.

Worker threads reach the UI thread through `SessionCall` messages the app runs, never by waiting
on it, so a thread that finishes while the app is closing cannot hang.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dgchat.app import model_source
from dgchat.model_backend.engine_protocol import Engine, served
from dgchat.app.error_modal import ErrorModal
from dgchat.app.model_source import ModelSource, ServerSource, as_source
from dgchat.app.paths import display_name, short_path
from dgchat.model_backend import loader
from dgchat.model_backend.errors import GenerationCancelled, error_text
from dgchat.model_backend.events import StepEvent
from dgchat.remote.engine import RemoteEngine
from textual.message import Message
from textual.message_pump import MessagePump

if TYPE_CHECKING:
    from dgchat.config import Config
    from textual.app import App

__all__ = ["Engine", "EngineJob", "JobDone", "ModelChange", "ModelSession", "SessionCall", "load_engine"]


def load_engine(path: ModelSource, *, n_gpu_layers: int | None, n_threads: int | None,
                progress: Callable[[float], bool], precise: bool = False, experts_on: str = "auto") -> Engine:
    """Load a model file, or connect to a server's model (tests replace this to wrap the engine).
    precise: config.toml's [engine] precise (f32 KV cache, no flash attention; a server has its own);
    n_gpu_layers, experts_on: its [engine] gpu_layers and experts_on (model_backend/placement.py)."""
    if isinstance(path, ServerSource):
        # the server's /v1/models answers here: a dead server or a wrong key fails the "load"
        engine = RemoteEngine.connect(path.url, api_key=path.api_key, retries=model_source.SERVER_RETRIES)
        progress(1.0)
        return engine

    return loader.load_engine(path, n_gpu_layers=n_gpu_layers, n_threads=n_threads, progress=progress,
                              precise=precise, experts_on=experts_on)


# -- jobs ----------------------------------------------------------------------------------------

class EngineJob:
    """One piece of work on the engine, run by a worker thread; the UI reads `latest`/`progress`.

    `run(job)` does the work with `job.engine` and returns the result; it records step events with
    `record()` and stops at the next step once `job.cancel` is set. `version` changes whenever
    something new was recorded, so the screen repaints only then."""

    def __init__(self, kind: str, run: Callable[[EngineJob], Any] | None = None, *, owner: str = "") -> None:
        self.kind = kind
        self.owner = owner or kind  # who runs it, for "… is still generating"
        self._run = run
        self.engine: Engine | None = None  # lent by the session when the job starts
        self.cancel = threading.Event()
        self.done = threading.Event()
        self.latest: dict[int, StepEvent] = {}  # sequence -> its latest step
        self.phase = ""
        self.progress = (0, 0)  # work units done, planned
        self.version = 0
        self.result: Any = None
        self.error: BaseException | None = None
        self.started_at = 0.0

    # -- the worker side ------------------------------------------------------------------------
    def record(self, index: int, event: Any, *, phase: str | None = None,
               progress: tuple[int, int] | None = None) -> None:
        if isinstance(event, StepEvent):
            self.latest[index] = event
        if phase is not None:
            self.phase = phase
        if progress is not None:
            self.progress = progress
        self.version += 1

    def work(self) -> Any:
        """The job itself (subclasses override, or pass `run`)."""
        assert self._run is not None
        return self._run(self)

    def finished(self) -> None:
        """Runs on the worker thread after `work`, error or not (saving what must not be lost)."""

    def execute(self) -> None:
        self.started_at = time.perf_counter()
        try:
            self.result = self.work()
        except BaseException as exc:  # noqa: BLE001 - reported to the UI, never lost in a thread
            self.error = exc
        finally:
            try:
                self.finished()
            finally:
                self.done.set()

    # -- the UI side ----------------------------------------------------------------------------
    def stop(self) -> None:
        self.cancel.set()

    @property
    def running(self) -> bool:
        return not self.done.is_set()

    @property
    def event(self) -> StepEvent | None:
        """The latest step of sequence 0 (single-answer jobs)."""
        return self.latest.get(0)

    @property
    def cancelled(self) -> bool:
        return isinstance(self.error, GenerationCancelled) or (self.cancel.is_set() and self.error is None)

    def error_text(self) -> str:
        return error_text(self.error) if self.error is not None else ""


class JobDone(Message):
    """Posted to a job's owner (a screen) when the job has ended."""

    def __init__(self, job: EngineJob) -> None:
        super().__init__()
        self.job = job


class SessionCall(Message):
    """A session callback from a worker thread; the app runs it on the UI thread."""

    def __init__(self, fn: Callable[..., None], *args: Any) -> None:
        super().__init__()
        self.fn = fn
        self.args = args


@dataclass(frozen=True)
class ModelChange:
    """What changed: "loading" (also progress), "loaded", "failed", "busy", "idle", "default"."""

    kind: str
    path: ModelSource | None = None
    error: str = ""


# -- the session ---------------------------------------------------------------------------------

class ModelSession:
    def __init__(self, app: App, config: Config, default_path: ModelSource | None) -> None:
        self.app = app
        self.config = config
        # a file, or a server (app/model_source.py): the "paths" below are sources of either kind
        self.default_path: ModelSource | None = as_source(default_path) if default_path else None
        self.engine: Engine | None = None
        self.path: ModelSource | None = None  # the loaded engine's file (or server)
        self.loading_path: ModelSource | None = None
        self.load_fraction = 0.0
        self.load_errors: dict[ModelSource, str] = {}  # last failure per model, for the status lines
        self.job: EngineJob | None = None
        self.closing = threading.Event()
        self._pending_load: tuple[ModelSource, bool] | None = None  # waits for the running job to stop
        self._watchers: weakref.WeakKeyDictionary[MessagePump, Callable[[ModelChange], None]] = (
            weakref.WeakKeyDictionary())
        self._switch_interval = sys.getswitchinterval()
        self._close_lock = threading.Lock()
        self._orphan: Engine | None = None  # closed by the running job's thread when it ends (close())

    # -- watching -------------------------------------------------------------------------------
    def watch(self, node: MessagePump, callback: Callable[[ModelChange], None]) -> None:
        """Call `callback(change)` on the UI thread after every change, while `node` runs."""
        self._watchers[node] = callback

    def _changed(self, kind: str, path: ModelSource | None = None, error: str = "") -> None:
        change = ModelChange(kind, path, error)
        for node, callback in list(self._watchers.items()):
            if node.is_running:
                callback(change)

    # -- state ----------------------------------------------------------------------------------
    def loaded(self, path: ModelSource | None) -> Engine | None:
        """The engine when `path` is the loaded model, else None."""
        if self.engine is not None and path is not None and self.path == as_source(path):
            return self.engine
        return None

    @property
    def busy(self) -> bool:
        return self.job is not None and self.job.running

    def busy_text(self) -> str:
        job = self.job
        if job is None or not job.running:
            return ""
        return f"{job.owner[:1].upper()}{job.owner[1:]} is still generating: stop it (Esc there) or wait."

    def loaded_url(self) -> str:
        """The URL of the server whose model is loaded ("" for a local model)."""
        return self.path.url if isinstance(self.path, ServerSource) else ""

    def model_name(self, source: ModelSource | None) -> str:
        """A model as status lines and saved answers name it: its file name, or for a server the
        served model's id once connected ("tiny-llada on 127.0.0.1:8765")."""
        engine = self.loaded(source)
        if isinstance(source, ServerSource) and engine is not None:
            server = served(engine)
            return f"{server.model_id if server is not None else 'model'} on {source.host}"
        return display_name(source)

    def status_text(self, wanted: ModelSource | None, *, when: str = "it loads when you generate") -> str:
        """One line on `wanted` (a chat's model, or the default): loading, loaded, failed or idle."""
        return " · ".join(text for text, _ in self.status_parts(wanted, when=when))

    def status_parts(self, wanted: ModelSource | None, *,
                     when: str = "it loads when you generate") -> list[tuple[str, int]]:
        """status_text as (text, rank) parts for a status line that fits its width: a loaded model's
        engine label (rank 4) is the first thing a narrow line leaves out (status_bar.fit_parts)."""
        if self.loading_path is not None:
            return [(f"Loading {display_name(self.loading_path)}… {100 * self.load_fraction:.0f}%", 0)]
        if wanted is None:
            return [("No model — start with dgchat --model PATH, or Ctrl+P → model: open…", 0)]
        engine = self.loaded(wanted)
        if engine is not None:
            return [(self.model_name(wanted), 0), (engine.label, 4)]
        if wanted in self.load_errors:
            return [(display_name(wanted), 0), (f"failed to load: {self.load_errors[wanted]}", 0)]
        return [(display_name(wanted), 0), (f"not loaded ({when})", 1)]

    # -- loading --------------------------------------------------------------------------------
    def load(self, path: ModelSource, *, force: bool = False, preempt: bool = False, report: bool = True) -> bool:
        """Start loading `path` unless it is loaded or loading. While a job runs the engine cannot
        change: with `preempt` the job is stopped and the load starts when it has ended, otherwise
        nothing happens and the user is told why (False). `report`: a failure opens a dialog."""
        path = as_source(path)
        if not force and self.loaded(path) is not None:
            return True
        if self.loading_path == path:
            return True
        if self.busy:
            if not preempt:
                self.app.notify(f"{self.busy_text()} Then the model can change.", severity="warning")
                return False
            assert self.job is not None
            self.job.stop()
            self._pending_load = (path, report)
            return True
        self.loading_path = path
        self.load_fraction = 0.0
        self.load_errors.pop(path, None)
        self._load_in_thread(path, report)
        self._changed("loading", path)
        return True

    def use_default(self, path: ModelSource) -> None:
        """`path` becomes the model of chats without their own (the caller saved it in the config)."""
        self.default_path = as_source(path)
        self._changed("default", self.default_path)

    def _load_in_thread(self, path: ModelSource, report: bool) -> None:
        config, closing, app = self.config, self.closing, self.app
        last = [0.0, -1.0]

        def progress(fraction: float) -> bool:
            now = time.monotonic()
            if fraction >= 1.0 or fraction - last[1] >= 0.01 and now - last[0] >= 0.05:
                last[0], last[1] = now, fraction
                app.post_message(SessionCall(self._progress, path, fraction))
            return not closing.is_set()  # False aborts the load when the app quits

        def work() -> None:
            try:
                engine = load_engine(path, n_gpu_layers=config.n_gpu_layers, n_threads=config.n_threads,
                                     progress=progress, precise=bool(getattr(config, "precise", None)),
                                     experts_on=getattr(config, "experts_on", None) or "auto")
            except BaseException as exc:  # noqa: BLE001 - shown to the user, not raised in a thread
                app.post_message(SessionCall(self._failed, path, error_text(exc), report))
                return
            if closing.is_set() or not app.post_message(SessionCall(self._loaded, path, engine)):
                engine.close()

        app.run_worker(work, thread=True, group="model-load", exit_on_error=False, name=f"load {display_name(path)}")

    def _progress(self, path: ModelSource, fraction: float) -> None:
        if path == self.loading_path:
            self.load_fraction = fraction
            self._changed("loading", path)

    def _loaded(self, path: ModelSource, engine: Engine) -> None:
        if path != self.loading_path or self.closing.is_set():
            engine.close()  # superseded by a later request, or the app is going away
            return
        old = self.engine
        self.engine, self.path = engine, path
        self.loading_path = None
        if old is not None and old is not engine:
            old.close()  # never busy here: loads do not start while a job runs
        self._changed("loaded", path)

    def _failed(self, path: ModelSource, message: str, report: bool) -> None:
        if path != self.loading_path:
            return
        self.loading_path = None
        self.load_errors[path] = message
        if report:
            title = "Server not available" if isinstance(path, ServerSource) else "Model failed to load"
            self.app.push_screen(ErrorModal(title, f"{short_path(path)}\n\n{message}"))
        self._changed("failed", path, message)

    # -- lending --------------------------------------------------------------------------------
    def engine_for(self, wanted: ModelSource | None, *, notify: bool = True) -> Engine | None:
        """The engine for a job on `wanted` when one may start now; otherwise None, a notice saying
        why, and `wanted` starts loading when it is not loaded."""
        def say(text: str, **kwargs: Any) -> None:
            if notify:
                self.app.notify(text, **kwargs)

        if self.busy:
            say(self.busy_text(), severity="warning")
            return None
        if wanted is None:
            say("No model: start dgchat with --model PATH, or Ctrl+P → model: open…", severity="warning", timeout=8)
            return None
        engine = self.loaded(wanted)
        if engine is not None and self.loading_path is None:
            return engine
        if self.loading_path is not None:
            say(f"{display_name(self.loading_path)} is still loading; try again when it is ready.")
            return None
        if self.load(wanted):
            say(f"Loading {display_name(wanted)}; try again when it is ready.")
        return None

    def start(self, job: EngineJob, owner: MessagePump) -> bool:
        """Lend the loaded engine to `job` and run it on a worker thread; `owner` gets JobDone."""
        if self.busy or self.engine is None or self.closing.is_set():
            return False
        job.engine = self.engine
        self.job = job
        # The job's thread needs the GIL back after every llama.cpp call; with Python's default 5 ms
        # switch interval a busy UI thread could hold it that long each time. 0.5 ms keeps the wait
        # negligible next to a denoising step.
        self._switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(min(self._switch_interval, 0.0005))
        app = self.app

        def work() -> None:
            job.execute()
            with self._close_lock:
                orphan = self._orphan if self._orphan is job.engine else None
                if orphan is not None:
                    self._orphan = None
            if orphan is not None:  # the app went away while this job ran: it was the engine's last user
                orphan.close()
            owner.post_message(JobDone(job))
            app.post_message(SessionCall(self._ended, job))

        app.run_worker(work, thread=True, group="engine-job", exit_on_error=False, name=job.kind)
        self._changed("busy")
        return True

    def _ended(self, job: EngineJob) -> None:
        if job is not self.job:
            return
        self.job = None
        sys.setswitchinterval(self._switch_interval)
        pending, self._pending_load = self._pending_load, None
        self._changed("idle")
        if pending is not None and not self.closing.is_set():
            self.load(pending[0], report=pending[1])

    # -- ending ---------------------------------------------------------------------------------
    async def stop_all(self, timeout: float = 5.0) -> None:
        """Stop the running job and wait (up to `timeout`) for it to end; its owner saves it."""
        job = self.job
        if job is None or not job.running:
            return
        job.stop()
        deadline = time.monotonic() + timeout
        while job.running and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

    def close(self) -> None:
        """The app is going away: no more loads; the engine is closed now, or by the job still using
        it when that job ends (it was told to stop; the lock decides which of the two closes it)."""
        self.closing.set()
        with self._close_lock:
            engine, self.engine = self.engine, None
            if engine is not None and self.busy:
                self._orphan, engine = engine, None
        if engine is not None:
            engine.close()
