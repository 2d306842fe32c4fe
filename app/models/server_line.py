"""The Models screen's server line: when the app's model comes from a server, the line above the
table that names it, with its own Use button ("Use this server").

A mixin of ModelsScreen (app/models_screen.py): its methods run on the screen and use its widgets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dgchat.app.model_source import ModelSource, ServerSource
from dgchat.config import save_server
from dgchat.model_backend.engine_protocol import served
from dgchat.model_backend.errors import DgchatError
from dgchat.remote.client import API_KEY_ENV
from dgchat.terminal_text import one_line
from textual.screen import Screen
from textual.widgets import Static

if TYPE_CHECKING:  # the mixin's methods run on the Models screen: the type checker sees them there
    _ScreenBase = Screen[ModelSource | None]
else:
    _ScreenBase = object


class ServerLine(_ScreenBase):
    """The server the app knows of, shown and usable from the Models screen."""

    def server(self) -> ServerSource | None:
        """The server this app knows of: the session's (from --server or the config), else the
        config's [server] url when a local model runs now."""
        session, config = self.app.session, self.app.config
        for source in (session.default_path, session.path):
            if isinstance(source, ServerSource):
                return source
        if config.server_url:
            import os

            try:
                return ServerSource.of(config.server_url, os.environ.get(API_KEY_ENV) or config.server_api_key)
            except DgchatError:
                return None
        return None

    def _show_server(self) -> None:
        source = self.server()
        line = self.query_one("#models-server")
        line.display = source is not None
        if source is None:
            return
        session = self.app.session
        engine = served(session.loaded(source))
        if engine is not None:
            kind = "live canvas" if engine.is_dgchat else "text only"
            text = f"Served by {source.url}: {engine.model_id} · {kind}"
        elif source in session.load_errors:
            text = f"Server {source.url}: not available ({session.load_errors[source]})"
        else:
            text = f"Server {source.url}: not connected"
        if session.default_path == source:
            text = "● " + text + " · in use"
        if self.app.config.server_url == source.url:
            text += " · [server] url in the config"
        # the server's model id and its error text are outside text
        self.query_one("#models-server-text", Static).update(one_line(text))

    def action_use_server(self) -> None:
        """Use the server: it becomes the default source (saved as [server] url unless the config
        names it already; its key is not written: --api-key or $DGCHAT_API_KEY give it) and the
        screen closes with it as the result."""
        source = self.server()
        if source is None:
            return
        app = self.app
        config = app.config
        if config.server_url != source.url:
            try:
                save_server(config.path, source.url)
            except DgchatError as exc:
                self._message(str(exc), error=True)
                return
            config.server_url, config.server_api_key = source.url, None
            config.exists = True
        app.session.use_default(source)
        self.dismiss(source)
