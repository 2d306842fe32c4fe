"""The multi-line prompt box: Enter sends, Shift+Enter / Ctrl+J insert a newline, Up recalls.

Up on the first line (or while browsing) steps back through earlier prompts, Down steps forward
and finally restores what was being typed. Anywhere else the arrows move the cursor as usual.

Alt+letter is never typed: terminals (and tmux) send Alt+C as ESC c, which Textual reads as key
"alt+c" with the character "c", and a TextArea types every key that has a printable character.
Such keys go on to the screen's bindings instead (Alt+C copies the last answer).
"""

from __future__ import annotations

from typing import Any

from textual import events
from textual.binding import Binding
from textual.message import Message
from textual.widgets import TextArea


class PromptInput(TextArea):
    BINDINGS = [
        Binding("enter", "submit", "Send", priority=True, id="input.send"),
        Binding("shift+enter,ctrl+j", "newline", "Newline", show=False, priority=True, id="input.newline"),
        Binding("up", "history_back", "Earlier prompt", show=False, id="input.history_back"),
        Binding("down", "history_forward", "Later prompt", show=False, id="input.history_forward"),
    ]

    class Submitted(Message):
        def __init__(self, prompt: PromptInput, text: str) -> None:
            super().__init__()
            self.prompt = prompt
            self.text = text

    def __init__(self, *, history: list[str] | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("soft_wrap", True)
        kwargs.setdefault("show_line_numbers", False)
        kwargs.setdefault("tab_behavior", "focus")
        super().__init__(**kwargs)
        self.prompts: list[str] = list(history or [])  # newest first
        self._history_index = -1  # -1: not browsing
        self._draft = ""
        self._recalled: str | None = None

    async def _on_key(self, event: events.Key) -> None:
        if event.key.startswith("alt+"):
            # not TextArea's typing (prevent_default skips the base class's handler); the event
            # still bubbles, so bindings (the screen's, and TextArea's own alt+backspace) run
            event.prevent_default()

    def on_mount(self) -> None:
        if self.app.is_headless:
            self.cursor_blink = False  # nobody watches a headless run; keeps screenshots stable

    def set_history(self, history: list[str]) -> None:
        self.prompts = list(history)
        self._history_index = -1

    # Enter and Shift+Enter are priority bindings: the app runs them when it reads the key, while the
    # letters read just before it (a paste without bracketed paste, tmux's send-keys, a fast typist on
    # a slow machine) still wait in this widget's queue to be typed. Read the text, or insert the
    # newline, only after them (call_later runs after the messages already queued here): sending
    # at once sent an empty or half box, or nothing, and the letters landed after the fact.
    def action_submit(self) -> None:
        self.call_later(self._submit)

    def _submit(self) -> None:
        text = self.text
        if not text.strip():
            return
        self.post_message(self.Submitted(self, text))

    def action_newline(self) -> None:
        self.call_later(self.insert, "\n")

    def _recall(self, index: int) -> None:
        self._history_index = index
        text = self._draft if index < 0 else self.prompts[index]
        self._recalled = text
        self.load_text(text)
        self.move_cursor(self.document.end)

    def _browsing(self) -> bool:
        return self._history_index >= 0 and self.text == self._recalled

    def action_history_back(self) -> None:
        row, _ = self.cursor_location
        if (row == 0 or self._browsing()) and self.prompts:
            if self._history_index < 0 or not self._browsing():
                self._draft = self.text
                self._history_index = -1
            if self._history_index + 1 < len(self.prompts):
                self._recall(self._history_index + 1)
            return
        self.action_cursor_up()

    def action_history_forward(self) -> None:
        if self._browsing():
            self._recall(self._history_index - 1)
            return
        self.action_cursor_down()

    def clear_prompt(self) -> None:
        self.load_text("")
        self._history_index = -1
        self._draft = ""
