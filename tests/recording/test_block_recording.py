"""Recordings of block-diffusion answers (SDAR, BD3LM; docs/BLOCK_DIFFUSION.md): an answer written
block after block is many small canvases (a 48-token answer in blocks of 4 is 12 or 13), and its
history, its replayed steps, its progress lines and its .cast must cover every block in order.

On the tiny random-weight block models of tests/fixtures/block_tiny.py (gibberish text, real
engine); the CLI runs are `python -m dgchat generate ... --record / --visual` as a user types them.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from dgchat.model_backend.events import FinalEvent, StepEvent
from dgchat.model_backend.loader import load_engine
from dgchat.model_backend.params import DiffusionParams
from dgchat.recording.asciicast import asciicast, summary_line
from dgchat.recording.blocks import block_size_of
from dgchat.recording.frame_text import canvas_text, progress_line, render_step
from dgchat.recording.history import DenoisingHistory, HistoryError, HistoryRecorder
from fixtures.block_tiny import converted
from fixtures.cli_terminal import InTerminal
from fixtures.terminal_screen import TerminalScreen

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.fixture(scope="module")
def sdar(base: Path):
    engine = load_engine(converted(base, "sdar"), precise=True)
    yield engine
    engine.close()


def generate(engine, text: str, **params) -> tuple[list[StepEvent], FinalEvent]:
    prompt = engine.chat_prompt([{"role": "user", "content": text}])
    events = list(engine.generate(prompt, engine.resolve(DiffusionParams(**params))))
    final = events.pop()
    assert isinstance(final, FinalEvent)
    return events, final


def test_history_of_a_block_answer_covers_every_block_in_order(sdar) -> None:
    assert block_size_of(sdar) == 4
    events, final = generate(sdar, "Tell me about the castle", max_tokens=48)
    blocks = sorted({e.canvas_index for e in events})
    assert final.stats.tokens == 48 and len(blocks) >= 12 and blocks == list(range(len(blocks)))
    recorder = HistoryRecorder(sdar)
    for event in events:
        recorder.add(event)
    history = recorder.history()
    assert history.block_size == 4 and not history.truncated
    back = DenoisingHistory.from_bytes(history.to_bytes())
    assert back.block_size == 4
    replayed = list(back.events())
    assert len(replayed) == len(events)
    for got, want in zip(replayed, events):
        assert (got.step, got.canvas_index, got.canvas_step, got.committed) == (
            want.step, want.canvas_index, want.canvas_step, want.committed)
        assert np.array_equal(got.answer_tokens, want.answer_tokens)
        assert np.array_equal(got.canvas.tokens, want.canvas.tokens)
        assert np.array_equal(got.canvas.state, want.canvas.state)
    # the blocks come in order, each starting where the earlier ones end
    index = [e.canvas_index for e in replayed]
    assert index == sorted(index)
    last = replayed[-1]
    assert np.array_equal(np.concatenate([last.answer_tokens, last.canvas.tokens])[:48], final.tokens)
    # and it replays without the model: the same text per step from the recording's own vocabulary
    for event in replayed[::5]:
        assert canvas_text(back.vocab, event).plain == canvas_text(sdar, event).plain


def test_a_long_block_answer_packs_small(sdar) -> None:
    """Each block's keyframe repeats the answer so far; zlib keeps that small (a 256-token answer
    in 64 blocks: a few kilobytes, not the 64 x 128 ids it spells out)."""
    events, final = generate(sdar, "hello there", max_tokens=256)
    recorder = HistoryRecorder(sdar)
    for event in events:
        recorder.add(event)
    blob = recorder.history().to_bytes()
    assert final.stats.canvases >= 64 and recorder.history().answer.size > 60 * 128
    assert len(blob) < 8000, len(blob)


def with_header(blob: bytes, **changes) -> bytes:
    """The packed history with its JSON header changed."""
    body = zlib.decompress(blob[4:])
    head_len = int.from_bytes(body[:4], "little")
    header = json.loads(body[5:5 + head_len]) | changes
    head = json.dumps(header).encode()
    return blob[:4] + zlib.compress(len(head).to_bytes(4, "little") + body[4:5] + head + body[5 + head_len:])


def test_block_size_in_the_header_is_checked_and_optional() -> None:
    history = DenoisingHistory(block_size=32)
    blob = history.to_bytes()
    assert DenoisingHistory.from_bytes(blob).block_size == 32
    assert DenoisingHistory.from_bytes(DenoisingHistory().to_bytes()).block_size is None  # older recordings
    assert b"block_size" not in zlib.decompress(DenoisingHistory().to_bytes()[4:])  # their header, unchanged
    for bad in (0, 5000, True, "4", 2.5):
        with pytest.raises(HistoryError, match="block size"):
            DenoisingHistory.from_bytes(with_header(blob, block_size=bad))


def test_progress_line_counts_blocks_and_the_answers_tokens(sdar) -> None:
    events, _ = generate(sdar, "Tell me about the castle", max_tokens=24)
    later = next(e for e in events if e.canvas_index == 3 and e.canvas_step == 1)
    decided = int(later.answer_tokens.size) + later.committed
    line = progress_line(later, timings=False, block_size=4).plain
    assert re.fullmatch(rf"step {later.step} \(block 4, 1/{later.total_steps}\)  {decided} tokens  \d+\.\ds", line)
    # the engine says it writes blocks: render_step counts them without being told
    assert render_step(sdar, later, timings=False).renderables[0].plain == line
    # a canvas model's line is as before
    assert progress_line(later, timings=False).plain.startswith(f"step {later.step} (canvas 4, 1/")


def play(path: Path) -> tuple[dict, list[list]]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return json.loads(lines[0]), [json.loads(line) for line in lines[1:]]


def dgchat(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dgchat", *args], capture_output=True, text=True, timeout=timeout,
                          check=False)


@pytest.mark.parametrize("name,block,tokens", [("sdar", 4, 24), ("bd3lm", 32, 40)])
def test_generate_record_writes_frames_for_every_block(base: Path, tmp_path: Path, name: str, block: int,
                                                       tokens: int) -> None:
    """`dgchat generate --record` on a block model: a frame per step, the progress lines naming
    each block in order, ending on the answer's text."""
    model = converted(base, name)
    target = tmp_path / "out.cast"
    res = dgchat("generate", "-m", str(model), "-p", "Tell me about the castle", "--max-tokens", str(tokens),
                 "--json", "--record", str(target), "--record-pace", "0.1", "--record-width", "60")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["stats"]["tokens"] == tokens
    header, frames = play(target)
    steps = [ANSI.sub("", f[2]) for f in frames if "step " in f[2]]
    assert len(steps) == out["stats"]["steps"]
    found = [re.search(r"step (\d+) \(block (\d+), (\d+)/(\d+)\)  (\d+) tokens", s) for s in steps]
    assert all(found), steps[0][:200]
    blocks = [int(m.group(2)) for m in found]
    assert blocks == sorted(blocks) and blocks[0] == 1
    expected = -(-tokens // block)  # SDAR may need one more: its first block holds the prompt's last tokens
    assert blocks[-1] in (expected, expected + 1) and set(blocks) == set(range(1, blocks[-1] + 1))
    assert [int(m.group(1)) for m in found] == list(range(1, len(steps) + 1))
    decided = [int(m.group(5)) for m in found]
    assert decided == sorted(decided) and decided[-1] >= tokens
    assert [f[0] for f in frames if "step " in f[2]] == pytest.approx([0.1 * i for i in range(len(steps))])
    screen = TerminalScreen(header["width"], header["height"])
    for frame in frames:
        screen.feed(frame[2])
    shown = screen.lines()
    assert shown[0] == summary_line(tokens, out["stats"]["steps"], float(shown[0].split(" · ")[-1][:-2]))


def test_generate_visual_on_a_terminal_labels_each_step_with_its_block(base: Path) -> None:
    """On a terminal --visual redraws the frame in place (at most 30 a second, the last one always;
    each step's frame is in the .cast, above): the frames drawn name their block, in order. (To a
    pipe --visual is ignored: tests/commands/test_generate_cli.py.)"""
    run = InTerminal("generate", "-m", str(converted(base, "sdar")), "-p", "Tell me about the castle",
                     "--max-tokens", "12", "--visual")
    rc, err = run.finish()
    assert rc == 0, err
    # (a redraw starts where the last frame's canvas ended: no line start to anchor to)
    lines = re.findall(r"step (\d+) \(block (\d+), (\d+)/4\)  (\d+) tokens", run.text)
    assert lines, run.text
    steps, blocks = [int(s) for s, _, _, _ in lines], [int(b) for _, b, _, _ in lines]
    assert steps == sorted(steps) and blocks == sorted(blocks)
    assert blocks[-1] >= -(-int(lines[-1][3]) // 4)  # the last frame: its tokens took this many blocks of 4


def test_asciicast_of_a_block_answer_from_a_history(sdar) -> None:
    """The app's export path: a history read back from its bytes (no engine) still counts blocks."""
    events, final = generate(sdar, "hello there", max_tokens=16)
    recorder = HistoryRecorder(sdar)
    for event in events:
        recorder.add(event)
    history = DenoisingHistory.from_bytes(recorder.history().to_bytes())
    cast = asciicast(history, final.text, summary="s", width=40, timestamp=1)
    frames = [ANSI.sub("", json.loads(line)[2]) for line in cast.splitlines()[1:]]
    labels = [m.group(1) for f in frames for m in [re.search(r"\(block (\d+), ", f)] if m]
    assert len(labels) == len(events) and labels[0] == "1" and labels[-1] == str(events[-1].canvas_index + 1)
