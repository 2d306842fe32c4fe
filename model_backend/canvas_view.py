"""What a live canvas shows at each position: the one rule the app's LiveCanvas and
`dgchat generate --visual` share (each draws the result its own way).

- A decided position shows its token's text (control characters made visible: VISIBLE_CONTROLS);
  an undecided one a dim dot, or on uniform-state canvases (DiffusionGemma) its current draft
  token, dimmed.
- Special tokens (pad, bos, mask, end of turn, anything the vocabulary marks control) never show
  their text. A decided one shows nothing: the answer's text will not contain it (llama.cpp's
  detokenizer leaves control tokens out), so the canvas reads as the answer will. A special draft
  token on a uniform-state canvas is still undecided: it shows the dot.
- The answer ends at the first decided end token: nothing at or after it is shown.

So the decided text at the start of what is shown is the answer as it would be kept if the
generation stopped now: the decided prefix (model_backend.canvas.decided_length), cut at its
first end token, without special tokens.
"""

from __future__ import annotations

from typing import Protocol

from dgchat.model_backend.canvas import Cell
from dgchat.model_backend.events import StepEvent

# Model text is never written raw to a terminal or a recording: an escape sequence would drive the
# terminal, a bidi override would reorder what is shown. The rule (control pictures, ␛ for ESC,
# U+FFFD for C1 controls and bidi overrides, direction marks dropped) is dgchat.terminal_text's, the
# one every place that shows outside text uses; re-exported here for the canvas renderers.
from dgchat.terminal_text import VISIBLE_CONTROLS, terminal_safe  # noqa: F401

PLACEHOLDER = "·"  # an undecided position
HOLE = -1  # the token of a shown placeholder
DRAFT = -1  # the style key of an undecided position showing its draft token (uniform-state)


class TokenKinds(Protocol):
    """Per-token lookups, cheap after the first call for a token (the engine caches them)."""

    def is_special(self, token: int) -> bool: ...
    def is_end(self, token: int) -> bool: ...


class TokenText(TokenKinds, Protocol):
    """What drawing a canvas needs of a vocabulary: an engine, or a recording's own
    (recording.history.RecordedVocab)."""

    def piece(self, token: int) -> str: ...


def shown_cells(event: StepEvent, kinds: TokenKinds) -> list[tuple[int, int]]:
    """What to draw for `event`, in order: (token, key) per shown position.

    `key` is the position's Cell state (tokens of the answer's earlier canvases are DONE) or DRAFT;
    `token` is HOLE where the placeholder is drawn (key Cell.MASKED). Positions not shown at all
    (decided special tokens, everything from the first decided end token on) have no entry."""
    is_special = kinds.is_special
    shown: list[tuple[int, int]] = []
    for token in event.answer_tokens.tolist():
        if is_special(token):
            if kinds.is_end(token):
                return shown
            continue
        shown.append((token, Cell.DONE))
    uniform = event.uniform_state
    masked = Cell.MASKED
    for token, state in zip(event.canvas.tokens.tolist(), event.canvas.state.tolist()):
        if state == masked:
            # masked diffusion: the token is the mask id; uniform-state: a draft that may still change
            shown.append((token, DRAFT) if uniform and not is_special(token) else (HOLE, masked))
        elif not is_special(token):
            shown.append((token, state))
        elif kinds.is_end(token):
            break
    return shown
