"""The real `dgchat` app in a pseudo-terminal with a block-diffusion model (SDAR, blocks of 4; the
tiny random-weight model of tests/fixtures/block_tiny.py): what a person sees while an answer is
written block after block, frame by frame.

The app runs as `python -m dgchat --model M` in a pty (as tests/app/test_store_kill9.py and the bench
tests/bench/bench_canvas_seen.py do); the terminal reports synchronized output (`?2026`) as
supported, so each frame the app draws is delimited, and the screen is read after every frame with
tests/fixtures/terminal_screen.py. Checked per terminal size: the progress line names the blocks in
order (`block 7 · step 2/4 · 26 tokens`), several blocks are seen being written, the decided
token count never goes back, no frame is blank between the first canvas and the finished answer
(the canvas or the answer's text is always on screen: the swap from canvas to Markdown included),
and the finished answer's line counts its blocks.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest
from fixtures.app_pty import Terminal, app_env, saved_answer, wait_until
from fixtures.block_tiny import converted

PROGRESS = re.compile(r"block (\d+) · step (\d+)/(\d+) · (\d+) tokens")
LOADED = " · T 0"  # the status line of the loaded model (a narrow one leaves out the engine's label)
PROMPT = "Tell me a story about a dragon"
MAX_TOKENS = 192
PROBE = 16  # letters and digits of the answer in a row: its text is on screen


def alnum(text: str) -> str:
    return re.sub(r"[^0-9A-Za-z]", "", text)


@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")
@pytest.mark.parametrize("cols,rows", [(140, 40), (80, 24)])
def test_a_block_answer_as_a_person_sees_it(tmp_path: Path, base: Path, cols: int, rows: int) -> None:
    model = converted(base, "sdar")
    home = tmp_path / "home"
    (home / "config").mkdir(parents=True)
    # a config file: no setup wizard
    (home / "config" / "config.toml").write_text(f"refresh_hz = 30\n[sampler]\nmax_tokens = {MAX_TOKENS}\n")
    env = app_env(home, tmp_path)
    term = Terminal([sys.executable, "-m", "dgchat", "--model", str(model)], env, cols, rows)
    db = home / "data" / "chats.db"
    try:
        wait_until(lambda: LOADED in term.text(), 60, "the model to load")
        time.sleep(0.5)
        term.keys(PROMPT)
        time.sleep(0.3)
        start = term.now()
        term.keys("\r")
        wait_until(lambda: saved_answer(db) is not None, 60, "the answer")
        time.sleep(0.8)  # the swap to the finished answer and a few quiet frames
        end = term.now()
        final_screen = term.text()
        term.keys("\x11")  # Ctrl+Q
    finally:
        code = term.close()
    assert code == 0
    answer = saved_answer(db)
    assert answer is not None and answer["status"] == "done" and answer["meta"]["stats"]["tokens"] == MAX_TOKENS
    blocks_total = answer["meta"]["stats"]["canvases"]

    frames = [(t, text) for t, text in term.frames() if start <= t <= end]
    text_probe = alnum(answer["content"])
    probes = {text_probe[i:i + PROBE] for i in range(max(1, len(text_probe) - PROBE + 1))}
    seen_blocks: list[int] = []
    decided: list[int] = []
    drawn: set[tuple[int, int]] = set()
    shown = False
    blank = 0
    for _, text in frames:
        m = PROGRESS.search(text)
        if m:
            block, step, _, tokens = (int(g) for g in m.groups())
            seen_blocks.append(block)
            decided.append(tokens)
            drawn.add((block, step))
        flat = alnum(text)
        words = any(flat[i:i + PROBE] in probes for i in range(max(0, len(flat) - PROBE + 1)))
        visible = bool(m) or words
        shown = shown or visible
        if shown and not visible:
            blank += 1
    print(f"\n{cols}x{rows}: {len(frames)} frames, {len(drawn)} of {answer['meta']['stats']['steps']} steps drawn, "
          f"blocks seen {sorted(set(seen_blocks))[:3]}…{max(seen_blocks, default=0)} of {blocks_total}, "
          f"blank frames {blank}")
    assert len(set(seen_blocks)) >= 3, "too few blocks were seen being written"
    assert seen_blocks == sorted(seen_blocks) and decided == sorted(decided)
    assert blank == 0
    # the finished answer: its line counts blocks
    assert re.search(rf"{MAX_TOKENS} tokens · {blocks_total} blocks · \d+ steps", final_screen), final_screen
    assert not PROGRESS.search(final_screen)
