"""How far rounded matrix-product operands move DiffusionGemma's self-conditioning signal.

The diffusion head keeps, for the next denoising step, MLP(softmax(x) @ E): a vocabulary-wide product
and three small ones. On the CPU backend they run in float32 like the host's numpy (the engine's own
check, fixtures/backend_oracle.py, allows 1e-4 relative). GPU backends round f32 x f32 operands:
ggml-vulkan's matmul tiles are f16 on fp16 devices, ggml-cuda's cuBLAS uses TF32 tensor-op math (both
a 10-bit mantissa). This runs the bundled model's denoising loop on the CPU and, at every step,
recomputes the signal on the host three ways - operands rounded to f16, to tf32, and exact with a
float64 sum - against the host's float32 result, and prints the largest relative difference per seed
(the seeds and settings of test_dg_every_backend_step_is_the_numpy_step). The GPU backends' bound in
tests/fixtures/device.py comes from this.

    python tests/bench/signal_rounding.py [--model assets/dgchat-tiny-plays.gguf]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from dgchat.model_backend import diffusion_gemma_embed as dge
from dgchat.model_backend.events import FinalEvent
from dgchat.model_backend.loader import load_engine
from dgchat.model_backend.params import DiffusionParams

BUNDLED = Path(__file__).resolve().parents[2] / "assets" / "dgchat-tiny-plays.gguf"
PROMPT = "Good evening. Have you a bed for the night?"
CASES = [(0, {}), (1, {}), (2, {"t_min": 0.1, "t_max": 0.3})]


def to_f16(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16).astype(np.float32)


def to_tf32(a: np.ndarray) -> np.ndarray:
    """Round to nearest even at 10 mantissa bits, keeping float32's exponent range."""
    b = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    b = (b + np.uint32(0x0FFF) + ((b >> 13) & np.uint32(1))) & np.uint32(0xFFFFE000)
    return b.view(np.float32)


ROUNDINGS = {"f16": to_f16, "tf32": to_tf32, "exact, f64 sums": lambda a: a}


def rounded_signal(sc, embedding: np.ndarray, processed: np.ndarray, rnd) -> np.ndarray:
    """sc.signal(sc.soft_embeddings(...)) with each product's operands rounded by `rnd`, summed in float64."""
    def mm(x, w):
        return (rnd(x).astype(np.float64) @ rnd(w).astype(np.float64)).astype(np.float32)

    probs = dge._softmax(processed.copy())
    probs[probs < dge._F32_TINY] = 0.0  # as both paths do (engine/patches/0010)
    soft = mm(probs, embedding) * np.float32(sc.embed_scale)
    n = dge._rms(soft, sc.eps) * sc.pre_norm
    return mm(dge._gelu_tanh(mm(n, sc.gate.T)) * mm(n, sc.up.T), sc.down.T)


class SignalProbe:
    """An engine step_check: the largest relative signal difference seen, per rounding."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.worst = dict.fromkeys(ROUNDINGS, 0.0)

    def __call__(self, source, items, stats, logits) -> None:
        sc, embedding = self.engine.selfcond, self.engine.embedding
        start = 0
        for _, _, req in items:
            n = req.canvas.size
            x = np.array(logits[start : start + n], dtype=np.float32, copy=True)
            start += n
            if req.sample.bias_ids.size:
                x[:, req.sample.bias_ids] += req.sample.bias_values
            processed = (x * np.float32(req.sample.inv_temp)).astype(np.float32)
            want = sc.signal(sc.soft_embeddings(embedding, processed, None))
            scale = max(1e-6, float(np.abs(want).max()))
            for name, rnd in ROUNDINGS.items():
                got = rounded_signal(sc, embedding, processed, rnd)
                self.worst[name] = max(self.worst[name], float(np.abs(got - want).max()) / scale)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=BUNDLED)
    args = ap.parse_args()
    engine = load_engine(args.model, n_gpu_layers=0)
    if getattr(engine, "selfcond", None) is None:
        print(f"{args.model.name} has no self-conditioning")
        return 1
    with engine:
        prompt = engine.chat_prompt([{"role": "user", "content": PROMPT}])
        for seed, temps in CASES:
            probe = SignalProbe(engine)
            engine.step_check = probe
            try:
                params = DiffusionParams(seed=seed, max_tokens=96, sampler_on="backend", logit_bias=((9, 1.5),),
                                         pad_bias=-1.5, **temps)
                [e for e in engine.generate(prompt, params) if isinstance(e, FinalEvent)]
            finally:
                engine.step_check = None
            print(f"seed {seed} {temps or ''}: largest relative signal difference "
                  + ", ".join(f"{k} {v:.2e}" for k, v in probe.worst.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
