"""The scrolled conversation: it keeps the latest message in view while the user is at the end.

A one-off scroll_end when a chat opens is not enough: answers render their Markdown over the next
refreshes and a resize re-wraps every message, both after that scroll ran, and the view was left a
few lines above the end. Here every layout change (this widget's size, or the height of what it
holds: its virtual size) scrolls to the end again while `following` is set. The user scrolling up
clears it, scrolling back down to the end sets it again.

Textual's own anchor() does the first part too, but while the messages are shorter than the view it
pins them to the bottom instead of the top, which would move every short chat.
"""

from __future__ import annotations

from textual import events
from textual.containers import VerticalScroll


class Conversation(VerticalScroll):
    following: bool = True  # the view stays at the end (the user has not scrolled up)
    # a live canvas is drawing: the chat screen keeps its text in view (not the end: the canvas keeps
    # empty room below its text for the tokens to come), so this widget leaves the scrolling alone
    live: bool = False

    def end_live(self, follow: bool) -> None:
        """The live canvas is gone: back to keeping the end in view if the user was following."""
        self.live = False
        self.follow(follow)

    def follow(self, on: bool = True) -> None:
        """Go to the end and stay there (`on`), or leave the view where it is put next (a search
        hit shown in the middle of a chat)."""
        self.following = on
        if on:
            self.scroll_end(animate=False)

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if self.live:
            return
        if new_value < old_value and new_value >= self.max_scroll_y:
            return  # clamped by a shorter layout (messages removed), not scrolled by the user
        self.following = new_value >= self.max_scroll_y

    def _keep_at_end(self) -> None:
        if self.following and not self.live:
            self.scroll_end(animate=False)  # after the refresh: the new layout's end

    def watch_virtual_size(self) -> None:
        self._keep_at_end()  # the messages got taller or shorter (Markdown laid out, re-wrapped)

    def on_resize(self, event: events.Resize) -> None:
        self._keep_at_end()  # the view's own size changed (the terminal, the prompt box)
