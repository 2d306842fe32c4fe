"""`dgchat` without a subcommand: open the chat app."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from dgchat.app import paths
from dgchat.app.config import Config, load_config
from dgchat.app.store import Store
from dgchat.model_backend.errors import DgchatError


def resolve_app_model(arg: str | None, config: Config) -> Path | None:
    """--model, else $DGCHAT_MODEL, else default_model from the config, else the bundled model."""
    if arg:
        return Path(arg).expanduser()
    env = os.environ.get("DGCHAT_MODEL")
    if env:
        return Path(env).expanduser()
    if config.default_model:
        return Path(config.default_model).expanduser()
    from dgchat.assets import bundled_model_path

    return bundled_model_path()


def build_app(args: argparse.Namespace, **kwargs):
    """The app for these arguments (config and database opened and validated); raises DgchatError."""
    config = load_config()
    store = Store(paths.db_path())
    try:
        chat_id = getattr(args, "chat", None)
        if chat_id is not None and store.get_chat(chat_id) is None:
            raise DgchatError(f"no saved chat with id {chat_id} (chats are in {paths.db_path()})")
        from dgchat.app.app import DgchatApp

        return DgchatApp(
            config=config, store=store, model_path=resolve_app_model(getattr(args, "model", None), config),
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

