"""The chat with a block-diffusion model (SDAR; docs/BLOCK_DIFFUSION.md) under Pilot, on the tiny
random-weight model of tests/fixtures/block_tiny.py (its text is gibberish; the engine is real).

Such a model writes its answer block after block, each block a small canvas of 4 positions: a
48-token answer is 12 or 13 canvases. The live canvas shows the answer so far with the current
block filling in at its end, drawn at every step (lockstep), its decided text never shrinking from
one frame to the next (no blank frame between blocks), its progress line counting blocks and the
answer's tokens; the finished answer is Markdown with its blocks counted; Esc keeps the decided
prefix; Ctrl+R adds a version; the status line, `model: info` and the settings say what the model
fixes (the canvas is one block) and what its settings mean (steps per block, SDAR's threshold);
`p` replays every step of every block in order and `x` exports them as a .cast.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from dgchat.app.generation import decided_tokens
from dgchat.app.widgets.canvas import PLACEHOLDER, LiveCanvas
from dgchat.app.widgets.message import MessageView
from dgchat.app.widgets.replay import ReplayView
from dgchat.model_backend.events import StepEvent
from fixtures.app_harness import (
    GatedEngine,
    make_app,
    setup_home,
    type_text,
    wait_for,
    wait_idle,
    wait_model,
)
from fixtures.block_tiny import converted
from fixtures.terminal_screen import TerminalScreen
from test_canvas_widget import LockstepEngine, drawn_by, expected_text
from textual.widgets import Markdown

SIZE = (110, 34)
MAX_TOKENS = 48
PROGRESS = re.compile(r"block (\d+) · step (\d+)/(\d+) · (\d+) tokens · \d+\.\d tok/s")


def squeeze(text: str) -> str:
    return re.sub(r"\s", "", text)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # the config's [sampler] of the other app tests (steps = 8, gen_length = 32) would be replaced for
    # this model anyway (the canvas is its block); a short answer keeps each test quick
    return setup_home(tmp_path, monkeypatch, config=f"[sampler]\nmax_tokens = {MAX_TOKENS}\n")


@pytest.fixture
def sdar(base: Path) -> Path:
    return converted(base, "sdar")


def record_frames(monkeypatch) -> list[tuple[StepEvent, str, list[str], int]]:
    """Every frame a LiveCanvas builds: (event, progress line, canvas lines, the canvas's height)."""
    from dgchat.app import live_view

    monkeypatch.setattr(live_view, "UI_CPU_BUDGET", 1.0)  # a slow frame must not skip steps here
    frames: list[tuple[StepEvent, str, list[str], int]] = []
    build = LiveCanvas._rebuild

    def recording(self) -> bool:
        before = self.frames
        grew = build(self)
        if self.frames != before and self.event is not None and self.id == "live-canvas":
            frames.append((self.event, self._strips[0].text.rstrip(), [s.text for s in self._strips[1:]],
                           self._height))
        return grew

    monkeypatch.setattr(LiveCanvas, "_rebuild", recording)
    return frames


def _status(screen) -> str:
    """The whole status line (a narrow one leaves parts out: status_bar.fit_parts)."""
    from dgchat.app.widgets.status_bar import StatusBar

    return screen.query_one("#status", StatusBar).full_text


def _answers(screen) -> list[MessageView]:
    return [v for v in screen.query(MessageView) if v.message.role == "assistant" and not v.has_class("-removed")]


async def test_live_canvas_writes_block_after_block_without_a_blank_frame(home, sdar, monkeypatch):
    frames = record_frames(monkeypatch)
    app = make_app(sdar)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        screen = app.chat_screen
        engine = app.session.engine
        status = _status(screen)
        assert ("block diffusion (SDAR, blocks of 4) · 4 steps/block · max 48 tokens · T 0 · threshold 0.85"
                in status), status
        app.session.engine = lockstep = LockstepEngine(engine, drawn_by(app))
        await type_text(pilot, "Tell me about the castle")
        await pilot.press("enter")
        await wait_idle(pilot, timeout=60)
        steps = lockstep.steps
        blocks = sorted({ev.canvas_index for ev in steps})
        assert blocks == list(range(len(blocks))) and len(blocks) >= 12, "the answer is not block after block"
        assert {ev.step for ev, *_ in frames} == {ev.step for ev in steps}  # every step drawn
        shown_before = ""
        for ev, progress, lines, _ in frames:
            # the answer so far, then the current block: earlier blocks' text, this block's tokens and dots
            shown = squeeze("".join(lines))
            assert shown == squeeze(expected_text(engine, ev)), f"step {ev.step}"
            m = PROGRESS.fullmatch(progress)
            assert m, progress
            decided = min(int(ev.answer_tokens.size) + ev.committed, MAX_TOKENS)
            assert [int(g) for g in m.groups()] == [ev.canvas_index + 1, ev.canvas_step, ev.total_steps, decided]
            # never a frame with less decided text than the one before: a new block starts after the
            # text of the finished ones, it never replaces them
            assert shown.startswith(shown_before), f"step {ev.step}: the decided text went back"
            shown_before = shown.split(PLACEHOLDER)[0]
        first_of_block = [(ev, lines) for ev, _, lines, _ in frames if ev.canvas_step == 1 and ev.canvas_index]
        assert first_of_block and all(squeeze("".join(lines)) for _, lines in first_of_block)
        # the canvas keeps room ahead for the blocks to come: a few layouts an answer, not one a block
        heights = [h for *_, h in frames]
        grew = sum(1 for a, b in zip(heights, heights[1:]) if b != a)
        assert heights == sorted(heights) and grew <= 2, heights
        # the finished answer: Markdown, its blocks counted
        (view,) = _answers(screen)
        message = app.store.get_message(view.message.id)
        assert view.query(Markdown) and message.content.strip() and message.status == "done"
        meta = str(view.query_one(".message--meta").render())
        assert re.match(rf"48 tokens · {len(blocks)} blocks · {len(steps)} steps · \d+\.\d tok/s · hit max tokens",
                        meta), meta
        assert message.meta["block_size"] == 4 and message.meta["stats"]["canvases"] == len(blocks)
        last = steps[-1]
        tokens = np.concatenate([last.answer_tokens, last.canvas.tokens])[:MAX_TOKENS]
        assert message.content == engine.detokenize(tokens)


class WordVocab:
    """Every token a 5-cell word (English-like widths), none special."""

    def piece(self, token: int) -> str:
        return " word"

    def is_special(self, token: int) -> bool:
        return False

    def is_end(self, token: int) -> bool:
        return False


def block_events(blocks: int, block: int = 4) -> list[StepEvent]:
    """An answer of `blocks` blocks, one token decided per step, left to right."""
    from dgchat.model_backend.canvas import CanvasSnapshot, Cell
    from dgchat.model_backend.events import StepTiming

    events, step = [], 0
    for b in range(blocks):
        for k in range(block):
            step += 1
            state = np.array([Cell.DONE] * k + [Cell.NEW] + [Cell.MASKED] * (block - k - 1), np.int8)
            events.append(StepEvent(
                step=step, total_steps=block, canvas_index=b, canvas_step=k + 1,
                canvas=CanvasSnapshot(np.ones(block, np.int32), state, np.zeros(block, np.float32)),
                answer_tokens=np.ones(b * block, np.int32), committed=k + 1, canvas_length=block,
                timing=StepTiming(1, 1), elapsed_s=0.01 * step))
    return events


@pytest.mark.parametrize("block_size,most", [(4, 6), (0, None)])
async def test_the_canvas_keeps_room_for_blocks_to_come(block_size, most):
    """A block answer's canvas is 4 positions; reserving room for those alone grew the canvas (a
    layout of the whole conversation) every other line. With room kept for the tokens to come it
    grows a few times over a 256-token answer."""
    from textual.app import App
    from textual.containers import VerticalScroll

    canvas = LiveCanvas(WordVocab(), canvas_length=4, block_size=block_size, answer_limit=256)

    class Host(App):
        def compose(self):
            with VerticalScroll():
                yield canvas

    heights = []
    async with Host().run_test(size=(52, 40)) as pilot:
        await pilot.pause()
        for ev in block_events(64):
            canvas.show(ev)
            heights.append(canvas._height)
        text_lines = canvas.text_lines
    changes = sum(1 for a, b in zip(heights, heights[1:]) if b != a)
    assert text_lines >= 26  # 256 words of 5 cells, 50 a line
    if most is not None:
        assert changes <= most, heights
        assert PROGRESS.fullmatch(canvas._strips[0].text.rstrip())
    else:  # a canvas model's rule applied to blocks: a layout every line or two
        assert changes >= 12, heights


async def test_an_npc_variant_of_a_block_model_names_its_block():
    """The NPC workshop's compact canvas (app/widgets/npc.py) counts blocks as the chat's does."""
    from types import SimpleNamespace

    from dgchat.app.widgets.npc import VariantCanvas
    from textual.app import App

    vocab = WordVocab()
    engine = SimpleNamespace(info=SimpleNamespace(family="block_diffusion", attention_block=4), piece=vocab.piece,
                             is_special=vocab.is_special, is_end=vocab.is_end, eog_ids=list)
    canvas = VariantCanvas(engine, "#1")

    class Host(App):
        def compose(self):
            yield canvas

    async with Host().run_test(size=(60, 10)) as pilot:
        await pilot.pause()
        canvas.show(block_events(3)[9])
        assert canvas._strips[0].text.rstrip() == "#1 · block 3 · step 2/4"


async def test_esc_keeps_the_decided_prefix_and_ctrl_r_adds_a_version(home, sdar):
    app = make_app(sdar)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        screen = app.chat_screen
        engine = app.session.engine
        app.session.engine = gated = GatedEngine(engine, hold_at=11)
        await type_text(pilot, "Tell me about the castle")
        await pilot.press("enter")
        await wait_for(pilot, gated.holding.is_set, what="the answer's third block or so")
        await pilot.pause(0.2)
        event = screen.generation.event
        assert event.canvas_index >= 2
        kept = engine.detokenize(decided_tokens(engine, event))
        assert kept.strip()
        assert PROGRESS.match(screen.canvas._strips[0].text)
        await pilot.press("escape")
        await wait_idle(pilot)
        (view,) = _answers(screen)
        message = app.store.get_message(view.message.id)
        assert message.status == "stopped" and message.meta["stop_reason"] == "cancelled"
        assert message.content == kept  # every finished block and the current block's decided prefix
        assert "stopped" in str(view.query_one(".message--header").render())

        app.session.engine = engine
        screen.query_one("#prompt").focus()
        await pilot.press("ctrl+r")
        await wait_idle(pilot, timeout=60)
        (view,) = _answers(screen)
        assert "‹ 2/2 ›" in str(view.query_one(".message--header").render())
        regenerated = app.store.get_message(view.message.id)
        assert regenerated.status == "done" and regenerated.meta["stats"]["tokens"] == MAX_TOKENS
        assert [v.status for v in app.store.versions(regenerated.id)] == ["stopped", "done"]


async def test_settings_and_model_info_say_what_the_model_fixes(home, sdar):
    from dgchat.app.error_modal import ErrorModal
    from dgchat.app.settings_modal import SettingsModal
    from textual.widgets import Input, Select

    app = make_app(sdar)
    async with app.run_test(size=(110, 40)) as pilot:
        await wait_model(pilot)
        screen = app.chat_screen
        screen.action_model_info()
        await pilot.pause()
        assert isinstance(app.screen, ErrorModal)
        text = str(app.screen.query_one("#error-message").render())
        assert "architecture: qwen3 (block_diffusion)" in text
        assert "runs as: block diffusion (SDAR, blocks of 4)" in text
        assert "writes: left to right, block after block (4 tokens a block, fixed by the model;" in text
        assert "no infill" in text
        assert re.search(r"steps per block\s+4\s+\(model file\)", text), text
        assert re.search(r"canvas \(one block\)\s+4\s+\(model file\)", text), text
        assert re.search(r"max tokens \(answer\)\s+48\s+\(config\)", text), text
        await pilot.press("escape")
        await pilot.pause()

        # a chat that has its own canvas length from another model keeps it, unused here
        chat = app.store.create_chat(system_prompt="")
        app.store.update_chat_settings(chat.id, model=None, system_prompt="", params={"gen_length": 64})
        screen.open_chat(chat.id)
        await pilot.pause()
        await pilot.press("ctrl+o")
        await wait_for(pilot, lambda: isinstance(app.screen, SettingsModal), what="the settings")
        modal = app.screen

        def hint(name: str) -> str:
            return str(modal.query_one(f"#hint-{name}").render())

        for name in ("gen_length", "block_length"):
            field = modal.query_one(f"#field-{name}", Input)
            assert field.disabled and field.value == "4", name
            assert hint(name).startswith("fixed: "), hint(name)
        assert hint("gen_length") == "fixed: one block (Max tokens: the answer)"
        for name in ("algorithm", "cache"):
            assert modal.query_one(f"#field-{name}", Select).disabled and hint(name).startswith("fixed:")
        assert hint("steps") == "default: 4 · per block (blocks of 4 tokens)"
        assert hint("threshold") == "default: 0.85 · SDAR's dynamic threshold"
        assert hint("max_tokens") == "default: 48 · the whole answer's length"
        assert not modal.query_one("#field-steps", Input).disabled
        modal.query_one("#field-steps", Input).value = "2"
        await pilot.pause()
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: not isinstance(app.screen, SettingsModal), what="save")
        assert app.store.get_chat(chat.id).params == {"steps": 2, "gen_length": 64}
        assert "2 steps/block" in _status(screen)


async def test_replay_and_export_cover_every_block_in_order(home, sdar, tmp_path):
    from textual.widgets import Input

    app = make_app(sdar)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        screen = app.chat_screen
        engine = app.session.engine
        steps: list[StepEvent] = []

        class Recording:
            def __getattr__(self, name):
                return getattr(engine, name)

            def generate(self, prompt, params=None, **kwargs):
                for ev in engine.generate(prompt, params, **kwargs):
                    if isinstance(ev, StepEvent):
                        steps.append(ev)
                    yield ev

        app.session.engine = Recording()
        await type_text(pilot, "Tell me about the castle")
        await pilot.press("enter")
        await wait_idle(pilot, timeout=60)
        app.session.engine = engine
        (view,) = _answers(screen)
        assert len({e.canvas_index for e in steps}) >= 12
        view.focus()
        await pilot.press("p")
        await wait_for(pilot, lambda: view.replay is not None, what="the replay")
        replay: ReplayView = view.replay
        assert replay.history.block_size == 4 and len(replay.steps) == len(steps)
        await pilot.press("home")
        for i, step in enumerate(steps):
            if i:
                await pilot.press("right")
            assert replay.index == i
            lines = replay.canvas._strips
            assert squeeze("".join(s.text for s in lines[1:])) == squeeze(expected_text(engine, step)), step.step
            m = PROGRESS.match(lines[0].text)
            assert m and (int(m.group(1)), int(m.group(2))) == (step.canvas_index + 1, step.canvas_step)
        await pilot.press("escape")
        await wait_for(pilot, lambda: view.replay is None, what="the replay to close")

        view.focus()
        await pilot.press("x")
        await pilot.pause()
        target = tmp_path / "casts" / "blocks.cast"
        app.screen.query_one(Input).value = str(target)
        await pilot.press("enter")
        await pilot.pause()
        lines = target.read_text(encoding="utf-8").splitlines()
        header = json.loads(lines[0])
        frames = [json.loads(line) for line in lines[1:]]
        labels = [re.search(r"step (\d+) \(block (\d+), (\d+)/4\)", re.sub(r"\x1b\[[0-9;]*m", "", f[2]))
                  for f in frames if "step " in f[2]]
        assert all(labels) and len(labels) == len(steps)
        assert [(int(m.group(2)), int(m.group(3))) for m in labels] == [(s.canvas_index + 1, s.canvas_step)
                                                                        for s in steps]
        screen_ = TerminalScreen(header["width"], header["height"])
        for frame in frames:
            screen_.feed(frame[2])
        assert squeeze("".join(screen_.lines()[1:])) == squeeze(view.message.content)
