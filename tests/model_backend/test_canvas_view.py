"""What a live canvas shows at each position (model_backend.canvas_view): the one rule the app's
LiveCanvas and `dgchat generate --visual` draw with. Special tokens never show their text, nothing
is shown from the answer's first decided end token on, undecided positions are placeholders."""

from __future__ import annotations

import numpy as np
import pytest
from dgchat.model_backend.canvas import CanvasSnapshot, Cell, decided_length
from dgchat.model_backend.canvas_view import DRAFT, HOLE, PLACEHOLDER, shown_cells
from dgchat.model_backend.events import StepEvent, StepTiming
from dgchat.recording.frame_text import canvas_text

M, N, D, F = Cell.MASKED, Cell.NEW, Cell.DONE, Cell.FIXED
THE, GATE, KING, ESC = 1, 2, 3, 4
PAD, EOT, MASK, BOS = 7, 8, 9, 10


class Vocab:
    pieces = {THE: " the", GATE: " gate", KING: " king", ESC: "\x1b[2J", PAD: "<pad>", EOT: "<eot>", MASK: "<mask>",
              BOS: "<bos>"}
    special = {PAD, EOT, MASK, BOS}
    ends = {EOT}

    def piece(self, token: int) -> str:
        return self.pieces[token]

    def is_special(self, token: int) -> bool:
        return token in self.special

    def is_end(self, token: int) -> bool:
        return token in self.ends


def event(tokens, states, answer=(), uniform=False) -> StepEvent:
    tokens = np.array(tokens, np.int32)
    states = np.array(states, np.int8)
    return StepEvent(step=1, total_steps=4, canvas_index=0, canvas_step=1,
                     canvas=CanvasSnapshot(tokens, states, np.zeros(tokens.size, np.float32)),
                     answer_tokens=np.array(answer, np.int32), committed=int((states != M).sum()),
                     canvas_length=int(tokens.size), timing=StepTiming(1, 1), elapsed_s=1.0, uniform_state=uniform)


def test_decided_special_tokens_show_nothing_and_undecided_positions_are_placeholders():
    ev = event([THE, PAD, MASK, GATE, BOS, PAD], [D, N, M, D, D, N])
    assert shown_cells(ev, Vocab()) == [(THE, D), (HOLE, M), (GATE, D)]


def test_nothing_is_shown_from_the_first_decided_end_token_on():
    # undecided positions before the end stay placeholders; after it nothing, decided or not
    ev = event([MASK, THE, EOT, KING, MASK, EOT, GATE], [M, D, N, D, M, D, D])
    assert shown_cells(ev, Vocab()) == [(HOLE, M), (THE, D)]
    # an end token given by the caller (a fixed template cell) ends it too
    assert shown_cells(event([THE, EOT, KING], [F, F, D]), Vocab()) == [(THE, F)]


def test_answer_tokens_of_earlier_canvases_follow_the_same_rule():
    ev = event([KING, MASK], [N, M], answer=[BOS, THE, PAD, GATE])
    assert shown_cells(ev, Vocab()) == [(THE, D), (GATE, D), (KING, N), (HOLE, M)]
    assert shown_cells(event([KING], [D], answer=[THE, EOT, GATE]), Vocab()) == [(THE, D)]


def test_uniform_state_drafts_show_dimmed_but_never_a_special_draft():
    # an undecided draft end token does not end anything: it may still change
    ev = event([THE, PAD, EOT, GATE, KING, EOT, PAD], [D, M, M, M, N, D, M], uniform=True)
    assert shown_cells(ev, Vocab()) == [(THE, D), (HOLE, M), (HOLE, M), (GATE, DRAFT), (KING, N)]


@pytest.mark.parametrize("seed", range(40))
def test_decided_text_at_the_start_is_the_answer_kept_if_stopped_now(seed):
    """What the canvas starts with is what the app keeps when the user stops now: the decided prefix
    (canvas.decided_length) up to its first end token, without special tokens."""
    rng = np.random.default_rng(seed)
    tokens = rng.choice([THE, GATE, KING, PAD, EOT, BOS], size=12, p=[0.3, 0.25, 0.25, 0.1, 0.05, 0.05])
    states = rng.choice([M, N, D], size=12, p=[0.3, 0.3, 0.4])
    ev = event(tokens, states)
    prefix = tokens[: decided_length(ev.canvas.state)].tolist()
    kept = prefix[: prefix.index(EOT)] if EOT in prefix else prefix
    kept = [t for t in kept if t not in Vocab.special]
    shown = shown_cells(ev, Vocab())
    leading = []
    for token, key in shown:
        if token == HOLE:
            break
        leading.append(token)
    assert leading == kept
    assert not any(t in Vocab.special for t, _ in shown)
    # and nothing is shown from the first decided end token on
    decided_ends = [i for i, (t, s) in enumerate(zip(tokens, states)) if t == EOT and s != M]
    if decided_ends:
        assert len(shown) <= decided_ends[0]


def test_cli_canvas_uses_the_rule_and_keeps_escape_sequences_off_the_terminal():
    ev = event([THE, ESC, PAD, MASK, GATE, EOT, KING], [D, D, N, M, N, D, M])
    text = canvas_text(Vocab(), ev)
    assert text.plain == " the\u241b[2J" + PLACEHOLDER + " gate"
    assert "\x1b" not in text.plain
    styles = {text.plain[span.start:span.end]: str(span.style) for span in text.spans}
    assert styles[PLACEHOLDER] == "dim italic"
    assert styles[" gate"] == "bold black on yellow"


def test_terminal_safe_shows_controls_and_defuses_bidi_overrides():
    from dgchat.model_backend.canvas_view import terminal_safe

    assert terminal_safe("a\tb\nc\x1b[31m\x07\x7f") == "a b\nc\u241b[31m\u2407\u2421"
    # C1 controls (a lone CSI \x9b starts a sequence on some terminals) and bidi overrides / isolates
    assert terminal_safe("x\x9b31m\x85y") == "x\ufffd31m\ufffdy"
    assert terminal_safe("\u202egnp.exe\u2066a\u2069") == "\ufffdgnp.exe\ufffda\ufffd"
    assert terminal_safe("a\u200eb\u200fc") == "abc"  # invisible direction marks dropped
    assert terminal_safe("東京 é ☃") == "東京 é ☃"
