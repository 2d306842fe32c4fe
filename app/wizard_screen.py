"""The first-run wizard: shown instead of the chat when there is no config file yet.

    1 Welcome    what dgchat is, and the promise: after setup nothing leaves this machine
    2 Machine    cores, RAM, free disk, GPU offload, VRAM (dgchat.hub.detect_hardware); every value
                 can be corrected and the correction is kept (hardware.toml); Enter in a field goes
                 on. This machine's speed (dgchat.hub.machine_profile): the saved profile, or, the
                 first time, a few seconds of measuring in a worker with its progress shown (the
                 wizard stays usable; closing it stops the measurement). A GPU this engine build
                 cannot use is named, with the command that rebuilds the engine for it.
    3 Model      the catalog with fit badges, predicted answer times and the estimate behind them,
                 the recommendation (by memory and speed: config answer_seconds_limit) preselected,
                 with why, and which stronger models were passed over as too slow; the bundled
                 model is always a choice; installed models and models in
                 the Hugging Face cache need no download. "Use a server…" opens a form instead (URL,
                 optional API key): the server's /v1/models is asked on a worker thread, and what it
                 serves (a dgchat server with the live canvas, or text only) is shown before the test
    4 Download   asked first (size, disk, free disk, predicted answer time: the Models screen's
                 question); bytes, speed and time left; Cancel keeps the partial file and Resume
                 continues it (also after quitting); the sha256 result; a gated repo asks for a
                 token; a DiffusionGemma file is converted with progress; a checkpoint entry shows two
                 bars (app/widgets/checkpoint_pull.py): its download, then its conversion and
                 quantization, and the question offers to keep the checkpoint
    5 Ready      the model loads and answers a short test on the live canvas; "Start chatting"
                 writes `default_model` to the config (so the wizard does not come back) and hands
                 the loaded model to the chat; for a server it writes `[server] url` instead (the
                 API key only when the user ticks "save the key", else it comes from $DGCHAT_API_KEY)

The only network traffic is the download the user starts in step 4 (or the server the user names) (dgchat.hub lifts HF_HUB_OFFLINE
for that call alone); everything else reads local files. When the hub cannot be reached at all the
download page says "No network connection" and offers the bundled model, which needs none.

Run again later from the command palette (setup: run again, or setup: correct the hardware values,
which opens at step 2): then "Close" leaves it without changing anything, and only "Start chatting"
changes the default model.

Small terminals: below NARROW columns the buttons take short labels and the steps line numbers the
other steps only; below SHORT rows the buttons lose their borders and the model table shows fewer
rows. Where the bar's buttons still do not fit (60 columns, run again) they take the shorter words
of TINY_LABELS rather than being cut. The main button is docked at the right of the button bar, so
it is on screen at any width, and every step's body scrolls. Paths break after a '/' (PathText);
the recommendation above the table is one clause, the rest of its reason leads its row's details.

The steps line marks a step passed over with '–' (the download, when the model needed none); the
download page's heading says what became of the download (paused, not downloaded, downloaded).
"""

from __future__ import annotations

import threading
from typing import Any

from dgchat import assets
from dgchat.app import model_ops
from dgchat.app.generation import ChatAnswer
from dgchat.app.live_view import LiveView
from dgchat.app.model_ops import (
    HubTask,
    Problem,
    describe_problem,
    short_path,
    start_hub_task,
)
from dgchat.app.model_source import ModelSource, ServerSource
from dgchat.app.no_model_screen import NoModelScreen
from dgchat.app.session import JobDone, ModelChange, ModelSession
from dgchat.app.trial import trial_params
from dgchat.app.widgets.canvas import LiveCanvas
from dgchat.app.widgets.checkpoint_pull import PullPanel, conversion_label, keep_answer
from dgchat.app.widgets.checkpoint_pull import download_confirm as checkpoint_confirm
from dgchat.app.widgets.path_text import PathText
from dgchat.app.widgets.steady_cursor import steady_cursors_when_headless
from dgchat.app.widgets.tick_box import TickBox
from dgchat.hub import (
    DownloadCancelled,
    Hardware,
    HubError,
    TokenRequiredError,
    clear_hardware_overrides,
    load_hardware_overrides,
    save_hardware_overrides,
)
from dgchat.hub.fit import Recommendation
from dgchat.hub.hardware import rebuild_command
from dgchat.hub.machine_profile import MachineProfile, ProfileCancelled, summary
from dgchat.hub.manager import ModelRow, PullResult
from dgchat.hub.registry import InstalledModel
from dgchat.hub.speed import rate_words
from dgchat.hub.util import format_bytes
from dgchat.model_backend.errors import DgchatError
from dgchat.model_backend.events import GenerationStats
from dgchat.remote.client import API_KEY_ENV, RemoteClient
from dgchat.terminal_text import one_line, safe_document, safe_message
from rich.cells import cell_len
from rich.table import Table
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import (
    Button,
    Checkbox,
    ContentSwitcher,
    DataTable,
    Input,
    Label,
    ProgressBar,
    Static,
)

STEPS = ("welcome", "hardware", "model", "download", "ready")
STEP_TITLES = {"welcome": "Welcome", "hardware": "This machine", "model": "Model", "download": "Download",
               "ready": "Ready"}
TEST_PROMPT = "Say hello and tell me, in one sentence, what you can do."
SERVER_CHECK_TIMEOUT = 15.0  # seconds the server form waits for /v1/models (connect and answer)
KEY_NOT_SAVED = ("Not saved: the key is used now, and later starts read it from $DGCHAT_API_KEY "
                 "(or --api-key). Tick the box to keep it in the config file.")
KEY_SAVED = "The key is saved in the config file (readable by you only)."

WELCOME = (
    "dgchat chats with text-diffusion language models on this computer. An answer starts as a "
    "canvas of blanks that the model fills in over a few parallel steps, and you watch it happen.\n\n"
    "Setup takes a minute: it looks at what this machine offers, suggests a model that fits, "
    "downloads it if it is not here yet, and runs a short test."
)
PROMISE = ("After this setup, nothing leaves this machine: no telemetry, no network calls. dgchat goes "
           "online only when you ask it to download a model.")

# hardware field -> (label, input id, kind)
HW_FIELDS = (
    ("cpu_cores", "CPU cores", "hw-cores"),
    ("ram_total", "RAM", "hw-ram"),
    ("disk_free", "Free disk", "hw-disk"),
    ("vram_total", "GPU memory", "hw-vram"),
)
WIZARD_MAX_WIDTH = 110  # #wizard's max-width in dgchat.tcss
TABLE_INSET = 6  # #wizard's padding (2) + #wiz-body's border and padding (4)
TABLE_ROWS = 10  # model rows #wiz-models shows before it scrolls (its max-height less the header)
SHORT_TABLE_ROWS = 6  # the same below SHORT rows (WizardScreen.-short #wiz-models)
NARROW = 90  # columns below which the buttons take their short labels
SHORT = 28  # rows below which the buttons lose their borders and the table shows fewer rows
# button -> its label below NARROW columns (the main button's labels are short already)
SHORT_LABELS = {"Use a server…": "Server…", "Use the bundled model": "Bundled model",
                "Choose another model": "Other model", "Run the test again": "Test again"}
# a label -> a shorter one, used only where the bar's visible buttons would not fit whole with the
# labels above (60 columns, run again: Close joins them): a shorter word reads better than a cut one
TINY_LABELS = {"Bundled model": "Bundled", "Use this model": "Use it", "Use it (no download)": "Use it",
               "Resume download": "Resume", "Other model": "Other", "Test again": "Again",
               "Start chatting": "Chat", "Download again": "Again"}  # each set again by every _nav
NAV_MIN_WIDTH = (16, 8)  # a bar button's min-width: Textual's Button default, below NARROW dgchat.tcss's
HW_LABEL_WIDTH = (14, 12)  # #hw-grid's first column (below NARROW columns): the speed rows line up with it


class QuietLine(Static):
    """A Static that takes no row while it says nothing (the ready step's stats and error line: at
    60x20 the test answer and the note below need those rows)."""

    def __init__(self, content: str = "", **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self.display = bool(content)

    def update(self, content: Any = "", *, layout: bool = True) -> None:
        super().update(content, layout=layout)
        self.display = bool(str(content))


def _size_text(value: int | None) -> str:
    return format_bytes(value) if value is not None else ""


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
        self.mgr: Any = None  # ModelManager
        self.hw: Hardware | None = None
        self._shown_hw: dict[str, str] = {}  # the text each hardware field was filled with
        self.rows: list[ModelRow] = []
        self.choice: ModelRow | None = None
        self.model_path: ModelSource | None = None  # a file, or the server of the server form
        self.server_checked: ServerSource | None = None  # the form's server, once /v1/models answered
        self.server_model = ""  # what it serves (the model the session will use)
        self.server_is_dgchat = False
        self.server_typed_key: str | None = None  # the key typed in the form (saved only if ticked)
        self.server_task: HubTask | None = None
        self.pull_task: HubTask | None = None
        self.download_state = "idle"  # idle | running | paused | failed | done
        self.problem: Problem | None = None
        self.pull_result: PullResult | InstalledModel | None = None
        self.keep_checkpoint = False  # ticked in the download question of a checkpoint entry
        self.detecting = False
        self.load_state = "idle"  # idle | loading | loaded | failed (the session loads it)
        self.generation: ChatAnswer | None = None  # the test answer
        self.canvas: LiveCanvas | None = None
        self.live: LiveView | None = None
        self._finish_when_done = False
        self._first_since_load = False  # the next test answer is the loaded model's first
        self._table_width = 0  # the width the model table was laid out for
        # this machine's speed: the saved profile, or measured once in a worker
        self.profile: MachineProfile | None = None
        self.profile_state = "unknown"  # unknown | measuring | ready | failed | stopped
        self.profile_error = ""
        self.profile_task: HubTask | None = None
        self.profile_progress: tuple[float, str] = (0.0, "")
        self._auto_choice: str | None = None  # the row preselected as recommended (not the user's pick)
        self.recommendation: Recommendation | None = None  # the model list's (hub.fit.recommend)

    # -- layout ---------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        with Vertical(id="wizard"):
            yield Label("dgchat setup", id="wiz-title")
            yield Static("", id="wiz-steps")
            with ContentSwitcher(initial="step-welcome", id="wiz-body"):
                with VerticalScroll(id="step-welcome", classes="wiz-step"):
                    yield Label("Welcome to dgchat", classes="wiz--h1")
                    yield Static(WELCOME, markup=False, classes="wiz--text")
                    yield Static(Text.assemble(("Promise: ", "bold"), PROMISE), id="wiz-promise",
                                 classes="wiz--promise")
                    yield Static("", id="wiz-welcome-error", classes="wiz--error", markup=False)
                with VerticalScroll(id="step-hardware", classes="wiz-step"):
                    yield Label("This machine", classes="wiz--h1")
                    yield Static("Detected automatically. If something is wrong, correct it here: the model "
                                 "suggestions are based on these numbers, and your corrections are kept.",
                                 markup=False, classes="wiz--text")
                    with Grid(id="hw-grid"):
                        for key, label, wid in HW_FIELDS:
                            yield Label(label, classes="hw--label")
                            yield Input("", id=wid, compact=True, placeholder="unknown, e.g. 8G"
                                        if key != "cpu_cores" else "unknown")
                            yield Label("", id=f"{wid}-note", classes="hw--note", markup=False)
                        yield Label("GPU offload", classes="hw--label")
                        yield TickBox("offloads", id="hw-offload", compact=True)
                        yield Label("", id="hw-offload-note", classes="hw--note", markup=False)
                    # a GPU this engine build cannot use: what to run (the whole width: it is long)
                    yield Static("", id="hw-offload-help", markup=False)
                    yield Static("", id="hw-speed", markup=False)
                    yield Static("", id="hw-notes", classes="wiz--muted", markup=False)
                    yield Static("", id="hw-error", classes="wiz--error", markup=False)
                with Vertical(id="step-model", classes="wiz-step"):
                    yield Label("Choose a model", classes="wiz--h1")
                    # whole, not in a scroll box of its own: the reason is one clause (see _fill_models)
                    with Vertical(id="model-why-box"):
                        yield Static("", id="model-why", classes="wiz--muted", markup=False)
                        yield Static("", id="model-speed", classes="wiz--muted", markup=False)
                    yield DataTable(id="wiz-models", cursor_type="row", zebra_stripes=False)
                    with VerticalScroll(id="model-detail-scroll"):
                        yield Static("", id="model-detail", markup=False)
                with VerticalScroll(id="step-server", classes="wiz-step"):
                    yield Label("Use a server", classes="wiz--h1")
                    yield Static("Chat with a model on another machine instead of downloading one: a `dgchat "
                                 "serve` server (the live canvas works) or any OpenAI-compatible server such as "
                                 "vLLM (answers arrive as text).", markup=False, classes="wiz--text")
                    with Grid(id="srv-grid"):
                        yield Label("URL", classes="hw--label")
                        yield Input("", id="srv-url", compact=True, placeholder="http://gpu-box:8765")
                        yield Label("API key", classes="hw--label")
                        yield Input("", id="srv-key", compact=True, password=True,
                                    placeholder="optional (else $DGCHAT_API_KEY)")
                        yield Label("", classes="hw--label")
                        yield TickBox("save the key in the config file", id="srv-save-key", compact=True)
                    yield Static(KEY_NOT_SAVED, id="srv-key-note", classes="wiz--muted", markup=False)
                    yield Static("", id="srv-result", markup=False)
                    yield Static("", id="srv-error", classes="wiz--error", markup=False)
                with VerticalScroll(id="step-download", classes="wiz-step"):
                    yield Label("", id="dl-title", classes="wiz--h1", markup=False)
                    yield Static("", id="dl-source", classes="wiz--muted", markup=False)
                    yield PullPanel(id="dl-panel")  # a checkpoint: a second bar for its conversion
                with VerticalScroll(id="step-ready", classes="wiz-step"):  # at 60x20 its notes need more rows
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
            with Horizontal(id="wiz-nav"):
                yield Button("Back", id="wiz-back")
                yield Static("", id="wiz-nav-gap")
                yield Button("Skip setup", id="wiz-skip")
                yield Button("Close", id="wiz-close")
                yield Button("Detect again", id="wiz-redetect")
                yield Button("Use a server…", id="wiz-server")
                yield Button("Use the bundled model", id="wiz-bundled")
                yield Button("Cancel", id="wiz-cancel", variant="warning")
                yield Button("Retry", id="wiz-retry")
                yield Button("Run the test again", id="wiz-retest")
                yield Button("Next", id="wiz-next", variant="primary")

    def on_mount(self) -> None:
        steady_cursors_when_headless(self)
        self.live = LiveView(self, self._draw, lambda: self.generation.event if self.generation else None,
                             hz=self.app.config.refresh_hz)
        self.session.watch(self, self._model_changed)
        self._fit_to_size()
        try:
            self.mgr = model_ops.make_manager()
        except DgchatError as exc:  # a broken catalog: setup cannot offer downloads
            self.query_one("#wiz-welcome-error", Static).update(f"The model catalog could not be read: {exc}")
        self.go(self.start_step)

    # -- navigation -----------------------------------------------------------------------------
    def go(self, step: str) -> None:
        self.step = step
        self.query_one(ContentSwitcher).current = f"step-{step}"
        self._show_steps()
        if step == "hardware" and self.hw is None and not self.detecting:
            self._detect()
        elif step == "model":
            self._ensure_profile()
            self._fill_models()
        elif step == "server":
            self._show_server_check()
        elif step == "ready":
            # measuring beside the test would skew both: stopped (nothing saved; measured next time)
            self._stop_measuring()
            self._enter_ready()
        self._nav()
        self.call_after_refresh(self._focus_step)

    def _focus_step(self) -> None:
        if self.step == "model":
            self.query_one("#wiz-models", DataTable).focus()
        elif self.step == "server":
            self.query_one("#srv-url", Input).focus()
        elif self.step == "hardware":
            self.query_one("#hw-cores", Input).focus()
        else:
            nxt = self.query_one("#wiz-next", Button)
            if nxt.display and not nxt.disabled:
                nxt.focus()

    def download_skipped(self) -> bool:
        """Whether the model the ready step uses came without the download step: the bundled model,
        an installed one, a server (also after a download of another model failed or was paused)."""
        result = self.pull_result
        return not (self.download_state == "done" and result is not None and self.model_path == result.path)

    def _show_steps(self) -> None:
        """'✓ Welcome  ›  2 This machine  ›  3 Model …'; where that does not fit, only the current
        step is named ('✓ 1 › 2 This machine › 3 › 4 › 5'). A step passed over is marked '–', not
        '✓' (the download, when the model needed none)."""
        current = STEPS.index("model" if self.step == "server" else self.step)
        skipped = {"download"} if self.step == "ready" and self.download_skipped() else set()

        def line(short: bool) -> Text:
            text = Text()
            for i, step in enumerate(STEPS):
                if i:
                    text.append(" › " if short else "  ›  ", style="dim")
                name = f"{i + 1}" if short and i != current else STEP_TITLES[step]
                if i < current and step in skipped:
                    text.append(f"– {name}" if short else f"– {name} skipped", style="dim")
                elif i < current:
                    text.append(f"✓ {name}", style="dim")
                elif i == current:
                    text.append(f"{i + 1} {name}", style="bold reverse")
                else:
                    text.append(name if short else f"{i + 1} {name}", style="dim")
            return text

        full = line(False)
        room = min(self.app.size.width, WIZARD_MAX_WIDTH) - 4  # #wizard's and #wiz-steps' padding
        self.query_one("#wiz-steps", Static).update(full if full.cell_len <= room else line(True))

    def _fit_to_size(self) -> None:
        """Short labels below NARROW columns, borderless buttons below SHORT rows (see the module
        docstring); the main button is docked (dgchat.tcss) and needs nothing here."""
        width, height = self.app.size
        narrow, short = width < NARROW, height < SHORT
        changed = narrow != self.has_class("-narrow") or short != self.has_class("-short")
        self.set_class(narrow, "-narrow")
        self.set_class(short, "-short")
        for button in self.query("#wiz-nav Button").results(Button):
            button.compact = short
        if changed and self.is_mounted:
            self._show_steps()
            self._nav()
            self._show_speed()

    def _label(self, text: str) -> str:
        return SHORT_LABELS.get(text, text) if self.has_class("-narrow") else text

    def _nav(self) -> None:
        """Which buttons the current step offers, and what they say."""
        show = {"wiz-back": False, "wiz-skip": False, "wiz-close": False, "wiz-redetect": False,
                "wiz-server": False, "wiz-bundled": False, "wiz-cancel": False, "wiz-retry": False, "wiz-retest": False, "wiz-next": True}
        label, enabled, back_label = "Next", True, "Back"
        step = self.step
        if step == "welcome":
            show["wiz-skip"] = not self.rerun
            enabled = self.mgr is not None
        elif step == "hardware":
            show["wiz-back"] = show["wiz-redetect"] = True
            enabled = self.hw is not None and not self.detecting
        elif step == "model":
            show["wiz-back"] = show["wiz-bundled"] = show["wiz-server"] = True
            row = self.choice
            label, enabled = self._choose_label(row)
            self.query_one("#wiz-bundled", Button).disabled = self._bundled_row() is None
        elif step == "server":
            show["wiz-back"] = True
            checking = self.server_task is not None and self.server_task.running
            if self.server_checked is not None:
                label = "Next: test it"
            else:
                label = "Checking…" if checking else "Check the server"
            enabled = not checking and bool(self.query_one("#srv-url", Input).value.strip())
        elif step == "download":
            state = self.download_state
            show["wiz-back"] = state != "running"
            back_label = "Choose another model"
            show["wiz-cancel"] = state == "running"
            show["wiz-retry"] = state in ("paused", "failed") and self.problem is not None and bool(self.problem.retry)
            if show["wiz-retry"] and self.problem is not None:
                self.query_one("#wiz-retry", Button).label = self.problem.retry or "Retry"
            # a failed download (no network above all): the model that needs none is one press away
            show["wiz-bundled"] = state == "failed" and self._bundled_row() is not None
            self.query_one("#wiz-bundled", Button).disabled = False
            show["wiz-next"] = state == "done"
            label = "Next: test it"
        elif step == "ready":
            show["wiz-back"] = True
            back_label = "Choose another model"
            running = self.generation is not None and self.generation.running
            show["wiz-retest"] = self.load_state == "loaded" and not running
            label = "Start chatting"
            enabled = self.load_state == "loaded" and not self._finish_when_done
        if self.rerun:
            show["wiz-close"] = not (step == "download" and self.download_state == "running")
        for wid, visible in show.items():
            self.query_one(f"#{wid}", Button).display = visible
        nxt = self.query_one("#wiz-next", Button)
        nxt.label = label
        nxt.disabled = not enabled
        self.query_one("#wiz-back", Button).label = self._label(back_label)
        for wid, text in (("wiz-server", "Use a server…"), ("wiz-bundled", "Use the bundled model"),
                          ("wiz-retest", "Run the test again")):
            self.query_one(f"#{wid}", Button).label = self._label(text)
        self._fit_nav_labels()
        for button in self.query("#wiz-nav Button").results(Button):
            # Textual keeps a button's width for its old label (the width is cached, a new label only
            # repaints): measured again, so a longer label is never cut
            button.clear_cached_dimensions()
            button.refresh(layout=True)

    def _fit_nav_labels(self) -> None:
        """TINY_LABELS where the visible buttons would not fit the bar: the docked main button would
        cover the end of the one before it ("Bundled mod")."""
        buttons = [b for b in self.query("#wiz-nav Button").results(Button) if b.display]
        min_width = NAV_MIN_WIDTH[self.has_class("-narrow")]

        def width(button: Button) -> int:  # its label and padding (Button's content width), margin-left 1
            return max(cell_len(str(button.label)) + 2, min_width) + 1

        room = min(self.app.size.width, WIZARD_MAX_WIDTH) - 2  # #wizard's padding
        if sum(map(width, buttons)) <= room:
            return
        for button in buttons:
            button.label = TINY_LABELS.get(str(button.label), str(button.label))

    def _choose_label(self, row: ModelRow | None) -> tuple[str, bool]:
        if row is None:
            return "Next", False
        if row.status in ("installed", "bundled") and row.path is not None:
            return "Use this model", True
        if row.status == "in HF cache":
            return "Use it (no download)", True
        if row.status == "partial":
            return "Resume download", row.entry is not None
        if row.status == "available":
            return "Download", row.entry is not None
        return "Next", False  # missing

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        bid = event.button.id
        if bid == "wiz-next":
            self.action_next()
        elif bid == "wiz-back":
            self.action_back()
        elif bid == "wiz-skip":
            self.skip()
        elif bid == "wiz-close":
            self.close()
        elif bid == "wiz-redetect":
            self._redetect()
        elif bid == "wiz-server":
            self.go("server")
        elif bid == "wiz-bundled":
            row = self._bundled_row()
            if row is not None:
                self.choose(row)
        elif bid == "wiz-cancel":
            self.cancel_download()
        elif bid == "wiz-retry":
            self._retry()
        elif bid == "wiz-retest":
            self._start_test()

    def action_next(self) -> None:
        nxt = self.query_one("#wiz-next", Button)
        if nxt.disabled or not nxt.display:
            return
        if self.step == "welcome":
            self.go("hardware")
        elif self.step == "hardware":
            if self._apply_hardware():
                self.go("model")
        elif self.step == "model":
            if self.choice is not None:
                self.choose(self.choice)
        elif self.step == "server":
            if self.server_checked is not None:
                self.model_path = self.server_checked
                self.go("ready")
            else:
                self._check_server()
        elif self.step == "download":
            if self.download_state == "done":
                self.go("ready")
        elif self.step == "ready":
            self.finish()

    def action_back(self) -> None:
        if self.step == "welcome" or (self.rerun and self.step == self.start_step):
            if self.rerun:
                self.close()
            return
        if self.step == "download":
            if self.download_state == "running":
                return
            self.go("model")
        elif self.step == "server":
            self.go("model")
        elif self.step == "ready":
            self._stop_test()
            self.go("server" if isinstance(self.model_path, ServerSource) else "model")
        else:
            self.go(STEPS[STEPS.index(self.step) - 1])

    # -- 2: the machine -------------------------------------------------------------------------
    def _detect(self, *, as_detected: bool = False) -> None:
        if self.mgr is None:  # opened at this step with a catalog that could not be read
            self.query_one("#hw-error", Static).update(
                str(self.query_one("#wiz-welcome-error", Static).render()) or "The model catalog could not be read.")
            return
        self.detecting = True
        self.query_one("#hw-notes", Static).update("Looking at this machine…")
        models_dir = self.mgr.models_dir
        threads = self.app.config.n_threads

        def call(_progress: Any, _cancel: threading.Event) -> tuple[Hardware, MachineProfile | None]:
            return model_ops.machine_and_profile(models_dir, threads, as_detected=as_detected)

        start_hub_task(self, "detect-hardware", call, progress=lambda p: None, done=self._detected,
                       failed=self._detect_failed)
        self._nav()

    def _redetect(self) -> None:
        try:
            clear_hardware_overrides()
        except OSError as exc:
            self.query_one("#hw-error", Static).update(f"could not remove the saved corrections: {exc}")
        self._detect(as_detected=True)

    def _detected(self, result: tuple[Hardware, MachineProfile | None]) -> None:
        hw, profile = result
        self.detecting = False
        self.hw = hw
        if profile is not None and self.profile is None:
            self.profile, self.profile_state = profile, "ready"
        self._fill_hardware(hw)
        self._ensure_profile()
        self._nav()
        if self.step == "hardware":
            self.query_one("#hw-cores", Input).focus()

    def _detect_failed(self, exc: BaseException) -> None:
        self.detecting = False
        self.query_one("#hw-error", Static).update(describe_problem(exc).message)
        self._nav()

    def _fill_hardware(self, hw: Hardware) -> None:
        values = {
            "cpu_cores": str(hw.cpu_cores) if hw.cpu_cores is not None else "",
            "ram_total": _size_text(hw.ram_total),
            "disk_free": _size_text(hw.disk_free),
            "vram_total": _size_text(hw.vram_total),
        }
        for key, _label, wid in HW_FIELDS:
            self.query_one(f"#{wid}", Input).value = values[key]
        self._shown_hw = values
        self.query_one("#hw-cores-note", Label).update("CPUs dgchat may use")
        self.query_one("#hw-ram-note", Label).update(
            f"{format_bytes(hw.ram_available)} free now" if hw.ram_available is not None else "")
        self.query_one("#hw-disk-note", Label).update(PathText(f"in {short_path(hw.models_dir)}"))
        if hw.gpus:
            names = ", ".join(g.name for g in hw.gpus)
            free = f", {format_bytes(hw.vram_free)} free" if hw.vram_free is not None else ""
            vram_note = f"{names}{free}" + (" (unified memory)" if hw.unified_memory else "")
        else:
            vram_note = "no GPU found" if hw.vram_total is None else ""
        self.query_one("#hw-vram-note", Label).update(vram_note)
        box = self.query_one("#hw-offload", Checkbox)
        box.value = hw.gpu_offload
        unused_gpu = hw.gpus[0] if hw.gpus and not hw.gpu_offload else None
        if hw.gpu_offload:
            offload = "this engine build offloads layers to the GPU"
        elif unused_gpu is not None:
            offload = "CPU only: this engine build cannot use the GPU"
        else:
            offload = "CPU only: this engine build does not offload to a GPU"
        self.query_one("#hw-offload-note", Label).update(offload)
        help_ = self.query_one("#hw-offload-help", Static)
        help_.display = unused_gpu is not None
        notes = list(hw.notes)
        if unused_gpu is not None:
            help_.update(f"{unused_gpu.name} is here, but this engine build runs models on the CPU only. To let "
                         f"dgchat use the GPU, rebuild the engine in dgchat's source folder:\n"
                         f"{rebuild_command(unused_gpu.kind)}")
            notes = [n for n in notes if not n.startswith("gpu_offload:")]  # the same, said above
        self.query_one("#hw-notes", Static).update("\n".join(notes))
        self.query_one("#hw-error", Static).update("")
        self._show_speed()

    def _apply_hardware(self) -> bool:
        """Take the user's corrections (saved for next time); False with a message on a bad value."""
        assert self.hw is not None
        error = self.query_one("#hw-error", Static)
        changes: dict[str, Any] = {}
        for key, label, wid in HW_FIELDS:
            text = self.query_one(f"#{wid}", Input).value.strip()
            if text == self._shown_hw.get(key, ""):
                continue
            if not text:
                error.update(f"{label}: enter a value (e.g. 16G), or press Detect again")
                self.query_one(f"#{wid}", Input).focus()
                return False
            changes[key] = text
        offload = self.query_one("#hw-offload", Checkbox).value
        if offload != self.hw.gpu_offload:
            changes["gpu_offload"] = offload
        if not changes:
            error.update("")
            return True
        try:
            hw = self.hw.with_overrides(**changes)
            saved = load_hardware_overrides()
        except HubError as exc:
            error.update(str(exc).replace("hardware override: ", ""))
            return False
        saved.update({k: getattr(hw, k) for k in changes})
        try:
            save_hardware_overrides(saved)
        except (HubError, OSError) as exc:
            error.update(f"the correction is used now but could not be saved: {exc}")
        self.hw = hw
        self._fill_hardware(hw)
        return True

    # -- 2b: this machine's speed ---------------------------------------------------------------
    # The saved profile comes with the hardware (one detection worker). Without one, it is measured
    # as soon as the machine step has the hardware, in its own worker: the wizard stays usable, the
    # model step shows the list by memory until the profile arrives and then lists answer times.
    def _ensure_profile(self) -> None:
        if self.profile is not None or self.hw is None or self.profile_state == "failed":
            return
        if self.profile_task is not None and self.profile_task.running:
            return
        self.profile_state = "measuring"
        self.profile_progress = (0.0, "starting")
        self.profile_task = model_ops.start_profile_task(
            self, self.app.config.n_threads, progress=self._measuring, done=self._measured,
            failed=self._measure_failed)
        self._show_speed()

    def _stop_measuring(self) -> None:
        if self.profile_task is not None and self.profile_task.running:
            self.profile_task.close()
            self.profile_task = None
            self.profile_state = "stopped"

    def _measuring(self, fraction: float, what: str) -> None:
        self.profile_progress = (fraction, what)
        self._show_speed()

    def _measured(self, profile: MachineProfile) -> None:
        self.profile_task = None
        self.profile, self.profile_state = profile, "ready"
        self._show_speed()
        if self.step == "model":
            self._fill_models()

    def _measure_failed(self, exc: BaseException) -> None:
        self.profile_task = None
        if isinstance(exc, ProfileCancelled):
            self.profile_state = "stopped"
        else:
            self.profile_state = "failed"
            self.profile_error = describe_problem(exc).message
        self._show_speed()
        if self.step == "model":
            self._fill_models()

    def speed_status(self) -> str:
        """One line on the measurement while there is no profile ("" once there is one)."""
        state = self.profile_state
        if state == "measuring":
            return model_ops.measuring_text(*self.profile_progress)
        if state == "failed":
            return (f"This machine's speed could not be measured ({self.profile_error}); models are "
                    "suggested by memory only.")
        if state in ("unknown", "stopped") and self.profile is None:
            return "This machine's speed is not measured yet; models are suggested by memory only."
        return ""

    def no_speed(self) -> str:
        """Why a model that fits has no answer time (model_ops.speed_lines)."""
        if self.profile_state == "measuring":
            return "not known yet (measuring this machine, a few seconds)"
        if self.profile_state == "failed":
            return "unknown (this machine's speed could not be measured)"
        return "unknown (this machine's speed is not measured)"

    def _show_speed(self) -> None:
        """The machine step's speed rows (dgchat.hub.machine_profile.summary) or the measurement's
        progress, and the model step's status line."""
        status = self.speed_status()
        speed = self.query_one("#hw-speed", Static)
        if self.profile is not None:
            grid = Table.grid(padding=(0, 1))
            grid.add_column(width=HW_LABEL_WIDTH[self.has_class("-narrow")], style="bold", no_wrap=True)
            grid.add_column()
            for label, value in summary(self.profile):
                grid.add_row(Text(label), Text(value))  # the CPU's name is the system's text, never markup
            speed.update(grid)
        else:
            speed.update(Text(status, style="red" if self.profile_state == "failed" else ""))
        line = self.query_one("#model-speed", Static)
        line.update(status)
        line.display = bool(status)

    # -- 3: the model ---------------------------------------------------------------------------
    def _fill_models(self) -> None:
        table = self.query_one("#wiz-models", DataTable)
        table.clear()
        why = self.query_one("#model-why", Static)
        limit = self.app.config.answer_seconds_limit
        try:
            self.rows = self.mgr.listing(self.hw, profile=self.profile, limit_s=limit)
            rec = (self.mgr.recommend(self.hw, profile=self.profile, limit_s=limit)
                   if self.hw is not None else None)
        except DgchatError as exc:
            self.rows = []
            self.recommendation = None
            why.update(f"The model list could not be read: {exc}")
            self.choice = None
            self._nav()
            return
        # why, in a clause, so that the line stays whole on a small terminal: the rest of the reason
        # leads the starred row's details below the table (the row is preselected; _details), its
        # predicted time is their Speed line; without a profile #model-speed says the list goes by memory
        self.recommendation = rec
        why.update("" if rec is None else f"★ {rec.entry.title} is recommended: {rec.headline or rec.reason}.")
        self._show_speed()
        selected = 0
        # the user's pick stays; a preselected recommendation follows the new one
        keep = self.choice.name if self.choice is not None and self.choice.name != self._auto_choice else None
        for i, row in enumerate(self.rows):
            if (keep is not None and row.name == keep) or (keep is None and row.recommended):
                selected = i
        self._table_width = self._table_room()
        model_ops.fill_model_table(table, self.rows, ["★" if r.recommended else "" for r in self.rows],
                                   self._table_width, visible_rows=self._table_rows())
        if self.rows:
            table.move_cursor(row=selected, animate=False)
            self._select(selected)
            self._auto_choice = self.rows[selected].name if keep is None else self._auto_choice

    def _table_room(self) -> int:
        return max(20, min(self.app.size.width, WIZARD_MAX_WIDTH) - TABLE_INSET)

    def _table_rows(self) -> int:
        return SHORT_TABLE_ROWS if self.app.size.height < SHORT else TABLE_ROWS

    def on_resize(self, _event: events.Resize) -> None:
        self._fit_to_size()
        self._show_steps()
        if self.step == "model" and self.rows and self._table_width != self._table_room():
            self._fill_models()

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        if event.data_table.id == "wiz-models" and event.cursor_row < len(self.rows):
            self._select(event.cursor_row)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if event.data_table.id == "wiz-models" and event.cursor_row < len(self.rows):
            self._select(event.cursor_row)
            self.action_next()

    def _select(self, index: int) -> None:
        self.choice = self.rows[index]
        self.query_one("#model-detail", Static).update(PathText(self._details(self.choice)))
        self._nav()

    def _details(self, row: ModelRow) -> str:
        """The row's details; the recommended row's begin with the rest of its recommendation's
        reason (the line above the table names the reason only): the memory it needs of what is
        usable, and what the reason says of other models (hub.fit.Recommendation.notes)."""
        text = model_ops.row_details(row, self.hw, no_speed=self.no_speed())
        rec = self.recommendation
        if not row.recommended or rec is None or not rec.notes:
            return text
        first, _, rest = text.partition("\n")
        notes = [note[0].upper() + note[1:] + "." for note in rec.notes]
        return "\n".join([first, *notes, *([rest] if rest else [])])

    def _bundled_row(self) -> ModelRow | None:
        for row in self.rows:
            if row.entry is not None and row.entry.bundled and row.path is not None:
                return row
        if not self.rows and self.mgr is not None:
            path = assets.bundled_model_path()
            bundled = self.mgr.catalog.bundled
            if path is not None:
                return ModelRow(name=bundled.name, title=bundled.title, description=bundled.description,
                                status="bundled", size=path.stat().st_size, size_exact=True, entry=bundled, path=path)
        return None

    def choose(self, row: ModelRow) -> None:
        """Go on with this row: straight to the test when it is here, else through the download."""
        self.choice = row
        if row.status in ("installed", "bundled") and row.path is not None:
            self.model_path = row.path
            self.go("ready")
            return
        if row.entry is None and row.hf_cache is None:
            return
        if model_ops.downloads(row) and self.mgr is not None:
            # asked first, as the Models screen's Pull: size, disk, free disk, answer time
            modal = checkpoint_confirm(row, self.hw, self.mgr.models_dir, no_speed=self.no_speed())

            def answer(yes: bool | None) -> None:
                if yes and self.step == "model":
                    self.keep_checkpoint = keep_answer(modal)
                    self._download(row)

            self.app.push_screen(modal, answer)
            return
        self._download(row)

    def _download(self, row: ModelRow) -> None:
        self.choice = row
        self.model_path = None
        self.download_state = "idle"
        self.go("download")
        self._start_pull()

    # -- 3b: a server instead of a model file ---------------------------------------------------
    # The form's check asks /v1/models once, on a worker thread, without retries (a wrong address
    # should say so at once); the ready step then connects through the session like any model.
    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id in ("srv-url", "srv-key"):
            event.stop()
            if self.server_task is not None:
                self.server_task.close()  # its answer is for what was typed before
                self.server_task = None
            self.server_checked = None
            self._show_server_check()
            self._nav()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        """Enter in a form field does what Next does: the server form checks, the machine step
        applies the values typed (or says what is wrong with one) and goes on."""
        if event.input.id in ("srv-url", "srv-key") or (event.input.id or "").startswith("hw-"):
            event.stop()
            self.action_next()

    def on_checkbox_changed(self, event: Checkbox.Changed) -> None:
        if event.checkbox.id == "srv-save-key":
            event.stop()
            self.query_one("#srv-key-note", Static).update(KEY_SAVED if event.value else KEY_NOT_SAVED)

    def _show_server_check(self, error: str = "") -> None:
        result = self.query_one("#srv-result", Static)
        self.query_one("#srv-error", Static).update(safe_message(error))  # may quote the server's answer
        source = self.server_checked
        if source is None:
            result.update("")
            return
        kind = ("a dgchat server: answers draw on the live canvas" if self.server_is_dgchat else
                "text only: not a dgchat server, so answers arrive as text (no live canvas, no NPC lines)")
        result.update(Text.assemble(("✓ ", "bold green"), f"{source.url} serves {self.server_model} · {kind}"))

    def _check_server(self) -> None:
        import os

        url = self.query_one("#srv-url", Input).value.strip()
        typed = self.query_one("#srv-key", Input).value.strip() or None
        try:
            source = ServerSource.of(url, typed or os.environ.get(API_KEY_ENV))
        except DgchatError as exc:
            self._show_server_check(str(exc).replace("--server takes", "enter"))
            return
        self.server_checked = None
        self._show_server_check()
        self.query_one("#srv-result", Static).update(f"Asking {source.url} for its models…")

        def call(_progress: Any, _cancel: threading.Event) -> Any:
            with RemoteClient(source.url, api_key=source.api_key, retries=0, timeout=SERVER_CHECK_TIMEOUT,
                              connect_timeout=SERVER_CHECK_TIMEOUT) as client:
                return client.models()

        def done(models: list[Any]) -> None:
            self.server_task = None
            first = models[0]  # what RemoteEngine.connect uses
            self.server_checked = source
            self.server_typed_key = typed
            # the server names its model: shown here, in the ready step's title and status lines
            self.server_model = one_line(first.id, 200) + (f" (of {len(models)} models)" if len(models) > 1 else "")
            self.server_is_dgchat = bool(first.is_dgchat)
            self._show_server_check()
            self._nav()
            self.call_after_refresh(lambda: self.query_one("#wiz-next", Button).focus())

        def failed(exc: BaseException) -> None:
            self.server_task = None
            self._show_server_check(str(exc) if isinstance(exc, DgchatError) else f"{type(exc).__name__}: {exc}")
            self._nav()

        self.server_task = start_hub_task(self, "server-check", call, progress=lambda p: None, done=done,
                                          failed=failed)
        self._nav()

    # -- 4: the download ------------------------------------------------------------------------
    def _start_pull(self) -> None:
        row = self.choice
        assert row is not None
        mgr = self.mgr
        self.problem = None
        self.pull_result = None
        self.download_state = "running"
        self._show_download_title()
        if row.entry is not None and row.entry.checkpoint:
            source = (f"from huggingface.co/{row.entry.repo}: a checkpoint of {len(row.entry.files)} files, then "
                      f"converted and quantized to {row.entry.quant} into {short_path(mgr.models_dir)}"
                      + ("; the checkpoint is kept" if self.keep_checkpoint else ""))
        elif row.entry is not None and row.status != "in HF cache":
            source = (f"from huggingface.co/{row.entry.repo} · {row.entry.filename}\n"
                      f"into {short_path(mgr.models_dir)}")
            if row.needs_convert:
                source += " (converted once to dgchat's layout)"
        else:
            cached = row.hf_cache.path if row.hf_cache is not None else None
            source = f"from your Hugging Face cache: {short_path(cached) if cached else row.name}"
        self.query_one("#dl-source", Static).update(PathText(source))
        partial = row.partial
        self.panel.stages(conversion_label(row.entry))
        self.panel.start(model_ops.PHASES["resolving"], partial.done if partial else 0,
                         partial.total if partial else None)

        if row.entry is not None:
            name, keep = row.name, self.keep_checkpoint

            def call(progress: Any, cancel: threading.Event) -> Any:
                return mgr.pull(name, progress=progress, cancel=cancel, keep_checkpoint=keep)
        else:
            path, convert = row.hf_cache.path, row.needs_convert  # type: ignore[union-attr]

            def call(progress: Any, cancel: threading.Event) -> Any:
                return mgr.import_model(path, convert=convert, progress=progress, cancel=cancel)

        self.pull_task = start_hub_task(self, "pull", call, progress=self.show_progress, done=self._pulled,
                                        failed=self._pull_failed)
        self._nav()

    def _show_download_title(self) -> None:
        """The download page's heading says what is happening now: the download, its pause, its
        failure or its end (not "Downloading …" over a failure)."""
        row = self.choice
        if row is None:
            return
        cached = row.status == "in HF cache"
        title = {
            "paused": f"Paused: {row.title}",
            "failed": f"Not {'added' if cached else 'downloaded'}: {row.title}",
            "done": f"{'Added' if cached else 'Downloaded'}: {row.title}",
        }.get(self.download_state, f"Getting {row.title}" if cached else f"Downloading {row.title}")
        self.query_one("#dl-title", Label).update(title)

    @property
    def panel(self) -> PullPanel:
        return self.query_one("#dl-panel", PullPanel)

    def show_progress(self, p: Any) -> None:
        """One progress report (dgchat.hub.Progress) on screen: phase, bar, bytes/speed/ETA, message."""
        if self.download_state == "running":
            self.panel.show(p)

    def cancel_download(self) -> None:
        if self.pull_task is not None and self.pull_task.running:
            self.pull_task.stop()
            self.panel.stopping()

    def _pulled(self, result: PullResult | InstalledModel) -> None:
        self.download_state = "done"
        self.pull_result = result
        if isinstance(result, PullResult):
            self.model_path = result.path
            text = model_ops.pull_summary(result)
        else:
            self.model_path = result.path
            text = f"Added: sha256 {result.sha256[:16]}… · {short_path(result.path)}"
        self.panel.finished(text)
        self._show_download_title()
        self._nav()
        self.call_after_refresh(self._focus_step)

    def _pull_failed(self, exc: BaseException) -> None:
        problem = describe_problem(exc)
        self.problem = problem
        if isinstance(exc, DownloadCancelled):
            self.download_state = "paused"
            self.panel.paused(exc)
        else:
            self.download_state = "failed"
            self.panel.failed(problem)
        self._show_download_title()
        self._nav()
        if isinstance(exc, TokenRequiredError):
            self._ask_token(exc)
        else:
            self.call_after_refresh(lambda: self.query_one("#wiz-retry", Button).focus())

    def _ask_token(self, exc: TokenRequiredError) -> None:
        def done(stored: bool | None) -> None:
            if stored:
                self._start_pull()

        self.app.push_screen(model_ops.TokenModal(exc.repo, str(exc), exc.had_token), done)

    def _retry(self) -> None:
        if self.problem is not None and self.problem.token and self.choice is not None:
            repo = self.choice.entry.repo if self.choice.entry is not None else ""
            self._ask_token(TokenRequiredError(self.problem.message, repo=repo or "", had_token=False))
            return
        self._start_pull()

    # -- 5: ready -------------------------------------------------------------------------------
    # The model loads through the app's session (the one loader) and the test runs as a job on it;
    # "Start chatting" leaves it loaded for the chat.
    def _enter_ready(self) -> None:
        path = self.model_path
        assert path is not None
        config_file = short_path(self.app.config.path)
        if isinstance(path, ServerSource):
            title = f"{self.server_model} on {path.host}"
            key = ("with the key" if self.query_one("#srv-save-key", Checkbox).value and self.server_typed_key
                   else "without a key (it comes from $DGCHAT_API_KEY)")
            note = (f"“Start chatting” saves this server as [server] url in {config_file}, {key}. "
                    "Change it later: F4, or Ctrl+P → setup: run again")
        else:
            title = self.choice.title if self.choice is not None else path.name
            note = f"“Start chatting” saves this as your default model in {config_file}"
            if self.app.config.server_url:
                note += f" and removes the server {self.app.config.server_url} ([server] url) from it"
            note += ". Models can be changed later: F4, or Ctrl+P → model: manage models…"
        self.query_one("#ready-note", Static).update(PathText(note))
        self.query_one("#ready-title", Label).update(f"Ready: {title}")
        self.query_one("#ready-model", Static).update(PathText(short_path(path)))
        self.query_one("#ready-error", Static).update("")
        self.query_one("#ready-stats", Static).update("")
        self._finish_when_done = False
        session = self.session
        if session.loaded(path) is not None and session.loading_path is None:
            self._loaded(path)
            return
        self.load_state = "loading"
        self.query_one("#ready-loading").display = True
        self.query_one("#ready-bar", ProgressBar).update(total=100, progress=0)
        self.query_one("#ready-answer", VerticalScroll).remove_children()
        # a test of the previous choice may still be stopping: the load starts when it has ended
        if not session.load(path, preempt=True, report=False):
            self._load_failed(path, session.busy_text())
        self._nav()

    @property
    def session(self) -> ModelSession:
        return self.app.session

    def _model_changed(self, change: ModelChange) -> None:
        path = self.model_path
        if self.step != "ready" or path is None or change.path != path:
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
        self._start_test()

    def _load_failed(self, path: ModelSource, message: str) -> None:
        self.load_state = "failed"
        self.query_one("#ready-loading").display = False
        self.query_one("#ready-error", Static).update(
            f"The model failed to load: {safe_message(message)}\nChoose another model (the bundled one always works).")
        self._nav()

    def _start_test(self) -> None:
        path = self.model_path
        engine = self.session.loaded(path)
        if engine is None or (self.generation is not None and self.generation.running):
            return
        error = self.query_one("#ready-error", Static)
        try:
            params = trial_params(engine, self.app.config.sampler_params())
        except DgchatError as exc:
            error.update(f"The test could not start: {exc}")
            self._nav()
            return
        error.update("")
        self.query_one("#ready-stats", Static).update("")
        answer = self.query_one("#ready-answer", VerticalScroll)
        answer.remove_children()
        generation = ChatAnswer([{"role": "user", "content": TEST_PROMPT}], params, owner="the setup test")
        if not self.session.start(generation, self):
            error.update(f"The test could not start: {self.session.busy_text() or 'the model is not ready'}")
            self._nav()
            return
        self.generation = generation
        self.canvas = LiveCanvas(engine, id="wiz-canvas")
        answer.mount(self.canvas)
        assert self.live is not None
        self.live.start()
        self._nav()

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
        self._nav()
        self.call_after_refresh(self._focus_step)

    def test_stats(self, s: GenerationStats, stop_reason: str, *, first: bool = False) -> str:
        """What the test measured, and what it counts: one short answer (`first`: the first since
        the model loaded), timed with the canvas drawn at every step, beside the model step's
        prediction, which is for a 256-token answer: the two rates differ for those reasons."""
        stopped = " · stopped" if stop_reason == "cancelled" else ""
        measured = (f"Test: {s.tokens} tokens · {s.steps} steps · {s.elapsed_s:.1f} s · "
                    f"{s.tokens_per_s:.1f} tokens/s{stopped}")
        if isinstance(self.model_path, ServerSource):  # no prediction: the server's machine is not measured
            return f"{measured}\n{'First answer' if first else 'A short answer'} from the server, timed here."
        counts = f"{'First answer since loading' if first else 'A short answer'}, timed while drawn live"
        row = self.choice  # the model tested (a server's test returned above)
        if row is not None and row.speed is not None:
            p = row.speed.prediction
            counts += (f"; predicted for a {p.answer_tokens}-token answer: {p.per_answer()} "
                       f"({rate_words(p.tokens_per_s)})")
        return f"{measured}\n{counts}."

    def _stop_test(self) -> None:
        if self.generation is not None and self.generation.running:
            self.generation.stop()
            if self.canvas is not None:
                self.canvas.mark_stopping()

    def finish(self) -> None:
        """Save the choice and close the wizard; the loaded model stays loaded for the chat."""
        path = self.model_path
        if path is None or self.session.loaded(path) is None:
            return
        if self.generation is not None and self.generation.running:
            self._finish_when_done = True  # after the test stops (at once: it is cancelled)
            self._stop_test()
            self._nav()
            return
        config = self.app.config
        try:
            if isinstance(path, ServerSource):
                key = self.server_typed_key if self.query_one("#srv-save-key", Checkbox).value else None
                model_ops.save_server(config.path, path.url, key)
                config.server_url, config.server_api_key = path.url, key
            else:
                if config.server_url:  # the ready note said so: else the server would win at the next start
                    model_ops.save_server(config.path, None)
                    config.server_url = config.server_api_key = None
                model_ops.save_default_model(config.path, path)
                config.default_model = str(path)
        except DgchatError as exc:
            self.query_one("#ready-error", Static).update(str(exc))
            return
        config.exists = True
        self.session.use_default(path)
        self.dismiss(None)

    def skip(self) -> None:
        """No setup: write the config (so this does not come back) and go to the chat as it is."""
        app = self.app
        try:
            model_ops.save_default_model(app.config.path, None)
        except DgchatError as exc:
            self.query_one("#wiz-welcome-error", Static).update(str(exc))
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
        if self.pull_task is not None and self.pull_task.running:
            self.pull_task.close()
        self._stop_test()
        self.dismiss(None)

    # -- teardown -------------------------------------------------------------------------------
    def on_unmount(self) -> None:
        if self.pull_task is not None:
            self.pull_task.close()
        if self.server_task is not None:
            self.server_task.close()
        if self.profile_task is not None:  # stops the measurement; nothing half-measured is saved
            self.profile_task.close()
        self._stop_test()
