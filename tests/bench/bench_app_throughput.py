"""Tokens/s inside the chat app vs `dgchat generate`, same model and settings, side by side.

    python tests/bench/bench_app_throughput.py [--model M.gguf] [--runs 5] [--steps 64 --gen-length 64]

Without --model a random-weight llada GGUF is built (tests/fixtures/gguf_models.py): `--size medium`
(default, ~65 ms a step on one core, like a small real model) or `--size small` (~10 ms a step, the
worst case for the UI). Each round runs:

  cli       `python -m dgchat generate --json` in a subprocess (the command users run)
  app-pty   the full app in a pseudo-terminal: the real Textual driver writes every frame as
            escape codes (the parent drains them), the live canvas repaints at refresh_hz
  app-headless  the same app under Textual's headless driver (what the tests use)

and reads tokens/s from the generation statistics (tokens / generation time, model load excluded;
the same numbers `dgchat generate --json` prints). Rounds alternate so machine-load drift hits
every mode alike; the report gives medians and the ratio app / cli (target >= 0.9).
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import os
import pty
import re
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROMPT = "Halt, traveller! None may pass the gate after dark. Who goes there?"


SIZES = {
    # ~60-70 ms a step on one core of the dev machine: the order of a small real model on CPU
    "medium": dict(n_embd=512, n_layer=8, n_head=8, n_head_kv=4, n_ff=1536),
    # ~10 ms a step: the worst case for the UI, whose per-frame cost is then largest by comparison
    "small": dict(n_embd=256, n_layer=4, n_head=4, n_head_kv=2, n_ff=512),
}


def build_model(folder: Path, args: argparse.Namespace) -> Path:
    """A random-weight llada GGUF whose answer to PROMPT fills max_tokens: random weights may emit
    an end token early, which would leave too few tokens to time."""
    sys.path.insert(0, str(HERE.parent))
    from fixtures.gguf_models import TinySpec, write_tiny_gguf

    from dgchat.model_backend.loader import load_engine
    from dgchat.model_backend.params import DiffusionParams

    for seed in range(20):
        path = folder / f"bench-llada-{args.size}-{seed}.gguf"
        write_tiny_gguf(path, TinySpec(arch="llada", seed=seed, **SIZES[args.size]))
        with load_engine(path) as engine:
            prompt = engine.chat_prompt([{"role": "user", "content": PROMPT}])
            params = DiffusionParams(steps=args.steps, gen_length=args.gen_length, max_tokens=args.max_tokens)
            final = list(engine.generate(prompt, params))[-1]
        if final.stats.tokens >= args.max_tokens:
            return path
    raise RuntimeError("no seed gave a full-length answer; pass --model")


# -- the CLI ----------------------------------------------------------------------------------------
def run_cli(model: Path, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, "-m", "dgchat", "generate", "-m", str(model), "-p", PROMPT, "--json",
           "--steps", str(args.steps), "--gen-length", str(args.gen_length), "--max-tokens", str(args.max_tokens)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=600)
    data = json.loads(out.stdout)
    return {"tokens_per_s": data["stats"]["tokens_per_s"], "tokens": data["stats"]["tokens"],
            "steps": data["stats"]["steps"], "text": data["text"]}


# -- the app (child side) ---------------------------------------------------------------------------
def child(args: argparse.Namespace) -> None:
    """Runs inside the pty (or headless): answer the prompt `runs` times, write the statistics."""
    from dgchat.app.main import build_app

    app = build_app(argparse.Namespace(model=args.model, chat=None))
    results: list[dict] = []
    log = open(args.out + ".log", "w", buffering=1)  # noqa: SIM115 - the child's trace, for failures

    async def pilot_script(pilot) -> None:
        log.write("pilot started\n")
        while app.session.engine is None:
            await asyncio.sleep(0.02)
        log.write(f"model loaded; screen {app.screen}\n")
        screen = app.chat_screen
        for _ in range(args.child_runs):
            screen.action_new_chat()
            screen.query_one("#prompt").insert(PROMPT)
            await pilot.press("enter")

            def answered() -> bool:
                if screen.generation is not None or screen.chat is None:
                    return False
                rows = app.store.messages(screen.chat.id)
                return bool(rows) and rows[-1].role == "assistant" and rows[-1].status != "generating"

            while not answered():
                await asyncio.sleep(0.01)
            canvas = screen.last_canvas
            log.write("answer done\n")
            answer = app.store.messages(screen.chat.id)[-1]
            results.append({"tokens_per_s": answer.meta["stats"]["tokens_per_s"],
                            "tokens": answer.meta["stats"]["tokens"], "steps": answer.meta["stats"]["steps"],
                            "elapsed_s": answer.meta["stats"]["elapsed_s"],
                            "frames": canvas.frames if canvas is not None else 0, "text": answer.content})
        Path(args.out).write_text(json.dumps(results))
        app.exit()

    if args.headless:
        async def main() -> None:
            async with app.run_test(size=(120, 40)) as pilot:
                await pilot_script(pilot)
        asyncio.run(main())
    else:
        app.run(auto_pilot=pilot_script)
    app.store.close()


def _home(folder: Path, args: argparse.Namespace) -> dict:
    home = folder / "home"
    (home / "config").mkdir(parents=True, exist_ok=True)
    threads = f"n_threads = {args.threads}\n" if args.threads else ""
    (home / "config" / "config.toml").write_text(
        f"refresh_hz = {args.refresh_hz}\n{threads}[sampler]\nsteps = {args.steps}\ngen_length = {args.gen_length}\n"
        f"max_tokens = {args.max_tokens}\n"
    )
    env = dict(os.environ, DGCHAT_HOME=str(home), TERM="xterm-256color")
    env.pop("NO_COLOR", None)
    return env


def _child_cmd(model: Path, out: Path, args: argparse.Namespace, headless: bool) -> list[str]:
    cmd = [sys.executable, __file__, "--child", "--model", str(model), "--out", str(out), "--child-runs", "1"]
    return cmd + (["--headless"] if headless else [])


def run_app_pty(model: Path, folder: Path, args: argparse.Namespace) -> dict:
    """The app with its real terminal driver, in a 120x40 pseudo-terminal whose output is drained."""
    out = folder / "app-result.json"
    out.unlink(missing_ok=True)
    env = _home(folder, args)
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen(_child_cmd(model, out, args, headless=False), stdin=slave, stdout=slave, stderr=slave,
                            env=env, close_fds=True, start_new_session=True)
    os.close(slave)
    drained = [0]
    tail = bytearray()  # the last screenful, to explain a failure

    def drain() -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                return
            if not chunk:
                return
            drained[0] += len(chunk)
            tail.extend(chunk)
            del tail[:-20000]

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        pass
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(timeout=5)
        os.close(master)
    if not out.exists():
        text = re.sub(rb"\x1b\[[0-9;?<>]*[A-Za-z]|\x1b\][^\x07]*\x07", b" ", bytes(tail)).decode("utf-8", "replace")
        raise RuntimeError(f"the app run failed (exit {proc.returncode}); last output:\n{' '.join(text.split())[-1500:]}")
    result = json.loads(out.read_text())[0]
    result["terminal_bytes"] = drained[0]
    return result


def run_app_headless(model: Path, folder: Path, args: argparse.Namespace) -> dict:
    out = folder / "app-headless.json"
    out.unlink(missing_ok=True)
    env = _home(folder, args)
    subprocess.run(_child_cmd(model, out, args, headless=True), env=env, check=True, timeout=600,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return json.loads(out.read_text())[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="GGUF to use (default: build a random-weight llada model)")
    parser.add_argument("--size", choices=SIZES, default="medium", help="the built model's size (default: medium)")
    parser.add_argument("--runs", type=int, default=5, help="rounds (each: cli, app-pty, app-headless)")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--gen-length", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1,
                        help="llama.cpp threads for both (default 1: on a small shared machine more threads "
                             "make ggml's thread barriers, not the app, dominate the timings; 0 = llama.cpp's default)")
    parser.add_argument("--refresh-hz", type=int, default=30)
    parser.add_argument("--timeout", type=int, default=300, help="seconds allowed per app run")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--headless", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--child-runs", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return 0

    with tempfile.TemporaryDirectory(prefix="dgchat-bench-") as tmp:
        folder = Path(tmp)
        model = Path(args.model) if args.model else build_model(folder, args)
        print(f"model {model.name} · steps {args.steps} · canvas {args.gen_length} · max tokens {args.max_tokens}"
              f" · refresh {args.refresh_hz} Hz · {os.cpu_count()} CPUs")
        run_cli(model, args)  # warm-up: page cache, pip's bytecode
        rows: dict[str, list[dict]] = {"cli": [], "app-pty": [], "app-headless": []}
        for i in range(args.runs):
            for name, fn in (("cli", lambda: run_cli(model, args)),
                             ("app-pty", lambda: run_app_pty(model, folder, args)),
                             ("app-headless", lambda: run_app_headless(model, folder, args))):
                r = fn()
                rows[name].append(r)
                extra = f" · {r['frames']} repaints" if "frames" in r else ""
                print(f"  round {i + 1} {name:<13} {r['tokens_per_s']:8.1f} tok/s  ({r['tokens']} tokens, "
                      f"{r['steps']} steps{extra})", flush=True)
        same = {r["text"] for rs in rows.values() for r in rs}
        med = {k: statistics.median(r["tokens_per_s"] for r in v) for k, v in rows.items()}
        print()
        print(f"{'mode':<14}{'median tok/s':>14}{'ratio vs cli':>14}")
        for name in rows:
            print(f"{name:<14}{med[name]:>14.1f}{med[name] / med['cli']:>14.3f}")
        print(f"\nsame answer text in every run: {'yes' if len(same) == 1 else 'NO'}")
        ratio = med["app-pty"] / med["cli"]
        print(f"app (real terminal) / dgchat generate = {ratio:.3f}  (target >= 0.9: {'met' if ratio >= 0.9 else 'NOT met'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
