"""The wizard's model step: the catalog with fit badges, predicted answer times and the estimate
behind them; the recommendation (by memory and speed: config answer_seconds_limit) preselected, with
why, and which stronger models were passed over as too slow. The bundled model is always a choice;
installed models and models in the Hugging Face cache need no download. A model to download is asked
about first (size, disk, free disk, predicted answer time: the Models screen's question).

The recommendation above the table is one clause, so that it stays whole on a small terminal; the
rest of its reason leads its row's details. "Use a server…" is the screen's (server.py's form).
"""

from __future__ import annotations

from typing import Any

from dgchat import assets
from dgchat.app import model_ops
from dgchat.app.widgets.checkpoint_pull import download_confirm, keep_answer
from dgchat.app.widgets.path_text import PathText
from dgchat.app.wizard.messages import GetModel, NavChanged, NextRequested, UseModel
from dgchat.app.wizard.speed import SpeedReport
from dgchat.app.wizard.step import SHORT, WIZARD_MAX_WIDTH, NavPlan
from dgchat.hub import Hardware
from dgchat.hub.fit import Recommendation
from dgchat.hub.manager import ModelManager, ModelRow
from dgchat.model_backend.errors import DgchatError
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widget import Widget
from textual.widgets import DataTable, Label, Static

TABLE_INSET = 6  # #wizard's padding (2) + #wiz-body's border and padding (4)
TABLE_ROWS = 10  # model rows #wiz-models shows before it scrolls (its max-height less the header)
SHORT_TABLE_ROWS = 6  # the same below SHORT rows (#wizard-screen.-short #wiz-models)


def choose_label(row: ModelRow | None) -> tuple[str, bool]:
    """The main button's label for the selected row, and whether it can be pressed."""
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


class ModelStep(Vertical):
    """Step 3: the model list, the selected row's details, and the choice."""

    def __init__(self, **kwargs: Any) -> None:
        # not a scroll box: the table and the details scroll each on their own
        super().__init__(id="step-model", classes="wiz-step", **kwargs)
        self.mgr: ModelManager | None = None
        self.hw: Hardware | None = None
        self.speed = SpeedReport()
        self.rows: list[ModelRow] = []
        self.choice: ModelRow | None = None
        self.recommendation: Recommendation | None = None  # the model list's (hub.fit.recommend)
        self._auto_choice: str | None = None  # the row preselected as recommended (not the user's pick)
        self._table_width = 0  # the width the model table was laid out for

    def compose(self) -> ComposeResult:
        yield Label("Choose a model", classes="wiz--h1")
        # whole, not in a scroll box of its own: the reason is one clause (see fill)
        with Vertical(id="model-why-box"):
            yield Static("", id="model-why", classes="wiz--muted", markup=False)
            yield Static("", id="model-speed", classes="wiz--muted", markup=False)
        yield DataTable(id="wiz-models", cursor_type="row", zebra_stripes=False)
        with VerticalScroll(id="model-detail-scroll"):
            yield Static("", id="model-detail", markup=False)

    # -- the screen's hooks ---------------------------------------------------------------------
    def enter(self, mgr: ModelManager | None, hw: Hardware | None, speed: SpeedReport) -> None:
        """The step shows: the list for this machine (`hw`) and its speed as known now."""
        self.mgr, self.hw, self.speed = mgr, hw, speed
        self.fill()

    def set_speed(self, speed: SpeedReport) -> None:
        """A new speed report: the status line follows at once, the list when the screen refills it."""
        self.speed = speed
        self._show_speed()

    def nav_plan(self) -> NavPlan:
        label, enabled = choose_label(self.choice)
        return NavPlan(shown=frozenset({"wiz-back", "wiz-bundled", "wiz-server"}), next_label=label,
                       next_enabled=enabled, disabled={"wiz-bundled": self.bundled_row() is None})

    def focus_target(self) -> Widget | None:
        return self.query_one("#wiz-models", DataTable)

    def next(self) -> None:
        if self.choice is not None:
            self.choose(self.choice)

    def fit_width(self) -> None:
        """The terminal was resized: the table is laid out again if its width changed."""
        if self.rows and self._table_width != self._table_room():
            self.fill()

    # -- the list -------------------------------------------------------------------------------
    def fill(self) -> None:
        table = self.query_one("#wiz-models", DataTable)
        table.clear()
        why = self.query_one("#model-why", Static)
        limit = self.app.config.answer_seconds_limit
        profile, mgr = self.speed.profile, self.mgr
        assert mgr is not None  # the machine step's Next needs the catalog
        try:
            self.rows = mgr.listing(self.hw, profile=profile, limit_s=limit)
            rec = mgr.recommend(self.hw, profile=profile, limit_s=limit) if self.hw is not None else None
        except DgchatError as exc:
            self.rows = []
            self.recommendation = None
            why.update(f"The model list could not be read: {exc}")
            self.choice = None
            self.post_message(NavChanged())
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

    def _show_speed(self) -> None:
        """The status line above the table: measuring, not measured, failed ("" with a profile)."""
        status = self.speed.status()
        line = self.query_one("#model-speed", Static)
        line.update(status)
        line.display = bool(status)

    def _table_room(self) -> int:
        return max(20, min(self.app.size.width, WIZARD_MAX_WIDTH) - TABLE_INSET)

    def _table_rows(self) -> int:
        return SHORT_TABLE_ROWS if self.app.size.height < SHORT else TABLE_ROWS

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        if event.data_table.id == "wiz-models" and event.cursor_row < len(self.rows):
            self._select(event.cursor_row)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if event.data_table.id == "wiz-models" and event.cursor_row < len(self.rows):
            self._select(event.cursor_row)
            # after the NavChanged of _select: the screen checks the main button as it now is
            self.post_message(NextRequested())

    def _select(self, index: int) -> None:
        self.choice = self.rows[index]
        self.query_one("#model-detail", Static).update(PathText(self._details(self.choice)))
        self.post_message(NavChanged())

    def _details(self, row: ModelRow) -> str:
        """The row's details; the recommended row's begin with the rest of its recommendation's
        reason (the line above the table names the reason only): the memory it needs of what is
        usable, and what the reason says of other models (hub.fit.Recommendation.notes)."""
        text = model_ops.row_details(row, self.hw, no_speed=self.speed.no_speed())
        rec = self.recommendation
        if not row.recommended or rec is None or not rec.notes:
            return text
        first, _, rest = text.partition("\n")
        notes = [note[0].upper() + note[1:] + "." for note in rec.notes]
        return "\n".join([first, *notes, *([rest] if rest else [])])

    # -- the choice -----------------------------------------------------------------------------
    def bundled_row(self) -> ModelRow | None:
        """The bundled model's row (it needs no download), also when the list could not be read."""
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

    def choose_bundled(self) -> None:
        row = self.bundled_row()
        if row is not None:
            self.choose(row)

    def choose(self, row: ModelRow) -> None:
        """Go on with this row: straight to the test when it is here, else through the download."""
        self.choice = row
        if row.status in ("installed", "bundled") and row.path is not None:
            self.post_message(UseModel(row.path))
            return
        if row.entry is None and row.hf_cache is None:
            return
        if model_ops.downloads(row) and self.mgr is not None:
            # asked first, as the Models screen's Pull: size, disk, free disk, answer time
            modal = download_confirm(row, self.hw, self.mgr.models_dir, no_speed=self.speed.no_speed())

            def answer(yes: bool | None) -> None:
                if yes and self.display:  # still the current step (the ContentSwitcher shows only that one)
                    self.post_message(GetModel(row, keep_checkpoint=keep_answer(modal)))

            self.app.push_screen(modal, answer)
            return
        self.post_message(GetModel(row))
