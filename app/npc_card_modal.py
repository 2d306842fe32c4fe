"""Create or edit a character card: name, id, role, setting, voice, example lines, banned words.

Saving validates with dgchat.npc's own rules (the same as `dgchat npc` reading the file) and writes
the TOML file atomically; a problem is named under the form and nothing is written."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from dgchat.app.npc_cards import card_from_form, store_card
from dgchat.app.save_dialog import SaveDialog
from dgchat.app.widgets.steady_cursor import steady_cursors_when_headless
from dgchat.npc.cards import CharacterCard, slug
from dgchat.npc.errors import CardError
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Button, Input, Label, Static, TextArea

_SPLIT_WORDS = re.compile(r"[,\n]")


class CardModal(SaveDialog[CharacterCard]):
    """Dismisses with the saved card (its `source` set), or None when cancelled."""

    BINDINGS = [
        Binding("escape", "cancel", "Cancel", id="dialog.cancel"),
        Binding("ctrl+s", "save", "Save", priority=True, id="card.save"),
    ]
    # CSS, not DEFAULT_CSS: it must win over the app stylesheet's `.dialog TextArea` (Screen CSS is app-wide,
    # hence every rule names CardModal)
    CSS = """
    CardModal .card--row { height: auto; margin-bottom: 1; }
    CardModal .card--label { width: 15; color: $text-muted; }
    CardModal .card--row Input, CardModal .card--row TextArea { width: 1fr; background: $boost; }
    CardModal .card--row TextArea { padding: 0; }
    CardModal #card-fields { height: auto; max-height: 1fr; }
    CardModal #card-setting, CardModal #card-voice { height: 2; }
    CardModal #card-examples { height: 3; }
    CardModal .card--hint { color: $text-muted; }
    CardModal #card-error.-empty { display: none; }
    /* a short terminal: no gaps, and the fields scroll between the title and the buttons */
    CardModal.-short #card-dialog { padding: 0 2; }
    CardModal.-short .dialog--title { margin-bottom: 0; }
    CardModal.-short .card--row { margin-bottom: 0; }
    CardModal.-short #card-fields { height: 1fr; }
    CardModal.-short .dialog--buttons { margin-top: 0; }
    """
    # the whole form (30 rows) fits in a dialog of 90% from 34 rows; below that it gets `-short`
    VERTICAL_BREAKPOINTS = [(0, "-short"), (34, "-roomy")]

    def __init__(self, card: CharacterCard | None, others: Sequence[CharacterCard]) -> None:
        super().__init__(classes="dialog-screen")
        self.card = card
        self.others = list(others)

    def compose(self) -> ComposeResult:
        card = self.card
        title = f"Edit character — {card.name}" if card else "New character"
        with Vertical(classes="dialog -wide", id="card-dialog"):
            yield Label(title, classes="dialog--title", markup=False)
            with VerticalScroll(id="card-fields"):
                yield from self._row("Name", Input(card.name if card else "", placeholder="required, e.g. Captain Brann",
                                                   id="card-name", compact=True))
                yield from self._row("Id", Input(card.id if card else "", placeholder="from the name", id="card-id",
                                                 compact=True))
                yield from self._row("Role", Input(card.role if card else "",
                                                   placeholder="the night captain of the city gate", id="card-role",
                                                   compact=True))
                yield from self._row("Setting", TextArea(card.setting if card else "", id="card-setting",
                                                         soft_wrap=True, compact=True, tab_behavior="focus"))
                yield from self._row("Voice / tone", TextArea(card.voice if card else "", id="card-voice",
                                                              soft_wrap=True, compact=True, tab_behavior="focus"))
                yield from self._row("Example lines", TextArea("\n".join(card.examples) if card else "",
                                                               id="card-examples", soft_wrap=True, compact=True,
                                                               tab_behavior="focus"))
                yield from self._row("Banned words", Input(", ".join(card.banned_words) if card else "",
                                                           placeholder="okay, dude", id="card-banned", compact=True))
            yield Static("One example line per line; banned words separated by commas. Ctrl+S saves.",
                         classes="card--hint")
            yield Label("", id="card-error", classes="dialog--error -empty", markup=False)
            with Horizontal(classes="dialog--buttons"):
                yield Button("Save", variant="primary", id="save")
                yield Button("Cancel", id="cancel")

    @staticmethod
    def _row(label: str, field: Input | TextArea) -> ComposeResult:
        with Horizontal(classes="card--row"):
            yield Label(label, classes="card--label")
            yield field

    def on_mount(self) -> None:
        steady_cursors_when_headless(self)
        self.query_one("#card-name", Input).focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "card-name":
            self.query_one("#card-id", Input).placeholder = f"from the name: {slug(event.value)}"

    # -- reading the form -----------------------------------------------------------------------
    def form(self) -> dict[str, Any]:
        def text(widget_id: str) -> str:
            widget = self.query_one(f"#{widget_id}")
            return widget.text if isinstance(widget, TextArea) else widget.value  # type: ignore[attr-defined]

        examples = [line.strip() for line in text("card-examples").splitlines() if line.strip()]
        banned = [w.strip() for w in _SPLIT_WORDS.split(text("card-banned")) if w.strip()]
        return {
            "name": text("card-name"),
            "id": text("card-id").strip(),
            "role": text("card-role"),
            "setting": text("card-setting"),
            "voice": text("card-voice"),
            "examples": examples,
            "banned_words": banned,
        }

    def show_error(self, message: str) -> None:
        label = self.query_one("#card-error", Label)
        label.update(message)
        label.set_class(not message, "-empty")

    def action_save(self) -> None:
        try:
            card = card_from_form(self.form(), "card")
            saved = store_card(card, self.card, self.others)
        except CardError as exc:
            self.show_error(str(exc))
            return
        except OSError as exc:
            self.show_error(f"cannot write the card: {exc.strerror or exc}")
            return
        self.dismiss(saved)
