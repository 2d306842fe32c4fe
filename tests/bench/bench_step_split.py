"""How a denoising step's time splits between llama.cpp and the Python sampler.

Canvas 256, prompt 64 tokens, on the test fixture models (built here) or the given GGUFs (the
bundled model: `--model assets/dgchat-tiny-plays.gguf`), for each sampler mode.
Prints one table; the numbers are ratios from one run on this machine (time is noisy, shares are not).

    python tests/bench/bench_step_split.py [--model PATH ...] [--steps N]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fixtures.gguf_models import TinySpec, write_tiny_gguf  # noqa: E402
from dgchat.model_backend.engine import DiffusionEngine  # noqa: E402
from dgchat.model_backend.events import FinalEvent  # noqa: E402
from dgchat.model_backend.params import DiffusionParams  # noqa: E402

CONFIGS = {
    "dgchat greedy (block 32)": dict(block_length=32, temperature=0.0, algorithm="confidence"),
    "dgchat sampled t=0.8 top-p .95": dict(block_length=32, temperature=0.8, top_p=0.95, algorithm="confidence"),
    "dgchat entropy (eps)": dict(eps=1e-3, temperature=0.0, algorithm="entropy"),
    "reference greedy (eps)": dict(eps=1e-3, temperature=0.0, top_k=1, mode="reference"),
    "reference sampled t=0.8 top-k 40": dict(eps=1e-3, temperature=0.8, top_k=40, top_p=0.95, mode="reference"),
}
# uniform-state models (DiffusionGemma, the bundled model): the entropy-bound sampler
UNIFORM_CONFIGS = {
    "entropy-bound (model defaults)": dict(),
    "entropy-bound 2.0": dict(entropy_bound=2.0),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", action="append", default=[])
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--canvas", type=int, default=256)
    args = ap.parse_args()
    models = [Path(m) for m in args.model]
    tmp = Path(tempfile.mkdtemp())
    if not models:
        models = [
            write_tiny_gguf(tmp / "tiny-llada.gguf", TinySpec(arch="llada")),
            write_tiny_gguf(tmp / "fixture-llada-wide.gguf",
                            TinySpec(arch="llada", n_embd=256, n_layer=4, n_head=8, n_head_kv=4, n_ff=768)),
        ]
    print(f"canvas {args.canvas}, prompt {args.prompt_tokens} tokens, {args.steps} steps")
    print(f"{'model':28} {'configuration':32} {'ms/step':>8} {'llama.cpp':>10} {'sampler':>8} {'share':>6}")
    for path in models:
        with DiffusionEngine.load(path) as engine:
            words = engine.encode("Halt, traveller! None may pass the gate after dark. " * 20)
            prompt = words[: args.prompt_tokens]
            for name, cfg in (UNIFORM_CONFIGS if engine.info.uniform_state else CONFIGS).items():
                params = DiffusionParams(steps=args.steps, gen_length=args.canvas, max_tokens=args.canvas,
                                         early_stop=False, **cfg)
                # warm-up run, then the measured one
                for _ in range(2):
                    final = [e for e in engine.generate(prompt, params) if isinstance(e, FinalEvent)][0]
                s = final.stats
                print(f"{path.stem[:28]:28} {name:32} {s.ms_per_step:8.2f} {1000 * s.model_s / s.steps:10.2f} "
                      f"{1000 * s.sampler_s / s.steps:8.2f} {100 * s.sampler_share:5.1f}%")


if __name__ == "__main__":
    main()
