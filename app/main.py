"""`dgchat` without a subcommand: open the chat app."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from dgchat import assets
from dgchat.app import paths
from dgchat.app.app import DgchatApp
from dgchat.config import Config, load_config
from dgchat.app.model_source import ModelSource, ServerSource
from dgchat.app.store import Store
from dgchat.model_backend.errors import DgchatError, InvalidParameterError
from dgchat.remote.client import API_KEY_ENV


def resolve_app_model(arg: str | None, config: Config) -> Path | None:
    """--model, else $DGCHAT_MODEL, else default_model from the config, else the bundled model."""
    if arg:
        return Path(arg).expanduser()
    env = os.environ.get("DGCHAT_MODEL")
    if env:
        return Path(env).expanduser()
    if config.default_model:
        return Path(config.default_model).expanduser()

    return assets.bundled_model_path()


def resolve_app_source(args: argparse.Namespace, config: Config) -> ModelSource | None:
    """The app's model: --server URL, else --model, else $DGCHAT_MODEL, else the config's [server]
    url, else its default_model, else the bundled model. A server named on the command line or in
    the config wins over default_model, as for `dgchat generate` (dgchat.commands.server_args)."""
    server = getattr(args, "server", None)
    model = getattr(args, "model", None)
    if server and model:
        raise InvalidParameterError("give --model or --server, not both")
    if not server and not model and not os.environ.get("DGCHAT_MODEL"):
        server = config.server_url
    if not server:
        return resolve_app_model(model, config)

    key = getattr(args, "api_key", None) or os.environ.get(API_KEY_ENV) or config.server_api_key
    return ServerSource.of(server, key)


def build_app(args: argparse.Namespace, **kwargs):
    """The app for these arguments (config and database opened and validated); raises DgchatError."""
    config = load_config()
    source = resolve_app_source(args, config)  # a bad --server URL fails before the database opens
    store = Store(paths.db_path())
    try:
        chat_id = getattr(args, "chat", None)
        if chat_id is not None and store.get_chat(chat_id) is None:
            raise DgchatError(f"no saved chat with id {chat_id} (chats are in {paths.db_path()})")

        return DgchatApp(
            config=config, store=store, model_path=source,
            open_chat=chat_id, **kwargs,
        )
    except BaseException:
        store.close()
        raise


def run_app(args: argparse.Namespace) -> int:
    app = build_app(args)
    try:
        result = app.run()
    finally:
        app.store.close()
    return int(result or 0) if app.return_code is None else int(app.return_code or 0)

