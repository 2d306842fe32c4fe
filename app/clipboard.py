"""Copying text: OSC 52 through the terminal, else a system clipboard tool, else a file.

OSC 52 cannot be confirmed (terminals silently drop it), so "auto" sends it where it is known to
work and falls back where it is known not to: macOS Terminal, the Linux console, `screen`, dumb
terminals and headless runs. The fallback uses pbcopy / wl-copy / xclip / xsel when present, and
otherwise writes the text to a file under the data dir; the notice says which happened.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from dgchat.app import paths

_TOOLS = (
    ("pbcopy", ["pbcopy"]),
    ("wl-copy", ["wl-copy"]),
    ("xclip", ["xclip", "-selection", "clipboard"]),
    ("xsel", ["xsel", "--clipboard", "--input"]),
)


@dataclass(frozen=True)
class CopyResult:
    method: str  # "osc52" | tool name | "file"
    notice: str
    path: Path | None = None


def terminal_supports_osc52(environ: dict[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    term = env.get("TERM", "")
    if env.get("TERM_PROGRAM") == "Apple_Terminal":
        return False
    if term in ("", "dumb", "linux") or (term.startswith("screen") and "TMUX" not in env):
        return False
    return True


def _system_tool(text: str, environ: dict[str, str]) -> str | None:
    for name, argv in _TOOLS:
        if name in ("wl-copy",) and not environ.get("WAYLAND_DISPLAY"):
            continue
        if name in ("xclip", "xsel") and not environ.get("DISPLAY"):
            continue
        if shutil.which(argv[0]) is None:
            continue
        try:
            subprocess.run(argv, input=text.encode("utf-8"), check=True, timeout=3,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError):
            continue
        return name
    return None


def copy_text(app, text: str, mode: str = "auto", environ: dict[str, str] | None = None) -> CopyResult:
    """Copy `text` for the user; `app` is the Textual app (for OSC 52)."""
    env = dict(os.environ if environ is None else environ)
    chars = f"{len(text)} characters"
    osc52_ok = mode == "osc52" or (mode == "auto" and not app.is_headless and terminal_supports_osc52(env))
    if osc52_ok:
        app.copy_to_clipboard(text)
        return CopyResult("osc52", f"Copied {chars} to the clipboard.")
    if mode == "auto":
        tool = _system_tool(text, env)
        if tool is not None:
            return CopyResult(tool, f"Copied {chars} with {tool} (this terminal cannot take OSC 52 clipboard data).")
    path = paths.clipboard_fallback_path()
    paths.atomic_write_text(path, text)
    app.copy_to_clipboard(text)  # harmless where unsupported; keeps Textual's own clipboard in sync
    why = "clipboard = \"file\" in the config" if mode == "file" else "this terminal cannot take OSC 52 clipboard data"
    return CopyResult("file", f"Saved {chars} to {path} ({why}).", path)
