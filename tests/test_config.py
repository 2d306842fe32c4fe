"""The TOML config: defaults, every validated value, clear messages, and where it is looked for."""

from __future__ import annotations

from pathlib import Path

import pytest

from dgchat.app import paths
from dgchat.config import ConfigError, load_config, validate_for_app
from dgchat.app.main import resolve_app_model


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_missing_file_gives_defaults(tmp_path):
    config = load_config(tmp_path / "nope.toml")
    assert not config.exists
    assert (config.default_model, config.theme, config.refresh_hz, config.clipboard) == (None, None, 30, "auto")
    assert config.sampler == {} and config.keys == {}


def test_a_full_valid_file(tmp_path):
    path = _write(tmp_path, """
default_model = "~/models/llada.gguf"
theme = "light"
system_prompt = "You are a herald."
refresh_hz = 20
clipboard = "file"
n_threads = 4
n_gpu_layers = 0

[sampler]
steps = 64
gen_length = 128
block_length = 32
algorithm = "entropy"
threshold = 0.9
temperature = 1
cache = "prefix"
max_tokens = 512
seed = 7

[keys]
"chat.regenerate" = "f5"
"app.help" = "f1, ctrl+h"
""")
    c = load_config(path)
    assert c.exists
    assert c.default_model == str(Path("~/models/llada.gguf").expanduser())
    assert c.theme == "textual-light"
    assert (c.system_prompt, c.refresh_hz, c.clipboard, c.n_threads, c.n_gpu_layers) == (
        "You are a herald.", 20, "file", 4, 0)
    assert c.sampler["temperature"] == 1.0 and isinstance(c.sampler["temperature"], float)
    p = c.sampler_params()
    assert (p.steps, p.gen_length, p.block_length, p.algorithm, p.threshold, p.cache, p.max_tokens, p.seed) == (
        64, 128, 32, "entropy", 0.9, "prefix", 512, 7)
    assert c.keys == {"chat.regenerate": "f5", "app.help": "f1,ctrl+h"}


@pytest.mark.parametrize(
    "text, message",
    [
        ("default_model = 3", "default_model must be the path of a GGUF file (got 3)"),
        ('default_model = ""', "default_model must be the path of a GGUF file (got '')"),
        ("theme = 1", "theme must be"),
        ("refresh_hz = 0", "refresh_hz must be an integer from 1 to 120 (got 0)"),
        ('refresh_hz = "fast"', "refresh_hz must be an integer from 1 to 120 (got 'fast')"),
        ("refresh_hz = true", "refresh_hz must be an integer from 1 to 120 (got true)"),
        ('clipboard = "x11"', "clipboard must be one of auto, osc52, file (got 'x11')"),
        ("n_threads = 0", "n_threads must be a whole number from 1 to "),
        ("n_gpu_layers = -1", "n_gpu_layers must be an integer >= 0 (got -1)"),
        ("system_prompt = 5", "system_prompt must be a string (got 5)"),
        ("colour = 'red'", "unknown setting 'colour'"),
        ("sampler = 3", "[sampler] must be a table"),
        ("[sampler]\nsteps = 0", "[sampler] steps must be a positive integer (got 0)"),
        ("[sampler]\nsteps = 1.5", "[sampler] steps must be a positive integer (got 1.5)"),
        ('[sampler]\nalgorithm = "best"', "[sampler] algorithm must be one of confidence, entropy"),
        ("[sampler]\ntemperature = -1", "[sampler] temperature must be >= 0 (got -1.0)"),
        ("[sampler]\nthreshold = 2", "[sampler] threshold must be in (0, 1] (got 2.0)"),
        ('[sampler]\ncache = "all"', "[sampler] cache must be one of auto, none, prefix, dual (got 'all')"),
        ("[sampler]\ngen_length = 100\nblock_length = 32", "[sampler] canvas length 100 is not divisible by block length 32"),
        ("[sampler]\nwarp = 9", "[sampler] unknown setting 'warp'"),
        ("[keys]\n\"chat.stop\" = 1", "[keys] chat.stop must be a key such as \"ctrl+r\" (got 1)"),
        ("[keys]\n\"chat.stop\" = \"ctrl + r\"", "[keys] chat.stop: 'ctrl + r' is not a key name"),
        ("refresh_hz = ", "not valid TOML"),
    ],
)
def test_bad_values_name_the_problem(tmp_path, text, message):
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert message in str(info.value)
    assert str(path) in str(info.value)  # and the file


def test_ui_checks(tmp_path):
    config = load_config(_write(tmp_path, 'theme = "nord"\n[keys]\n"chat.stop" = "f4"\n'))
    validate_for_app(config, themes={"nord", "textual-dark"}, binding_ids={"chat.stop"})
    with pytest.raises(ConfigError, match="theme 'nord' is not a theme"):
        validate_for_app(config, themes={"textual-dark"}, binding_ids={"chat.stop"})
    with pytest.raises(ConfigError, match="unknown binding id 'chat.stop'"):
        validate_for_app(config, themes={"nord"}, binding_ids={"app.quit"})


def test_locations_follow_dgchat_home_or_platformdirs(tmp_path, monkeypatch):
    monkeypatch.setenv("DGCHAT_HOME", str(tmp_path / "h"))
    assert paths.config_path() == tmp_path / "h" / "config" / "config.toml"
    assert paths.db_path() == tmp_path / "h" / "data" / "chats.db"
    monkeypatch.delenv("DGCHAT_HOME")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xc"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xd"))
    assert paths.config_path() == tmp_path / "xc" / "dgchat" / "config.toml"
    assert paths.db_path() == tmp_path / "xd" / "dgchat" / "chats.db"


def test_model_resolution_order(tmp_path, monkeypatch):
    monkeypatch.setenv("DGCHAT_HOME", str(tmp_path))
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.toml").write_text('default_model = "/models/configured.gguf"\n')
    config = load_config()
    monkeypatch.delenv("DGCHAT_MODEL", raising=False)
    assert resolve_app_model("/x/arg.gguf", config) == Path("/x/arg.gguf")
    assert resolve_app_model(None, config) == Path("/models/configured.gguf")
    monkeypatch.setenv("DGCHAT_MODEL", "/env/model.gguf")
    assert resolve_app_model(None, config) == Path("/env/model.gguf")
    # the CLI's subcommands read the same setting
    from dgchat.commands.common import resolve_model_path

    monkeypatch.delenv("DGCHAT_MODEL")
    assert resolve_model_path(None) == Path("/models/configured.gguf")


def test_atomic_write_replaces_and_leaves_no_temp_files(tmp_path):
    target = tmp_path / "f.txt"
    paths.atomic_write_text(target, "one")
    paths.atomic_write_text(target, "two")
    assert target.read_text() == "two"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


# -- writing single keys (save_default_model, save_server, save_precise) ------------------------------


def test_save_server_sets_replaces_and_removes_the_table_keeping_the_rest(tmp_path):
    from dgchat.config import save_server

    path = _write(tmp_path, '# mine\ntheme = "dark"\n\n[server]  # the box\nurl = "http://old:1"\napi_key = "old"\n'
                            '# about the box\n\n[sampler]\nsteps = 8\n')
    save_server(path, "http://new:2", "k2")
    config = load_config(path)
    assert (config.server_url, config.server_api_key, config.sampler) == ("http://new:2", "k2", {"steps": 8})
    assert "# the box" in path.read_text() and "# about the box" in path.read_text()
    save_server(path, "http://other:3")  # a key meant for another server is never kept
    assert (load_config(path).server_url, load_config(path).server_api_key) == ("http://other:3", None)
    save_server(path, None)
    text = path.read_text()
    assert "[server]" not in text and "url" not in text and "# about the box" in text
    assert load_config(path).sampler == {"steps": 8}


def test_save_server_appends_the_table_to_a_new_file(tmp_path):
    from dgchat.config import CONFIG_HEADER, save_server

    path = tmp_path / "config.toml"
    save_server(path, "http://box:8765", "secret")
    assert path.read_text() == CONFIG_HEADER + '\n[server]\nurl = "http://box:8765"\napi_key = "secret"\n'
    assert path.stat().st_mode & 0o777 == 0o600  # it may hold a key


def test_a_key_written_another_way_is_refused_and_the_file_kept(tmp_path):
    from dgchat.config import save_precise, save_server

    text = 'server.url = "http://a:1"\nengine.precise = true\n'
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError, match=r"declare \('server',\) twice .*, so \[server\] was not written"):
        save_server(path, "http://b:2")
    with pytest.raises(ConfigError, match=r", so \[engine\] precise was not written"):
        save_precise(path, False)
    assert path.read_text() == text
