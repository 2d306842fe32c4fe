"""Package data: the bundled default model and the model catalog."""

from __future__ import annotations

from pathlib import Path

ASSETS_DIR = Path(__file__).resolve().parent
BUNDLED_MODEL_NAME = "dgchat-tiny-plays.gguf"


def bundled_model_path() -> Path | None:
    """The model shipped with dgchat, or None when this installation has none."""
    path = ASSETS_DIR / BUNDLED_MODEL_NAME
    return path if path.exists() else None
