"""The wizard's download step: the chosen model comes from the hub (or the Hugging Face cache).

Bytes, speed and time left; Cancel keeps the partial file and Resume continues it (also after
quitting); the sha256 result; a gated repo asks for a token; a DiffusionGemma file is converted with
progress; a checkpoint entry shows two bars (app/widgets/checkpoint_pull.py): its download, then its
conversion and quantization. The heading says what became of the download (paused, not downloaded,
downloaded). This is the wizard's only network traffic besides a server the user names (dgchat.hub
lifts HF_HUB_OFFLINE for that call alone); when the hub cannot be reached at all the page says "No
network connection" and offers the bundled model, which needs none.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from dgchat.app import model_ops
from dgchat.app.hub_task import HubTask, start_hub_task
from dgchat.app.model_ops import Problem, describe_problem
from dgchat.app.paths import short_path
from dgchat.app.token_modal import TokenModal
from dgchat.app.widgets.checkpoint_pull import PullPanel, conversion_label
from dgchat.app.widgets.path_text import PathText
from dgchat.app.wizard.messages import Downloaded, GoToStep, NavChanged
from dgchat.app.wizard.step import NavPlan
from dgchat.hub import DownloadCancelled, TokenRequiredError
from dgchat.hub.download import Progress
from dgchat.hub.manager import ModelManager, ModelRow, PullResult
from dgchat.hub.registry import InstalledModel
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widget import Widget
from textual.widgets import Label, Static


class DownloadStep(VerticalScroll):
    """Step 4: one download (or import) at a time, with its progress, its result or its problem."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(id="step-download", classes="wiz-step", **kwargs)
        self.mgr: ModelManager | None = None
        self.row: ModelRow | None = None
        self.keep_checkpoint = False  # ticked in the download question of a checkpoint entry
        self.offer_bundled = False  # the bundled model is there to offer when the download fails
        self.state = "idle"  # idle | running | paused | failed | done
        self.problem: Problem | None = None
        self.result: PullResult | InstalledModel | None = None
        self.pull_task: HubTask | None = None

    def compose(self) -> ComposeResult:
        yield Label("", id="dl-title", classes="wiz--h1", markup=False)
        yield Static("", id="dl-source", classes="wiz--muted", markup=False)
        yield PullPanel(id="dl-panel")  # a checkpoint: a second bar for its conversion

    # -- the screen's hooks ---------------------------------------------------------------------
    def prepare(self, mgr: ModelManager, row: ModelRow, *, keep_checkpoint: bool, offer_bundled: bool) -> None:
        """The model to get next (the screen shows the step, then calls start)."""
        self.mgr, self.row = mgr, row
        self.keep_checkpoint, self.offer_bundled = keep_checkpoint, offer_bundled
        self.state = "idle"

    def nav_plan(self) -> NavPlan:
        state = self.state
        retry = state in ("paused", "failed") and self.problem is not None and bool(self.problem.retry)
        shown = {"wiz-back"} if state != "running" else {"wiz-cancel"}
        if retry:
            shown.add("wiz-retry")
        # a failed download (no network above all): the model that needs none is one press away
        if state == "failed" and self.offer_bundled:
            shown.add("wiz-bundled")
        labels = {"wiz-retry": self.problem.retry or "Retry"} if retry and self.problem is not None else {}
        return NavPlan(shown=frozenset(shown), next_label="Next: test it", next_shown=state == "done",
                       back_label="Choose another model", labels=labels, disabled={"wiz-bundled": False},
                       busy=state == "running")

    def focus_target(self) -> Widget | None:
        return None

    def next(self) -> None:
        if self.state == "done":
            self.post_message(GoToStep("ready"))

    @property
    def running(self) -> bool:
        return self.state == "running"

    @property
    def done_path(self) -> Path | None:
        """The file this step got, once it is done (None before, and after a failure or a pause)."""
        return self.result.path if self.state == "done" and self.result is not None else None

    # -- the download ---------------------------------------------------------------------------
    def start(self) -> None:
        row, mgr = self.row, self.mgr
        assert row is not None and mgr is not None
        self.problem = None
        self.result = None
        self.state = "running"
        self._show_title()
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
        self.post_message(NavChanged())

    def _show_title(self) -> None:
        """The heading says what is happening now: the download, its pause, its failure or its end
        (not "Downloading …" over a failure)."""
        row = self.row
        if row is None:
            return
        cached = row.status == "in HF cache"
        title = {
            "paused": f"Paused: {row.title}",
            "failed": f"Not {'added' if cached else 'downloaded'}: {row.title}",
            "done": f"{'Added' if cached else 'Downloaded'}: {row.title}",
        }.get(self.state, f"Getting {row.title}" if cached else f"Downloading {row.title}")
        self.query_one("#dl-title", Label).update(title)

    @property
    def panel(self) -> PullPanel:
        return self.query_one("#dl-panel", PullPanel)

    def show_progress(self, p: Progress) -> None:
        """One progress report (dgchat.hub.Progress) on screen: phase, bar, bytes/speed/ETA, message."""
        if self.state == "running":
            self.panel.show(p)

    def cancel(self) -> None:
        """Pause the download (its partial file is kept; Resume continues it)."""
        if self.pull_task is not None and self.pull_task.running:
            self.pull_task.stop()
            self.panel.stopping()

    def close_task(self) -> None:
        """The wizard closes: a download in progress is paused, its partial file kept."""
        if self.pull_task is not None and self.pull_task.running:
            self.pull_task.close()

    def _pulled(self, result: PullResult | InstalledModel) -> None:
        self.state = "done"
        self.result = result
        if isinstance(result, PullResult):
            text = model_ops.pull_summary(result)
        else:
            text = f"Added: sha256 {result.sha256[:16]}… · {short_path(result.path)}"
        self.post_message(Downloaded(result.path))
        self.panel.finished(text)
        self._show_title()
        self.post_message(NavChanged(focus="step"))

    def _pull_failed(self, exc: BaseException) -> None:
        problem = describe_problem(exc)
        self.problem = problem
        if isinstance(exc, DownloadCancelled):
            self.state = "paused"
            self.panel.paused(exc)
        else:
            self.state = "failed"
            self.panel.failed(problem)
        self._show_title()
        if isinstance(exc, TokenRequiredError):
            self.post_message(NavChanged())
            self._ask_token(exc)
        else:
            self.post_message(NavChanged(focus="wiz-retry"))

    def _ask_token(self, exc: TokenRequiredError) -> None:
        def done(stored: bool | None) -> None:
            if stored:
                self.start()

        self.app.push_screen(TokenModal(exc.repo, str(exc), exc.had_token), done)

    def retry(self) -> None:
        """Retry (or Resume): a token problem asks for the token first."""
        if self.problem is not None and self.problem.token and self.row is not None:
            repo = self.row.entry.repo if self.row.entry is not None else ""
            self._ask_token(TokenRequiredError(self.problem.message, repo=repo or "", had_token=False))
            return
        self.start()

    def on_unmount(self) -> None:
        if self.pull_task is not None:
            self.pull_task.close()
