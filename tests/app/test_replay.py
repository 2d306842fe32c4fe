"""Replaying an answer's denoising in the app (p on a focused answer), and exporting it as an
asciicast (x): on real generations, the replayed frames are the steps the engine produced, every
one of them, whatever the live canvas managed to draw."""

from __future__ import annotations

import json
import re

import pytest
from dgchat.app.store import Store
from dgchat.app.widgets.message import MessageView
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
