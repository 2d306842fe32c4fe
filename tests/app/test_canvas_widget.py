"""The live canvas: its layout (spans per cell state, wrapping, control characters), and on real
generations in the app that it never draws a special token's text nor anything after the end."""

from __future__ import annotations

import dataclasses
import re
import time

import numpy as np
import pytest
from dgchat.app.widgets.canvas import (
    PLACEHOLDER,
    LiveCanvas,
    _wrap,
    chop_cells,
    progress_text,
)
from dgchat.assets import bundled_model_path
from dgchat.model_backend.canvas import CanvasSnapshot, Cell
from dgchat.model_backend.canvas_view import VISIBLE_CONTROLS
from dgchat.model_backend.events import StepEvent, StepTiming
from fixtures.app_harness import (
    SIZE,
    make_app,
    setup_home,
    type_text,
    wait_idle,
    wait_model,
)
from rich.style import Style

S = {k: Style() for k in (Cell.MASKED, Cell.NEW, Cell.DONE, Cell.FIXED, -1)}


class FakeEngine:
    pieces = {1: " the", 2: " gate", 3: "\x13", 4: "é\n", 5: "東京", 6: " king", 7: "<pad>", 8: "<eot>", 9: "<mask>"}
    special = {7, 8, 9}
    ends = {8}

    def piece(self, token: int) -> str:
        return self.pieces[token]

    def is_special(self, token: int) -> bool:
        return token in self.special

    def is_end(self, token: int) -> bool:
        return token in self.ends


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


def test_special_tokens_take_no_room_and_the_end_token_ends_the_canvas():
    canvas = LiveCanvas(FakeEngine())
    canvas.event = event([1, 7, 9, 2, 8, 6, 6], [Cell.DONE, Cell.NEW, Cell.MASKED, Cell.NEW, Cell.DONE, Cell.DONE,
                                                 Cell.MASKED], answer=[7, 5])
    assert canvas._spans() == [("東京", 4, Cell.DONE), (" the", 4, Cell.DONE), (PLACEHOLDER, 1, Cell.MASKED),
                               (" gate", 5, Cell.NEW)]
    # room is reserved only for the undecided positions before the end token
    canvas.event = event([1] * 10 + [8] + [1] * 30, [Cell.MASKED] * 10 + [Cell.DONE] + [Cell.MASKED] * 30)
    assert canvas._room_to_grow(20) == 10 * 3 // 20 + 1
    # uniform-state: a special draft is an undecided position like any other
    canvas.event = event([7, 1], [Cell.MASKED, Cell.MASKED], uniform=True)
    assert canvas._spans() == [(PLACEHOLDER, 1, Cell.MASKED), (" the", 4, -1)]


# -- the live canvas in the app, on real generations ----------------------------------------------


class LockstepEngine:
    """Wraps a real engine: after each step it waits until the live canvas has drawn that step, so
    every step is drawn once; `inject` may rewrite each StepEvent first."""

    def __init__(self, engine, drawn, inject=None) -> None:
        self._engine = engine
        self.drawn = drawn
        self.inject = inject
        self.steps: list[StepEvent] = []

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def generate(self, prompt, params=None, *, cancel=None, **kwargs):
        for ev in self._engine.generate(prompt, params, cancel=cancel, **kwargs):
            if isinstance(ev, StepEvent):
                if self.inject is not None:
                    ev = self.inject(ev)
                self.steps.append(ev)
                yield ev
                deadline = time.monotonic() + 10.0
                while not self.drawn(ev) and time.monotonic() < deadline and not (cancel and cancel.is_set()):
                    time.sleep(0.005)
            else:
                yield ev


def special_pieces(engine) -> list[str]:
    pieces = [engine.piece(t) for t in range(engine.model.n_vocab) if engine.is_special(t)]
    return [p for p in pieces if p.strip()]


def expected_text(engine, ev: StepEvent) -> str:
    """What the canvas must show for `ev`, written out independently of model_backend.canvas_view:
    decided text without special tokens, placeholders (uniform-state: non-special drafts) for
    undecided positions, nothing from the first decided end token on."""
    out = []
    cells = [(int(t), Cell.DONE) for t in ev.answer_tokens]
    cells += [(int(t), int(s)) for t, s in zip(ev.canvas.tokens, ev.canvas.state)]
    for token, state in cells:
        decided = state != Cell.MASKED
        if decided and engine.is_end(token):
            break
        if not decided:
            out.append(engine.piece(token) if ev.uniform_state and not engine.is_special(token) else PLACEHOLDER)
        elif not engine.is_special(token):
            out.append(engine.piece(token))
    return "".join(out).translate(VISIBLE_CONTROLS)


def record_frames(monkeypatch) -> list[tuple[StepEvent, list[str]]]:
    """Every frame a LiveCanvas builds: its event and its canvas lines (the progress line left out).
    The frame budget is lifted (a slow layout on a busy machine would otherwise skip steps)."""
    from dgchat.app import live_view

    monkeypatch.setattr(live_view, "UI_CPU_BUDGET", 1.0)
    frames: list[tuple[StepEvent, list[str]]] = []
    build = LiveCanvas._rebuild

    def recording(self) -> bool:
        before = self.frames
        grew = build(self)
        if self.frames != before and self.event is not None:
            frames.append((self.event, [strip.text for strip in self._strips[1:]]))
        return grew

    monkeypatch.setattr(LiveCanvas, "_rebuild", recording)
    return frames


def drawn_by(app):
    def drawn(ev: StepEvent) -> bool:
        canvas = app.chat_screen.canvas
        return canvas is not None and canvas.event is ev and (canvas._built_for or (None,))[0] == id(ev)
    return drawn


def check_frames(engine, frames, steps) -> None:
    assert frames, "no frame drawn"
    drawn_steps = {ev.step for ev, _ in frames}
    assert drawn_steps == {ev.step for ev in steps}  # lockstep: every step was drawn
    specials = special_pieces(engine)
    squeeze = lambda s: re.sub(r"\s", "", s)  # noqa: E731 (wrapping moves spaces and newlines)
    for ev, lines in frames:
        shown = "".join(lines)
        for piece in specials:
            assert piece not in shown, f"step {ev.step} draws {piece!r}: {shown!r}"
        assert squeeze(shown) == squeeze(expected_text(engine, ev)), f"step {ev.step}"


def decided_specials(engine, ev: StepEvent) -> tuple[bool, bool]:
    """(a special token is decided, a decided end token has positions after it) in `ev`."""
    decided = ev.canvas.tokens[ev.canvas.state != Cell.MASKED].tolist()
    ends = [i for i, (t, s) in enumerate(zip(ev.canvas.tokens.tolist(), ev.canvas.state.tolist()))
            if s != Cell.MASKED and engine.is_end(t)]
    return any(engine.is_special(t) for t in decided), bool(ends) and ends[0] < ev.canvas.tokens.size - 1


@pytest.mark.skipif(bundled_model_path() is None, reason="this installation has no bundled model")
async def test_bundled_model_canvas_never_draws_special_tokens(tmp_path, monkeypatch):
    """The bundled model (a trained DiffusionGemma with a real chat template) decides <pad> and
    <end_of_turn> mid-answer: at no drawn step is their text on the canvas, nor anything after the end."""
    setup_home(tmp_path, monkeypatch, config="[sampler]\nseed = 0\n")
    frames = record_frames(monkeypatch)
    app = make_app(bundled_model_path())
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot, timeout=60)
        engine = app.session.engine
        assert {"<pad>", "<end_of_turn>", "<start_of_turn>", "<mask>", "<bos>", "<eos>"} <= set(special_pieces(engine))
        app.session.engine = lockstep = LockstepEngine(engine, drawn_by(app))
        await type_text(pilot, "Halt, traveller! Who goes there?")
        await pilot.press("enter")
        await wait_idle(pilot, timeout=120)
        # (checked while the app still holds the model: its vocabulary goes with it at exit)
        seen = [decided_specials(engine, ev) for ev, _ in frames]
        assert any(special for special, _ in seen), "the model decided no special token: the test proves nothing"
        assert any(cut for _, cut in seen), "no decided end token before the canvas's end: the cut is untested"
        check_frames(engine, frames, lockstep.steps)


async def test_injected_special_tokens_are_never_drawn(tmp_path, monkeypatch, llada_gguf):
    """Masked diffusion on the fixture model, with special tokens forced into decided positions and
    an end token decided mid-canvas from step 3 on: every drawn step shows neither, nor anything
    after the end token (decided or not)."""
    setup_home(tmp_path, monkeypatch)
    frames = record_frames(monkeypatch)
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        engine = app.session.engine
        model = engine.model
        plain = [model.bos, next(t for t in range(model.n_vocab) if engine.piece(t) == "<|im_start|>"),
                 engine.info.mask_token]
        assert not any(engine.is_end(t) for t in plain) and all(engine.is_special(t) for t in plain)

        def inject(ev: StepEvent) -> StepEvent:
            tokens, state = ev.canvas.tokens.copy(), ev.canvas.state.copy()
            for i, token in zip((1, 4, 7), plain):
                tokens[i], state[i] = token, Cell.DONE
            if ev.canvas_step >= 3:
                tokens[16], state[16] = model.eot, Cell.NEW
            canvas = CanvasSnapshot(tokens, state, ev.canvas.confidence)
            return dataclasses.replace(ev, canvas=canvas)

        app.session.engine = lockstep = LockstepEngine(engine, drawn_by(app), inject)
        await type_text(pilot, "hello")
        await pilot.press("enter")
        await wait_idle(pilot)
        assert len(lockstep.steps) == 8
        assert all(decided_specials(engine, ev) == (True, ev.canvas_step >= 3) for ev, _ in frames)
        check_frames(engine, frames, lockstep.steps)
