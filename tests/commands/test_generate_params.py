"""`dgchat generate --json` says where each setting came from (model_backend/param_resolution):
a flag, the config, the model file, the family's defaults; `--precise` is one of them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from dgchat.assets import bundled_model_path

BUNDLED = bundled_model_path()
pytestmark = pytest.mark.skipif(BUNDLED is None, reason="this installation has no bundled model")


def _generate(*args: str, config: str | None = None, tmp_path: Path) -> dict:
    env = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "config"))
    if config is not None:
        (tmp_path / "config" / "dgchat").mkdir(parents=True, exist_ok=True)
        (tmp_path / "config" / "dgchat" / "config.toml").write_text(config)
    res = subprocess.run([sys.executable, "-m", "dgchat", "generate", "-m", str(BUNDLED), "-p", "Who goes there?",
                          "--max-tokens", "16", "--json", *args], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_values_and_sources_of_a_flag_the_config_and_the_model_file(tmp_path: Path) -> None:
    out = _generate("--steps", "7", config="[engine]\nprecise = true\n", tmp_path=tmp_path)
    table = out["params"]
    assert table["steps"] == {"value": 7, "source": "flag"}
    assert table["max_tokens"] == {"value": 16, "source": "flag"}
    assert table["precise"] == {"value": True, "source": "config"}
    # the bundled model's file names its canvas and pad bias (dgchat.diffusion.*); the family its algorithm
    assert table["gen_length"]["source"] == "model file" and table["pad_bias"]["source"] == "model file"
    assert table["algorithm"] == {"value": "entropy", "source": "family default"}
    assert table["cache"] == {"value": "none", "source": "derived"}
    assert table["seed"] == {"value": 0, "source": "default"}
    # the values are the ones the run used (the flat `settings` object)
    assert all(out["settings"][name] == row["value"] for name, row in table.items() if name not in ("precise",
                                                                                                  "logit_bias"))
    assert out["stats"]["steps"] > 0


def test_the_flag_wins_over_the_config(tmp_path: Path) -> None:
    out = _generate("--no-precise", config="[engine]\nprecise = true\n", tmp_path=tmp_path)
    assert out["params"]["precise"] == {"value": False, "source": "flag"}
    out = _generate("--precise", "--temperature", "0.5", tmp_path=tmp_path)
    table = out["params"]
    assert table["precise"] == {"value": True, "source": "flag"}
    assert table["temperature"] == {"value": 0.5, "source": "flag"}
    plain = _generate(config="", tmp_path=tmp_path)["params"]
    assert plain["precise"] == {"value": False, "source": "default"}


def test_a_bad_engine_table_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "config" / "dgchat").mkdir(parents=True)
    (tmp_path / "config" / "dgchat" / "config.toml").write_text("[engine]\nprecise = 1\n")
    env = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "config"))
    res = subprocess.run([sys.executable, "-m", "dgchat", "generate", "-m", str(BUNDLED), "-p", "x", "--json"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode != 0 and "[engine] precise must be true or false (got 1)" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
