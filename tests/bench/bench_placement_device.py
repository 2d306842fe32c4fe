"""Experts in RAM on a device with little memory: the placement, the tokens, and the time per step.

Loads one DiffusionGemma file three ways in one process and runs the same generation on each:

- `cpu`: every weight in RAM, computed on the CPU (`--gpu-layers 0`);
- `device`: every layer on the GPU (`--experts-on gpu`, no memory limit);
- `limited`: the device's memory stated as `--gpu-memory` ($DGCHAT_GPU_MEMORY), placed by
  model_backend/placement.py: with a limit smaller than the model, the first layers' routed experts
  stay in RAM (llama.cpp's tensor buffer-type overrides) and the rest goes to the device.

It prints each load's placement (what went where, bytes per device), ms per step, and how many answer
tokens equal the CPU's; exit status 1 when the limited load did not keep experts in RAM or its tokens
differ from the CPU's. On a software GPU (lavapipe) set GGML_VK_DISABLE_F16=1 for token equality:
ggml-vulkan's f16 operands otherwise move logits by ~1e-2 (README, "What has run where"), which
random weights turn into different draws.

    GGML_VK_VISIBLE_DEVICES=0 GGML_VK_DISABLE_F16=1 python tests/bench/bench_placement_device.py \\
        --model /tmp/dg-L4-16k.gguf --gpu-memory 2G

The model: `python tests/bench/make_fullshape_dg.py /tmp/dg-L4-16k.gguf --layers 4 --n-vocab 16384`
(DiffusionGemma 26B-A4B's widths and 128 experts, 4 layers, a 16,384-token vocabulary: 1.9 GB).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from dgchat.model_backend import llamacpp  # noqa: E402
from dgchat.model_backend.events import FinalEvent, StepEvent  # noqa: E402
from dgchat.model_backend.loader import load_engine  # noqa: E402
from dgchat.model_backend.params import DiffusionParams  # noqa: E402

PROMPT = [{"role": "user", "content": "Say something to the guard at the gate."}]


def run(model: Path, *, gpu_layers: int | None, experts_on: str, limit: str | None, steps: int,
        gen_length: int, threads: int | None) -> dict:
    """One load and one generation; the limit is read by the load (model_backend/llamacpp/offload.py)."""
    if limit is None:
        os.environ.pop(llamacpp.GPU_MEMORY_ENV, None)
    else:
        os.environ[llamacpp.GPU_MEMORY_ENV] = limit
    t0 = time.perf_counter()
    with load_engine(model, n_gpu_layers=gpu_layers, experts_on=experts_on, n_threads=threads) as engine:
        load_s = time.perf_counter() - t0
        placement = engine.placement
        prompt = engine.chat_prompt(PROMPT)
        # random weights: every step runs (no early stop, a confidence threshold never reached)
        params = DiffusionParams(steps=steps, gen_length=gen_length, max_tokens=gen_length, seed=1,
                                 early_stop=False, confidence_threshold=-1.0)
        t1 = time.perf_counter()
        events = list(engine.generate(prompt, params))
        wall = time.perf_counter() - t1
    final = events[-1]
    assert isinstance(final, FinalEvent)
    n_steps = sum(isinstance(e, StepEvent) for e in events)
    return {"placement": placement.as_json(), "summary": placement.summary(), "load_s": round(load_s, 2),
            "steps": n_steps, "ms_per_step": round(1000 * wall / max(1, n_steps), 1),
            "tokens": [int(t) for t in final.tokens]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--gpu-memory", default="2G", help="the device memory the limited load may use (default 2G)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--gen-length", type=int, default=32)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    info = llamacpp.engine_info()
    gpus = llamacpp.local_gpu_devices()
    print(f"engine {info.llama_cpp_version} patch level {info.patch_level}; devices: "
          + (", ".join(f"{d.name} ({d.description}, {d.memory_free / 2**30:.1f} GiB free)" for d in gpus) or "none"))
    if not gpus:
        print("no local GPU device: nothing to place")
        return 0
    common = dict(steps=args.steps, gen_length=args.gen_length, threads=args.threads)
    results = {
        "cpu": run(args.model, gpu_layers=0, experts_on="auto", limit=None, **common),
        "device": run(args.model, gpu_layers=None, experts_on="gpu", limit=None, **common),
        "limited": run(args.model, gpu_layers=None, experts_on="auto", limit=args.gpu_memory, **common),
    }
    cpu_tokens = np.asarray(results["cpu"]["tokens"])
    print(f"model {args.model.name}; {args.steps} steps, canvas {args.gen_length}; "
          f"GGML_VK_DISABLE_F16={os.environ.get('GGML_VK_DISABLE_F16', '')!r}")
    print(f"{'load':8} {'ms/step':>9} {'load s':>7}  {'tokens = CPU':>12}  placement")
    for name, r in results.items():
        same = int((np.asarray(r["tokens"]) == cpu_tokens).sum()) if len(r["tokens"]) == cpu_tokens.size else 0
        r["tokens_equal_cpu"] = same
        limit = f" (limit {args.gpu_memory})" if name == "limited" else ""
        print(f"{name:8} {r['ms_per_step']:9.1f} {r['load_s']:7.1f}  {same:>5} / {cpu_tokens.size:<4}  "
              f"{r['summary']}{limit}")
    limited = results["limited"]
    ok = bool(limited["placement"]["experts_in_ram"]) and limited["tokens_equal_cpu"] == cpu_tokens.size
    print("placement check: " + ("ok" if ok else "FAILED") + f" (experts in RAM: layers "
          f"{limited['placement']['experts_in_ram']}; reason: {limited['placement']['reason']})")
    if args.json:
        args.json.write_text(json.dumps({"model": str(args.model), "gpu_memory": args.gpu_memory,
                                         "devices": [d.name for d in gpus], **results}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
