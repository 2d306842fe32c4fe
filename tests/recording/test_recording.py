"""Denoising histories and asciicast recordings (dgchat.recording), on real generations: a history
rebuilds every step the engine showed, survives the database's bytes, refuses damaged bytes, and a
.cast made from it plays, in a terminal emulator, frame by frame into the answer's final text."""

from __future__ import annotations

import json
import re
import zlib

import numpy as np
import pytest
from dgchat.assets import bundled_model_path
from dgchat.model_backend.canvas import CanvasSnapshot, Cell
from dgchat.model_backend.loader import load_engine
from dgchat.model_backend.errors import InvalidParameterError
from dgchat.model_backend.events import FinalEvent, StepEvent, StepTiming
from dgchat.model_backend.params import DiffusionParams
from dgchat.recording import history as history_module
from dgchat.recording.asciicast import Pace, asciicast, summary_line
from dgchat.recording.frame_text import canvas_text
from dgchat.recording.history import DenoisingHistory, HistoryError, HistoryRecorder
from fixtures.terminal_screen import TerminalScreen

needs_bundled = pytest.mark.skipif(bundled_model_path() is None, reason="this installation has no bundled model")


def run(engine, text: str, params: DiffusionParams) -> tuple[list[StepEvent], FinalEvent]:
    prompt = engine.chat_prompt([{"role": "user", "content": text}])
    events = list(engine.generate(prompt, engine.resolve(params)))
    final = events.pop()
    assert isinstance(final, FinalEvent)
    return events, final


def record(engine, events: list[StepEvent]) -> DenoisingHistory:
    recorder = HistoryRecorder(engine)
    for event in events:
        recorder.add(event)
    return recorder.history()


def assert_same_steps(replayed: list[StepEvent], recorded: list[StepEvent]) -> None:
    assert len(replayed) == len(recorded)
    for got, want in zip(replayed, recorded):
        assert (got.step, got.canvas_index, got.canvas_step, got.total_steps, got.canvas_length, got.committed) == (
            want.step, want.canvas_index, want.canvas_step, want.total_steps, want.canvas_length, want.committed)
        assert got.uniform_state == want.uniform_state
        assert np.array_equal(got.canvas.tokens, want.canvas.tokens), f"step {want.step}"
        assert np.array_equal(got.canvas.state, want.canvas.state), f"step {want.step}: states differ"
        assert np.array_equal(got.answer_tokens, want.answer_tokens)
        assert abs(got.elapsed_s - want.elapsed_s) <= 0.0005


@pytest.fixture(scope="module")
def bundled_run():
    path = bundled_model_path()
    if path is None:
        pytest.skip("this installation has no bundled model")
    with load_engine(path) as engine:
        events, final = run(engine, "Halt, traveller! Who goes there?", DiffusionParams(seed=0))
        yield engine, events, final


@needs_bundled
def test_history_rebuilds_every_step_of_the_bundled_model(bundled_run):
    """DiffusionGemma (uniform state: every undecided draft changes each step, accepted tokens may
    be replaced), an answer over two canvases: each replayed step equals the step the engine showed,
    NEW marks included, after a trip through the stored bytes."""
    engine, events, final = bundled_run
    assert events[0].uniform_state and len({e.canvas_index for e in events}) >= 2, "the run proves too little"
    history = record(engine, events)
    blob = history.to_bytes()
    assert_same_steps(list(DenoisingHistory.from_bytes(blob).events()), events)
    # compact: a few hundred bytes a step even though every draft moves (the raw canvases take ~10x)
    raw = sum(e.canvas.tokens.nbytes + e.canvas.state.nbytes for e in events)
    assert len(blob) < raw / 3 and len(blob) / len(events) < 600, (len(blob), raw)
    # the replay needs no model: the history carries the text and kind of its tokens
    vocab = DenoisingHistory.from_bytes(blob).vocab
    for event in events:
        assert canvas_text(vocab, event).plain == canvas_text(engine, event).plain


def test_history_of_a_masked_model_over_several_canvases(llada_gguf):
    with load_engine(llada_gguf) as engine:
        ends = [t for t in range(engine.model.n_vocab) if engine.is_end(t)]
        params = DiffusionParams(steps=8, gen_length=16, max_tokens=40, seed=1,
                                 logit_bias=tuple((t, -100.0) for t in ends))
        events, final = run(engine, "hello", params)
        assert final.stats.canvases == 3 and not events[0].uniform_state
        history = record(engine, events)
        assert_same_steps(list(DenoisingHistory.from_bytes(history.to_bytes()).events()), events)
        # masked diffusion changes a position once, when it accepts it: after each canvas's keyframe
        # (all its positions) a step records only the positions it decided
        keyframes = sum(e.canvas_length for e in events if e.canvas_step == 1)
        assert history.positions.size == keyframes + sum(
            int(np.count_nonzero(e.canvas.state == Cell.NEW)) for e in events if e.canvas_step > 1)


def toy_event(step: int, tokens, states, *, canvas_index: int = 0, answer=()) -> StepEvent:
    tokens = np.array(tokens, np.int32)
    return StepEvent(step=step, total_steps=4, canvas_index=canvas_index, canvas_step=step,
                     canvas=CanvasSnapshot(tokens, np.array(states, np.int8), np.zeros(tokens.size, np.float32)),
                     answer_tokens=np.array(answer, np.int32), committed=int(sum(s != Cell.MASKED for s in states)),
                     canvas_length=tokens.size, timing=StepTiming(1, 1), elapsed_s=0.01 * step)


class ToyVocab:
    pieces = {0: "<mask>", 1: " the", 2: " gate", 3: "<eot>", 4: "\x1b]0;pwned\x07\x1b[31m", 5: "\u202egnirts",
              6: "\x9b31m"}

    def piece(self, token: int) -> str:
        return self.pieces[token]

    def is_special(self, token: int) -> bool:
        return token in (0, 3)

    def is_end(self, token: int) -> bool:
        return token == 3


def toy_history() -> DenoisingHistory:
    recorder = HistoryRecorder(ToyVocab())
    recorder.add(toy_event(1, [0, 0, 0, 0], [Cell.MASKED] * 4))
    recorder.add(toy_event(2, [1, 0, 0, 0], [Cell.NEW, Cell.MASKED, Cell.MASKED, Cell.MASKED]))
    recorder.add(toy_event(3, [1, 4, 0, 5], [Cell.DONE, Cell.NEW, Cell.MASKED, Cell.NEW]))
    recorder.add(toy_event(4, [1, 4, 6, 5], [Cell.DONE, Cell.DONE, Cell.NEW, Cell.DONE]))
    return recorder.history()


def test_damaged_bytes_are_refused_with_one_line():
    blob = toy_history().to_bytes()
    DenoisingHistory.from_bytes(blob)
    bad = [b"", b"DGH\x02" + blob[4:], blob[:4] + b"not zlib", blob[:-3], b"DGH\x01" + zlib.compress(b"\x00" * 3)]
    body = bytearray(zlib.decompress(blob[4:]))
    head_len = int.from_bytes(body[:4], "little")
    header = json.loads(body[5:5 + head_len])
    header["changes"] += 1  # counts that do not add up
    head = json.dumps(header).encode()
    bad.append(b"DGH\x01" + zlib.compress(len(head).to_bytes(4, "little") + body[4:5] + head + body[5 + head_len:] + b"\0" * 8))
    meta_at = 5 + head_len
    positions_at = meta_at + 4 * 8 * header["steps"]
    body[positions_at:positions_at + 2] = (9).to_bytes(2, "little")  # a position outside the canvas
    bad.append(b"DGH\x01" + zlib.compress(bytes(body)))
    for blob in bad:
        with pytest.raises(HistoryError) as err:
            DenoisingHistory.from_bytes(blob)
        assert "\n" not in str(err.value)
    with pytest.raises(HistoryError):  # a bomb: more than MAX_BLOB once inflated
        DenoisingHistory.from_bytes(b"DGH\x01" + zlib.compress(b"\0" * (history_module.MAX_BLOB + 10)))


def test_a_long_generation_keeps_its_first_steps_and_says_so(monkeypatch):
    monkeypatch.setattr(history_module, "MAX_STEPS", 2)
    history = toy_history()
    assert history.truncated and history.steps == 2
    assert DenoisingHistory.from_bytes(history.to_bytes()).truncated


def play(cast: str) -> tuple[dict, list[tuple[float, str]], TerminalScreen]:
    lines = cast.splitlines()
    header = json.loads(lines[0])
    events = [json.loads(line) for line in lines[1:]]
    assert all(isinstance(e, list) and len(e) == 3 and e[1] == "o" and isinstance(e[2], str) for e in events)
    times = [e[0] for e in events]
    assert times == sorted(times) and times[0] >= 0
    return header, [(e[0], e[2]) for e in events], TerminalScreen(header["width"], header["height"])


def squeeze(text: str) -> str:
    return re.sub(r"\s", "", text)


@needs_bundled
def test_asciicast_plays_step_by_step_into_the_final_text(bundled_run):
    engine, events, final = bundled_run
    history = record(engine, events)
    summary = summary_line(final.stats.tokens, final.stats.steps, final.stats.elapsed_s)
    cast = asciicast(history, final.text, summary=summary, width=60, title="dgchat · test", timestamp=1)
    header, frames, screen = play(cast)
    assert header == {"version": 2, "width": 60, "height": header["height"], "timestamp": 1, "title": "dgchat · test"}
    assert 2 <= header["height"] <= 60
    step_frames = frames[1:-2]
    assert len(step_frames) == len(events)
    screen.feed(frames[0][1])
    for (t, text), event in zip(step_frames, events):
        assert t == pytest.approx(round(event.elapsed_s, 3), abs=0.001)  # the real pace
        screen.feed(text)
        shown = screen.lines()
        assert shown[0].startswith(f"step {event.step} (canvas {event.canvas_index + 1}, ")
        assert squeeze("".join(shown[1:])) == squeeze(canvas_text(engine, event).plain)
    for _, text in frames[-2:]:
        screen.feed(text)
    assert screen.lines()[0] == summary
    assert squeeze("".join(screen.lines()[1:])) == squeeze(final.text)
    assert frames[-1][0] - frames[-2][0] == pytest.approx(2.0)  # the final text is held


def test_asciicast_at_a_chosen_pace_and_model_text_made_safe():
    history = toy_history()
    cast = asciicast(history, "final \x1b[2J text\u202e", summary="4 tokens", pace=Pace.parse("0.5"), width=40)
    _, frames, screen = play(cast)
    assert [t for t, _ in frames[1:-1]] == [0.0, 0.5, 1.0, 1.5, 2.0]
    for _, text in frames:
        # only the recording's own sequences: cursor home, clear line / below, SGR, cursor shown / hidden
        for seq in re.findall(r"\x1b(\[[0-9;?]*[A-Za-z]|.)", text):
            assert re.fullmatch(r"\[(H|K|J|2J|\?25[hl]|[0-9;]*m)", seq), repr(seq)
        assert not set(text) & {"\x9b", "\u202e", "\x07"}
        screen.feed(text)
    assert "␛]0;pwned␇" in history_text(history) and screen.lines()[1] == "final ␛[2J text\ufffd"


def history_text(history: DenoisingHistory) -> str:
    last = list(history.events())[-1]
    return canvas_text(history.vocab, last).plain


def test_pace_is_real_or_seconds_per_step():
    assert Pace.parse("real").seconds_per_step is None and Pace.parse("0.25").seconds_per_step == 0.25
    for bad in ("fast", "0", "-1", "nan", "inf", "100"):
        with pytest.raises(InvalidParameterError):
            Pace.parse(bad)
