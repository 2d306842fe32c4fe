"""Conversion to GGUF, quantization, and the default model's training recipe."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dgchat.convert.api import ConvertResult, convert

__all__ = ["ConvertResult", "convert"]


def __getattr__(name: str):
    # `convert` pulls in numpy and gguf; keep `import dgchat.convert` itself cheap
    if name in __all__:
        from dgchat.convert import api  # lazily: numpy and gguf only when used

        return getattr(api, name)
    raise AttributeError(name)
