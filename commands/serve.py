"""`dgchat serve`: the local OpenAI-compatible API (docs/SERVER.md)."""

from __future__ import annotations

import argparse
import asyncio
import os

from dgchat.commands.common import (add_common, add_model_args, add_precise_arg, open_local_engine,
                                   placement_choice, precise_choice, resolve_model_path)
from dgchat.model_backend.errors import DgchatError, InvalidParameterError
from dgchat.server import DEFAULT_PORT  # the server itself is imported when the command runs
from dgchat.server.logs import write_stderr

TOKEN_ENV = "DGCHAT_API_TOKEN"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve", help="serve the model over an OpenAI-compatible HTTP API",
        description="Serve the model on an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions, "
                    "/v1/models) plus /v1/infill for NPC line templates. Bound to 127.0.0.1 unless --host says "
                    "otherwise; any other address needs --token. Ctrl-C stops it gracefully.",
    )
    add_common(p)
    add_model_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any free port)")
    tokens = p.add_mutually_exclusive_group()
    tokens.add_argument("--token", default=None,
                        help=f"require `Authorization: Bearer TOKEN` on every request; required when --host is not "
                             f"a loopback address. Visible to other users in `ps`: prefer --token-file or "
                             f"${TOKEN_ENV}")
    tokens.add_argument("--token-file", metavar="PATH",
                        help=f"read the token from this file (its first line; default: ${TOKEN_ENV})")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="also accept requests whose Host header names NAME (besides loopback names and the bound "
                        "address; '*': any). Guards against DNS rebinding")
    p.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                   help="let web pages from ORIGIN (e.g. http://localhost:3000) call the API; requests from any "
                        "other page are refused")
    p.add_argument("--max-queue", type=int, default=8, metavar="N",
                   help="requests that may wait behind the running one; more get 429 (default 8)")
    p.add_argument("--max-body", type=int, default=1 << 20, metavar="BYTES",
                   help="largest request body; larger ones get 413 (default 1 MiB)")
    p.add_argument("--model-id", help="the model's id in the API (default: the file name without .gguf)")
    p.add_argument("--cards", action="append", metavar="PATH",
                   help="character cards for /v1/infill (default: the data folder's npc/cards)")
    add_precise_arg(p, help="f32 KV cache, no flash attention: batched choices equal unbatched ones, logits match "
                            "the reference implementation (default: [engine] precise in config.toml, else off)")
    p.add_argument("--quiet", action="store_true", help="no access log")


def _token(args: argparse.Namespace) -> str | None:
    """--token, else --token-file's first line, else $DGCHAT_API_TOKEN."""
    if args.token is not None:
        write_stderr(f"dgchat serve: warning: --token is visible to other users of this machine (`ps`); "
                     f"prefer --token-file PATH or ${TOKEN_ENV}")
        return args.token
    if args.token_file is not None:
        try:
            with open(args.token_file, encoding="utf-8") as f:
                token = f.readline().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidParameterError(f"cannot read --token-file {args.token_file}: "
                                        f"{getattr(exc, 'strerror', None) or exc}") from None
        if not token:
            raise InvalidParameterError(f"--token-file {args.token_file} is empty")
        return token
    return os.environ.get(TOKEN_ENV) or None


def run(args: argparse.Namespace) -> int:
    # imported when the command runs, so that `dgchat serve --help` loads neither the HTTP stack nor llama.cpp
    from dgchat.server.app import ServeConfig  # heavy: the HTTP server's stack, then llama.cpp's shared library

    config = ServeConfig(host=args.host, port=args.port, token=_token(args), max_body=args.max_body,
                         max_queue=args.max_queue, model_id=args.model_id,
                         cards=tuple(args.cards) if args.cards else None, quiet=args.quiet,
                         allow_hosts=tuple(args.allow_host), allow_origins=tuple(args.allow_origin))
    config.validate()  # before loading the model: a refused --host costs nothing

    from dgchat.model_backend import llamacpp  # the shared library: loaded once the config is valid
    from dgchat.server.app import serve  # heavy: see above

    llamacpp.set_verbose(getattr(args, "verbose", False))
    engine = open_local_engine(resolve_model_path(args.model), n_threads=args.threads,
                               precise=precise_choice(args)[0], **placement_choice(args))
    stopped_cleanly = False

    def ready(server) -> None:
        auth = "token required" if config.token else "no token"
        write_stderr(f"dgchat serve: {server.model_id} on {server.url}/v1 ({auth}); Ctrl-C stops")

    try:
        stopped_cleanly = asyncio.run(serve(engine, config, ready=ready))
    except OSError as exc:
        stopped_cleanly = True  # it never started serving
        raise DgchatError(f"cannot listen on {config.host}:{config.port}: {exc.strerror or exc}") from None
    finally:
        if stopped_cleanly:
            engine.close()  # otherwise the worker may still be inside llama.cpp: the process exit frees it
    write_stderr("dgchat serve: stopped")  # stderr may be gone by now: never raises
    return 0
