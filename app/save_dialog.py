"""A dialog whose buttons are Save (id "save") and Cancel: the prompt editor, the character card.

Save runs the dialog's own `action_save` (which checks the form and dismisses with the result, or
says what is wrong and stays open); Cancel, Escape and any other button dismiss it with None.
"""

from __future__ import annotations

from typing import TypeVar

from textual.screen import ModalScreen
from textual.widgets import Button

ResultT = TypeVar("ResultT")


class SaveDialog(ModalScreen[ResultT | None]):
    def action_save(self) -> None:
        raise NotImplementedError

    def action_cancel(self) -> None:
        self.dismiss(None)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "save":
            self.action_save()
        else:
            self.dismiss(None)
