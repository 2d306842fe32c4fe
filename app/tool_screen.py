"""ToolScreen: the NPC workshop and the drafting screen, screens that run jobs on the app's model.

Both borrow the session's engine (app/session.py) for one job at a time and draw it live with a
LiveView. Tool screens are installed on the app under fixed names, so leaving one (Esc, F3 / F5)
and coming back finds it as it was, a running job included.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from dgchat.app.live_view import LiveView
from dgchat.app.session import EngineJob, JobDone, ModelChange, ModelSession
from textual.screen import ModalScreen, Screen

if TYPE_CHECKING:
    from dgchat.app.session import Engine
    from textual.app import App

TOOL_NAMES = ("npc-workshop", "drafting")


class ToolScreen(Screen):
    """A screen that runs jobs on the session's engine and draws them live."""

    TOOL_NAME: ClassVar[str] = ""
    OWNER: ClassVar[str] = ""  # "the NPC workshop": who is generating, in the session's notices

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.job: EngineJob | None = None
        self.live: LiveView | None = None

    @property
    def session(self) -> ModelSession:
        return self.app.session  # type: ignore[attr-defined]

    def on_mount(self) -> None:
        self.live = LiveView(self, self._draw, self._job_version, hz=self.app.config.refresh_hz)
        self.session.watch(self, self._model_changed)
        self.set_interval(0.5, self._idle_status)  # the status line's own clock (drafting: saved / editing)

    def on_screen_resume(self) -> None:
        self.update_status()

    # -- the model ------------------------------------------------------------------------------
    @property
    def engine_busy(self) -> bool:
        return self.job is not None and self.job.running

    def model_status(self) -> str:
        """One line on the model these screens use: the chats' default model."""
        return " · ".join(text for text, _ in self.model_status_parts())

    def model_status_parts(self) -> list[tuple[str, int]]:
        """model_status as ranked parts (ModelSession.status_parts) for a line that fits its width."""
        session = self.session
        if session.loading_path is None and session.engine is not None:
            return session.status_parts(session.path)
        return session.status_parts(session.default_path)

    def engine_for_job(self) -> Engine | None:
        """The loaded engine when a job may start now; otherwise None and a notice saying why
        (and the default model starts loading when nothing is loaded)."""
        if self.engine_busy:
            return None
        session = self.session
        if session.engine is not None and session.loading_path is None and not session.busy:
            return session.engine  # whatever the chat loaded: the tools use the model in memory
        return session.engine_for(session.default_path)

    def _model_changed(self, change: ModelChange) -> None:
        self._idle_status()

    def _idle_status(self) -> None:
        if not self.engine_busy:
            self.update_status()

    # -- jobs -----------------------------------------------------------------------------------
    def start_job(self, job: EngineJob) -> bool:
        job.owner = self.OWNER or job.owner
        if not self.session.start(job, self):
            self.notify(self.session.busy_text() or "The model is not ready.", severity="warning")
            return False
        self.job = job
        assert self.live is not None
        self.live.start()
        self.refresh_bindings()
        return True

    def _job_version(self) -> int | None:
        return self.job.version if self.job is not None else None

    def _draw(self) -> None:
        if self.job is not None:
            self.show_progress(self.job)

    def on_job_done(self, message: JobDone) -> None:
        job = message.job
        if job is not self.job:
            return
        if self.live is not None:
            self.live.stop()
        self.job = None
        self.refresh_bindings()
        self.job_finished(job)

    def stop_job(self) -> None:
        if self.job is not None and self.job.running:
            self.job.stop()
            self.refresh_bindings()

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
