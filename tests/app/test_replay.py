"""Replaying an answer's denoising in the app (p on a focused answer), and exporting it as an
asciicast (x): on real generations, the replayed frames are the steps the engine produced, every
one of them, whatever the live canvas managed to draw."""

from __future__ import annotations

import json
import re

import pytest
from dgchat.app.store import Store
from dgchat.app.widgets.message import MessageView, meta_line
from dgchat.app.widgets.replay import DEFAULT_PACE, REAL, ReplayView
from dgchat.assets import bundled_model_path
from dgchat.model_backend.events import StepEvent
from fixtures.app_harness import SIZE, make_app, setup_home, type_text, wait_for, wait_idle, wait_model
from fixtures.terminal_screen import TerminalScreen
from test_canvas_widget import expected_text

needs_bundled = pytest.mark.skipif(bundled_model_path() is None, reason="this installation has no bundled model")


class RecordingEngine:
    """A real engine that also keeps every StepEvent it yields (what a replay must show)."""

    def __init__(self, engine) -> None:
        self._engine = engine
        self.steps: list[StepEvent] = []

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def generate(self, prompt, params=None, **kwargs):
        for event in self._engine.generate(prompt, params, **kwargs):
            if isinstance(event, StepEvent):
                self.steps.append(event)
            yield event


def squeeze(text: str) -> str:
    return re.sub(r"\s", "", text)


def canvas_lines(replay: ReplayView) -> str:
    return "".join(strip.text for strip in replay.canvas._strips[1:])


async def answer(pilot, text: str) -> tuple[RecordingEngine, MessageView]:
    app = pilot.app
    engine = app.session.engine
    app.session.engine = recorder = RecordingEngine(engine)
    await type_text(pilot, text)
    await pilot.press("enter")
    await wait_idle(pilot, timeout=120)
    app.session.engine = engine
    screen = app.chat_screen
    view = [v for v in screen.query(MessageView) if v.message.role == "assistant"][-1]
    return recorder, view


@needs_bundled
async def test_replay_draws_every_recorded_step_of_the_bundled_model(tmp_path, monkeypatch):
    setup_home(tmp_path, monkeypatch, config="[sampler]\nseed = 0\n")
    app = make_app(bundled_model_path())
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot, timeout=60)
        engine = app.session.engine
        recorded, view = await answer(pilot, "Halt, traveller! Who goes there?")
        steps = recorded.steps
        assert len(steps) >= 24 and len({e.canvas_index for e in steps}) >= 2
        view.focus()
        await pilot.press("p")
        await wait_for(pilot, lambda: view.replay is not None, what="the replay")
        replay = view.replay
        assert app.focused is replay and not view.query_one(".message--body").display
        assert len(replay.steps) == len(steps)
        # scrub: every recorded step, one key press each, drawn as the live canvas drew it
        await pilot.press("home")
        for i, step in enumerate(steps):
            if i:
                await pilot.press("right")
            assert replay.paused and replay.index == i
            assert squeeze(canvas_lines(replay)) == squeeze(expected_text(engine, step)), f"step {step.step}"
            assert replay.canvas._strips[0].text.startswith(f"step {step.canvas_step}/{step.total_steps}")
            assert f"step {i + 1}/{len(steps)}" in str(replay.slider.render())
        await pilot.press("right")  # past the end: stays on the last step
        assert replay.index == len(steps) - 1
        # back, then play from the first step at the default pace: in order, to the end
        await pilot.press("left")
        assert replay.index == len(steps) - 2
        await pilot.press("home")
        replay.frames_shown.clear()
        await pilot.press("space")
        assert not replay.paused and replay.pace == DEFAULT_PACE
        await wait_for(pilot, lambda: replay.paused, timeout=len(steps) / DEFAULT_PACE + 10, what="the end")
        shown = replay.frames_shown
        assert shown == sorted(shown) and shown[-1] == len(steps) - 1
        # the pace keys: faster up to "real", slower down to 1 step a second
        for _ in range(10):
            await pilot.press("plus")
        assert replay.pace == REAL
        for _ in range(10):
            await pilot.press("minus")
        assert replay.pace == 1
        await pilot.press("escape")
        await wait_for(pilot, lambda: view.replay is None, what="the replay to close")
        assert view.query_one(".message--body").display and app.focused is view


async def test_export_a_recording_from_the_app_plays_into_the_answer(tmp_path, monkeypatch, llada_gguf):
    setup_home(tmp_path, monkeypatch)
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        recorded, view = await answer(pilot, "hello")
        view.focus()
        await pilot.press("x")
        await pilot.pause()
        from textual.widgets import Input

        target = tmp_path / "casts" / "answer.cast"
        app.screen.query_one(Input).value = str(target)
        await pilot.press("enter")
        await pilot.pause()
        lines = target.read_text(encoding="utf-8").splitlines()
        header = json.loads(lines[0])
        assert header["version"] == 2 and header["width"] > 20 and "hello" in header["title"]
        frames = [json.loads(line) for line in lines[1:]]
        steps = [f for f in frames if "step " in f[2]]
        assert len(steps) == len(recorded.steps) == 8
        # the default pace: 10 steps a second
        assert [round(f[0], 3) for f in steps] == [round(i / DEFAULT_PACE, 3) for i in range(8)]
        screen = TerminalScreen(header["width"], header["height"])
        for frame in frames:
            screen.feed(frame[2])
        assert squeeze("".join(screen.lines()[1:])) == squeeze(view.message.content)
        assert sorted(p.name for p in target.parent.iterdir()) == ["answer.cast"]


async def test_answers_without_a_recording_say_so(tmp_path, monkeypatch, llada_gguf):
    """An answer from a database before recordings (schema 3), and one whose recording was dropped
    by the per-chat bound: p explains instead of replaying."""
    home = setup_home(tmp_path, monkeypatch)
    db = home / "data" / "chats.db"
    db.parent.mkdir(parents=True)
    with Store(db, upgrade_to=3) as old:
        chat = old.create_chat("old chat")
        old.add_message(chat.id, "user", "hi")
        old.add_message(chat.id, "assistant", "an answer from before recordings")
    app = make_app(llada_gguf, chat=chat.id)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        notices: list[str] = []
        screen = app.chat_screen
        screen.notify = lambda message, **kw: notices.append(str(message))  # type: ignore[method-assign]
        old_view = [v for v in screen.query(MessageView) if v.message.role == "assistant"][0]
        old_view.focus()
        await pilot.press("p")
        await pilot.pause()
        assert old_view.replay is None and notices and notices[-1].startswith("No recording for this answer")
        _, view = await answer(pilot, "and now?")
        assert app.store.recording(view.message.id).data
        with app.store._tx() as conn:  # what the per-chat bound does to an old recording
            conn.execute("UPDATE recordings SET data = NULL WHERE message_id = ?", (view.message.id,))
        view.focus()
        await pilot.press("p")
        await pilot.pause()
        assert view.replay is None and "was dropped" in notices[-1]


@needs_bundled
async def test_the_replays_last_step_counts_what_the_answer_counts(tmp_path, monkeypatch):
    """Issue 43: the replay's last frame said `step 24/24 · 30/32 tokens` under an answer whose line
    said `16 tokens`: the canvas's decided positions, the end token and what follows it included.
    The replay names both: the answer's tokens (as the answer's line counts them) and the canvas's
    positions decided."""
    # a seed whose last step leaves some positions of the second canvas undecided (on the machines this
    # was written on): DiffusionGemma's answer takes their drafts, so they count as the answer's tokens
    setup_home(tmp_path, monkeypatch, config="[sampler]\nseed = 193275\n")
    app = make_app(bundled_model_path())
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot, timeout=60)
        recorded, view = await answer(pilot, "Halt, traveller! Who goes there?")
        tokens = view.message.meta["stats"]["tokens"]
        last = recorded.steps[-1]
        assert meta_line(view.message).startswith(f"{tokens} tokens")  # the answer's line
        view.focus()
        await pilot.press("p")
        await wait_for(pilot, lambda: view.replay is not None, what="the replay")
        replay = view.replay
        await pilot.press("end")
        head = replay.canvas._strips[0].text
        canvas = f" · canvas {last.canvas_index + 1}" if last.canvas_index else ""
        assert head.startswith(f"step {last.canvas_step}/{last.total_steps}{canvas} · {tokens} tokens · "
                               f"{last.committed}/{last.canvas_length} positions decided · "), head


def _event(earlier: list[int], tokens: list[int], states: list[int], *, uniform: bool = False) -> StepEvent:
    import numpy as np
    from dgchat.model_backend.canvas import CanvasSnapshot
    from dgchat.model_backend.events import StepTiming

    canvas = CanvasSnapshot(np.array(tokens), np.array(states), np.zeros(len(tokens)))
    return StepEvent(step=24, total_steps=24, canvas_index=1 if earlier else 0, canvas_step=24, canvas=canvas,
                     answer_tokens=np.array(earlier, dtype=np.int32), committed=sum(1 for s in states if s),
                     canvas_length=len(tokens), timing=StepTiming(0, 0), elapsed_s=2.0, uniform_state=uniform)


class _Kinds:
    END, MASK = 2, 9

    def is_special(self, token: int) -> bool:
        return token in (self.END, self.MASK)

    def is_end(self, token: int) -> bool:
        return token == self.END


def test_the_replay_line_names_the_answers_tokens_and_the_canvas_positions():
    """The count the answer's line shows (the tokens before the end token) beside the positions the
    canvas decided (the end token and what follows it included): masked diffusion, where a masked
    position is no token yet, and uniform-state (DiffusionGemma), whose answer is its last draft."""
    from dgchat.app.widgets.replay import answer_tokens_at, replay_progress_text

    done, masked = 2, 0
    # an earlier canvas of 4, then 3 tokens, a hole, the end token and 2 decided positions after it
    masked_event = _event([5, 5, 5, 5], [5, 5, 5, 9, 2, 5, 5, 9], [done] * 3 + [masked] + [done] * 3 + [masked])
    assert answer_tokens_at(masked_event, _Kinds()) == 7
    assert replay_progress_text(masked_event, _Kinds()) == (
        "step 24/24 · canvas 2 · 7 tokens · 6/8 positions decided · 3.5 tok/s")
    uniform_event = _event([], [5, 6, 7, 2, 5], [done, masked, done, masked, done], uniform=True)
    assert answer_tokens_at(uniform_event, _Kinds()) == 3  # the draft at position 2 is the answer's
    block_line = replay_progress_text(uniform_event, _Kinds(), block_size=4)
    assert block_line == "block 1 · step 24/24 · 3 tokens · 1.5 tok/s"
