"""The `dgchat` command: `dgchat` opens the chat app; subcommands do the rest without a UI."""

from __future__ import annotations

import argparse
import importlib
import sys

from dgchat import __version__

# subcommand -> module under dgchat.commands exposing add_parser(subparsers) and run(args) -> int
SUBCOMMANDS = ["generate", "convert", "bench", "models", "npc", "serve", "rpc-server"]


def _module_name(command: str) -> str:
    return f"dgchat.commands.{command.replace('-', '_')}"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line and exit code 2, like every other bad input
        from dgchat.terminal_text import cli_line

        self.print_usage(sys.stderr)
        cli_line("error", message)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="dgchat",
        description="A local terminal chat for text-diffusion language models. "
        "Without a subcommand, opens the chat app.",
    )
    parser.add_argument("--version", action="version", version=f"dgchat {__version__}")
    parser.add_argument("-m", "--model", help="GGUF model to open in the app (default: configured or bundled model)")
    parser.add_argument("--chat", type=int, metavar="ID", help="open this saved chat in the app")
    parser.add_argument("--verbose", action="store_true", help="show llama.cpp's log lines")
    # the chat app's server (subcommands take their own --server after the subcommand's name)
    parser.add_argument("--server", dest="app_server", metavar="URL",
                        help="chat with the model an OpenAI-compatible server serves (dgchat serve: with the live "
                             "canvas; vLLM and others: text only) instead of a local model (default without "
                             "--model: [server] url of the config)")
    parser.add_argument("--api-key", dest="app_api_key", metavar="KEY",
                        help="the server's API key (default: $DGCHAT_API_KEY, else [server] api_key). Visible to "
                             "other users in `ps`: prefer $DGCHAT_API_KEY")
    from dgchat.commands.common import RPC_HELP

    parser.add_argument("--rpc", dest="app_rpc", metavar="HOST:PORT[,HOST:PORT]", help=RPC_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(_module_name(name))
        except ModuleNotFoundError as exc:
            if exc.name == _module_name(name):
                continue  # not built yet
            raise
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from dgchat.hub.offline import enforce_offline

    enforce_offline()  # no hub request unless the user asks for a download (docs/MODELS.md)
    parser = build_parser()
    args = parser.parse_args(argv)
    from dgchat.model_backend.errors import DgchatError

    try:
        if args.command is not None and (args.app_server or args.app_api_key):
            from dgchat.model_backend.errors import InvalidParameterError

            raise InvalidParameterError(f"put --server and --api-key after the subcommand: dgchat {args.command} "
                                        "--server URL")
        if args.command is not None and args.app_rpc:
            from dgchat.model_backend.errors import InvalidParameterError

            raise InvalidParameterError(f"put --rpc after the subcommand: dgchat {args.command} --rpc HOST:PORT")
        rpc_spec = args.app_rpc if args.command is None else getattr(args, "rpc", None)
        if rpc_spec:  # before any model loads, in the app too (docs/SCALING.md)
            from dgchat.commands.common import use_rpc_servers

            use_rpc_servers(rpc_spec, command=args.command,
                            remote=args.app_server if args.command is None else getattr(args, "server", None))
        if args.command is None:
            from dgchat.app.main import run_app

            args.server, args.api_key = args.app_server, args.app_api_key
            if args.api_key:
                sys.stderr.write("dgchat: warning: --api-key is visible to other users of this machine (`ps`); "
                                 "prefer $DGCHAT_API_KEY\n")
            return run_app(args)
        module = importlib.import_module(_module_name(args.command))
        return int(module.run(args) or 0)
    except DgchatError as exc:
        from dgchat.terminal_text import cli_line

        # every command's errors end here: one line, by the terminal rule, bounded (a server's
        # error body can be 100 KB of HTML with escape sequences)
        cli_line("error", exc)
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("dgchat: interrupted\n")
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
