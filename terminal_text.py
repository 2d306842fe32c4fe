"""Text from outside at a terminal: the one rule for model output, server error bodies, model
names, stored chats and card files wherever they are written to a terminal (docs/SECURITY.md,
"Text from outside at the terminal").

A terminal interprets what it is sent: ESC starts a sequence that can set the window title, clear
the screen, move the cursor or (OSC 52) write the clipboard; C1 controls do the same in 8-bit form;
bidi overrides reorder what is shown, so `exe.txt` can read as `txt.exe`. Text that came from
outside is therefore never written raw:

- C0 control characters are drawn as control pictures (ESC as ␛, so no sequence survives, BEL as
  ␇, CR as ␍), newlines stay newlines, tabs become spaces (or stay tabs where the widget lays them
  out: `keep_tabs`); DEL is ␡;
- C1 controls and the bidi embeddings, overrides and isolates become U+FFFD (visible);
- the invisible direction marks (LRM, RLM, ALM) are dropped.

Exact text is kept where no terminal is involved: the chat database, `--json`, and standard
output when it is not a terminal (`for_stream`).

This module imports nothing heavy: `dgchat`'s error printer uses it on every error.
"""

from __future__ import annotations

from typing import TextIO

# str.translate table of the rule (model_backend.canvas_view re-exports it for the live canvas)
VISIBLE_CONTROLS: dict[int, int | str | None] = (
    {c: 0x2400 + c for c in range(32) if c not in (9, 10)} | {9: " ", 127: "\u2421"}
    | {c: 0xFFFD for c in range(0x80, 0xA0)}
    | {c: 0xFFFD for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))}
    | {0x200E: None, 0x200F: None, 0x061C: None}
)
# the same with tabs left alone: a Markdown view or a text widget lays a tab out itself (a tab in a
# code block is indentation, and a tab cannot drive a terminal)
_VISIBLE_KEEP_TABS: dict[int, int | str | None] = {k: v for k, v in VISIBLE_CONTROLS.items() if k != 9}

# An error line quotes what it was given (a server's error body can be 100 KB, multi-line, with
# escape sequences): at most this many characters of the message are printed.
MESSAGE_LIMIT = 1000


def terminal_safe(text: str, *, keep_tabs: bool = False) -> str:
    """`text` as it may be written to a terminal or a .cast file (see VISIBLE_CONTROLS)."""
    return text.translate(_VISIBLE_KEEP_TABS if keep_tabs else VISIBLE_CONTROLS)


def safe_document(text: str) -> str:
    """Multi-line text from outside (an answer, a prompt of a stored chat) for a view that lays it
    out: CRLF line ends read as newlines (a lone CR, which would move the cursor back over the
    line, shows as ␍), tabs are kept, everything else follows terminal_safe."""
    return terminal_safe(text.replace("\r\n", "\n"), keep_tabs=True)


def safe_message(text: object, limit: int = MESSAGE_LIMIT) -> str:
    """A message that may span lines (an error dialog's body) quoting outside text: safe_document,
    at most `limit` characters ("..." marks a cut)."""
    text = str(text)
    if len(text) > limit:
        text = text[: max(0, limit - 3)] + "..."
    return safe_document(text)


def one_line(text: object, limit: int = MESSAGE_LIMIT) -> str:
    """`text` as one line of a message: sanitised (terminal_safe), line breaks and runs of white
    space as one space, at most `limit` characters ("..." marks a cut)."""
    text = str(text)
    # bound the work on a huge message before anything else (whitespace runs only shrink it)
    if len(text) > 8 * limit:
        text = text[: 8 * limit]
    text = " ".join(terminal_safe(text.replace("\r\n", "\n").replace("\r", "\n")).split())
    if len(text) > limit:
        text = text[: max(0, limit - 3)].rstrip() + "..."
    return text


def for_stream(text: str, stream: TextIO) -> str:
    """`text` as written to `stream`: sanitised (safe_document) when it is a terminal, exact
    otherwise (a pipe or a file gets what the model wrote, byte for byte)."""
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):  # a closed or stream-like object without a terminal
        tty = False
    return safe_document(text) if tty else text


def cli_line(kind: str | None, message: object, stream: TextIO | None = None) -> None:
    """Write `dgchat: KIND: message` as one line (one_line: sanitised, bounded) to standard
    error: the one printer of the command line's errors and warnings."""
    import sys

    stream = stream if stream is not None else sys.stderr
    prefix = f"dgchat: {kind}: " if kind else "dgchat: "
    stream.write(prefix + one_line(message) + "\n")
