"""Global settings: one TOML file under the platformdirs config dir, validated with clear messages.

    # ~/.config/dgchat/config.toml
    default_model = "~/models/llada-8b-instruct.Q4_K_M.gguf"
    theme = "dark"            # "dark", "light" or any Textual theme name
    system_prompt = ""        # persona for new chats
    refresh_hz = 30           # live-canvas repaints per second
    clipboard = "auto"        # auto | osc52 | file
    n_threads = 8             # CPU threads for llama.cpp (default: all cores)
    n_gpu_layers = 99         # older spelling of [engine] gpu_layers
    export_dir = "~/Documents/dgchat"  # where Ctrl+S writes chats (default: that, else <data dir>/exports;
                                       # a relative folder is inside your home folder)
    answer_seconds_limit = 90  # models predicted to take longer for a 256-token answer are not recommended

    [sampler]                 # defaults for every chat, over the model's recommended values
    steps = 64
    gen_length = 128
    temperature = 0.0

    [engine]                  # how local models are run (`dgchat`, `dgchat generate|serve|npc`)
    precise = false           # f32 KV cache, no flash attention: exact logits, slower (--precise)
    gpu_layers = 99           # llama.cpp's n_gpu_layers (--gpu-layers; default: planned from free GPU memory)
    experts_on = "auto"       # auto | cpu | gpu: where a mixture of experts' experts may go (--experts-on)

    [keys]                    # binding id = "key" or "key1,key2" (F1 lists the ids)
    "chat.stop" = "escape"

    [server]                  # `dgchat`, `dgchat generate|npc` without -m use this server (docs/SCALING.md)
    url = "http://gpu-box:8765"
    api_key = "..."           # or $DGCHAT_API_KEY; --api-key wins

The app changes a few keys in place (`save_default_model`, `save_server`, `save_precise`): line by line
through dgchat.toml_write, so that a person's comments and layout stay, and atomically.

This module must stay importable without Textual: `dgchat generate` reads `default_model` from it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dgchat import paths
from dgchat.hub.speed import DEFAULT_LIMIT_S
from dgchat.model_backend.errors import DgchatError, InvalidParameterError
from dgchat.model_backend.params import DiffusionParams, max_threads
from dgchat.model_backend.placement import EXPERTS_ON
from dgchat.toml_files import TomlFileError, parse_toml, read_regular_file, read_toml
from dgchat.toml_write import set_keys

CLIPBOARD_MODES = ("auto", "osc52", "file")
THEME_ALIASES = {"dark": "textual-dark", "light": "textual-light"}

# the sampler settings [sampler] may set; their types and ranges are DiffusionParams.FIELDS'
SAMPLER_KEYS = ("steps", "gen_length", "block_length", "max_tokens", "algorithm", "threshold", "temperature", "eps",
                "top_k", "top_p", "cache", "seed")
TOP_KEYS = (
    "default_model", "theme", "system_prompt", "refresh_hz", "clipboard", "n_threads", "n_gpu_layers", "export_dir",
    "answer_seconds_limit", "sampler", "keys", "server", "engine",
)
ENGINE_KEYS = ("precise", "gpu_layers", "experts_on")
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
    n_gpu_layers: int | None = None  # [engine] gpu_layers, or the older top-level n_gpu_layers
    export_dir: str | None = None  # None: dgchat.app.export.default_export_dir()
    # seconds a 256-token answer may take for the wizard and the model lists to recommend a model
    answer_seconds_limit: float = DEFAULT_LIMIT_S
    sampler: dict[str, Any] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict)
    server_url: str | None = None  # [server] url: an OpenAI-compatible server (dgchat.remote)
    server_api_key: str | None = None  # [server] api_key
    precise: bool | None = None  # [engine] precise (None: not set; model_backend/param_resolution's "config")
    experts_on: str | None = None  # [engine] experts_on (None: not set, "auto")

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
        _engine(path, raw["engine"], config)
    return config


def _engine(path: Path, table: Any, config: Config) -> None:
    if not isinstance(table, dict):
        raise _fail(path, "[engine] must be a table of engine settings (precise, gpu_layers, experts_on)")
    for key in table:
        if key not in ENGINE_KEYS:
            raise _fail(path, f"[engine] unknown setting {key!r} (known: {', '.join(ENGINE_KEYS)})")
    value = table.get("precise")
    if value is not None and not isinstance(value, bool):
        raise _fail(path, f"[engine] precise must be true or false (got {_describe(value)})")
    config.precise = value
    if "gpu_layers" in table:
        layers = _int(path, "[engine] gpu_layers", table["gpu_layers"], 0, None, "an integer >= 0")
        if config.n_gpu_layers is not None and config.n_gpu_layers != layers:
            raise _fail(path, f"n_gpu_layers ({config.n_gpu_layers}) and [engine] gpu_layers ({layers}) disagree: "
                              "keep [engine] gpu_layers")
        config.n_gpu_layers = layers
    if "experts_on" in table:
        value = table["experts_on"]
        if value not in EXPERTS_ON:
            raise _fail(path, f"[engine] experts_on must be one of {', '.join(EXPERTS_ON)} (got {_describe(value)})")
        config.experts_on = value


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
        spec = DiffusionParams.FIELDS[key]
        if not spec.has_type(value):
            raise _fail(path, f"[sampler] {key} must be {spec.what} (got {_describe(value)})")
        out[key] = float(value) if spec.kind is float else value
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


# -- writing: single keys, edited in place ----------------------------------------------------------

CONFIG_HEADER = (
    "# dgchat settings; every key is optional (docs/APP.md lists them all).\n"
    "# Written by the first-run setup; edit freely.\n"
)


def save_default_model(config_path: Path, model_path: Path | str | None) -> None:
    """Set (or with None remove) `default_model` in the config file, keeping everything else as it
    is (comments, other keys, tables); creates the file if there is none. Atomic."""
    value = str(model_path) if model_path is not None else None
    _edit(Path(config_path), None, {"default_model": value}, "default_model",
          lambda top: top.get("default_model") == value, "(a multi-line value?)")


def save_server(config_path: Path, url: str | None, api_key: str | None = None) -> None:
    """Set the `[server]` table's url (and api_key when given; an api_key already there is removed
    otherwise, so a key meant for another server is never sent to this one), or with url None
    remove both. Everything else in the file stays as it is (comments, other keys and tables);
    creates the file if there is none. Atomic."""
    key = api_key if url is not None and api_key else None
    _edit(Path(config_path), "server", {"url": url, "api_key": key}, "[server]",
          lambda table: table.get("url") == url and table.get("api_key") == key,
          "(is it written another way, such as server.url = …?)")


def save_precise(config_path: Path, precise: bool) -> None:
    """Set `[engine] precise` (exact mode: f32 KV cache, no flash attention), keeping everything
    else as it is; creates the table, or the file, if there is none. Atomic."""
    _edit(Path(config_path), "engine", {"precise": precise}, "[engine] precise",
          lambda table: table.get("precise") is precise, "(is it written another way, such as engine.precise = …?)")


def _edit(config_path: Path, table: str | None, values: dict[str, object | None], what: str,
          took: Callable[[dict[str, Any]], bool], not_taken: str) -> None:
    """Write the config file with `values` set in `table` (toml_write.set_keys) once the result parses
    and `took` finds the edit in it, atomically (0600, as every settings file: it may hold a key);
    else a ConfigError and the file unchanged."""
    text = set_keys(_config_text(config_path), table, values)
    try:
        parsed = parse_toml(text)
    except TomlFileError as exc:
        raise ConfigError(f"{config_path}: {exc}, so {what} was not written") from None
    section = parsed if table is None else parsed.get(table)
    if not took(section if isinstance(section, dict) else {}):
        raise ConfigError(f"{config_path}: {what} could not be set {not_taken}; edit it by hand")
    paths.atomic_write_text(config_path, text)


def _config_text(config_path: Path) -> str:
    """The config file's text to edit, or a new file's header when there is none."""
    try:  # a regular file of bounded size (a FIFO would block the app)
        return read_regular_file(config_path).decode("utf-8")
    except TomlFileError as exc:
        if exc.kind != "missing":
            raise ConfigError(f"{config_path}: {exc}") from None
        return CONFIG_HEADER
    except UnicodeDecodeError:
        raise ConfigError(f"{config_path}: not UTF-8 text") from None
