"""The NPC workshop and the drafting screen: running the app's loaded engine from a tool screen.

Both screens share the engine the app has loaded (one generation at a time: the engine holds a
lock). A job runs one call into the engine or `dgchat.npc` on a worker thread. Like the chat's
LiveGeneration, the worker only *stores* the latest StepEvent of each sequence (no message per step,
no waiting on the UI); the screen's timer picks them up at most `refresh_hz` times a second, within
a CPU budget for the UI thread, so drawing never slows the model down.

Tool screens are installed on the app under fixed names, so leaving one (Esc, F3 / F4) and coming
back finds it as it was, a running job included. The app asks `tools_busy()` before switching
models and `stop_tools()` when it quits.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from textual.message import Message
from textual.screen import ModalScreen, Screen
from textual.timer import Timer

from dgchat.model_backend.errors import DgchatError, GenerationCancelled
from dgchat.model_backend.events import StepEvent

if TYPE_CHECKING:
    from textual.app import App

UI_CPU_BUDGET = 0.1  # share of one core the UI may spend on live frames while a model runs
TOOL_NAMES = ("npc-workshop", "drafting")
# every job started per app, until it ends: the engine must not be closed under a running one, even
# after its screen is gone (the app removes screens before it unmounts itself)
_JOBS: weakref.WeakKeyDictionary[Any, set[EngineJob]] = weakref.WeakKeyDictionary()


class EngineJob:
    """One call into the engine, run by a worker thread; the UI reads `latest` and `progress`."""

    def __init__(self, kind: str, run: Callable[[EngineJob], Any]) -> None:
        self.kind = kind
        self._run = run
        self.cancel = threading.Event()
        self.done = threading.Event()
        self.latest: dict[int, StepEvent] = {}  # sequence -> its latest step
        self.phase = ""
        self.progress = (0, 0)  # work units done, planned
        self.version = 0  # bumped whenever something new is stored: the UI repaints only then
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

    def execute(self) -> None:
        self.started_at = time.perf_counter()
        try:
            self.result = self._run(self)
        except BaseException as exc:  # noqa: BLE001 - reported to the UI, never lost in a thread
            self.error = exc
        finally:
            self.done.set()

    # -- the UI side ----------------------------------------------------------------------------
    def stop(self) -> None:
        self.cancel.set()

    @property
    def running(self) -> bool:
        return not self.done.is_set()

    @property
    def cancelled(self) -> bool:
        return isinstance(self.error, GenerationCancelled) or (self.cancel.is_set() and self.error is None)

    def error_text(self) -> str:
        error = self.error
        if error is None:
            return ""
        return str(error) if isinstance(error, DgchatError) else f"{type(error).__name__}: {error}"


class JobDone(Message):
    def __init__(self, job: EngineJob) -> None:
        super().__init__()
        self.job = job


class ToolScreen(Screen):
    """A screen that runs jobs on the app's engine and draws them live."""

    TOOL_NAME: ClassVar[str] = ""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.job: EngineJob | None = None
        self._timer: Timer | None = None
        self._frame_interval = 1 / 30
        self._next_frame_at = 0.0
        self._frame_cpu = 0.0
        self._shown_version = -1
        self._switch_interval = sys.getswitchinterval()

    def on_mount(self) -> None:
        hz = max(1, int(self.app.config.refresh_hz))
        self._frame_interval = 1.0 / hz
        self._timer = self.set_interval(1.0 / hz, self._tick, pause=True)
        self.set_interval(0.5, self._idle_status)

    # -- the model ------------------------------------------------------------------------------
    @property
    def engine_busy(self) -> bool:
        return self.job is not None and self.job.running

    def model_status(self) -> str:
        """One line on the model these screens use: the app's loaded engine."""
        from dgchat.app.app import display_name

        app = self.app
        if app.loading_path is not None:
            return f"Loading {display_name(app.loading_path)}… {100 * app.load_fraction:.0f}%"
        if app.engine is not None:
            return f"{display_name(app.engine_path)} · {app.engine.label}"
        wanted = app.default_model_path
        if wanted is None:
            return "No model — start with dgchat --model PATH, or Ctrl+P → model: open…"
        if wanted in app.load_errors:
            return f"{display_name(wanted)} · failed to load: {app.load_errors[wanted]}"
        return f"{display_name(wanted)} · not loaded (it loads when you generate)"

    def engine_for_job(self) -> Any:
        """The loaded engine when a job may start now; otherwise None and a notice saying why
        (and the default model starts loading when nothing is loaded)."""
        from dgchat.app.app import display_name

        app = self.app
        if self.engine_busy:
            return None
        try:
            if app.chat_screen.generating:
                self.notify("The chat is still answering: stop it (Esc in the chat) or wait.", severity="warning")
                return None
        except LookupError:
            pass
        if app.loading_path is not None:
            self.notify(f"{display_name(app.loading_path)} is still loading; try again when it is ready.")
            return None
        if app.engine is not None:
            return app.engine
        if app.default_model_path is None:
            self.notify("No model: start dgchat with --model PATH, or Ctrl+P → model: open…", severity="warning",
                        timeout=8)
            return None
        if app.load_model(app.default_model_path):
            self.notify(f"Loading {display_name(app.default_model_path)}; try again when it is ready.")
        return None

    # -- jobs -----------------------------------------------------------------------------------
    def start_job(self, job: EngineJob) -> None:
        self.job = job
        jobs = _JOBS.setdefault(self.app, set())
        jobs.difference_update([j for j in jobs if not j.running])
        jobs.add(job)
        self._shown_version = -1
        self._next_frame_at = 0.0
        self._frame_cpu = time.thread_time()
        # the sampler thread needs the GIL back after every llama.cpp call (see ChatScreen)
        self._switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(min(self._switch_interval, 0.0005))
        if self._timer is not None:
            self._timer.resume()
        self.refresh_bindings()

        def work() -> None:
            job.execute()
            self.post_message(JobDone(job))

        self.run_worker(work, thread=True, group=f"{self.TOOL_NAME}-job", exit_on_error=False)

    def _tick(self) -> None:
        job = self.job
        if job is None or job.version == self._shown_version:
            return
        now = time.monotonic()
        if now < self._next_frame_at:
            return
        # frame budget, as on the chat screen: on a slow machine frames get rarer, the model not slower
        cpu = time.thread_time()
        spent = cpu - self._frame_cpu
        self._frame_cpu = cpu
        self._next_frame_at = now + max(self._frame_interval, spent / UI_CPU_BUDGET)
        self._shown_version = job.version
        self.show_progress(job)

    def on_job_done(self, message: JobDone) -> None:
        job = message.job
        if job is not self.job:
            return
        if self._timer is not None:
            self._timer.pause()
        sys.setswitchinterval(self._switch_interval)
        self.job = None
        self.refresh_bindings()
        self.job_finished(job)

    def stop_job(self) -> None:
        if self.job is not None and self.job.running:
            self.job.stop()
            self.refresh_bindings()

    async def stop_and_wait(self, timeout: float = 5.0) -> None:
        job = self.job
        if job is None or not job.running:
            return
        job.stop()
        deadline = time.monotonic() + timeout
        while job.running and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

    def before_exit(self) -> None:
        """The app is quitting: save what must not be lost."""

    def on_unmount(self) -> None:
        if self.job is not None:
            self.job.stop()

    # -- for subclasses -------------------------------------------------------------------------
    def show_progress(self, job: EngineJob) -> None:
        """Draw the job's latest state (UI thread, at most refresh_hz times a second)."""

    def job_finished(self, job: EngineJob) -> None:
        """The job ended: result, error or cancelled."""

    def _idle_status(self) -> None:
        if not self.engine_busy:
            self.update_status()

    def update_status(self) -> None:
        """Repaint the status line (model state changes while idle)."""


# -- the app's side ----------------------------------------------------------------------------

def open_tool(app: App, name: str, factory: Callable[[], ToolScreen]) -> None:
    """Show the tool screen `name` (created on first use, then kept): over the chat, or in place of
    the other tool screen."""
    if isinstance(app.screen, ModalScreen):
        return
    if not app.is_screen_installed(name):
        app.install_screen(factory(), name)
    screen = app.get_screen(name)
    if app.screen is screen:
        return
    if isinstance(app.screen, ToolScreen):
        app.switch_screen(name)
    else:
        app.push_screen(name)


def tool_screens(app: App) -> list[ToolScreen]:
    screens = []
    for name in TOOL_NAMES:
        if app.is_screen_installed(name):
            screen = app.get_screen(name)
            if isinstance(screen, ToolScreen):
                screens.append(screen)
    return screens


def tools_busy(app: App) -> bool:
    """Whether a tool screen's job is running the engine (the model must not be switched or closed)."""
    return any(job.running for job in _JOBS.get(app, ()))


async def stop_tools(app: App, timeout: float = 5.0) -> None:
    for screen in tool_screens(app):
        await screen.stop_and_wait(timeout)
        screen.before_exit()
