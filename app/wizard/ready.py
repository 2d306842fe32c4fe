"""The wizard's last step: the chosen model loads and answers a short test on the live canvas.

The model loads through the app's session (the one loader) and the test runs as a job on it. "Start
chatting" writes `default_model` to the config (so the wizard does not come back) and leaves the
model loaded for the chat; for a server it writes `[server] url` instead (the API key only when the
user ticked "save the key", else it comes from $DGCHAT_API_KEY). The test's line says what it
measured beside the model step's prediction, which is for a 256-token answer.
"""

from __future__ import annotations

from typing import Any

from dgchat.app.generation import ChatAnswer
from dgchat.app.live_view import LiveView
from dgchat.app.model_source import ModelSource, ServerSource
from dgchat.app.paths import short_path
from dgchat.app.session import JobDone, ModelChange, ModelSession
from dgchat.app.trial import trial_params
from dgchat.app.widgets.canvas import LiveCanvas
from dgchat.app.widgets.path_text import PathText
from dgchat.app.wizard.messages import Finished, NavChanged, ServerChoice
from dgchat.app.wizard.step import NavPlan
from dgchat.config import save_default_model, save_server
from dgchat.hub.manager import ModelRow
from dgchat.hub.speed import rate_words
from dgchat.model_backend.errors import DgchatError
from dgchat.model_backend.events import GenerationStats
from dgchat.terminal_text import safe_document, safe_message
from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.widget import Widget
from textual.widgets import Label, ProgressBar, Static

TEST_PROMPT = "Say hello and tell me, in one sentence, what you can do."


class QuietLine(Static):
    """A Static that takes no row while it says nothing (the stats and error lines: at 60x20 the
    test answer and the note below need those rows)."""

    def __init__(self, content: str = "", **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self.display = bool(content)

    def update(self, content: Any = "", *, layout: bool = True) -> None:
        super().update(content, layout=layout)
        self.display = bool(str(content))


class ReadyStep(VerticalScroll):
    """Step 5: load, test, and "Start chatting". A scroll box: at 60x20 its notes need more rows."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(id="step-ready", classes="wiz-step", **kwargs)
        self.source: ModelSource | None = None  # the model file, or the server
        self.row: ModelRow | None = None  # the model step's row of that file (its predicted speed)
        self.server: ServerChoice | None = None  # the server form's, when the source is a server
        self.load_state = "idle"  # idle | loading | loaded | failed (the session loads it)
        self.generation: ChatAnswer | None = None  # the test answer
        self.canvas: LiveCanvas | None = None
        self.live: LiveView | None = None
        self._finish_when_done = False
        self._first_since_load = False  # the next test answer is the loaded model's first

    def compose(self) -> ComposeResult:
        yield Label("", id="ready-title", classes="wiz--h1", markup=False)
        yield Static("", id="ready-model", classes="wiz--muted", markup=False)
        with Horizontal(id="ready-loading"):
            yield Label("Loading the model… ", id="ready-load-label")
            yield ProgressBar(total=100, show_eta=False, id="ready-bar")
        yield Label(f"A short test — “{TEST_PROMPT}”", id="ready-prompt", markup=False)
        yield VerticalScroll(id="ready-answer")
        yield QuietLine("", id="ready-stats", classes="wiz--muted", markup=False)
        yield QuietLine("", id="ready-error", classes="wiz--error", markup=False)
        yield Static("", id="ready-note", classes="wiz--muted", markup=False)

    def on_mount(self) -> None:
        self.live = LiveView(self, self._draw, lambda: self.generation.event if self.generation else None,
                             hz=self.app.config.refresh_hz)
        self.session.watch(self, self._model_changed)

    @property
    def session(self) -> ModelSession:
        return self.app.session

    # -- the screen's hooks ---------------------------------------------------------------------
    def enter(self, source: ModelSource, row: ModelRow | None, server: ServerChoice | None) -> None:
        """The step shows for `source` (`row`: the model list's row of a file; `server`: what the
        server form checked): load it unless it is loaded, then test it."""
        self.source, self.row, self.server = source, row, server
        config_file = short_path(self.app.config.path)
        if isinstance(source, ServerSource):
            assert server is not None
            title = f"{server.model} on {source.host}"
            key = ("with the key" if server.save_key and server.typed_key
                   else "without a key (it comes from $DGCHAT_API_KEY)")
            note = (f"“Start chatting” saves this server as [server] url in {config_file}, {key}. "
                    "Change it later: F4, or Ctrl+P → setup: run again")
        else:
            title = row.title if row is not None else source.name
            note = f"“Start chatting” saves this as your default model in {config_file}"
            if self.app.config.server_url:
                note += f" and removes the server {self.app.config.server_url} ([server] url) from it"
            note += ". Models can be changed later: F4, or Ctrl+P → model: manage models…"
        self.query_one("#ready-note", Static).update(PathText(note))
        self.query_one("#ready-title", Label).update(f"Ready: {title}")
        self.query_one("#ready-model", Static).update(PathText(short_path(source)))
        self.query_one("#ready-error", Static).update("")
        self.query_one("#ready-stats", Static).update("")
        self._finish_when_done = False
        session = self.session
        if session.loaded(source) is not None and session.loading_path is None:
            self._loaded(source)
            return
        self.load_state = "loading"
        self.query_one("#ready-loading").display = True
        self.query_one("#ready-bar", ProgressBar).update(total=100, progress=0)
        self.query_one("#ready-answer", VerticalScroll).remove_children()
        # a test of the previous choice may still be stopping: the load starts when it has ended
        if not session.load(source, preempt=True, report=False):
            self._load_failed(source, session.busy_text())
        self.post_message(NavChanged())

    def nav_plan(self) -> NavPlan:
        running = self.generation is not None and self.generation.running
        shown = {"wiz-back", "wiz-retest"} if self.load_state == "loaded" and not running else {"wiz-back"}
        return NavPlan(shown=frozenset(shown), next_label="Start chatting", back_label="Choose another model",
                       next_enabled=self.load_state == "loaded" and not self._finish_when_done)

    def focus_target(self) -> Widget | None:
        return None

    def next(self) -> None:
        self.finish()

    # -- loading --------------------------------------------------------------------------------
    def _model_changed(self, change: ModelChange) -> None:
        path = self.source
        if not self.display or path is None or change.path != path:  # not the current step, or another model
            return
        if change.kind == "loading" and self.load_state == "loading":
            fraction = self.session.load_fraction
            self.query_one("#ready-bar", ProgressBar).update(progress=round(100 * max(0.0, min(1.0, fraction))))
        elif change.kind == "loaded" and self.load_state != "loaded":
            self._first_since_load = True
            self._loaded(path)
        elif change.kind == "failed":
            self._load_failed(path, change.error)

    def _loaded(self, path: ModelSource) -> None:
        engine = self.session.loaded(path)
        assert engine is not None
        self.load_state = "loaded"
        self.query_one("#ready-loading").display = False
        self.query_one("#ready-model", Static).update(PathText(f"{short_path(path)} · runs as {engine.label}"))
        self.start_test()

    def _load_failed(self, path: ModelSource, message: str) -> None:
        self.load_state = "failed"
        self.query_one("#ready-loading").display = False
        self.query_one("#ready-error", Static).update(
            f"The model failed to load: {safe_message(message)}\nChoose another model (the bundled one always works).")
        self.post_message(NavChanged())

    # -- the test -------------------------------------------------------------------------------
    def start_test(self) -> None:
        """Run the short test (again) on the loaded model, drawn on the live canvas."""
        engine = self.session.loaded(self.source)
        if engine is None or (self.generation is not None and self.generation.running):
            return
        error = self.query_one("#ready-error", Static)
        try:
            params = trial_params(engine, self.app.config.sampler)
        except DgchatError as exc:
            error.update(f"The test could not start: {exc}")
            self.post_message(NavChanged())
            return
        error.update("")
        self.query_one("#ready-stats", Static).update("")
        answer = self.query_one("#ready-answer", VerticalScroll)
        answer.remove_children()
        generation = ChatAnswer([{"role": "user", "content": TEST_PROMPT}], params, owner="the setup test")
        if not self.session.start(generation, self):
            error.update(f"The test could not start: {self.session.busy_text() or 'the model is not ready'}")
            self.post_message(NavChanged())
            return
        self.generation = generation
        self.canvas = LiveCanvas(engine, id="wiz-canvas")
        answer.mount(self.canvas)
        assert self.live is not None
        self.live.start()
        self.post_message(NavChanged())

    def _draw(self) -> None:
        generation = self.generation
        if generation is not None and self.canvas is not None and generation.event is not None:
            self.canvas.show(generation.event)

    def on_job_done(self, message: JobDone) -> None:
        generation = message.job
        if generation is not self.generation or not isinstance(generation, ChatAnswer):
            return
        if self.live is not None:
            self.live.stop()
        self.generation = None
        answer = self.query_one("#ready-answer", VerticalScroll)
        if generation.error is not None and not generation.cancelled:
            self.query_one("#ready-error", Static).update(f"The test failed: {safe_message(generation.error_text())}")
        elif generation.final is not None:
            final = generation.final
            answer.remove_children()
            self.canvas = None
            answer.mount(Static(safe_document(final.text.strip()) or "(an empty answer)", markup=False,
                                id="ready-text"))
            self.query_one("#ready-stats", Static).update(
                self.test_stats(final.stats, final.stop_reason, first=self._first_since_load))
        self._first_since_load = False
        if self._finish_when_done:
            self._finish_when_done = False
            self.finish()
            return
        self.post_message(NavChanged(focus="step"))

    def test_stats(self, s: GenerationStats, stop_reason: str, *, first: bool = False) -> str:
        """What the test measured, and what it counts: one short answer (`first`: the first since
        the model loaded), timed with the canvas drawn at every step, beside the model step's
        prediction, which is for a 256-token answer: the two rates differ for those reasons."""
        stopped = " · stopped" if stop_reason == "cancelled" else ""
        measured = (f"Test: {s.tokens} tokens · {s.steps} steps · {s.elapsed_s:.1f} s · "
                    f"{s.tokens_per_s:.1f} tokens/s{stopped}")
        if isinstance(self.source, ServerSource):  # no prediction: the server's machine is not measured
            return f"{measured}\n{'First answer' if first else 'A short answer'} from the server, timed here."
        counts = f"{'First answer since loading' if first else 'A short answer'}, timed while drawn live"
        row = self.row  # the model tested (a server's test returned above)
        if row is not None and row.speed is not None:
            p = row.speed.prediction
            counts += (f"; predicted for a {p.answer_tokens}-token answer: {p.per_answer()} "
                       f"({rate_words(p.tokens_per_s)})")
        return f"{measured}\n{counts}."

    def stop_test(self) -> None:
        if self.generation is not None and self.generation.running:
            self.generation.stop()
            if self.canvas is not None:
                self.canvas.mark_stopping()

    def finish(self) -> None:
        """Save the choice; the screen then closes the wizard, the loaded model stays loaded for the chat."""
        path = self.source
        if path is None or self.session.loaded(path) is None:
            return
        if self.generation is not None and self.generation.running:
            self._finish_when_done = True  # after the test stops (at once: it is cancelled)
            self.stop_test()
            self.post_message(NavChanged())
            return
        config = self.app.config
        try:
            if isinstance(path, ServerSource):
                key = self.server.typed_key if self.server is not None and self.server.save_key else None
                save_server(config.path, path.url, key)
                config.server_url, config.server_api_key = path.url, key
            else:
                if config.server_url:  # the ready note said so: else the server would win at the next start
                    save_server(config.path, None)
                    config.server_url = config.server_api_key = None
                save_default_model(config.path, path)
                config.default_model = str(path)
        except DgchatError as exc:
            self.query_one("#ready-error", Static).update(str(exc))
            return
        config.exists = True
        self.session.use_default(path)
        self.post_message(Finished())

    def on_unmount(self) -> None:
        self.stop_test()
