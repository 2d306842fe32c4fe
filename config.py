"""Global settings: one TOML file under the platformdirs config dir, validated with clear messages.

    # ~/.config/dgchat/config.toml
    default_model = "~/models/llada-8b-instruct.Q4_K_M.gguf"
    theme = "dark"            # "dark", "light" or any Textual theme name
    system_prompt = ""        # persona for new chats
    refresh_hz = 30           # live-canvas repaints per second
    clipboard = "auto"        # auto | osc52 | file
    n_threads = 8             # CPU threads for llama.cpp (default: all cores)
    n_gpu_layers = 99         # layers to offload (default: all when the build supports it)
    export_dir = "~/Documents/dgchat"  # where Ctrl+S writes chats (default: that, else <data dir>/exports;
                                       # a relative folder is inside your home folder)
    answer_seconds_limit = 90  # models predicted to take longer for a 256-token answer are not recommended

    [sampler]                 # defaults for every chat, over the model's recommended values
    steps = 64
    gen_length = 128
    temperature = 0.0

    [engine]                  # how local models are run (`dgchat`, `dgchat generate|serve|npc`)
    precise = false           # f32 KV cache, no flash attention: exact logits, slower (--precise)

    [keys]                    # binding id = "key" or "key1,key2" (F1 lists the ids)
    "chat.stop" = "escape"

    [server]                  # `dgchat`, `dgchat generate|npc` without -m use this server (docs/SCALING.md)
    url = "http://gpu-box:8765"
    api_key = "..."           # or $DGCHAT_API_KEY; --api-key wins

This module must stay importable without Textual: `dgchat generate` reads `default_model` from it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dgchat import paths
from dgchat.hub.speed import DEFAULT_LIMIT_S
from dgchat.model_backend.errors import DgchatError, InvalidParameterError
from dgchat.model_backend.params import ALGORITHMS, CACHE_MODES, DiffusionParams, max_threads
from dgchat.toml_files import TomlFileError, read_toml

CLIPBOARD_MODES = ("auto", "osc52", "file")
THEME_ALIASES = {"dark": "textual-dark", "light": "textual-light"}

# sampler key -> (type, description used in messages)
SAMPLER_KEYS: dict[str, tuple[type, str]] = {
    "steps": (int, "a positive integer"),
    "gen_length": (int, "a positive integer"),
    "block_length": (int, "a positive integer"),
    "max_tokens": (int, "a positive integer"),
    "algorithm": (str, "one of " + ", ".join(ALGORITHMS)),
    "threshold": (float, "a number in (0, 1]"),
    "temperature": (float, "a number >= 0"),
    "eps": (float, "a number in [0, 1)"),
    "top_k": (int, "an integer >= 0"),
    "top_p": (float, "a number in (0, 1]"),
    "cache": (str, "one of " + ", ".join(CACHE_MODES)),
    "seed": (int, "an integer"),
}
TOP_KEYS = (
    "default_model", "theme", "system_prompt", "refresh_hz", "clipboard", "n_threads", "n_gpu_layers", "export_dir",
    "answer_seconds_limit", "sampler", "keys", "server", "engine",
)
ENGINE_KEYS = ("precise",)
SERVER_KEYS = ("url", "api_key")
_KEY_RE = re.compile(r"^(?:(?:ctrl|shift|alt|meta|super|hyper)\+)*(?:[a-z0-9_]+|[^\s,+])$")


class ConfigError(DgchatError):
    """The config file is not valid TOML or holds a bad value."""


@dataclass
class Config:
    path: Path
    exists: bool = False
    default_model: str | None = None
    theme: str | None = None  # None: remember the last theme picked in the app
    system_prompt: str = ""
    refresh_hz: int = 30
    clipboard: str = "auto"
    n_threads: int | None = None
    n_gpu_layers: int | None = None
    export_dir: str | None = None  # None: dgchat.app.export.default_export_dir()
    # seconds a 256-token answer may take for the wizard and the model lists to recommend a model
    answer_seconds_limit: float = DEFAULT_LIMIT_S
    sampler: dict[str, Any] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict)
    server_url: str | None = None  # [server] url: an OpenAI-compatible server (dgchat.remote)
    server_api_key: str | None = None  # [server] api_key
    precise: bool | None = None  # [engine] precise (None: not set; model_backend/param_resolution's "config")

    def sampler_params(self) -> DiffusionParams:
        """The config's sampler defaults as DiffusionParams (unset fields stay None)."""
        return DiffusionParams(**self.sampler)


def resolve_folder(value: str) -> Path:
    """A folder named in the config, as an absolute path: `~` expanded, a relative one inside the
    home folder (never the folder dgchat happened to be started from). Resolved once, when the
    config is read: the export dialogs take a relative path typed there as inside this folder, so
    a relative folder kept as it was got applied twice (exports/exports/chat.md)."""
    path = Path(value).expanduser()
    return path if path.is_absolute() else Path.home() / path


def _fail(path: Path, message: str) -> ConfigError:
    return ConfigError(f"{path}: {message}")


def _describe(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else str(value)


def _int(path: Path, name: str, value: Any, lo: int | None = None, hi: int | None = None, what: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or (lo is not None and value < lo) or (
        hi is not None and value > hi
    ):
        raise _fail(path, f"{name} must be {what or 'an integer'} (got {_describe(value)})")
    return value


def load_config(path: str | Path | None = None) -> Config:
    """Read and validate the config file; a missing file gives the defaults (`exists` False)."""
    path = Path(path) if path is not None else paths.config_path()
    config = Config(path=path)
    if not path.exists():
        return config
    try:  # a regular file of bounded size and nesting (dgchat.toml_files)
        raw = read_toml(path)
    except TomlFileError as exc:
        raise _fail(path, str(exc)) from None
    config.exists = True
    for key in raw:
        if key not in TOP_KEYS:
            raise _fail(path, f"unknown setting {key!r} (known: {', '.join(TOP_KEYS)})")

    if "default_model" in raw:
        value = raw["default_model"]
        if not isinstance(value, str) or not value.strip():
            raise _fail(path, f"default_model must be the path of a GGUF file (got {_describe(value)})")
        config.default_model = str(Path(value).expanduser())
    if "theme" in raw:
        value = raw["theme"]
        if not isinstance(value, str) or not value.strip():
            raise _fail(path, f"theme must be \"dark\", \"light\" or a Textual theme name (got {_describe(value)})")
        config.theme = THEME_ALIASES.get(value, value)
    if "system_prompt" in raw:
        if not isinstance(raw["system_prompt"], str):
            raise _fail(path, f"system_prompt must be a string (got {_describe(raw['system_prompt'])})")
        config.system_prompt = raw["system_prompt"]
    if "refresh_hz" in raw:
        config.refresh_hz = _int(path, "refresh_hz", raw["refresh_hz"], 1, 120, "an integer from 1 to 120")
    if "clipboard" in raw:
        value = raw["clipboard"]
        if value not in CLIPBOARD_MODES:
            raise _fail(path, f"clipboard must be one of {', '.join(CLIPBOARD_MODES)} (got {_describe(value)})")
        config.clipboard = value
    if "n_threads" in raw:
        # llama.cpp starts every thread asked for: 100000 segfaulted (model_backend.params.max_threads)
        top = max_threads()
        config.n_threads = _int(path, "n_threads", raw["n_threads"], 1, top,
                                f"a whole number from 1 to {top} (4 per core on this machine)")
    if "n_gpu_layers" in raw:
        config.n_gpu_layers = _int(path, "n_gpu_layers", raw["n_gpu_layers"], 0, None, "an integer >= 0")
    if "export_dir" in raw:
        value = raw["export_dir"]
        if not isinstance(value, str) or not value.strip():
            raise _fail(path, f"export_dir must be the path of a folder (got {_describe(value)})")
        config.export_dir = str(resolve_folder(value))
    if "answer_seconds_limit" in raw:
        value = raw["answer_seconds_limit"]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 1 <= value <= 86400:
            raise _fail(path, f"answer_seconds_limit must be a number of seconds from 1 to 86400 (got {_describe(value)})")
        config.answer_seconds_limit = float(value)
    if "sampler" in raw:
        config.sampler = _sampler(path, raw["sampler"])
    if "keys" in raw:
        config.keys = _keys(path, raw["keys"])
    if "server" in raw:
        config.server_url, config.server_api_key = _server(path, raw["server"])
    if "engine" in raw:
        config.precise = _engine(path, raw["engine"])
    return config


def _engine(path: Path, table: Any) -> bool | None:
    if not isinstance(table, dict):
        raise _fail(path, "[engine] must be a table with precise = true or false")
    for key in table:
        if key not in ENGINE_KEYS:
            raise _fail(path, f"[engine] unknown setting {key!r} (known: {', '.join(ENGINE_KEYS)})")
    value = table.get("precise")
    if value is not None and not isinstance(value, bool):
        raise _fail(path, f"[engine] precise must be true or false (got {_describe(value)})")
    return value


def _server(path: Path, table: Any) -> tuple[str | None, str | None]:
    if not isinstance(table, dict):
        raise _fail(path, "[server] must be a table with url and api_key")
    for key in table:
        if key not in SERVER_KEYS:
            raise _fail(path, f"[server] unknown setting {key!r} (known: {', '.join(SERVER_KEYS)})")
    url, key = table.get("url"), table.get("api_key")
    if url is not None and (not isinstance(url, str) or not url.startswith(("http://", "https://"))):
        raise _fail(path, f"[server] url must be an http:// or https:// URL (got {_describe(url)})")
    if key is not None and (not isinstance(key, str) or not key.strip()):
        raise _fail(path, "[server] api_key must be a non-empty string")
    return url, key


def _sampler(path: Path, table: Any) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise _fail(path, "[sampler] must be a table of sampler settings")
    out: dict[str, Any] = {}
    for key, value in table.items():
        if key not in SAMPLER_KEYS:
            raise _fail(path, f"[sampler] unknown setting {key!r} (known: {', '.join(SAMPLER_KEYS)})")
        kind, what = SAMPLER_KEYS[key]
        ok = (
            (kind is int and isinstance(value, int) and not isinstance(value, bool))
            or (kind is float and isinstance(value, (int, float)) and not isinstance(value, bool))
            or (kind is str and isinstance(value, str))
        )
        if not ok:
            raise _fail(path, f"[sampler] {key} must be {what} (got {_describe(value)})")
        out[key] = float(value) if kind is float else value
    try:
        DiffusionParams(**out).validate()
    except InvalidParameterError as exc:
        raise _fail(path, f"[sampler] {_plain(str(exc))}") from None
    return out


def _plain(message: str) -> str:
    """Parameter messages name CLI flags (--gen-length); the config file spells them gen_length."""
    return re.sub(r"--([a-z-]+)", lambda m: m.group(1).replace("-", "_"), message)


def _keys(path: Path, table: Any) -> dict[str, str]:
    if not isinstance(table, dict):
        raise _fail(path, "[keys] must be a table of binding id = \"key\"")
    out: dict[str, str] = {}
    for binding_id, value in table.items():
        if not isinstance(value, str) or not value.strip():
            raise _fail(path, f"[keys] {binding_id} must be a key such as \"ctrl+r\" (got {_describe(value)})")
        keys = [k.strip() for k in value.split(",")]
        for key in keys:
            if not _KEY_RE.match(key):
                raise _fail(path, f"[keys] {binding_id}: {key!r} is not a key name (examples: ctrl+r, f5, escape)")
        out[binding_id] = ",".join(keys)
    return out


def validate_for_app(config: Config, *, themes: set[str], binding_ids: set[str]) -> None:
    """The checks that need the UI: theme names and binding ids exist."""
    if config.theme is not None and config.theme not in themes:
        raise _fail(config.path, f"theme {config.theme!r} is not a theme (known: dark, light, {', '.join(sorted(themes))})")
    for binding_id in config.keys:
        if binding_id not in binding_ids:
            raise _fail(
                config.path,
                f"[keys] unknown binding id {binding_id!r} (press F1 in the app for the list; "
                f"known: {', '.join(sorted(binding_ids))})",
            )
