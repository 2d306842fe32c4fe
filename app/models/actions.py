"""The Models screen's actions on the selected row: Pull (and Cancel), Use, Verify, Remove and
Import…, each run as a hub task in a worker with its progress in the transfer panel, and what
happens when one ends or fails.

A mixin of ModelsScreen (app/models_screen.py): its methods run on the screen, which decides
which of them apply to the selected row (`why_not`).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dgchat.app import model_ops
from dgchat.app.confirm_modal import ConfirmModal
from dgchat.app.hub_task import start_hub_task
from dgchat.app.model_ops import describe_problem, short_path
from dgchat.app.model_source import ModelSource
from dgchat.app.models.text import import_check, resolved_path
from dgchat.app.prompt_modal import PromptModal
from dgchat.app.token_modal import TokenModal
from dgchat.app.widgets.checkpoint_pull import PullPanel, conversion_label, keep_answer
from dgchat.app.widgets.checkpoint_pull import download_confirm as checkpoint_confirm
from dgchat.app.widgets.transfer_panel import TransferPanel
from dgchat.config import save_default_model, save_server
from dgchat.hub import DownloadCancelled, TokenRequiredError
from dgchat.hub.manager import ModelRow, PullResult
from dgchat.hub.registry import InstalledModel
from dgchat.hub.util import format_bytes
from dgchat.model_backend.errors import DgchatError
from dgchat.model_backend.gguf_file import read_gguf_header
from textual.screen import Screen

if TYPE_CHECKING:  # the mixin's methods run on the Models screen: the type checker sees them there
    _ScreenBase = Screen[ModelSource | None]
else:
    _ScreenBase = object


class ModelActions(_ScreenBase):
    """What the Models screen's keys and buttons do to the selected row."""

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
        """Get the selected model; a download is asked about first (what, how big, the disk)."""
        row = self.selected
        if row is None or not self._allowed("pull"):
            return
        if not model_ops.downloads(row):
            self._start_pull(row, then_use)
            return
        modal = checkpoint_confirm(row, self.hw, self.mgr.models_dir, then_use=then_use, no_speed=self.no_speed())

        def answer(yes: bool | None) -> None:
            if yes:
                self._start_pull(row, then_use, keep=keep_answer(modal))

        self.app.push_screen(modal, answer)

    def _start_pull(self, row: ModelRow, then_use: bool, keep: bool = False) -> None:
        """`keep`: a checkpoint entry's checkpoint is kept after its conversion (the question's tick box)."""
        mgr = self.mgr
        self._then_use = then_use
        self._keep = keep
        if row.entry is not None:
            name = row.name

            def call(progress: Any, cancel: threading.Event) -> Any:
                return mgr.pull(name, progress=progress, cancel=cancel, keep_checkpoint=keep)
            verb = "Resuming" if row.status == "partial" else "Getting"
        else:
            path, convert = row.hf_cache.path, row.needs_convert  # type: ignore[union-attr]

            def call(progress: Any, cancel: threading.Event) -> Any:
                return mgr.import_model(path, convert=convert, progress=progress, cancel=cancel)
            verb = "Adding"
        self._run(row, f"{verb} {row.title}…", call, done=self._pulled,
                  start=(row.partial.done, row.partial.total) if row.partial is not None else (0, None))

    def _run(self, row: ModelRow | None, title: str, call: Any, *, done: Any, start: tuple[int, int | None] = (0, None)) -> None:
        panel = self.query_one(PullPanel)
        panel.display = True
        panel.remove_class("-failed")
        panel.stages(conversion_label(row.entry) if row is not None else None)
        panel.start(title, *start)
        self._panel_message = True
        self._panel_about = row.name if row is not None else None
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
        keep = name if self.task_row is None or self.task_row.entry is None else self.task_row.name
        self._panel_about = keep  # an import or a model from the HF cache is a row of its own now
        self.refresh_rows(keep=keep)
        if self._then_use:
            self._then_use = False
            self.switch_to(path, self.task_row.title if self.task_row else name)

    def _failed(self, exc: BaseException) -> None:
        self.hub_task = None
        panel = self.query_one(TransferPanel)
        problem = describe_problem(exc)
        if isinstance(exc, DownloadCancelled):
            panel.paused(exc, resume_word="Pull")
        else:
            panel.failed(problem)
            panel.add_class("-failed")
        then_use, self._then_use = self._then_use, False
        row = self.task_row
        self.refresh_rows()
        if isinstance(exc, TokenRequiredError) and row is not None:
            def after(stored: bool | None) -> None:
                if stored:  # the download was agreed to already
                    self._start_pull(row, then_use, keep=self._keep)

            self.app.push_screen(TokenModal(exc.repo, str(exc), exc.had_token), after)

    def action_use(self) -> None:
        row = self.selected
        if row is None or not self._allowed("use"):
            return
        if row.path is not None and row.status in ("installed", "bundled"):
            self.switch_to(row.path, row.title)
        else:
            self.action_pull(then_use=True)

    def switch_to(self, path: Path, title: str) -> None:
        """Use `path`: it becomes the default model (saved in the config) and the screen closes with
        it as the result; the app hands it to the chat, which uses it for the open chat. While the
        config names a server (which would win at the next start) the user is asked first, and
        yes removes it."""
        app = self.app
        server_url = app.config.server_url
        if server_url:
            def answer(yes: bool | None) -> None:
                if yes:
                    self._switch(path, forget_server=True)

            app.push_screen(ConfirmModal(
                "The config names a server",
                f"{short_path(app.config.path)} says [server] url = {server_url}, and that server wins over the "
                f"default model every time dgchat starts. Use {title}, and remove the server from the config?",
                confirm_label="Use it, remove the server", confirm_variant="primary"), answer)
            return
        self._switch(path)

    def _switch(self, path: Path, *, forget_server: bool = False) -> None:
        app = self.app
        try:
            if forget_server:
                save_server(app.config.path, None)
                app.config.server_url = app.config.server_api_key = None
            save_default_model(app.config.path, path)
        except DgchatError as exc:
            self._message(str(exc), error=True)
            return
        app.config.default_model = str(path)
        app.config.exists = True
        app.session.use_default(Path(path))
        self.dismiss(Path(path))

    def action_verify(self) -> None:
        row = self.selected
        if row is None or not self._allowed("verify"):
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
        if row is None or not self._allowed("remove"):
            return
        in_use = resolved_path(self._in_use())
        loaded = resolved_path(self.app.session.path)
        if row.path is not None and resolved_path(row.path) in (in_use, loaded):
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
        if not self._allowed("import_model"):
            return

        def chosen(text: str | None) -> None:
            if not text:
                return
            path = Path(text).expanduser()
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
