"""The saved chats: the sidebar's list (#chat-list), opening one, a new chat, rename, delete,
full-text search, and the sidebar shown or hidden.

The chat used last is reopened at the next start (the store's "last_chat" setting). Below
NARROW_BELOW columns a shown sidebar lies over the chat (dgchat.tcss).
"""

from __future__ import annotations

from dgchat.app.breakpoints import NARROW_BELOW
from dgchat.app.chat.part import ChatPart
from dgchat.app.confirm_modal import ConfirmModal
from dgchat.app.prompt_modal import PromptModal
from dgchat.app.search_modal import SearchModal
from dgchat.app.store import Chat
from dgchat.app.widgets.chat_list import ChatList
from dgchat.terminal_text import one_line


class SavedChats(ChatPart):
    """Which chat is open, and the sidebar's list of them."""

    def refresh(self) -> None:
        """The sidebar's list and the title bar's chat name, after a chat was added, renamed or opened."""
        screen = self.screen
        screen.query_one(ChatList).set_chats(self.store.list_chats(), screen.chat.id if screen.chat else None)
        screen.sub_title = one_line(screen.chat.title, 200) if screen.chat else "New chat"  # the terminal rule

    def open(self, chat_id: int, focus_message: int | None = None) -> None:
        screen = self.screen
        if screen.chat is not None and screen.chat.id == chat_id and focus_message is None:
            return
        if screen.refuse_while_answering():
            return
        chat = self.store.get_chat(chat_id)
        if chat is None:
            screen.notify(f"No saved chat with id {chat_id}.", severity="error")
            return
        screen.chat = chat
        screen.answers.pending = False
        self.store.set_setting("last_chat", chat_id)
        if focus_message is not None and all(m.id != focus_message for m in self.store.messages(chat_id)):
            self.store.show_version(focus_message)  # a search hit in an older version: show that version
        self.refresh()
        screen.transcript.render(focus_message)
        wanted = screen.model_path_for(chat)
        if wanted is not None and self.session.loaded(wanted) is None and self.session.loading_path is None:
            self.session.load(wanted)
        screen.recount()

    def reopen_last(self, chat_id: int | None) -> None:
        """At start: `chat_id` (--chat), else the chat used last (a deleted one leaves a new chat)."""
        screen = self.screen
        if chat_id is None:
            last = self.store.get_setting("last_chat")
            if isinstance(last, int) and not isinstance(last, bool) and self.store.get_chat(last) is not None:
                chat_id = last
        if chat_id is None:
            self.refresh()
            screen.transcript.render()
        else:
            self.open(chat_id)

    def ensure(self) -> Chat:
        """The open chat, created (and remembered for the next start) when it is a new one."""
        screen = self.screen
        if screen.chat is None:
            screen.chat = self.store.create_chat(system_prompt=self.app.config.system_prompt)
            self.store.set_setting("last_chat", screen.chat.id)  # the next start reopens it
        return screen.chat

    def new_chat(self) -> None:
        screen = self.screen
        if screen.refuse_while_answering():
            return
        screen.chat = None
        screen.answers.pending = False
        self.refresh()
        screen.transcript.render()
        screen.recount()
        screen.composer.focus()

    def search(self) -> None:
        def done(result: tuple[int, int | None] | None) -> None:
            if result is None:
                return
            chat_id, message_id = result
            self.open(chat_id, focus_message=message_id)

        self.app.push_screen(SearchModal(self.store), done)

    def rename(self, chat_id: int | None = None) -> None:
        screen = self.screen
        chat = self.store.get_chat(chat_id) if chat_id is not None else screen.chat
        if chat is None:
            screen.notify("This chat has no messages yet; it is named after the first prompt.")
            return

        def done(title: str | None) -> None:
            if title:
                self.store.rename_chat(chat.id, title)
                if screen.chat and screen.chat.id == chat.id:
                    screen.chat = self.store.get_chat(chat.id)
                self.refresh()

        self.app.push_screen(PromptModal("Rename chat", chat.title, ok_label="Rename"), done)

    def delete(self, chat_id: int | None = None) -> None:
        screen = self.screen
        chat = self.store.get_chat(chat_id) if chat_id is not None else screen.chat
        if chat is None:
            return
        if screen.generating and screen.chat is not None and screen.chat.id == chat.id:
            screen.refuse_while_answering()
            return

        def done(yes: bool | None) -> None:
            if not yes:
                return
            self.store.delete_chat(chat.id)
            if screen.chat is not None and screen.chat.id == chat.id:
                screen.chat = None
                screen.transcript.render()
            self.refresh()
            screen.update_status()

        self.app.push_screen(ConfirmModal("Delete chat", f"Delete “{chat.title}” and all its messages?"), done)

    def list_request(self, event: ChatList.Request) -> None:
        """What was asked in the sidebar's list: open, new, rename or delete a chat."""
        if event.action == "open" and event.chat_id is not None:
            self.open(event.chat_id)
            if self.narrow:
                # the sidebar lies over the chat there: put it away, back to the prompt. Not a choice
                # to hide it (Ctrl+B's inline display): the width rules decide again, a wide
                # terminal shows it
                sidebar = self.screen.query_one("#sidebar")
                sidebar.styles.clear_rule("display")
                sidebar.refresh(layout=True)
                self.screen.composer.focus()
        elif event.action == "new":
            self.new_chat()
        elif event.action == "rename":
            self.rename(event.chat_id)
        elif event.action == "delete":
            self.delete(event.chat_id)

    def toggle_sidebar(self) -> None:
        sidebar = self.screen.query_one("#sidebar")
        sidebar.display = not sidebar.display
        if sidebar.display and self.narrow:
            self.screen.query_one(ChatList).focus()  # it lies over the chat: shown to pick a chat from

    @property
    def narrow(self) -> bool:
        """Below NARROW_BELOW columns, where a shown sidebar lies over the chat (dgchat.tcss)."""
        return self.screen.size.width < NARROW_BELOW
