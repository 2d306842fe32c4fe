"""The Models screen (F4, or Ctrl+P → model: manage models…): the same model manager as the wizard
and `dgchat models`, from inside the app.

Every catalog model with its fit badge for this machine and its predicted answer time (from this
machine's speed profile: the saved one, or measured once in a worker when the screen opens, the
rows shown at once and their answer times when the measurement ends; "too slow here" over the
config's answer_seconds_limit), the installed and imported ones, and the runnable GGUFs in the
Hugging Face cache. On the selected row: **Use** makes it the default model
(written to the config) and loads it, getting it first when needed; **Pull** gets it: downloads a
catalog model (Cancel pauses, Pull again resumes) or adds one found in the Hugging Face cache;
**Verify** re-hashes an installed file; **Remove** forgets a model and deletes the file when dgchat
owns it (never a file in the HF cache or an imported original); **Import…** adds a GGUF from disk
(a DiffusionGemma file in the upstream layout is converted). Only Pull, and Use on a model that is
not here yet, go online, and only after a question naming the model, its size, the free disk and
how fast it would answer here.

When the app's model comes from a server (`dgchat --server URL`, or `[server] url` in config.toml),
a line above the table names it ("Served by http://…: MODEL · live canvas / text only") with its
own Use button ("Use this server"). Use on a local model while the config names a server asks
first: the config's server wins over the default model at every start, so the answer that uses
the model also removes `[server]` from the config (nothing changes silently).

Keys and buttons are there only where they apply to the selected row (the bundled model has
nothing to pull, verify or remove); a key pressed anyway says why it does not apply. The table
fits its width: the answer time without its after-a-GPU-rebuild part, shorter badge words, then no
Where column, then cut titles.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dgchat.app import model_ops
from dgchat.app.hub_task import HubTask, start_hub_task
from dgchat.app.model_ops import describe_problem, is_bundled
from dgchat.app.model_source import ModelSource
from dgchat.app.models.actions import ModelActions
from dgchat.app.models.server_line import ServerLine
from dgchat.app.models.text import hardware_line, resolved_path
from dgchat.app.widgets.checkpoint_pull import PullPanel
from dgchat.app.widgets.fitting_footer import FittingFooter
from dgchat.app.widgets.transfer_panel import TransferPanel
from dgchat.hub import Hardware
from dgchat.hub.machine_profile import MachineProfile, ProfileCancelled
from dgchat.hub.manager import ModelRow
from dgchat.model_backend.errors import DgchatError
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Button, DataTable, Header, Static

NARROW = 70  # columns below which the screen uses its short forms
SHORT = 24  # rows below which the buttons lose their borders
TABLE_ROWS = 14  # model rows the table shows before it scrolls (its max-height less the header)
# rows the rest of the screen needs at least (header, machine line, table header and margin, detail,
# a transfer's phase, bar, status and a two-line problem, the buttons, the footer), borderless buttons
# and no margins below SHORT rows: the table shows what is left, at least MIN_TABLE_ROWS
RESERVED_ROWS, RESERVED_ROWS_SHORT, MIN_TABLE_ROWS = 18, 13, 3

# action -> its button
ACTION_BUTTONS = {"use": "m-use", "pull": "m-pull", "cancel": "m-cancel", "verify": "m-verify",
                  "remove": "m-remove", "import_model": "m-import"}


class ModelsScreen(ServerLine, ModelActions, Screen[ModelSource | None]):
    DEFAULT_CSS = """
    #models-main { height: 1fr; padding: 0 1; }
    #models-hw { color: $text-muted; margin-bottom: 1; }
    #models-speed { color: $text-muted; margin-bottom: 1; }
    #models-speed.-error { color: $error; }
    #models-table { height: auto; max-height: 15; margin-bottom: 1; scrollbar-size-vertical: 1; }  /* TABLE_ROWS + header */
    #models-detail-scroll { height: 1fr; min-height: 3; }
    #models-panel { margin-bottom: 1; }
    #models-buttons { height: auto; }
    #models-server { height: auto; margin-bottom: 1; }
    #models-server-text { width: 1fr; }
    #models-server Button { min-width: 8; width: auto; }
    ModelsScreen.-short #models-server { margin-bottom: 0; }
    #models-buttons Button { margin-right: 1; min-width: 8; width: auto; }
    ModelsScreen.-short #models-hw, ModelsScreen.-short #models-table, ModelsScreen.-short #models-panel {
        margin-bottom: 0;
    }
    /* a transfer that failed: its bar (stopped where it was) says nothing the message does not, and
       its row is what keeps the buttons on an 80x24 screen */
    #models-panel.-failed ProgressBar { display: none; }
    ModelsScreen.-short #models-speed { margin: 0; }
    """

    BINDINGS = [
        Binding("escape", "close", "Close", id="models.close"),
        Binding("u", "use", "Use", id="models.use"),
        Binding("p", "pull", "Pull", id="models.pull"),
        Binding("c", "cancel", "Cancel", id="models.cancel"),
        Binding("v", "verify", "Verify", id="models.verify"),
        Binding("d,delete", "remove", "Remove", id="models.remove"),
        Binding("i", "import_model", "Import", id="models.import"),
    ]

    def __init__(self) -> None:
        super().__init__(id="models-screen")
        self.mgr: Any = None
        self.hw: Hardware | None = None
        self.rows: list[ModelRow] = []
        self.hub_task: HubTask | None = None
        self.task_row: ModelRow | None = None
        self._then_use = False
        self._keep = False  # the pull running keeps its checkpoint (a checkpoint entry)
        self.table_rows = TABLE_ROWS  # model rows the table shows at this terminal's height (_fit_to_size)
        self._table_width = 0  # the width the table was laid out for
        # the panel's last result or problem, and the model (row name) it is about: it shows while
        # that model is selected, so that "No network connection" is not read as another model's
        self._panel_message = False
        self._panel_about: str | None = None
        self.profile: MachineProfile | None = None  # this machine's speed: answer times
        self.profile_task: HubTask | None = None  # measuring it (the first time only)
        self.profile_error = ""

    def compose(self) -> ComposeResult:
        yield Header(icon="≡")
        with Vertical(id="models-main"):
            yield Static("Looking at this machine…", id="models-hw", markup=False)
            yield Static("", id="models-speed", markup=False)
            with Horizontal(id="models-server"):
                yield Static("", id="models-server-text", markup=False)
                yield Button("Use this server", id="m-server")
            yield DataTable(id="models-table", cursor_type="row")
            with VerticalScroll(id="models-detail-scroll"):
                yield Static("", id="models-detail", markup=False)
            yield PullPanel(id="models-panel")  # a checkpoint: a second bar for its conversion
            with Horizontal(id="models-buttons"):
                yield Button("Use", id="m-use", variant="primary")
                yield Button("Pull", id="m-pull")
                yield Button("Cancel", id="m-cancel", variant="warning")
                yield Button("Verify", id="m-verify")
                yield Button("Remove", id="m-remove", variant="error")
                yield Button("Import…", id="m-import")
        yield FittingFooter()

    def on_mount(self) -> None:
        self.sub_title = "Models"
        self.query_one(TransferPanel).display = False
        self.query_one("#models-speed").display = False
        self.app.session.watch(self, lambda _change: self._show_server())  # connected, failed, in use
        self._show_server()
        self._fit_to_size()
        try:
            self.mgr = model_ops.make_manager()
        except DgchatError as exc:
            self.query_one("#models-hw", Static).update(f"The model catalog could not be read: {exc}")
            self._buttons()
            return
        models_dir, threads = self.mgr.models_dir, self.app.config.n_threads
        start_hub_task(self, "detect-hardware", lambda _p, _c: model_ops.machine_and_profile(models_dir, threads),
                       progress=lambda p: None, done=self._detected, failed=self._detect_failed)
        self._buttons()

    def on_resize(self, event: events.Resize) -> None:
        laid_out = self.table_rows
        self._fit_to_size()
        if self.rows and (self._table_width != self._room() or self.table_rows != laid_out):
            self.refresh_rows()

    def _fit_to_size(self) -> None:
        """Short forms on a small terminal: borderless buttons when rows are few, a one-line
        description of the machine when columns are few."""
        width, height = self.app.size
        short = height < SHORT
        self.set_class(short, "-short")
        # the catalog grew past what 80x24 shows with a transfer's message: the table scrolls instead
        visible = max(MIN_TABLE_ROWS, min(TABLE_ROWS, height - (RESERVED_ROWS_SHORT if short else RESERVED_ROWS)))
        if visible != self.table_rows:
            self.table_rows = visible
            self.query_one("#models-table", DataTable).styles.max_height = visible + 1  # + its header
        for button in self.query("#models-buttons Button, #models-server Button").results(Button):
            button.compact = short
        if self.hw is not None:
            self.query_one("#models-hw", Static).update(hardware_line(self.hw, short=width < NARROW))

    def _room(self) -> int:
        """Columns the table has: the screen less #models-main's padding."""
        return max(20, self.app.size.width - 2)

    def _detected(self, result: tuple[Hardware, MachineProfile | None]) -> None:
        self.hw, self.profile = result
        self._fit_to_size()
        self.refresh_rows()
        self.query_one("#models-table", DataTable).focus()
        if self.profile is None:  # never measured with this engine build: once, now, in a worker
            self.profile_task = model_ops.start_profile_task(
                self, self.app.config.n_threads, progress=self._measuring, done=self._measured,
                failed=self._measure_failed)
            self._speed_line(model_ops.measuring_text(0.0, "starting"))

    def _speed_line(self, text: str, *, error: bool = False) -> None:
        line = self.query_one("#models-speed", Static)
        line.update(text)
        line.display = bool(text)
        line.set_class(error, "-error")

    def _measuring(self, fraction: float, what: str) -> None:
        self._speed_line(model_ops.measuring_text(fraction, what))

    def _measured(self, profile: MachineProfile) -> None:
        self.profile_task = None
        self.profile = profile
        self._speed_line("")
        self.refresh_rows()

    def _measure_failed(self, exc: BaseException) -> None:
        self.profile_task = None
        if isinstance(exc, ProfileCancelled):
            return
        self.profile_error = describe_problem(exc).message
        self._speed_line(f"No answer times: this machine's speed could not be measured ({self.profile_error}).",
                         error=True)
        self._show_detail()

    def no_speed(self) -> str:
        """Why a model that fits has no answer time (model_ops.speed_lines)."""
        if self.profile_task is not None and self.profile_task.running:
            return "not known yet (measuring this machine, a few seconds)"
        return "unknown (this machine's speed could not be measured)"

    def _detect_failed(self, exc: BaseException) -> None:
        self.query_one("#models-hw", Static).update(f"This machine could not be read: {describe_problem(exc).message}")
        self.refresh_rows()

    # -- the list -------------------------------------------------------------------------------
    def _in_use(self) -> Path | None:
        return self.app.session.default_path

    def refresh_rows(self, keep: str | None = None) -> None:
        table = self.query_one("#models-table", DataTable)
        if keep is None and self.selected is not None:
            keep = self.selected.name
        try:
            rows = self.mgr.listing(self.hw, profile=self.profile, limit_s=self.app.config.answer_seconds_limit)
        except DgchatError as exc:
            self._message(f"The model list could not be read: {exc}", error=True)
            return
        self.rows = rows
        in_use = resolved_path(self._in_use())
        marks = []
        selected = 0
        for i, row in enumerate(rows):
            using = row.path is not None and in_use is not None and resolved_path(row.path) == in_use
            marks.append("●" if using else ("★" if row.recommended else ""))
            if (keep is not None and row.name == keep) or (keep is None and using):
                selected = i
        self._table_width = self._room()
        model_ops.fill_model_table(table, rows, marks, self._table_width, visible_rows=self.table_rows)
        if rows:
            table.move_cursor(row=selected, animate=False)
        self._show_detail()

    @property
    def selected(self) -> ModelRow | None:
        table = self.query_one("#models-table", DataTable)
        if not self.rows or table.cursor_row is None or not 0 <= table.cursor_row < len(self.rows):
            return None
        return self.rows[table.cursor_row]

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        self._show_detail()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_use()

    def _show_detail(self) -> None:
        row = self.selected
        detail = self.query_one("#models-detail", Static)
        if row is None:
            detail.update("")
        else:
            cli = f"\nShell: dgchat models pull {row.name}" if row.entry is not None and not row.entry.bundled else ""
            using = row.path is not None and resolved_path(row.path) == resolved_path(self._in_use())
            detail.update(model_ops.row_details(row, self.hw, no_speed=self.no_speed())
                          + ("\n● in use (the default model)" if using else "") + cli)
        self._panel_follows_selection()
        self._buttons()

    def _panel_follows_selection(self) -> None:
        """The panel's result or problem shows while the model it is about is selected; a transfer
        that runs stays in view whatever is selected."""
        if self.busy or not self._panel_message:
            return
        row = self.selected
        self.query_one(TransferPanel).display = row is not None and row.name == self._panel_about

    # -- what applies to the selected row ---------------------------------------------------------
    @property
    def busy(self) -> bool:
        return self.hub_task is not None and self.hub_task.running

    def _can_get(self, row: ModelRow) -> bool:
        """Pull applies: a catalog model not installed, or a model in the HF cache not added yet."""
        if row.entry is not None:
            return not row.entry.bundled and row.status != "installed"
        return row.hf_cache is not None and row.status == "in HF cache"

    def why_not(self, action: str) -> str | None:
        """Why `action` does not apply to the selected row (None: it does). A running transfer is
        not a reason here: it only greys the keys for a while (check_action)."""
        if action == "cancel":
            return None if self.busy else "Nothing is being downloaded or checked right now."
        if action == "import_model":
            return None if self.mgr is not None else "The model catalog could not be read, so nothing can be added."
        row = self.selected
        if row is None:
            return "No model is selected."
        title = row.title
        bundled = is_bundled(row)
        if action == "use":
            if (row.path is not None and row.status in ("installed", "bundled")) or self._can_get(row):
                return None
            return f"{title}: its file is gone; remove it, then import or pull it again."
        if action == "pull":
            if self._can_get(row):
                return None
            if bundled:
                return f"{title} ships with dgchat: there is nothing to pull."
            if row.status == "installed":
                return f"{title} is installed already; Use (u) switches to it."
            return f"{title}: its file is gone; remove it, then import it again."
        if action == "verify":
            if row.installed is not None and row.status == "installed":
                return None
            if bundled:
                return f"{title} ships with dgchat: there is no download to verify."
            if row.status == "in HF cache":
                return f"{title} is in the Hugging Face cache, not added yet: Pull (p) adds and verifies it."
            if row.status == "missing":
                return f"{title}: its file is gone, so there is nothing to verify."
            return f"{title} is not on this machine: Pull (p) downloads and verifies it."
        if action == "remove":
            if bundled:
                return f"{title} ships with dgchat and cannot be removed."
            if row.installed is not None or row.partial is not None:
                return None
            if row.status == "in HF cache":
                return f"{title} is in the Hugging Face cache, which dgchat never deletes from."
            return f"{title} is not on this machine: there is nothing to remove."
        return None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Keys follow the buttons: hidden where they do not apply to the selected row, greyed
        while a transfer runs."""
        if action not in ACTION_BUTTONS or not self.is_mounted:
            return True
        try:
            if self.why_not(action) is not None:
                return False
        except Exception:  # noqa: BLE001 - not composed yet
            return True
        if self.busy and action != "cancel":
            return None
        return True

    def _buttons(self) -> None:
        busy = self.busy
        for action, button_id in ACTION_BUTTONS.items():
            button = self.query_one(f"#{button_id}", Button)
            button.display = self.why_not(action) is None
            button.disabled = busy and action != "cancel"
        self.refresh_bindings()

    def _allowed(self, action: str) -> bool:
        """Whether `action` may run now; if not, the user is told why."""
        why = self.why_not(action)
        if why is None and self.busy and action != "cancel":
            task = self.task_row.title if self.task_row is not None else "the transfer"
            why = f"Wait for {task} to finish, or Cancel it (c)."
        if why is not None:
            self.app.notify(why, title="Does not apply", timeout=6)
            return False
        return True

    def on_key(self, event: events.Key) -> None:
        """A key whose action is hidden or greyed does not reach the action (Textual skips it):
        say why instead of doing nothing."""
        action = self._action_for_key(event.key)
        if action in ACTION_BUTTONS and self.check_action(action, ()) is not True:
            event.stop()
            event.prevent_default()
            self._allowed(action)

    def _action_for_key(self, key: str) -> str | None:
        bindings = self._bindings.copy()
        keymap = getattr(self.app, "_keymap", None)  # the user's [keys] remapping
        if keymap:
            bindings.apply_keymap(keymap)
        for binding in bindings.key_to_bindings.get(key, ()):
            return binding.action
        return None

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        actions = {"m-server": self.action_use_server, "m-use": self.action_use, "m-pull": self.action_pull, "m-cancel": self.action_cancel,
                   "m-verify": self.action_verify, "m-remove": self.action_remove, "m-import": self.action_import_model}
        action = actions.get(event.button.id or "")
        if action is not None:
            action()

    def _message(self, text: str, *, error: bool = False, about: str | None = None) -> None:
        """`about`: the model (row name) the message is about; None: the selected one."""
        panel = self.query_one(TransferPanel)
        panel.display = True
        panel.remove_class("-failed")
        self._panel_message = True
        selected = self.selected
        self._panel_about = about if about is not None else (selected.name if selected is not None else None)
        if error:
            panel.failed(model_ops.Problem("That did not work", text, None))
        else:
            panel.finished(text)

    def on_unmount(self) -> None:
        if self.hub_task is not None:
            self.hub_task.close()
        if self.profile_task is not None:  # stops the measurement; nothing half-measured is saved
            self.profile_task.close()
