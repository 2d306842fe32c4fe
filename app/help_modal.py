"""The key help panel (F1 / ?): every binding with its current key and its id for [keys] remapping."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, Static

# (group title, [(binding id, key display, description)])
HelpRows = list[tuple[str, list[tuple[str, str, str]]]]

# The remapping example shown here and in docs/APP.md: a key no binding uses, so that copying
# the example does not take a key from something else (tests check it stays free).
REMAP_EXAMPLE = ("chat.regenerate", "f9")
ID_COLUMN_FROM = 80  # terminal columns from which the ids fit beside the descriptions
NARROW_KEY_WIDTH = 12


def remap_hint(config_path: str) -> str:
    binding_id, key = REMAP_EXAMPLE
    return f"Remap keys in {config_path}:  [keys]  \"{binding_id}\" = \"{key}\""


class HelpModal(ModalScreen[None]):
    BINDINGS = [Binding("escape,f1,question_mark,q", "close", "Close", id="help.close")]

    def __init__(self, rows: HelpRows, config_hint: str) -> None:
        super().__init__(classes="dialog-screen")
        self.rows = rows
        self.config_hint = config_hint

    def compose(self) -> ComposeResult:
        # below ID_COLUMN_FROM columns the ids (for [keys] remapping) would leave the descriptions a
        # few letters ("Qu…"): a person reading F1 there needs what each key does
        self._with_ids = self.app.size.width >= ID_COLUMN_FROM
        with Vertical(classes="dialog -wide -tall", id="help"):
            yield Label("Keys", classes="dialog--title")
            # one width per column for every group's table, so that the columns line up from group to
            # group (each table sized by its own rows moved them)
            key_width = max([16, *(len(key) for _group, rows in self.rows for _id, key, _d in rows)])
            if not self._with_ids:
                key_width = min(key_width, NARROW_KEY_WIDTH)
            id_width = max([0, *(len(binding_id) for _group, rows in self.rows for binding_id, _k, _d in rows)])
            with VerticalScroll(id="help-scroll"):
                for group, rows in self.rows:
                    table = Table(box=None, show_header=False, expand=True, padding=(0, 1))
                    table.add_column("key", width=key_width, overflow="fold")
                    table.add_column("action", ratio=1, overflow="fold")
                    if self._with_ids:
                        table.add_column("id", style="dim", width=id_width, no_wrap=True)
                    for binding_id, key, description in rows:
                        cells = [Text(key, style="bold"), Text(description)]
                        table.add_row(*cells, *([Text(binding_id)] if self._with_ids else []))
                    yield Label(group, classes="help--group", markup=False)
                    yield Static(table, classes="help--table")
            hint = self.config_hint if self._with_ids else (
                f"{self.config_hint}\n(each key's id shows in a terminal of {ID_COLUMN_FROM}+ columns)")
            yield Static(hint, markup=False, classes="dialog--help")

    def on_resize(self) -> None:
        if (self.app.size.width >= ID_COLUMN_FROM) != self._with_ids:
            self.refresh(recompose=True)

    def action_close(self) -> None:
        self.dismiss(None)
