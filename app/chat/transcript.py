"""The transcript: the conversation the chat screen shows, and what a message's keys do to it.

Versions: regenerating keeps the earlier answers and editing a prompt keeps the earlier prompt
with what followed it (app/store.py keeps each turn's versions). A turn with several versions
shows "‹ 2/3 ›"; [ / ] on the focused message flip between them. The version shown is the
conversation: it is what the model reads for the next prompt and what export writes.

Two changes swap widgets in one frame instead of removing and then mounting: a finished answer
taking its live canvas's place (replace_canvas) and another version taking the shown one's
(flip_version). The new views are mounted invisible, laid out, and swapped in one batch; removing
first showed the conversation without them while their Markdown was parsed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dgchat.app.chat.part import ChatPart
from dgchat.app.clipboard import copy_text
from dgchat.app.edit_modal import EditModal
from dgchat.app.store import Message
from dgchat.app.widgets.canvas import LiveCanvas
from dgchat.app.widgets.conversation import Conversation
from dgchat.app.widgets.message import MessageView
from textual.widgets import Label

if TYPE_CHECKING:  # the screen imports every area: only the type checker may look back
    from dgchat.app.chat_screen import ChatScreen


class Transcript(ChatPart):
    """The messages in #conversation and the message actions: copy, edit, regenerate, versions."""

    def __init__(self, screen: ChatScreen) -> None:
        super().__init__(screen)
        # the regenerated answer had the focus: its new version gets it (answering.py sets this)
        self.focus_new_answer = False

    @property
    def conversation(self) -> Conversation:
        return self.screen.query_one("#conversation", Conversation)

    # -- showing the conversation ---------------------------------------------------------------
    def render(self, focus_message: int | None = None) -> None:
        """Show the open chat's conversation anew, at its end or at `focus_message`."""
        screen = self.screen
        conversation = self.conversation
        for child in conversation.children:
            child.add_class("-removed")
        conversation.remove_children()
        screen.answers.canvas = None  # removed with the rest
        conversation.live = False
        if screen.chat is None:
            conversation.mount(Label(
                "New chat — type below and press Enter.  F1 keys · Ctrl+P commands · Ctrl+O settings",
                classes="conversation--hint",
            ))
            return
        views = [MessageView(m) for m in self.store.messages(screen.chat.id)]
        if views:
            conversation.mount_all(views)
        else:
            conversation.mount(Label("Empty chat. Type below and press Enter.", classes="conversation--hint"))
        if focus_message is not None:
            target = next((v for v in views if v.message.id == focus_message), None)
            if target is not None:
                conversation.follow(False)  # the view goes to that message, not to the end
                screen.call_after_refresh(self._focus_view, target)
                return
        conversation.follow()  # at the latest message, and kept there as the messages lay out

    def append(self, message: Message) -> None:
        """A prompt just sent, below the conversation, which follows it to its end again."""
        conversation = self.conversation
        conversation.query(".conversation--hint").remove()
        conversation.mount(MessageView(message))
        conversation.follow()

    def view_for(self, message_id: int) -> MessageView | None:
        """The widget showing a message (message ids are not widget ids: re-renders reuse them)."""
        for view in self.screen.query(MessageView):
            if view.message.id == message_id and not view.has_class("-removed"):
                return view
        return None

    def _focus_view(self, view: MessageView) -> None:
        view.focus()
        view.scroll_visible(animate=False, top=True)

    def last(self, role: str) -> Message | None:
        """The shown conversation's last message by `role` ("user", "assistant")."""
        chat = self.screen.chat
        if chat is None:
            return None
        for m in reversed(self.store.messages(chat.id)):
            if m.role == role:
                return m
        return None

    # -- message actions ------------------------------------------------------------------------
    def copy_message(self, message: Message) -> None:
        result = copy_text(self.app, message.content, self.app.config.clipboard)
        self.screen.notify(result.notice, timeout=6)

    def copy_last(self) -> None:
        last = self.last_or_say("assistant", "No answer to copy yet.")
        if last is not None:
            self.copy_message(last)

    def regenerate_message(self, message: Message) -> None:
        """`r` on an answer: only the last one has a prompt to answer again as it stands."""
        last = self.last("assistant")
        if last is None or last.id != message.id:
            self.screen.notify("Only the last answer can be regenerated; edit its prompt to re-run an earlier one.")
            return
        self.screen.answers.regenerate()

    def edit_last(self) -> None:
        last = self.last_or_say("user", "No prompt to edit yet.")
        if last is not None:
            self.edit_message(last)

    def last_or_say(self, role: str, nothing: str) -> Message | None:
        """The conversation's last message of `role`, or None after telling the person `nothing`."""
        last = self.last(role)
        if last is None:
            self.screen.notify(nothing)
        return last

    def edit_message(self, message: Message) -> None:
        """Edit a prompt and re-run from it: the edited prompt is a new version of that turn; the
        old prompt and everything after it stay as the earlier version ([ on the prompt)."""
        screen = self.screen
        if screen.refuse_while_answering() or screen.chat is None:
            return
        chat_id = screen.chat.id

        def done(text: str | None) -> None:
            if text is None or screen.chat is None or screen.chat.id != chat_id:
                return
            self.store.add_message(chat_id, "user", text, version_of=message.id)
            self.render()
            screen.composer.load_history()
            screen.start_generation()
            # the dialog gave focus back to the message it was opened from, which is gone now
            screen.call_after_refresh(screen.composer.focus)

        # nothing is replaced (the earlier version is kept), so the dialog warns of nothing
        self.app.push_screen(EditModal(message.content), done)

    # -- versions -------------------------------------------------------------------------------
    def flip_version(self, message: Message, step: int) -> None:
        """Show the older (step -1) or newer (+1) version of the message's turn; the conversation
        after it becomes that version's own continuation."""
        screen = self.screen
        if screen.refuse_while_answering() or screen.chat is None:
            return
        versions = self.store.versions(message.id)
        index = next((i for i, v in enumerate(versions) if v.id == message.id), None)
        if index is None or not 0 <= index + step < len(versions):
            return
        target = versions[index + step]
        self.store.show_version(target.id)
        conversation = self.conversation
        views = [v for v in conversation.children if isinstance(v, MessageView) and not v.has_class("-removed")]
        start = next((i for i, v in enumerate(views) if v.message.id == message.id), None)
        path = self.store.messages(screen.chat.id)
        at = next((i for i, m in enumerate(path) if m.id == target.id), None)
        if start is None or at is None:
            self.render(target.id)
        else:
            old = views[start:]  # the old version and what followed it
            for view in old:
                view.add_class("-removed")  # gone for view_for and the key handlers already
            screen.call_later(self._swap_versions, old, [MessageView(m) for m in path[at:]])

    async def _swap_versions(self, old: list[MessageView], shown: list[MessageView]) -> None:
        """Put another version (and its continuation) where the old one was in one frame, as
        replace_canvas does for a finished answer: the new views are mounted invisible after the
        old ones and swapped in once laid out. Removing first showed an empty conversation for a
        frame while the new answer's Markdown was parsed."""
        conversation = self.conversation
        following, y = conversation.following, conversation.scroll_y
        conversation.live = True  # no scrolling to the invisible views meanwhile
        for view in shown:
            view.styles.visibility = "hidden"
        anchor = old[-1] if old[-1].parent is conversation else None
        await conversation.mount_all(shown, after=anchor)
        conversation.call_after_refresh(self._show_swapped, old, shown, following, y)

    def _show_swapped(self, old: list[MessageView], shown: list[MessageView], following: bool, y: float) -> None:
        """The second half of _swap_versions, once the new views are laid out."""
        conversation = self.conversation
        with self.app.batch_update():
            for view in old:
                view.display = False
            for view in shown:
                view.styles.visibility = "visible"
            conversation.scroll_to(y=y, animate=False, immediate=True)
        for view in old:
            view.remove()
        conversation.end_live(following)
        if shown and shown[0].parent is conversation:
            shown[0].focus()
        self.screen.recount()

    # -- a finished answer in place of its canvas -----------------------------------------------
    async def replace_canvas(self, canvas: LiveCanvas | None, view: MessageView) -> None:
        """Put the finished answer where its canvas was, in one frame: the answer's view is mounted
        invisible beside the canvas, and only once its Markdown is parsed and laid out (Textual parses
        on a worker thread, tens of milliseconds) do the two swap, in one batch. Removing the canvas
        first would leave the answer off the screen meanwhile.

        The answer may be shorter than its canvas (a canvas keeps room for tokens to come; a
        model's single line breaks are one paragraph in Markdown): a view scrolled down the canvas
        would then show the empty space past the new end for a frame, until the scroll is clamped.
        The answer is laid out before the swap (invisible, not undisplayed) so that the scroll
        position is moved to the new end in the same batch."""
        conversation = self.conversation
        if canvas is None or canvas.parent is not conversation:
            if canvas is not None:
                canvas.remove()
            await conversation.mount(view)
            conversation.end_live(True)
            self._focus_regenerated(view)
            return
        view.styles.visibility = "hidden"  # laid out below the canvas (its height known), not drawn
        await conversation.mount(view, after=canvas)
        conversation.call_after_refresh(self._swap_canvas, canvas, view)

    def _swap_canvas(self, canvas: LiveCanvas, view: MessageView) -> None:
        """The second half of replace_canvas, once the answer is laid out."""
        conversation = self.conversation
        follow = self.screen.answers.following  # the user had not scrolled up from the canvas's text
        if canvas.parent is not conversation or view.parent is not conversation:
            conversation.end_live(follow)
            return  # the conversation was redrawn meanwhile (another chat opened)
        with self.app.batch_update():
            # where the view may be once the canvas is gone: at most the new end (the canvas's room
            # and lines leave the conversation's height)
            end = max(0, conversation.virtual_size.height - canvas.outer_size.height
                      - conversation.scrollable_content_region.height)
            if follow or conversation.scroll_y > end:
                conversation.scroll_to(y=end, animate=False, immediate=True)
            canvas.display = False
            view.styles.visibility = "visible"
        canvas.remove()
        conversation.end_live(follow)
        self._focus_regenerated(view)

    def _focus_regenerated(self, view: MessageView) -> None:
        """Give a regenerated answer's focus to its new version, unless the person moved on meanwhile
        (typing in the composer, another message)."""
        focus_it, self.focus_new_answer = self.focus_new_answer, False
        prompt = self.screen.composer.prompt
        if focus_it and self.screen.focused is prompt and not prompt.text:
            view.focus(scroll_visible=False)
