"""Where the model manager keeps its files. Everything hangs off dgchat.paths (platformdirs, or
one folder under $DGCHAT_HOME), so the app, the CLI and the tests agree on one layout:

    <data dir>/models/                  downloaded / converted models (dgchat owns these files)
    <data dir>/models/.partial/         resumable downloads: <file>.part + <file>.part.json
    <data dir>/models.json              the registry of installed models
    <config dir>/hardware.toml          the user's corrections to the detected hardware

$DGCHAT_MODELS_DIR moves the models folder (e.g. to a bigger disk).
"""

from __future__ import annotations

import os
from pathlib import Path

from dgchat import paths as app_paths

PARTIAL_DIRNAME = ".partial"


def models_dir() -> Path:
    env = os.environ.get("DGCHAT_MODELS_DIR")
    if env:
        return Path(env).expanduser()
    return app_paths.data_dir() / "models"


def partial_dir(models: Path | None = None) -> Path:
    return (models if models is not None else models_dir()) / PARTIAL_DIRNAME


def registry_path() -> Path:
    return app_paths.data_dir() / "models.json"


def hardware_overrides_path() -> Path:
    return app_paths.config_dir() / "hardware.toml"


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache as huggingface_hub itself resolves it (HF_HUB_CACHE, HF_HOME, XDG)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def existing_parent(path: Path) -> Path:
    """`path` or its nearest existing ancestor (for free-space checks before a folder exists)."""
    path = Path(path).expanduser().absolute()
    while not path.exists() and path.parent != path:
        path = path.parent
    return path
