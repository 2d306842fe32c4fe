"""The first-run wizard's screen: the title, the steps line, one step at a time (a ContentSwitcher
of the step widgets of this package) and the button bar (nav.py).

The screen holds what crosses steps: how it was opened, the model catalog, the model chosen (a file
or a server) and the step shown. It hands a step what it needs when it shows it, asks the current
step what the bar offers and passes the main button on to it; the steps answer with messages
(messages.py), and the screen decides what follows.

Run again later from the command palette (setup: run again, or setup: correct the hardware values,
which opens at step 2): then "Close" leaves it without changing anything, and only "Start chatting"
changes the default model.

Small terminals: below NARROW columns the bar's buttons take short labels and the steps line numbers
the other steps only; below SHORT rows the buttons lose their borders and the model table shows fewer
rows; every step's body scrolls. The steps line marks a step passed over with '–' (the download,
when the model needed none).
"""

from __future__ import annotations

from collections.abc import Callable

from dgchat.app import model_ops
from dgchat.app.generation import ChatAnswer
from dgchat.app.hub_task import HubTask
from dgchat.app.model_source import ModelSource, ServerSource
from dgchat.app.no_model_screen import NoModelScreen
from dgchat.app.paths import short_path
from dgchat.app.widgets.canvas import LiveCanvas
from dgchat.app.widgets.checkpoint_pull import PullPanel
from dgchat.app.widgets.steady_cursor import steady_cursors_when_headless
from dgchat.app.wizard.download import DownloadStep
from dgchat.app.wizard.hardware import HardwareStep
from dgchat.app.wizard.messages import (
    Downloaded,
    Finished,
    GetModel,
    GoToStep,
    NavChanged,
    NextRequested,
    ServerChoice,
    SpeedChanged,
    UseModel,
    UseServer,
)
from dgchat.app.wizard.model_choice import ModelStep
from dgchat.app.wizard.nav import WizardNav
from dgchat.app.wizard.ready import ReadyStep
from dgchat.app.wizard.server import ServerStep
from dgchat.app.wizard.step import NARROW, SHORT, STEPS, WizardStep
from dgchat.app.wizard.steps_line import StepsLine
from dgchat.app.wizard.welcome import WelcomeStep
from dgchat.config import save_default_model
from dgchat.hub import Hardware
from dgchat.hub.download import Progress
from dgchat.hub.manager import ModelManager, ModelRow, PullResult
from dgchat.hub.registry import InstalledModel
from dgchat.model_backend.errors import DgchatError
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import Button, ContentSwitcher, Input, Label


class WizardScreen(Screen[None]):
    """Pushed over the chat screen by DgchatApp.first_run_screen(); dismissed into the chat."""

    # the rest of its CSS, and what changes on a small terminal (-narrow, -short), is in dgchat.tcss
    DEFAULT_CSS = """
    #wiz-models { scrollbar-size-vertical: 1; }
    #srv-grid { grid-size: 2; grid-columns: 10 1fr; grid-rows: 1; grid-gutter: 1 1; height: auto; margin-bottom: 1; }
    #srv-grid Checkbox, #srv-grid Checkbox:focus { border: none; height: 1; }
    #srv-key-note, #srv-result { margin-bottom: 1; }
    """

    BINDINGS = [Binding("escape", "back", "Back", show=False)]

    def __init__(self, *, rerun: bool = False, start: str = "welcome") -> None:
        """`rerun`: opened from the palette after setup (Close instead of Skip setup, nothing is
        written unless the user finishes); `start`: the step to open at ("hardware" to correct
        the detected values)."""
        super().__init__(id="wizard-screen")
        if start not in ("welcome", "hardware"):
            raise ValueError(f"the wizard starts at welcome or hardware, not {start!r}")
        self.rerun = rerun
        self.start_step = start
        self.step = start
        self.mgr: ModelManager | None = None
        self.catalog_error = ""  # why the catalog could not be read (then setup cannot go on)
        self.model_path: ModelSource | None = None  # a file, or the server of the server form
        self.server: ServerChoice | None = None  # the server form's, once chosen
        self.welcome_step = WelcomeStep()
        self.hardware_step = HardwareStep()
        self.model_step = ModelStep()
        self.server_step = ServerStep()
        self.download_step = DownloadStep()
        self.ready_step = ReadyStep()
        self.steps: dict[str, WizardStep] = {
            "welcome": self.welcome_step, "hardware": self.hardware_step, "model": self.model_step,
            "server": self.server_step, "download": self.download_step, "ready": self.ready_step}

    def compose(self) -> ComposeResult:
        with Vertical(id="wizard"):
            yield Label("dgchat setup", id="wiz-title")
            yield StepsLine()
            with ContentSwitcher(initial="step-welcome", id="wiz-body"):
                yield self.welcome_step
                yield self.hardware_step
                yield self.model_step
                yield self.server_step
                yield self.download_step
                yield self.ready_step
            yield WizardNav()

    def on_mount(self) -> None:
        steady_cursors_when_headless(self)
        self._fit_to_size()
        try:
            self.mgr = model_ops.make_manager()
        except DgchatError as exc:  # a broken catalog: setup cannot offer downloads
            self.catalog_error = f"The model catalog could not be read: {exc}"
            self.welcome_step.show_catalog_error(self.catalog_error)
        self.go(self.start_step)

    @property
    def nav(self) -> WizardNav:
        return self.query_one(WizardNav)

    # -- navigation -----------------------------------------------------------------------------
    def go(self, step: str) -> None:
        """Show `step` (one of STEPS, or "server"), handing it what it needs."""
        self.step = step
        self.query_one(ContentSwitcher).current = f"step-{step}"
        self._show_steps()
        if step == "hardware":
            self.hardware_step.enter(self.mgr.models_dir if self.mgr is not None else None, self.catalog_error)
        elif step == "model":
            speed = self.hardware_step.ensure_profile()
            self.model_step.enter(self.mgr, self.hardware_step.hw, speed)
        elif step == "server":
            self.server_step.enter()
        elif step == "ready":
            # measuring beside the test would skew both: stopped (nothing saved; measured next time)
            self.hardware_step.stop_measuring()
            assert self.model_path is not None
            server = self.server if isinstance(self.model_path, ServerSource) else None
            self.ready_step.enter(self.model_path, self.model_step.choice, server)
        self._nav()
        self.call_after_refresh(self._focus_step)

    def _focus_step(self) -> None:
        target = self.steps[self.step].focus_target()
        if target is not None:
            target.focus()
            return
        main = self.nav.button("wiz-next")
        if main.display and not main.disabled:
            main.focus()

    def download_skipped(self) -> bool:
        """Whether the model the ready step uses came without the download step: the bundled model,
        an installed one, a server (also after a download of another model failed or was paused)."""
        got = self.download_step.done_path
        return got is None or self.model_path != got

    def _show_steps(self) -> None:
        self.query_one(StepsLine).show(self.step, download_skipped=self.download_skipped(), width=self.app.size.width)

    def _fit_to_size(self) -> None:
        """Short labels below NARROW columns, borderless buttons below SHORT rows (see the module
        docstring); the main button is docked (dgchat.tcss) and needs nothing here."""
        width, height = self.app.size
        narrow, short = width < NARROW, height < SHORT
        changed = narrow != self.has_class("-narrow") or short != self.has_class("-short")
        self.set_class(narrow, "-narrow")
        self.set_class(short, "-short")
        self.nav.set_compact(short)
        if changed and self.is_mounted:
            self._show_steps()
            self._nav()
            self.hardware_step.show_speed()  # its labels' width follows the grid's narrow column

    def on_resize(self, _event: events.Resize) -> None:
        self._fit_to_size()
        self._show_steps()
        if self.step == "model":
            self.model_step.fit_width()

    def _nav(self) -> None:
        """Which buttons the current step offers, and what they say."""
        self.nav.show(self.steps[self.step].nav_plan(), rerun=self.rerun, narrow=self.has_class("-narrow"),
                      width=self.app.size.width)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        actions: dict[str, Callable[[], None]] = {
            "wiz-next": self.action_next,
            "wiz-back": self.action_back,
            "wiz-skip": self.skip,
            "wiz-close": self.close,
            "wiz-redetect": self.hardware_step.redetect,
            "wiz-server": lambda: self.go("server"),
            "wiz-bundled": self.model_step.choose_bundled,  # on the model step, or after a failed download
            "wiz-cancel": self.download_step.cancel,
            "wiz-retry": self.download_step.retry,
            "wiz-retest": self.ready_step.start_test,
        }
        action = actions.get(event.button.id or "")
        if action is not None:
            action()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        """Enter in a form field (the machine step's, the server form's) does what Next does: the
        server form checks, the machine step applies the values typed (or says what is wrong with
        one) and goes on."""
        event.stop()
        self.action_next()

    def action_next(self) -> None:
        main = self.nav.button("wiz-next")
        if main.disabled or not main.display:
            return
        self.steps[self.step].next()

    def action_back(self) -> None:
        if self.step == "welcome" or (self.rerun and self.step == self.start_step):
            if self.rerun:
                self.close()
            return
        if self.step == "download":
            if self.download_step.running:
                return
            self.go("model")
        elif self.step == "server":
            self.go("model")
        elif self.step == "ready":
            self.ready_step.stop_test()
            self.go("server" if isinstance(self.model_path, ServerSource) else "model")
        else:
            self.go(STEPS[STEPS.index(self.step) - 1])

    # -- what the steps report ------------------------------------------------------------------
    def on_go_to_step(self, message: GoToStep) -> None:
        message.stop()
        self.go(message.step)

    def on_nav_changed(self, message: NavChanged) -> None:
        message.stop()
        self._nav()
        if message.focus == "step":
            self.call_after_refresh(self._focus_step)
        elif message.focus:
            button = self.nav.button(message.focus)
            self.call_after_refresh(button.focus)

    def on_next_requested(self, message: NextRequested) -> None:
        message.stop()
        self.action_next()

    def on_speed_changed(self, message: SpeedChanged) -> None:
        message.stop()
        self.model_step.set_speed(message.report)
        if message.settled and self.step == "model":
            self.model_step.fill()

    def on_use_model(self, message: UseModel) -> None:
        message.stop()
        self.model_path = message.path
        self.go("ready")

    def on_get_model(self, message: GetModel) -> None:
        message.stop()
        assert self.mgr is not None  # the model step lists nothing without the catalog
        self.model_path = None
        self.download_step.prepare(self.mgr, message.row, keep_checkpoint=message.keep_checkpoint,
                                   offer_bundled=self.model_step.bundled_row() is not None)
        self.go("download")
        self.download_step.start()

    def on_downloaded(self, message: Downloaded) -> None:
        message.stop()
        self.model_path = message.path

    def on_use_server(self, message: UseServer) -> None:
        message.stop()
        self.server = message.choice
        self.model_path = message.choice.source
        self.go("ready")

    def on_finished(self, message: Finished) -> None:
        message.stop()
        self.dismiss(None)

    # -- leaving --------------------------------------------------------------------------------
    def skip(self) -> None:
        """No setup: write the config (so this does not come back) and go to the chat as it is."""
        app = self.app
        try:
            save_default_model(app.config.path, None)
        except DgchatError as exc:
            self.welcome_step.show_error(str(exc))
            return
        app.config.exists = True
        self.dismiss(None)
        if app.session.default_path is not None:
            app.session.load(app.session.default_path)
        else:
            def after(result: str | None) -> None:
                if result == "open":
                    app.chat_screen.action_open_model()

            app.push_screen(NoModelScreen(short_path(app.config.path)), after)

    def close(self) -> None:
        """Leave a wizard run again from the palette without changing anything (a download in
        progress is paused, its partial file kept; the default model stays what it was)."""
        if not self.rerun:
            return
        self.download_step.close_task()
        self.ready_step.stop_test()
        self.dismiss(None)

    # -- the steps' state, as the app and the tests read it -------------------------------------
    @property
    def hw(self) -> Hardware | None:
        return self.hardware_step.hw

    @property
    def detecting(self) -> bool:
        return self.hardware_step.detecting

    @property
    def profile_state(self) -> str:
        return self.hardware_step.speed.state

    @property
    def rows(self) -> list[ModelRow]:
        return self.model_step.rows

    @property
    def choice(self) -> ModelRow | None:
        return self.model_step.choice

    @property
    def server_task(self) -> HubTask | None:
        return self.server_step.check_task

    @property
    def server_checked(self) -> ServerSource | None:
        return self.server_step.checked

    @property
    def download_state(self) -> str:
        return self.download_step.state

    @property
    def pull_task(self) -> HubTask | None:
        return self.download_step.pull_task

    @property
    def pull_result(self) -> PullResult | InstalledModel | None:
        return self.download_step.result

    @property
    def panel(self) -> PullPanel:
        return self.download_step.panel

    def show_progress(self, progress: Progress) -> None:
        """One download progress report on screen (DownloadStep.show_progress)."""
        self.download_step.show_progress(progress)

    @property
    def load_state(self) -> str:
        return self.ready_step.load_state

    @property
    def generation(self) -> ChatAnswer | None:
        return self.ready_step.generation

    @property
    def canvas(self) -> LiveCanvas | None:
        return self.ready_step.canvas
