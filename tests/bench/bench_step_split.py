"""How a denoising step's time splits between llama.cpp (the backend) and Python (the host).

Canvas 256, prompt 64 tokens, on the test fixture models (built here) or the given GGUFs (the
bundled model: `--model assets/dgchat-tiny-plays.gguf`), for each sampler mode, with the
vocabulary-wide sampler work on the backend (dgchat's engine) and on the host (numpy) side by side.
Prints one table; the numbers are ratios from one run on this machine (time is noisy, shares are not).
Where the engine runs the head's statistics as one CPU kernel (engine/patches/0011), a third row per
configuration runs the graph of separate nodes it replaced (DGCHAT_FUSED_HEAD=0), in a second engine.

    python tests/bench/bench_step_split.py [--model PATH ...] [--steps N] [--threads N]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fixtures.gguf_models import TinySpec, write_tiny_gguf  # noqa: E402
from dgchat.model_backend.loader import load_engine  # noqa: E402
from dgchat.model_backend.events import FinalEvent  # noqa: E402
from dgchat.model_backend.llamacpp import engine_info  # noqa: E402
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
    # a low temperature puts many probabilities in float32's subnormal range (engine/patches/0010)
    "entropy-bound T 0.1-0.3": dict(t_min=0.1, t_max=0.3),
}


@contextlib.contextmanager
def graph_of_nodes():
    """Heads set up inside run as the graph of separate nodes (read by llama.cpp at head set-up)."""
    old = os.environ.get("DGCHAT_FUSED_HEAD")
    os.environ["DGCHAT_FUSED_HEAD"] = "0"
    try:
        yield
    finally:
        if old is None:
            del os.environ["DGCHAT_FUSED_HEAD"]
        else:
            os.environ["DGCHAT_FUSED_HEAD"] = old


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", action="append", default=[])
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--canvas", type=int, default=256)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    models = [Path(m) for m in args.model]
    tmp = Path(tempfile.mkdtemp())
    if not models:
        models = [
            write_tiny_gguf(tmp / "tiny-llada.gguf", TinySpec(arch="llada")),
            write_tiny_gguf(tmp / "fixture-llada-wide.gguf",
                            TinySpec(arch="llada", n_embd=256, n_layer=4, n_head=8, n_head_kv=4, n_ff=768)),
        ]
    print(f"canvas {args.canvas}, prompt {args.prompt_tokens} tokens, {args.steps} steps; backend = llama.cpp, "
          "host = Python; 'sampler on' = where the vocabulary-wide part of a step runs")
    print(f"{'model':28} {'configuration':32} {'sampler on':>14} {'ms/step':>8} {'backend':>8} {'host':>7} "
          f"{'host share':>10} {'vs host':>7}")
    for path in models:
        with contextlib.ExitStack() as stack:
            engine = stack.enter_context(load_engine(path, n_threads=args.threads))
            words = engine.encode("Halt, traveller! None may pass the gate after dark. " * 20)
            prompt = words[: args.prompt_tokens]
            places = ("host", "backend") if engine.backend_sampler else ("host",)
            nodes = None  # the engine whose heads are the graph of nodes
            if engine.backend_sampler and engine_info().patch_level >= 5 and not engine.model.output_on_gpu:
                places += ("nodes",)
                nodes = stack.enter_context(load_engine(path, n_threads=args.threads))
            for name, cfg in (UNIFORM_CONFIGS if engine.info.uniform_state else CONFIGS).items():
                host_ms = None
                for where in places:
                    if cfg.get("mode") == "reference" and where != "host":
                        continue  # reference mode samples on the host, as llama.cpp's example does
                    params = DiffusionParams(steps=args.steps, gen_length=args.canvas, max_tokens=args.canvas,
                                             early_stop=False, confidence_threshold=-1.0,
                                             sampler_on="host" if where == "host" else "backend", **cfg)
                    runner = nodes if where == "nodes" else engine
                    # warm-up run, then the measured one
                    with graph_of_nodes() if where == "nodes" else contextlib.nullcontext():
                        for _ in range(2):
                            final = [e for e in runner.generate(prompt, params) if isinstance(e, FinalEvent)][0]
                    s = final.stats
                    host_ms = s.ms_per_step if where == "host" else host_ms
                    speedup = f"{host_ms / s.ms_per_step:6.2f}x" if host_ms else "      -"
                    label = "backend, nodes" if where == "nodes" else s.sampler_on
                    print(f"{path.stem[:28]:28} {name:32} {label:>14} {s.ms_per_step:8.2f} "
                          f"{1000 * s.model_s / s.steps:8.2f} {1000 * s.sampler_s / s.steps:7.2f} "
                          f"{100 * s.sampler_share:9.1f}% {speedup}")


if __name__ == "__main__":
    main()
