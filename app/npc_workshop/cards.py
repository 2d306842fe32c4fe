"""The NPC workshop's character cards: the list (hidden on a narrow terminal), new, edit and
delete, and which card the lines are written for.

A mixin of NpcScreen (app/npc_screen.py): its methods run on the screen and use its widgets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dgchat.app.confirm_modal import ConfirmModal
from dgchat.app.error_modal import ErrorModal
from dgchat.app.npc_card_modal import CardModal
from dgchat.app.npc_cards import load_shelf, remove_card
from dgchat.app.tool_screen import ToolScreen
from dgchat.app.widgets.npc import CardList
from dgchat.model_backend.errors import DgchatError
from dgchat.npc.cards import CharacterCard
from dgchat.terminal_text import one_line
from textual.widgets import Input, Static

if TYPE_CHECKING:  # the mixin's methods run on the workshop screen: the type checker sees them there
    _ScreenBase = ToolScreen
else:
    _ScreenBase = object


class NpcCards(_ScreenBase):
    """The workshop's card list and what its keys do."""

    @property
    def current_card(self) -> CharacterCard | None:
        return self.query_one(CardList).current

    def reload_cards(self, select: str | None = None) -> None:
        self.shelf = load_shelf()
        cards = self.query_one(CardList)
        current = select or (cards.current.id if cards.current else self._current_card)
        cards.set_cards(self.shelf.cards, current)
        errors = self.query_one("#npc-card-errors", Static)
        if self.shelf.errors:
            # a card file's problem quotes its path and values: one line each, by the terminal rule
            errors.update("\n".join(f"⚠ {one_line(e)}" for e in self.shelf.errors))
            errors.display = True
        else:
            errors.display = False
        hint = "n new · e edit · d delete" if self.shelf.cards else "No characters yet: n (or Ctrl+N) creates one"
        self.query_one("#npc-cards-hint", Static).update(hint)
        card = cards.current
        # the header names the current character: none once the last card is deleted
        self.sub_title = one_line(card.name, 200) if card is not None else ""
        self._recheck_form()

    def on_card_list_request(self, event: CardList.Request) -> None:
        event.stop()
        if event.action == "new":
            self.action_new_card()
        elif event.action == "edit":
            self._edit(event.card)
        elif event.action == "delete" and event.card is not None:
            self._delete(event.card)

    def action_new_card(self) -> None:
        self._edit(None)

    def action_edit_card(self) -> None:
        card = self.current_card
        if card is None:
            self.notify("No character yet: Ctrl+N creates one.")
            return
        self._edit(card)

    def _edit(self, card: CharacterCard | None) -> None:
        def done(saved: CharacterCard | None) -> None:
            if saved is not None:
                self.reload_cards(select=saved.id)
                self.notify(f"Saved {saved.name} ({self._short(saved.source)})")

        self.app.push_screen(CardModal(card, self.shelf.cards), done)

    def _delete(self, card: CharacterCard) -> None:
        def done(yes: bool | None) -> None:
            if not yes:
                return
            try:
                remove_card(card)
            except (OSError, DgchatError) as exc:
                self.app.push_screen(ErrorModal("Cannot delete the card", str(exc)))
                return
            self.reload_cards()

        where = self._short(card.source) if card.source else "its file"
        self.app.push_screen(ConfirmModal(f"Delete {card.name}?", f"The card is removed from {where}."), done)

    def action_toggle_cards(self) -> None:
        """Show or hide the character list. An explicit choice: it then holds at any width (an inline
        style wins over the `-narrow` rule that hides the list on narrow terminals)."""
        side = self.query_one("#npc-side")
        side.display = not side.display
        if side.display:
            self.query_one(CardList).focus()
        else:
            self._focus_off_hidden_list()

    def _focus_off_hidden_list(self) -> None:
        """Keys go to the form when the character list is hidden while it had the focus."""
        focused = self.focused
        side = self.query_one("#npc-side")
        if not side.display and (focused is None or side in focused.ancestors):
            self.query_one("#npc-template", Input).focus()

    def on_resize(self) -> None:
        # Screen._on_resize has set the width class by now (also when this screen comes back after a
        # resize under another one); the list may have just been hidden
        self.call_after_refresh(self._focus_off_hidden_list)

    def on_option_list_option_highlighted(self, event: CardList.OptionHighlighted) -> None:
        card = self.current_card
        if card is not None:
            self._current_card = card.id
            self.sub_title = one_line(card.name, 200)  # a shared card's name, by the terminal rule
        self._recheck_form()
