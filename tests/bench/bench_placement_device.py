"""Experts in RAM on a device with little memory: the placement, the tokens, and the time per step.

Runs the same generation of one DiffusionGemma file under up to three loads:

- `cpu`: every weight in RAM, computed on the CPU. Run it with a CPU-only engine (the default
  `.venv`): in a GPU build llama.cpp sends any product of 32 or more tokens to the device even with
  `--gpu-layers 0` (ggml's op offload copies the weights), so only a CPU build is a CPU reference;
- `device`: every layer on the GPU (`--experts-on gpu`, no memory limit);
- `limited`: the device's memory stated as `--gpu-memory` ($DGCHAT_GPU_MEMORY), placed by
  model_backend/placement.py: with a limit smaller than the model, the first layers' routed experts
  stay in RAM (llama.cpp's tensor buffer-type overrides) and the rest goes to the device.

It prints each load's placement (what went where, bytes per device), ms per step, and how many answer
tokens equal the CPU's (`--reference`: the JSON a `--loads cpu` run wrote) and the device load's.
Exit status 1 when the limited load kept no experts in RAM, or its tokens differ from the device
load's (from the CPU's when no device load ran). The device is the judge, not the CPU: a GPU
backend's own rounding (ggml-vulkan's f16 copies of attention's K, V and Q, also with
GGML_VK_DISABLE_F16=1: logits ~7e-3 from the CPU's, README "What has run where") already moves
sampled tokens of a whole-device load; what the split must not add is a difference of its own.

    python tests/bench/bench_placement_device.py --model assets/dgchat-tiny-plays.gguf --loads cpu \
        --json /tmp/cpu.json
    GGML_VK_VISIBLE_DEVICES=0 GGML_VK_DISABLE_F16=1 .venv-vulkan/bin/python \
        tests/bench/bench_placement_device.py --model assets/dgchat-tiny-plays.gguf --gpu-memory 41M \
        --reference /tmp/cpu.json

The bundled model (DiffusionGemma's layout, 4 experts top-2, 10 MB) planned for 41 MiB keeps the
experts of its first 2 layers in RAM. On lavapipe, models with DiffusionGemma's real widths are out
of reach: the 64-expert fixture below (0.5 GB) had not finished one limited load in 30 minutes on
2 cores, where the CPU build runs its 4 steps in 1 s; on a real GPU use it, or the full-shape file:
`python tests/bench/make_fullshape_dg.py M.gguf --layers 4 --n-embd 512 --n-vocab 4096 --n-expert 64
--n-expert-used 4 --expert-ff 2048 --n-ff 1024 --n-head 8` with `--gpu-memory 704M`.
tests/bench/vulkan_check.sh's `placement` stage runs the bundled-model case.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from dgchat.model_backend import llamacpp  # noqa: E402
from dgchat.model_backend.events import FinalEvent, StepEvent  # noqa: E402
from dgchat.model_backend.loader import load_engine  # noqa: E402
from dgchat.model_backend.params import DiffusionParams  # noqa: E402

PROMPT = [{"role": "user", "content": "Say something to the guard at the gate."}]


def run(model: Path, *, gpu_layers: int | None, experts_on: str, limit: str | None, steps: int,
        gen_length: int, threads: int | None, greedy: bool) -> dict:
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
        if greedy:  # DiffusionGemma's annealed temperature near 0: every draw the argmax
            params = replace(params, t_min=1e-6, t_max=2e-6)
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
    ap.add_argument("--loads", default="device,limited", help="which loads to run: cpu, device, limited")
    ap.add_argument("--reference", type=Path, default=None, help="a `--loads cpu` run's JSON: tokens to match")
    ap.add_argument("--gpu-memory", default="41M", help="the device memory the limited load may use")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--gen-length", type=int, default=32)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--greedy", action="store_true",
                    help="temperatures near 0: tokens are argmaxes, which a device's rounding moves far less often")
    args = ap.parse_args()

    info = llamacpp.engine_info()
    gpus = llamacpp.local_gpu_devices()
    print(f"engine {info.llama_cpp_version} patch level {info.patch_level}; devices: "
          + (", ".join(f"{d.name} ({d.description}, {d.memory_free / 2**30:.1f} GiB free)" for d in gpus) or "none"))
    loads = [name.strip() for name in args.loads.split(",") if name.strip()]
    if loads != ["cpu"] and not gpus:
        print("no local GPU device: nothing to place")
        return 0
    if "cpu" in loads and gpus:
        print("note: a GPU build's `cpu` load still offloads large products to the device (see --help)")
    common = dict(steps=args.steps, gen_length=args.gen_length, threads=args.threads, greedy=args.greedy)
    settings = {"cpu": dict(gpu_layers=0, experts_on="auto", limit=None),
                "device": dict(gpu_layers=None, experts_on="gpu", limit=None),
                "limited": dict(gpu_layers=None, experts_on="auto", limit=args.gpu_memory)}
    results = {name: run(args.model, **settings[name], **common) for name in loads}
    reference = (json.loads(args.reference.read_text())["cpu"]["tokens"] if args.reference
                 else results.get("cpu", {}).get("tokens"))
    print(f"model {args.model.name}; {args.steps} steps, canvas {args.gen_length}; "
          f"GGML_VK_DISABLE_F16={os.environ.get('GGML_VK_DISABLE_F16', '')!r}")
    device_tokens = results.get("device", {}).get("tokens")

    def equal(tokens: list[int], other: list[int] | None) -> int | None:
        return int((np.asarray(tokens) == np.asarray(other)).sum()) if other and len(other) == len(tokens) else None

    def shown(n: int | None, total: int) -> str:
        return f"{n:>5} / {total:<4}" if n is not None else f"{'-':>12}"

    print(f"{'load':8} {'ms/step':>9} {'load s':>7}  {'tokens = CPU':>12}  {'= device':>12}  placement")
    for name, r in results.items():
        r["tokens_equal_reference"] = equal(r["tokens"], reference)
        r["tokens_equal_device"] = equal(r["tokens"], device_tokens)
        limit = f" (limit {args.gpu_memory})" if name == "limited" else ""
        print(f"{name:8} {r['ms_per_step']:9.1f} {r['load_s']:7.1f}  {shown(r['tokens_equal_reference'], len(r['tokens']))}"
              f"  {shown(r['tokens_equal_device'], len(r['tokens']))}  {r['summary']}{limit}")
    ok = True
    if "limited" in results:
        limited = results["limited"]
        judge = device_tokens if device_tokens is not None else reference
        ok = bool(limited["placement"]["experts_in_ram"]) and (
            judge is None or equal(limited["tokens"], judge) == len(limited["tokens"]))
        print("placement check: " + ("ok" if ok else "FAILED") + f" (experts in RAM: layers "
              f"{limited['placement']['experts_in_ram']}; reason: {limited['placement']['reason']})")
    if args.json:
        args.json.write_text(json.dumps({"model": str(args.model), "gpu_memory": args.gpu_memory,
                                         "devices": [d.name for d in gpus], **results}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
