"""Screenshots of the chat app for the docs: mid-generation and after the answer.

    python tests/bench/app_screenshots.py [--model M.gguf] [--out docs] [--hold-at STEP]
    python tests/bench/app_screenshots.py --model assets/dgchat-tiny-plays.gguf --hold-at 15   # docs/*.png

Runs the real app headless (Textual's SVG export), holds one generation at a fixed step for the
live-canvas shot, lets it finish for the answer shot, and converts the SVGs to PNG with
`rsvg-convert` (Debian: librsvg2-bin) or, failing that, the `cairosvg` Python package.

Without --model it uses a small random-weight test model; its tokens are limited to word-like
vocabulary entries (a logit bias) so that the pictures show words rather than byte fragments, and
its sampler settings are fixed here. With --model (the docs use the bundled model) the model's own
defaults run, with seed 7, unbiased.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from fixtures.app_harness import GatedEngine  # noqa: E402

SIZE = (120, 36)
PROMPTS = ("Who guards the gate after dark?", "And what does the baker sell?")


def to_png(svg: str, target: Path) -> None:
    # rsvg drops the width of a leading no-break space in a <text>; plain spaces kept by
    # xml:space="preserve" render the same cells correctly
    svg = svg.replace("&#160;", " ").replace("<svg ", '<svg xml:space="preserve" ', 1)
    with tempfile.NamedTemporaryFile("w", suffix=".svg", delete=False, encoding="utf-8") as handle:
        handle.write(svg)
        source = handle.name
    try:
        if shutil.which("rsvg-convert"):
            subprocess.run(["rsvg-convert", source, "-o", str(target)], check=True)
        else:
            import cairosvg  # type: ignore[import-not-found]

            cairosvg.svg2png(url=source, write_to=str(target))
    finally:
        os.unlink(source)


def word_bias(engine) -> tuple[tuple[int, float], ...]:
    """Ban every token that is not a word piece (bytes, digits, specials, end tokens)."""
    ok = re.compile(r"^ [A-Za-z]{2,}[,.!?]?$")
    return tuple((t, -100.0) for t in range(engine.model.n_vocab) if not ok.match(engine.piece(t)))


async def shoot(model: Path, out: Path, random_weights: bool, hold_at: int) -> None:
    from dgchat.app.main import build_app

    app = build_app(argparse.Namespace(model=str(model), chat=None))
    async with app.run_test(size=SIZE) as pilot:
        while app.session.engine is None:
            await asyncio.sleep(0.02)
        screen = app.chat_screen
        if random_weights:
            bias = word_bias(app.session.engine)
            plain = screen.effective_params
            screen.effective_params = lambda engine: dataclasses.replace(plain(engine), logit_bias=bias)  # type: ignore[method-assign]

        # a first exchange, answered in full
        screen.query_one("#prompt").insert(PROMPTS[0])
        await pilot.press("enter")
        while screen.generation is not None:
            await asyncio.sleep(0.02)
        # the second answer, held mid-way for the live-canvas shot
        real = app.session.engine
        app.session.engine = gated = GatedEngine(real, hold_at=hold_at, elapsed_per_step=0.04)
        screen.query_one("#prompt").insert(PROMPTS[1])
        await pilot.press("enter")
        while not gated.holding.is_set():
            await asyncio.sleep(0.02)
        await pilot.pause(1.0)  # the live canvas redraws at its refresh rate: let it show the held step
        to_png(app.export_screenshot(title="dgchat"), out / "app-mid-generation.png")
        gated.release.set()
        while screen.generation is not None:
            await asyncio.sleep(0.02)
        await pilot.pause(0.3)
        to_png(app.export_screenshot(title="dgchat"), out / "app-answer.png")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="GGUF to use (default: a small random-weight test model)")
    parser.add_argument("--out", default=str(HERE.parent.parent / "docs"), help="folder for the PNGs")
    parser.add_argument("--hold-at", type=int, default=9, help="the denoising step the live-canvas shot shows")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dgchat-shots-") as tmp:
        home = Path(tmp) / "home"
        (home / "config").mkdir(parents=True)
        sampler = ('steps = 24\ngen_length = 96\nblock_length = 32\nmax_tokens = 96\ntemperature = 0.9\nseed = 7\n'
                   if args.model is None else 'seed = 7\n')
        (home / "config" / "config.toml").write_text('theme = "dark"\n[sampler]\n' + sampler)
        os.environ["DGCHAT_HOME"] = str(home)
        os.environ.pop("NO_COLOR", None)
        model = Path(args.model) if args.model else None
        if model is None:
            from fixtures.gguf_models import TinySpec, write_tiny_gguf

            model = write_tiny_gguf(Path(tmp) / "tiny-llada.gguf",
                                    TinySpec(arch="llada", n_embd=128, n_layer=2, n_head=4, n_head_kv=2, n_ff=256, seed=3))
        asyncio.run(shoot(model, out, random_weights=args.model is None, hold_at=args.hold_at))
    print(f"wrote {out / 'app-mid-generation.png'} and {out / 'app-answer.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
