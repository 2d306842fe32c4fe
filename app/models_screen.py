"""The Models screen (F4, or Ctrl+P → model: manage models…): the same model manager as the wizard
and `dgchat models`, from inside the app.

Every catalog model with its fit badge for this machine, the installed and imported ones, and the
runnable GGUFs in the Hugging Face cache. On the selected row: **Use** makes it the default model
(written to the config) and loads it, downloading or adding it first when needed; **Pull**
downloads (Cancel pauses, Pull again resumes); **Verify** re-hashes an installed file; **Remove**
forgets a model and deletes the file when dgchat owns it (never a file in the HF cache or an
imported original); **Import…** adds a GGUF from disk (a DiffusionGemma file in the upstream layout
is converted). Only Pull, and Use on a model that is not here yet, go online.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from dgchat.app import model_ops
from dgchat.app.confirm_modal import ConfirmModal
from dgchat.app.model_ops import (
    HubTask,
    TransferPanel,
    describe_problem,
    short_path,
    start_hub_task,
)
from dgchat.app.prompt_modal import PromptModal
from dgchat.hub import DownloadCancelled, Hardware, TokenRequiredError
from dgchat.hub.fit import Fit
from dgchat.hub.manager import ModelRow, PullResult
from dgchat.hub.registry import InstalledModel
from dgchat.hub.util import format_bytes
from dgchat.model_backend.errors import DgchatError
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Button, DataTable, Footer, Header, Static

FIT_STYLES = {Fit.VRAM: "bold green", Fit.RAM: "yellow", Fit.NONE: "red", Fit.UNKNOWN: "dim"}


def hardware_line(hw: Hardware) -> str:
    gpu = "GPU offload" if hw.gpu_offload else "CPU only (no GPU offload in this build)"
    vram = ""
    if hw.vram_total is not None:
        vram = f" · {format_bytes(hw.vram_total)} {'unified memory' if hw.unified_memory else 'VRAM'}"
    cores = f"{hw.cpu_cores} CPU cores" if hw.cpu_cores is not None else "CPU cores unknown"
    ram = f"{format_bytes(hw.ram_total)} RAM" if hw.ram_total is not None else "RAM unknown"
    disk = (f"{format_bytes(hw.disk_free)} free in {short_path(hw.models_dir)}" if hw.disk_free is not None
            else f"free disk unknown in {short_path(hw.models_dir)}")
    corrected = " · corrected by you" if hw.overridden else ""
    return f"This machine: {cores} · {ram} · {disk} · {gpu}{vram}{corrected}"


def import_check(text: str) -> str | None:
    """Why `text` cannot be imported, from the file's header alone, or None."""
    from dgchat.model_backend.gguf_file import read_gguf_header
    from dgchat.model_backend.model_info import inspect_header

    if not text:
        return "enter the path of a GGUF file"
    path = Path(text).expanduser()
    try:
        header = read_gguf_header(path)
        if header.architecture != "diffusion-gemma":  # the upstream layout is converted on import
            inspect_header(header)
    except DgchatError as exc:
        return str(exc)
    except OSError as exc:
        return f"cannot read {text}: {exc.strerror or exc}"
    return None


class ModelsScreen(Screen[Path | None]):
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

    def compose(self) -> ComposeResult:
        yield Header(icon="≡")
        with Vertical(id="models-main"):
            yield Static("Looking at this machine…", id="models-hw", markup=False)
            yield DataTable(id="models-table", cursor_type="row")
            with VerticalScroll(id="models-detail-scroll"):
                yield Static("", id="models-detail", markup=False)
            yield TransferPanel(id="models-panel")
            with Horizontal(id="models-buttons"):
                yield Button("Use", id="m-use", variant="primary")
                yield Button("Pull", id="m-pull")
                yield Button("Cancel", id="m-cancel", variant="warning")
                yield Button("Verify", id="m-verify")
                yield Button("Remove", id="m-remove", variant="error")
                yield Button("Import…", id="m-import")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = "Models"
        self.query_one("#models-table", DataTable).add_columns(" ", "Model", "Size", "Where", "Fit for this machine")
        self.query_one(TransferPanel).display = False
        try:
            self.mgr = model_ops.make_manager()
        except DgchatError as exc:
            self.query_one("#models-hw", Static).update(f"The model catalog could not be read: {exc}")
            self._buttons()
            return
        models_dir = self.mgr.models_dir
        start_hub_task(self, "detect-hardware", lambda _p, _c: model_ops.machine(models_dir),
                       progress=lambda p: None, done=self._detected, failed=self._detect_failed)
        self._buttons()

    def _detected(self, hw: Hardware) -> None:
        self.hw = hw
        self.query_one("#models-hw", Static).update(hardware_line(hw))
        self.refresh_rows()
        self.query_one("#models-table", DataTable).focus()

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
            rows = self.mgr.listing(self.hw)
        except DgchatError as exc:
            self._message(f"The model list could not be read: {exc}", error=True)
            return
        self.rows = rows
        table.clear()
        in_use = _resolved(self._in_use())
        selected = 0
        for i, row in enumerate(rows):
            using = row.path is not None and in_use is not None and _resolved(row.path) == in_use
            mark = "●" if using else ("★" if row.recommended else "")
            fit = row.fit
            badge = Text(model_ops.fit_text(fit), style=FIT_STYLES.get(fit.fit, "") if fit else "dim")
            title = row.title if len(row.title) <= 46 else row.title[:45] + "…"
            table.add_row(mark, title, model_ops.fmt_size(row.size, row.size_exact), model_ops.where_text(row),
                          badge, key=str(i))
            if (keep is not None and row.name == keep) or (keep is None and using):
                selected = i
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
            using = row.path is not None and _resolved(row.path) == _resolved(self._in_use())
            detail.update(model_ops.row_details(row, self.hw) + ("\n● in use (the default model)" if using else "")
                          + cli)
        self._buttons()

    def _buttons(self) -> None:
        row = self.selected
        busy = self.hub_task is not None and self.hub_task.running
        can_pull = row is not None and (
            (row.entry is not None and not row.entry.bundled and row.status != "installed")
            or (row.entry is None and row.hf_cache is not None and row.status == "in HF cache"))
        pull = self.query_one("#m-pull", Button)
        pull.label = ("Resume" if row is not None and row.status == "partial" else
                      "Add" if row is not None and row.entry is None else "Pull")
        pull.disabled = busy or not can_pull
        self.query_one("#m-use", Button).disabled = busy or row is None or not (
            (row.path is not None and row.status in ("installed", "bundled")) or can_pull)
        self.query_one("#m-verify", Button).disabled = busy or row is None or row.installed is None or \
            row.status != "installed"
        self.query_one("#m-remove", Button).disabled = busy or row is None or row.status == "bundled" or not (
            row.installed is not None or row.partial is not None)
        self.query_one("#m-import", Button).disabled = busy or self.mgr is None
        self.query_one("#m-cancel", Button).display = busy
        self.refresh_bindings()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Keys follow the buttons: hidden while they do not apply (Cancel), greyed when disabled."""
        buttons = {"use": "m-use", "pull": "m-pull", "cancel": "m-cancel", "verify": "m-verify",
                   "remove": "m-remove", "import_model": "m-import"}
        if action not in buttons or not self.is_mounted:
            return True
        try:
            button = self.query_one(f"#{buttons[action]}", Button)
        except Exception:  # noqa: BLE001 - not composed yet
            return True
        if not button.display:
            return False
        return None if button.disabled else True

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        actions = {"m-use": self.action_use, "m-pull": self.action_pull, "m-cancel": self.action_cancel,
                   "m-verify": self.action_verify, "m-remove": self.action_remove, "m-import": self.action_import_model}
        action = actions.get(event.button.id or "")
        if action is not None:
            action()

    def _allowed(self, button_id: str) -> bool:
        button = self.query_one(f"#{button_id}", Button)
        return button.display and not button.disabled

    def _message(self, text: str, *, error: bool = False) -> None:
        panel = self.query_one(TransferPanel)
        panel.display = True
        if error:
            panel.failed(model_ops.Problem("That did not work", text, None))
        else:
            panel.finished(text)

    # -- actions --------------------------------------------------------------------------------
    def action_close(self) -> None:
        if self.hub_task is not None and self.hub_task.running:
            self.hub_task.close()
            self.app.notify("The download is paused; the partial file is kept (Pull resumes it).")
        self.dismiss(None)

    def action_cancel(self) -> None:
        if self.hub_task is not None and self.hub_task.running:
            self.hub_task.stop()
            self.query_one(TransferPanel).stopping()

    def action_pull(self, then_use: bool = False) -> None:
        row = self.selected
        if row is None or not self._allowed("m-pull"):
            return
        mgr = self.mgr
        self._then_use = then_use
        if row.entry is not None:
            name = row.name

            def call(progress: Any, cancel: threading.Event) -> Any:
                return mgr.pull(name, progress=progress, cancel=cancel)
            verb = "Resuming" if row.status == "partial" else "Getting"
        else:
            path, convert = row.hf_cache.path, row.needs_convert  # type: ignore[union-attr]

            def call(progress: Any, cancel: threading.Event) -> Any:
                return mgr.import_model(path, convert=convert, progress=progress, cancel=cancel)
            verb = "Adding"
        self._run(row, f"{verb} {row.title}…", call, done=self._pulled,
                  start=(row.partial.done, row.partial.total) if row.partial is not None else (0, None))

    def _run(self, row: ModelRow | None, title: str, call: Any, *, done: Any, start: tuple[int, int | None] = (0, None)) -> None:
        panel = self.query_one(TransferPanel)
        panel.display = True
        panel.start(title, *start)
        self.task_row = row
        self.hub_task = start_hub_task(self, "models", call, progress=panel.show, done=done, failed=self._failed)
        self._buttons()

    def _pulled(self, result: PullResult | InstalledModel) -> None:
        if isinstance(result, PullResult):
            text, path = model_ops.pull_summary(result), result.path
            name = result.model.name if result.model is not None else (self.task_row.name if self.task_row else "")
        else:
            text, path, name = f"Added as {result.name!r}: sha256 {result.sha256[:16]}… · {short_path(result.path)}", \
                result.path, result.name
        self.query_one(TransferPanel).finished(text)
        self.hub_task = None
        self.refresh_rows(keep=name if self.task_row is None or self.task_row.entry is None else self.task_row.name)
        if self._then_use:
            self._then_use = False
            self.switch_to(path, self.task_row.title if self.task_row else name)

    def _failed(self, exc: BaseException) -> None:
        self.hub_task = None
        panel = self.query_one(TransferPanel)
        problem = describe_problem(exc)
        if isinstance(exc, DownloadCancelled):
            panel.paused(exc)
        else:
            panel.failed(problem)
        then_use, self._then_use = self._then_use, False
        self.refresh_rows()
        if isinstance(exc, TokenRequiredError):
            def after(stored: bool | None) -> None:
                if stored:
                    self.action_pull(then_use=then_use)

            self.app.push_screen(model_ops.TokenModal(exc.repo, str(exc), exc.had_token), after)

    def action_use(self) -> None:
        row = self.selected
        if row is None or not self._allowed("m-use"):
            return
        if row.path is not None and row.status in ("installed", "bundled"):
            self.switch_to(row.path, row.title)
        else:
            self.action_pull(then_use=True)

    def switch_to(self, path: Path, title: str) -> None:
        """Use `path`: it becomes the default model (saved in the config) and the screen closes with
        it as the result; the app hands it to the chat, which uses it for the open chat."""
        app = self.app
        try:
            model_ops.save_default_model(app.config.path, path)
        except DgchatError as exc:
            self._message(str(exc), error=True)
            return
        app.config.default_model = str(path)
        app.config.exists = True
        app.session.use_default(Path(path))
        self.dismiss(Path(path))

    def action_verify(self) -> None:
        row = self.selected
        if row is None or not self._allowed("m-verify"):
            return
        mgr, name = self.mgr, row.installed.name  # type: ignore[union-attr]

        def call(progress: Any, cancel: threading.Event) -> Any:
            return mgr.verify(name, progress=progress, cancel=cancel)

        def verified(result: Any) -> None:
            self.hub_task = None
            self.query_one(TransferPanel).finished(
                f"{result.name}: sha256 {result.sha256[:16]}… matches the file as installed "
                f"({format_bytes(result.size)}, {short_path(result.path)})")
            self._buttons()

        self._run(row, f"Verifying {row.title}…", call, done=verified)

    def action_remove(self) -> None:
        row = self.selected
        if row is None or not self._allowed("m-remove"):
            return
        in_use = _resolved(self._in_use())
        loaded = _resolved(self.app.session.path)
        if row.path is not None and _resolved(row.path) in (in_use, loaded):
            self._message(f"{row.title} is the model in use; use another one first, then remove it.", error=True)
            return
        if row.installed is not None:
            m = row.installed
            if m.owned:
                what = f"Its file is deleted: {short_path(m.path)} ({format_bytes(m.size)})."
            else:
                what = f"The file stays where it is ({short_path(m.path)}); dgchat only forgets it."
        else:
            what = "The paused download is deleted."

        def answer(yes: bool | None) -> None:
            if not yes:
                return
            try:
                result = self.mgr.remove(row.name)
            except DgchatError as exc:
                self._message(str(exc), error=True)
                return
            parts = []
            if result.deleted:
                parts.append("deleted " + ", ".join(short_path(p) for p in result.deleted))
            if result.kept:
                parts.append("kept " + ", ".join(short_path(p) for p in result.kept))
            if result.partial_removed:
                parts.append("dropped the paused download")
            self._message(f"Removed {result.name}: " + "; ".join(parts) if parts else f"Removed {result.name}.")
            self.refresh_rows(keep=row.name)

        self.app.push_screen(ConfirmModal("Remove model", f"Remove {row.title}? {what}", confirm_label="Remove"),
                             answer)

    def action_import_model(self) -> None:
        if not self._allowed("m-import"):
            return

        def chosen(text: str | None) -> None:
            if not text:
                return
            path = Path(text).expanduser()
            from dgchat.model_backend.gguf_file import read_gguf_header

            try:
                convert = read_gguf_header(path).architecture == "diffusion-gemma"
            except (DgchatError, OSError) as exc:
                self._message(str(exc), error=True)
                return
            mgr = self.mgr

            def call(progress: Any, cancel: threading.Event) -> Any:
                return mgr.import_model(path, convert=convert, progress=progress, cancel=cancel)

            self._then_use = False
            self._run(None, f"Importing {path.name}…", call, done=self._pulled)

        self.app.push_screen(
            PromptModal("Import a model", "", placeholder="/path/to/model.gguf", ok_label="Import", check=import_check,
                        help_text="A GGUF text-diffusion model on this machine. It stays where it is (a DiffusionGemma "
                                  "file in the upstream layout is converted into the models folder):"),
            chosen,
        )

    def on_unmount(self) -> None:
        if self.hub_task is not None:
            self.hub_task.close()


def _resolved(path: Path | str | None) -> Path | None:
    if path is None:
        return None
    try:
        return Path(path).expanduser().resolve()
    except OSError:
        return Path(path).expanduser().absolute()
