"""Command palette entries of the NPC workshop ("npc: …") and the drafting screen ("draft: …").

Opening either screen is always listed; the commands that act on a screen are listed while the
palette is opened over that screen. Screens are imported when used (app.py imports this module)."""

from __future__ import annotations

from collections.abc import Iterable

from dgchat.app.commands import Command, NamespacedProvider
from dgchat.app.drafting_screen import DraftingScreen, open_drafting
from dgchat.app.npc_screen import NpcScreen, open_workshop


class NpcCommands(NamespacedProvider):
    namespace = "npc"

    def commands(self) -> Iterable[Command]:
        app = self.dgchat
        items: list[Command] = [
            ("open workshop", "Character cards, NPC lines with holes, variants, export", lambda: open_workshop(app)),
        ]
        screen = self.screen
        if isinstance(screen, NpcScreen):
            items += [
                ("generate", "Generate the variants of the line", screen.action_generate),
                ("stop", "Stop the variants being generated", screen.action_stop),
                ("new character", "Create a character card", screen.action_new_card),
                ("edit character", "Edit the highlighted character card", screen.action_edit_card),
                ("keep all", "Keep every variant of the last line that was not rejected", screen.action_keep_all),
                ("export kept lines", "Write the kept lines as JSON or CSV", screen.action_export),
                ("clear results", "Forget the lines generated so far", screen.action_clear),
            ]
        return items


class DraftCommands(NamespacedProvider):
    namespace = "draft"

    def commands(self) -> Iterable[Command]:
        app = self.dgchat
        items: list[Command] = [
            ("open drafting", "A document the model helps write: rewrite, fill, continue", lambda: open_drafting(app)),
        ]
        screen = self.screen
        if isinstance(screen, DraftingScreen):
            items += [
                ("rewrite selection", "Rewrite the selected text in context (or fill in at the cursor)",
                 screen.action_rewrite),
                ("continue at cursor", "Let the model write on from the cursor", screen.action_continue),
                ("save now", "Write the document to its file now", screen.action_save),
            ]
        return items


TOOL_PROVIDERS = (NpcCommands, DraftCommands)
