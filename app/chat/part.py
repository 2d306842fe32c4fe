"""What every area of the chat screen shares: the screen it works for, and through it the app.

An area (app/chat/*.py) keeps its own state and reaches the widgets, the open chat and the other
areas through the screen, so that the screen stays the one place where they are wired together.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dgchat.app.session import ModelSession
from dgchat.app.store import Store

if TYPE_CHECKING:  # the screen imports every area: only the type checker may look back
    from dgchat.app.app import DgchatApp
    from dgchat.app.chat_screen import ChatScreen


class ChatPart:
    """One area of the chat screen's work."""

    def __init__(self, screen: ChatScreen) -> None:
        self.screen = screen

    @property
    def app(self) -> DgchatApp:
        return self.screen.app  # type: ignore[return-value]

    @property
    def store(self) -> Store:
        return self.screen.store

    @property
    def session(self) -> ModelSession:
        return self.screen.session
