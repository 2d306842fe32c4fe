"""The `dgchat` command: `dgchat` opens the chat app; subcommands do the rest without a UI."""

from __future__ import annotations

import argparse
import importlib
import sys
from types import ModuleType

from dgchat import __version__
from dgchat.commands.common import RPC_HELP, use_rpc_servers
from dgchat.hub.offline import enforce_offline
from dgchat.model_backend.errors import DgchatError, InvalidParameterError
from dgchat.terminal_text import cli_line

# The one place that loads a subcommand: name -> (its module under dgchat.commands, which exposes
# add_parser(subparsers) and run(args) -> int; its one-line help, the same as add_parser gives it).
# A command's module imports what it runs (llama.cpp, the server, the hub) at module level, so
# `dgchat --help` imports none of them and `dgchat generate ...` imports only generate's.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "generate": ("dgchat.commands.generate", "generate one answer (no UI)"),
    "convert": ("dgchat.commands.convert",
                "convert a checkpoint folder or GGUF to a dgchat GGUF (optionally quantized / cache-capable)"),
    "bench": ("dgchat.commands.bench", "measure speed and quality of decoding configurations"),
    "models": ("dgchat.commands.models", "list, download, import, verify and remove models"),
    "npc": ("dgchat.commands.npc", "generate NPC lines from character cards and a lines file (no UI)"),
    "serve": ("dgchat.commands.serve", "serve the model over an OpenAI-compatible HTTP API"),
    "rpc-server": ("dgchat.commands.rpc_server",
                   "serve this machine's CPU/GPU to `dgchat --rpc` elsewhere (llama.cpp RPC)"),
}


# `dgchat` without a subcommand: the chat app (Textual and the whole UI: the heaviest import of all)
APP_MODULE = "dgchat.app.main"


def _load(module: str) -> ModuleType:
    return importlib.import_module(module)


def command_module(command: str) -> ModuleType:
    """The module of a subcommand, imported on first use."""
    return _load(SUBCOMMANDS[command][0])


class _LazySubcommands(argparse._SubParsersAction):
    """The subcommands, listed from SUBCOMMANDS; a command's own parser is built (its module
    imported) only when argparse picks that command."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        for name, (_, help_text) in SUBCOMMANDS.items():
            self._name_parser_map[name] = None  # a valid choice, its parser not built yet
            self._choices_actions.append(self._ChoicesPseudoAction(name, (), help_text))

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        name = values[0]
        if self._name_parser_map.get(name, "") is None:
            listed = list(self._choices_actions)
            del self._name_parser_map[name]
            command_module(name).add_parser(self)
            self._choices_actions[:] = listed  # already listed, with the same help
        super().__call__(parser, namespace, values, option_string)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line and exit code 2, like every other bad input
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
    parser.add_argument("--rpc", dest="app_rpc", metavar="HOST:PORT[,HOST:PORT]", help=RPC_HELP)
    parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser, action=_LazySubcommands)
    return parser


def main(argv: list[str] | None = None) -> int:
    enforce_offline()  # no hub request unless the user asks for a download (docs/MODELS.md)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command is not None and (args.app_server or args.app_api_key):
            raise InvalidParameterError(f"put --server and --api-key after the subcommand: dgchat {args.command} "
                                        "--server URL")
        if args.command is not None and args.app_rpc:
            raise InvalidParameterError(f"put --rpc after the subcommand: dgchat {args.command} --rpc HOST:PORT")
        rpc_spec = args.app_rpc if args.command is None else getattr(args, "rpc", None)
        if rpc_spec:  # before any model loads, in the app too (docs/SCALING.md)
            use_rpc_servers(rpc_spec, command=args.command,
                            remote=args.app_server if args.command is None else getattr(args, "server", None))
        if args.command is None:
            args.server, args.api_key = args.app_server, args.app_api_key
            if args.api_key:
                sys.stderr.write("dgchat: warning: --api-key is visible to other users of this machine (`ps`); "
                                 "prefer $DGCHAT_API_KEY\n")
            return _load(APP_MODULE).run_app(args)
        return int(command_module(args.command).run(args) or 0)
    except DgchatError as exc:
        # every command's errors end here: one line, by the terminal rule, bounded (a server's
        # error body can be 100 KB of HTML with escape sequences)
        cli_line("error", exc)
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("dgchat: interrupted\n")
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
