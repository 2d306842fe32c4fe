"""`dgchat generate` end to end, as a user runs it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from dgchat.assets import bundled_model_path
from dgchat.model_backend.canvas_view import VISIBLE_CONTROLS
from fixtures.cli_terminal import InTerminal, pipe_env


def dgchat(*args: str, input: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dgchat", *args], capture_output=True, text=True, input=input,
                          timeout=timeout)


def test_json_output(llada_gguf: Path) -> None:
    res = dgchat("generate", "-m", str(llada_gguf), "-p", "Halt, traveller", "--gen-length", "32", "--steps", "16",
                 "--block-length", "8", "--json", "--seed", "3")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["architecture"] == "llada" and out["stop_reason"] in ("eos", "max_tokens")
    stats = out["stats"]
    assert stats["steps"] == 16 and stats["canvases"] == 1 and stats["tokens"] == len(out["tokens"]) <= 32
    assert stats["model_s"] > 0 and stats["tokens_per_s"] > 0
    assert out["settings"]["block_length"] == 8
    assert out["params"]["block_length"] == {"value": 8, "source": "flag"}
    # deterministic under a seed
    again = json.loads(dgchat("generate", "-m", str(llada_gguf), "-p", "Halt, traveller", "--gen-length", "32",
                              "--steps", "16", "--block-length", "8", "--json", "--seed", "3").stdout)
    assert again["tokens"] == out["tokens"]


def test_prompt_from_stdin_and_raw(dream_gguf: Path) -> None:
    raw = dgchat("generate", "-m", str(dream_gguf), "--raw", "--gen-length", "16", "--steps", "8", "--json",
                 input="Once upon a time")
    assert raw.returncode == 0, raw.stderr
    chat = dgchat("generate", "-m", str(dream_gguf), "--gen-length", "16", "--steps", "8", "--json", "-p", "-",
                  input="Once upon a time")
    assert chat.returncode == 0, chat.stderr
    n_raw = json.loads(raw.stdout)["stats"]["prompt_tokens"]
    n_chat = json.loads(chat.stdout)["stats"]["prompt_tokens"]
    assert n_chat >= n_raw + 6  # the ChatML template adds <|im_start|>user\n ... <|im_end|>\n<|im_start|>assistant\n


def test_visual_draws_the_canvas(llada_gguf: Path) -> None:
    run = InTerminal("generate", "-m", str(llada_gguf), "-p", "hi", "--gen-length", "16", "--steps", "4", "--visual")
    rc, err = run.finish()
    assert rc == 0, err
    assert "step 4 (canvas 1, 4/4)" in run.text and "16/16 tokens" in run.text  # the last frame, at least
    assert "--visual" not in err


def test_visual_to_a_pipe_prints_the_answer_only(llada_gguf: Path) -> None:
    """Issue 43, item 17: --visual redraws one frame in place; to a pipe or a file it would write
    every step as a new block of text, so there it is ignored (one line on stderr says so) and the
    output is the answer, exactly as without --visual."""
    args = ("generate", "-m", str(llada_gguf), "-p", "hi", "--gen-length", "32", "--steps", "16", "--seed", "3")
    env = pipe_env()
    visual = subprocess.run([sys.executable, "-m", "dgchat", *args, "--visual"], capture_output=True, text=True,
                            timeout=120, env=env, check=False)
    plain = subprocess.run([sys.executable, "-m", "dgchat", *args], capture_output=True, text=True, timeout=120,
                           env=env, check=False)
    assert visual.returncode == 0 and plain.returncode == 0, visual.stderr + plain.stderr
    assert plain.stdout.strip() and visual.stdout == plain.stdout
    assert "step " not in visual.stdout and "tok/s" not in visual.stdout
    note = [line for line in visual.stderr.splitlines() if "--visual" in line]
    assert note == [("dgchat: warning: --visual ignored: the output is not a terminal, so only the answer is "
                     "printed (--record FILE.cast keeps every step)")], visual.stderr


@pytest.mark.skipif(bundled_model_path() is None, reason="this installation has no bundled model")
def test_visual_never_prints_special_tokens_nor_past_the_end() -> None:
    """The bundled model decides <pad> and <end_of_turn> mid-answer (checked here on the same run):
    no frame shows their text, and the last frame ends where the answer ends."""
    from dgchat.model_backend.canvas import Cell
    from dgchat.model_backend.loader import load_engine
    from dgchat.model_backend.events import StepEvent
    from dgchat.model_backend.params import DiffusionParams

    model, prompt = bundled_model_path(), "Halt, traveller! Who goes there?"
    with load_engine(model) as engine:
        specials = [engine.piece(t) for t in range(engine.model.n_vocab) if engine.is_special(t)]
        events = list(engine.generate(engine.chat_prompt([{"role": "user", "content": prompt}]),
                                      DiffusionParams(seed=0)))
        steps = [ev for ev in events if isinstance(ev, StepEvent)]
        decided = [int(t) for ev in steps for t in ev.canvas.tokens[ev.canvas.state != Cell.MASKED]]
        decided_pieces = {engine.piece(t) for t in decided}  # (while the model is loaded)
    assert {"<pad>", "<end_of_turn>"} <= decided_pieces, "nothing special decided: proves nothing"
    assert events[-1].stop_reason == "eos"
    # a terminal wide enough for the progress line and the answer on one line each; the frames a
    # terminal is shown come at most 30 a second (each replacing the last), the last one always
    run = InTerminal("generate", "-m", str(model), "-p", prompt, "--seed", "0", "--visual", cols=400)
    rc, err = run.finish()
    assert rc == 0, err
    last = max(ev.canvas_index for ev in steps)
    assert f"(canvas {last + 1}, " in run.text
    for piece in specials:
        assert piece not in run.text
    answer = events[-1].text
    # the last frame (all decided, the end token among them) reads exactly as the answer printed after it
    assert run.text.endswith(f"\n{answer}\n{answer}\n")


def test_reference_mode_and_threshold(llada_gguf: Path) -> None:
    res = dgchat("generate", "-m", str(llada_gguf), "-p", "hi", "--mode", "reference", "--eps", "0.001",
                 "--gen-length", "24", "--steps", "8", "--top-k", "1", "--json")
    assert res.returncode == 0, res.stderr
    res = dgchat("generate", "-m", str(llada_gguf), "-p", "hi", "--gen-length", "32", "--block-length", "8",
                 "--threshold", "0.5", "--json")
    assert res.returncode == 0, res.stderr
    stats = json.loads(res.stdout)["stats"]
    assert stats["steps"] <= 32


def _one_line_error(res: subprocess.CompletedProcess, pattern: str) -> None:
    assert res.returncode == 2, (res.returncode, res.stderr)
    err = [line for line in res.stderr.splitlines() if line.startswith("dgchat: error:")]
    assert len(err) == 1 and pattern in err[0], res.stderr
    assert "Traceback" not in res.stderr


def test_bad_inputs(tmp_path: Path, llada_gguf: Path, causal_gguf: Path, unknown_arch_gguf: Path,
                    small_ctx_gguf: Path) -> None:
    _one_line_error(dgchat("generate", "-m", str(causal_gguf), "-p", "x"), "causal (autoregressive) model")
    _one_line_error(dgchat("generate", "-m", str(unknown_arch_gguf), "-p", "x"), "unknown model architecture: 'foo'")
    trunc = tmp_path / "trunc.gguf"
    trunc.write_bytes(llada_gguf.read_bytes()[:-1000])
    _one_line_error(dgchat("generate", "-m", str(trunc), "-p", "x"), "truncated")
    junk = tmp_path / "junk.gguf"
    junk.write_text("this is not a model\n")
    _one_line_error(dgchat("generate", "-m", str(junk), "-p", "x"), "not a GGUF file")
    _one_line_error(dgchat("generate", "-m", str(tmp_path / "none.gguf"), "-p", "x"), "not found")
    _one_line_error(dgchat("generate", "-m", str(small_ctx_gguf), "-p", "word " * 80), "exceeds the model's context")
    _one_line_error(dgchat("generate", "-m", str(llada_gguf), "-p", "x", "--steps", "0"), "--steps")
    _one_line_error(dgchat("generate", "-m", str(llada_gguf), "-p", "x", "--gen-length", "30", "--block-length", "8"),
                    "not divisible by block length 8")
    _one_line_error(dgchat("generate", "-m", str(llada_gguf), "-p", "x", "--algorithm", "best"), "invalid choice")


def test_ctrl_c_stops_cleanly(llada_gguf: Path) -> None:
    # --visual on a terminal draws the canvas: its first frame proves generation is under way,
    # however fast the machine, before Ctrl-C arrives
    run = InTerminal("generate", "-m", str(llada_gguf), "-p", "tell me a long story", "--gen-length", "512",
                     "--steps", "4096", "--block-length", "8", "--max-tokens", "512", "--visual")
    try:
        assert run.read_until("step ") and run.proc.poll() is None, run.text
        run.proc.send_signal(signal.SIGINT)
    finally:
        rc, err = run.finish(timeout=60)
    assert rc == 130, err
    assert "generation stopped" in err and "Traceback" not in err


def test_record_writes_an_asciicast_that_replays_into_the_answer(tmp_path: Path, llada_gguf: Path) -> None:
    """--record next to --json: the .cast has a v2 header, one frame per step at the chosen pace,
    and played in a terminal emulator ends on the answer the command printed."""
    import re

    from fixtures.terminal_screen import TerminalScreen

    target = tmp_path / "new folder" / "answer.cast"
    res = dgchat("generate", "-m", str(llada_gguf), "-p", "Halt, traveller", "--gen-length", "32", "--steps", "8",
                 "--seed", "3", "--json", "--record", str(target), "--record-pace", "0.25", "--record-width", "50")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert f"recording written to {target}" in res.stderr
    lines = target.read_text(encoding="utf-8").splitlines()
    header = json.loads(lines[0])
    assert header["version"] == 2 and header["width"] == 50 and header["height"] >= 2
    assert isinstance(header["timestamp"], int) and header["title"] == "dgchat · tiny-llada.gguf · Halt, traveller"
    frames = [json.loads(line) for line in lines[1:]]
    steps = [f for f in frames if "step " in f[2]]
    assert [f[0] for f in steps] == [0.25 * i for i in range(8)]
    assert re.sub(r"\x1b\[[0-9;]*m", "", steps[-1][2]).count("step 8 (canvas 1, 8/8)") == 1
    screen = TerminalScreen(header["width"], header["height"])
    for frame in frames:
        screen.feed(frame[2])
    shown = screen.lines()
    assert re.fullmatch(rf"{out['stats']['tokens']} tokens · 8 steps · \d+\.\d s", shown[0]), shown[0]
    squeeze = lambda s: re.sub(r"\s", "", s)  # noqa: E731
    assert squeeze("".join(shown[1:])) == squeeze(out["text"].translate(VISIBLE_CONTROLS))
    assert sorted(p.name for p in target.parent.iterdir()) == ["answer.cast"]  # written atomically


def test_record_refuses_bad_targets_and_settings_before_loading(tmp_path: Path, llada_gguf: Path) -> None:
    blocker = tmp_path / "a file"
    blocker.write_text("")
    for extra, pattern in (
        (["--record", str(tmp_path)], "a folder"),
        (["--record", str(blocker / "x.cast")], "is a file, not a folder"),
        (["--record", str(tmp_path / "x.cast"), "--record-pace", "fast"], "--record-pace must be"),
        (["--record", str(tmp_path / "x.cast"), "--record-width", "5"], "width must be 20-400"),
    ):
        # a missing model file proves the check runs before the model would load
        _one_line_error(dgchat("generate", "-m", str(tmp_path / "none.gguf"), "-p", "x", *extra), pattern)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a file"]
