"""The sidebar: saved chats, newest first. n new, r rename, d / Delete delete, Enter opens."""

from __future__ import annotations

from dgchat.app.store import Chat
from dgchat.terminal_text import one_line
from textual.binding import Binding
from textual.content import Content
from textual.message import Message
from textual.widgets import OptionList
from textual.widgets.option_list import Option


class ChatList(OptionList):
    BINDINGS = [
        Binding("n", "new_chat", "New", id="chats.new"),
        Binding("r", "rename_chat", "Rename", id="chats.rename"),
        Binding("d,delete", "delete_chat", "Delete", id="chats.delete"),
    ]

    class Request(Message):
        """The user asked for `action` ("open", "new", "rename", "delete") on `chat_id`."""

        def __init__(self, action: str, chat_id: int | None) -> None:
            super().__init__()
            self.action = action
            self.chat_id = chat_id

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._ids: list[int] = []

    def set_chats(self, chats: list[Chat], current: int | None) -> None:
        self._ids = [c.id for c in chats]
        self.clear_options()
        # a title is a stored prompt's first words or what the user typed: shown by the terminal
        # rule and as plain text (Content, not markup: "[b]" in a prompt is text)
        self.add_options([Option(Content(one_line(c.title, 200)), id=f"chat-{c.id}") for c in chats])
        if current in self._ids:
            self.highlighted = self._ids.index(current)

    @property
    def highlighted_chat(self) -> int | None:
        if self.highlighted is None or self.highlighted >= len(self._ids):
            return None
        return self._ids[self.highlighted]

    def on_hide(self) -> None:
        # the sidebar was hidden (a narrow terminal, Ctrl+B) while the list had the keys: the prompt
        # takes them (Textual's own Hide handler, which runs after this one, would leave no focus)
        if self.has_focus:
            for prompt in self.screen.query("#prompt"):
                prompt.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.post_message(self.Request("open", self._ids[event.option_index]))

    def action_new_chat(self) -> None:
        self.post_message(self.Request("new", None))

    def action_rename_chat(self) -> None:
        if self.highlighted_chat is not None:
            self.post_message(self.Request("rename", self.highlighted_chat))

    def action_delete_chat(self) -> None:
        if self.highlighted_chat is not None:
            self.post_message(self.Request("delete", self.highlighted_chat))
