"""The live canvas's own layout: spans per cell state, wrapping, control characters."""

from __future__ import annotations

import numpy as np
from rich.style import Style

from dgchat.app.widgets.canvas import PLACEHOLDER, LiveCanvas, _wrap, chop_cells, progress_text
from dgchat.model_backend.canvas import CanvasSnapshot, Cell
from dgchat.model_backend.events import StepEvent, StepTiming

S = {k: Style() for k in (Cell.MASKED, Cell.NEW, Cell.DONE, Cell.FIXED, -1)}


class FakeEngine:
    pieces = {1: " the", 2: " gate", 3: "\x13", 4: "é\n", 5: "東京", 6: " king"}

    def piece(self, token: int) -> str:
        return self.pieces[token]


def event(tokens, states, answer=(), uniform=False, step=3) -> StepEvent:
    tokens = np.array(tokens, np.int32)
    return StepEvent(step=step, total_steps=8, canvas_index=1 if answer else 0, canvas_step=step,
                     canvas=CanvasSnapshot(tokens, np.array(states, np.int8), np.zeros(len(tokens), np.float32)),
                     answer_tokens=np.array(answer, np.int32), committed=int(sum(s != Cell.MASKED for s in states)),
                     canvas_length=len(tokens), timing=StepTiming(1, 1), elapsed_s=2.0, uniform_state=uniform)


def lines(spans, width):
    return [strip.text for strip in _wrap(spans, S, width, Style())]


def test_spans_follow_cell_states():
    canvas = LiveCanvas(FakeEngine())
    canvas.event = event([1, 2, 6, 6], [Cell.DONE, Cell.NEW, Cell.MASKED, Cell.FIXED], answer=[5])
    assert canvas._spans() == [
        ("東京", 4, Cell.DONE), (" the", 4, Cell.DONE), (" gate", 5, Cell.NEW), (PLACEHOLDER, 1, Cell.MASKED),
        (" king", 5, Cell.FIXED)]
    # uniform-state models: an undecided cell shows its (dimmed) draft token
    canvas.event = event([1, 2], [Cell.MASKED, Cell.DONE], uniform=True)
    assert canvas._spans() == [(" the", 4, -1), (" gate", 5, Cell.DONE)]


def test_control_characters_never_reach_the_terminal():
    canvas = LiveCanvas(FakeEngine())
    assert canvas._piece(3) == ("\u2413", 1)
    assert canvas._piece(4) == ("é\n", 1)


def test_wrapping_breaks_before_words_folds_long_tokens_and_keeps_newlines():
    spans = [(" the", 4, Cell.DONE), (" gate", 5, Cell.DONE), (" king", 5, Cell.NEW)]
    assert lines(spans, 10) == [" the gate ", "king      "]
    assert lines([("abcdefghijkl", 12, Cell.DONE)], 5) == ["abcde", "fghij", "kl   "]
    assert lines([("a\nb", 2, Cell.DONE), ("c", 1, Cell.DONE)], 4) == ["a   ", "bc  "]
    assert lines([("東京東京", 8, Cell.DONE)], 5) == ["東京 ", "東京 "]  # a wide character never splits
    assert lines([], 3) == ["   "]
    assert chop_cells("東京", 3) == ("東", "京")


def test_room_is_reserved_for_undecided_positions():
    canvas = LiveCanvas(FakeEngine())
    canvas.event = event([1] * 40, [Cell.MASKED] * 40)
    # nothing decided yet: assume ~4 cells a token, i.e. 3 more per placeholder
    assert canvas._room_to_grow(20) == 40 * 3 // 20 + 1
    canvas.event = event([1] * 40, [Cell.MASKED] * 40, uniform=True)
    assert canvas._room_to_grow(20) == 0  # drafts already take their room


def test_progress_line():
    assert progress_text(event([1, 2], [Cell.DONE, Cell.MASKED], answer=[5, 6])) == (
        "step 3/8 · canvas 2 · 1/2 tokens · 1.5 tok/s")
    assert progress_text(event([1], [Cell.DONE]), stopping=True).endswith("· stopping…")
