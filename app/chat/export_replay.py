"""Export and replay: the chat to Markdown (Ctrl+S), an answer's denoising replayed in place (`p`)
and written as an asciicast (`x`, or from the replay).

Replay loads the answer's recording (the denoising history the answer's worker kept, see
app/generation.py) and shows it in place of the answer's text (app/widgets/replay.py); a .cast goes
into the export folder at the replay's pace, as wide as the answer is here.
"""

from __future__ import annotations

import shlex

from dgchat.app.chat.part import ChatPart
from dgchat.app.export import (
    default_export_path,
    default_recording_path,
    export_chat,
    export_dir,
    export_error_text,
    export_problem,
    export_recording,
    export_target,
)
from dgchat.app.paths import short_path
from dgchat.app.prompt_modal import PromptModal
from dgchat.app.store import MAX_RECORDINGS_BYTES_PER_CHAT, Message
from dgchat.app.widgets.conversation import Conversation
from dgchat.app.widgets.message import MessageView
from dgchat.app.widgets.path_suggester import PathSuggester
from dgchat.app.widgets.replay import DEFAULT_PACE
from dgchat.recording.history import DenoisingHistory, HistoryError


class ExportReplay(ChatPart):
    """The export dialogs and an answer's recording."""

    def export_markdown(self) -> None:
        """Ask where, then write the open chat (its shown versions) as Markdown."""
        screen = self.screen
        if screen.chat is None:
            screen.notify("Nothing to export yet.")
            return
        chat = screen.chat
        folder = export_dir(self.app.config.export_dir)

        def write(text: str) -> str | None:
            # runs on Export: a problem is shown in the dialog, which stays open with the path typed
            if not text:
                return "enter the file to write"
            target = export_target(text, folder)
            problem = export_problem(target)
            if problem:
                return problem
            try:
                written = export_chat(chat, self.store.messages(chat.id), target)
            except OSError as exc:
                return export_error_text(target, exc)
            screen.notify(f"Exported to {written}")
            return None

        self.app.push_screen(PromptModal(
            "Export chat to Markdown", default_export_path(chat, folder).name, ok_label="Export", check=write,
            suggester=PathSuggester((".md",)),
            help_text=f"Into {folder} (export_dir in {short_path(self.app.config.path)}; a missing folder is "
                      "created, an existing file replaced):",
        ))

    # -- recordings: replay and .cast export ----------------------------------------------------
    def load_recording(self, message: Message) -> DenoisingHistory | None:
        """The answer's denoising history, or None and a notice saying why there is none."""
        screen = self.screen
        stored = self.store.recording(message.id)
        if stored is None:
            screen.notify("No recording for this answer: dgchat records answers since version 4 of the chat "
                          "database, and this one is older.", timeout=8)
            return None
        if stored.data is None:
            screen.notify("This answer's recording was dropped: a chat keeps its newest recordings "
                          f"({MAX_RECORDINGS_BYTES_PER_CHAT >> 20} MB).", timeout=8)
            return None
        try:
            return DenoisingHistory.from_bytes(stored.data)
        except HistoryError as exc:
            screen.notify(f"This answer's recording cannot be read: {exc}.", severity="error", timeout=8)
            return None

    def replay(self, view: MessageView) -> None:
        """Show the answer's denoising in place of its text."""
        history = self.load_recording(view.message)
        if history is None:
            return
        if not history.steps:
            self.screen.notify("This answer's recording has no steps.")
            return
        self.screen.call_later(view.start_replay, history)

    def export_cast(self, message: Message, history: DenoisingHistory | None = None, *,
                         seconds_per_step: float | None = 1.0 / DEFAULT_PACE) -> None:
        """Ask where, then write the answer's denoising as a .cast file (asciinema's format)."""
        screen = self.screen
        chat = self.store.get_chat(message.chat_id)
        history = history if history is not None else self.load_recording(message)
        if history is None or chat is None:
            return
        folder = export_dir(self.app.config.export_dir)
        conversation = screen.query_one("#conversation", Conversation)
        width = max(40, conversation.content_size.width - 4)  # the width the answer has here (less its margin)
        pace = "the real pace" if seconds_per_step is None else f"{1 / seconds_per_step:g} steps a second"

        def write(text: str) -> str | None:
            if not text:
                return "enter the file to write"
            target = export_target(text, folder)
            problem = export_problem(target, "answer.cast")
            if problem:
                return problem
            try:
                written = export_recording(history, chat, message, target, seconds_per_step=seconds_per_step,
                                           width=width)
            except OSError as exc:
                return export_error_text(target, exc)
            # the whole path: the command works from any folder
            screen.notify(f"Recording exported to {written}\nPlay it: asciinema play {shlex.quote(str(written))}",
                          timeout=10)
            return None

        self.app.push_screen(PromptModal(
            # the file's name in the box (a whole path there showed only its end: the box scrolls to
            # the cursor) and the folder in the line above it; a typed absolute path goes elsewhere
            "Export the denoising as a recording (.cast)", default_recording_path(chat, message, folder).name,
            ok_label="Export", check=write, suggester=PathSuggester((".cast",)),
            help_text=f"An asciicast at {pace}, {width} columns wide, into {folder} (a missing folder is "
                      "created, an existing file replaced):",
        ))
