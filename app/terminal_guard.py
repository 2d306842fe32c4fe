"""The app's last line of defence against outside text driving the terminal.

Every widget that shows outside text (answers, prompts of stored chats, chat titles, model names,
server errors, card fields) passes it through dgchat.terminal_text's rule first, so ESC shows as
␛ and a bidi override as U+FFFD. Widgets that lay out and edit text themselves (Textual's
TextArea and Input: the prompt box, the edit dialog, the drafting editor, the card editor) cannot
show a picture there without their cursor arithmetic going wrong, and a widget added later might
forget the rule. So every line the app writes to the terminal also passes through this guard: the
characters the rule is about are dropped from the text of each line as it becomes terminal output.

Dropping is exact for the layout: every one of these characters is zero cells wide for Textual
(rich.cells.cell_len), so the line is as wide as the layout computed, only without the bytes a
terminal would act on. Textual's own escape sequences (cursor moves, colours, modes) are written
around the text, not inside it, and are untouched.

The hook is Textual's Strip.render, through which every line of every widget reaches the terminal
(the compositor's full and partial updates and inline mode). install() wraps it once per process.
"""

from __future__ import annotations

import re
from typing import Any

from rich.segment import Segment
from textual.strip import Strip

# C0 (newline and tab included: inside a rendered line they would move the cursor), DEL, C1, the
# bidi embeddings, overrides and isolates, and the direction marks: the characters
# dgchat.terminal_text's rule is about, all zero cells wide for Textual
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")

_installed = False


def clean_strip(strip: Strip) -> Strip:
    """`strip` without the characters above in its text segments (the same strip when it has none)."""
    if not _UNSAFE.search(strip.text):  # the usual case, one search over the line
        return strip
    segments = list(strip)
    if not any(control is None and _UNSAFE.search(text) for text, _, control in segments):
        return strip
    return Strip([Segment(_UNSAFE.sub("", text), style, control) if control is None else Segment(text, style, control)
                  for text, style, control in segments], strip.cell_length)


def install() -> None:
    """Route every rendered line through clean_strip (idempotent)."""
    global _installed
    if _installed:
        return
    original = Strip.render

    def render(self: Strip, console: Any) -> str:
        if getattr(self, "_render_cache", None) is not None:
            return original(self, console)  # rendered (and cleaned) before
        cleaned = clean_strip(self)
        text = original(cleaned, console)
        if cleaned is not self:
            try:
                self._render_cache = text  # keep Textual's per-strip cache working for this strip
            except AttributeError:
                pass
        return text

    Strip.render = render  # type: ignore[method-assign]
    _installed = True
