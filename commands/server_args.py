"""The command line's server options (`dgchat generate|npc --server URL`), shared by both commands."""

from __future__ import annotations

import argparse
import math
import os
import sys

from dgchat.config import load_config
from dgchat.model_backend.errors import InvalidParameterError
from dgchat.remote.client import API_KEY_ENV, DEFAULT_DEADLINE, DEFAULT_RETRIES, DEFAULT_TIMEOUT


def add_server_args(parser: argparse.ArgumentParser, *, many: bool = False) -> None:
    g = parser.add_argument_group("remote engine (docs/SCALING.md)")
    if many:
        g.add_argument("--server", action="append", default=[], metavar="URL",
                       help="a dgchat serve server to run on instead of a local model (repeatable: the entries are "
                            "spread over the servers; default without -m: [server] url of the config)")
    else:
        g.add_argument("--server", metavar="URL",
                       help="an OpenAI-compatible server to run on instead of a local model: dgchat serve (with "
                            "the live canvas) or vLLM and others (text only); default without -m: [server] url "
                            "of the config")
    g.add_argument("--api-key", metavar="KEY",
                   help=f"the server's API key (default: ${API_KEY_ENV}, else [server] api_key). Visible to other "
                        f"users in `ps`: prefer ${API_KEY_ENV}")
    g.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                   help=f"give up on a server that sends nothing for this long (default {DEFAULT_TIMEOUT:g})")
    g.add_argument("--deadline", type=float, default=DEFAULT_DEADLINE, metavar="SECONDS",
                   help=f"give up on a request that has not finished after this long, even while the server keeps "
                        f"sending (default {DEFAULT_DEADLINE:g}; raise it for long answers on a slow server)")
    g.add_argument("--retries", type=int, default=DEFAULT_RETRIES, metavar="N",
                   help=f"tries again after 0.5, 1, 2, ... s when a server cannot be reached or answers 429/5xx "
                        f"(default {DEFAULT_RETRIES}; at most 15 s of waiting in all)")
    if many:
        g.add_argument("--per-server", type=int, default=2, metavar="N",
                       help="requests in flight on each server (default 2: one generating, one queued)")


def server_choice(args: argparse.Namespace) -> tuple[list[str], str | None]:
    """The servers to use and the API key: --server, else the config's [server] url when no model
    was named (-m wins over the config: a local model stays a one-flag choice)."""
    given = args.server
    urls = [given] if isinstance(given, str) else list(given or [])
    config = None
    if not urls and not getattr(args, "model", None) and not os.environ.get("DGCHAT_MODEL"):
        config = _config()
        if config is not None and config.server_url:
            urls = [config.server_url]
    if not urls:
        return [], None
    for name in ("timeout", "deadline"):
        value = getattr(args, name, None)
        if value is not None and not (math.isfinite(value) and 0 < value <= 1e6):
            raise InvalidParameterError(f"--{name} must be a number of seconds in (0, 1e6] (got {value:g})")
    if args.retries < 0:
        raise InvalidParameterError(f"--retries must be >= 0 (got {args.retries})")
    if args.api_key:
        sys.stderr.write(f"dgchat: warning: --api-key is visible to other users of this machine (`ps`); prefer "
                         f"${API_KEY_ENV}\n")
        return urls, args.api_key
    key = os.environ.get(API_KEY_ENV)
    if not key:
        config = config or _config()
        key = config.server_api_key if config is not None else None
    return urls, key or None


def _config():
    return load_config()
