"""Graph splits per denoising step with every layer on a device, and the ops that run on the CPU.

ggml's scheduler cuts a graph into splits, one per run of nodes on the same backend; a node whose op
the device does not support (ggml's supports_op) goes to the CPU, and every switch costs a copy of
the split's inputs and a synchronisation. This runs a few denoising steps of a model with every
layer offloaded (n_gpu_layers=999) and GGML_SCHED_DEBUG=2 set, so ggml prints each graph's split
assignment, and reports per decode: the number of splits, the nodes per backend, and the CPU nodes
grouped by op and name. Nodes that only read weights or inputs kept on the CPU (the token embedding
lookup) are listed as such: they are one split at the start, not a round trip.

    GGML_VK_VISIBLE_DEVICES=0 python tests/bench/bench_device_splits.py --model M.gguf [--steps 4]

`--planned` loads by model_backend/placement.py's plan instead of every layer (with
DGCHAT_GPU_MEMORY=1G, say, a mixture of experts keeps its first layers' experts in RAM): the
expert products of those layers then show where llama.cpp runs them, on the CPU (a CPU split per
such layer) or on the device with the weights copied from RAM (ggml's op offload of batches of 32
or more; the copies are the split inputs counted here).

On a CPU-only engine there is nothing to offload and the script says so. Used by
tests/bench/vulkan_check.sh (lavapipe) and usable as is on CUDA or Metal.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
from pathlib import Path

os.environ.setdefault("GGML_SCHED_DEBUG", "2")  # read when llama.cpp creates a scheduler

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from dgchat.model_backend import llamacpp  # noqa: E402
from dgchat.model_backend.llamacpp.library import set_log_hook  # noqa: E402
from dgchat.model_backend.loader import load_engine  # noqa: E402
from dgchat.model_backend.events import StepEvent  # noqa: E402
from dgchat.model_backend.params import DiffusionParams  # noqa: E402

SPLIT_RE = re.compile(r"^## SPLIT #(\d+): (\S+) # (\d+) inputs")
# node # 12 (  MUL_MAT):        blk.0.attn_q (  96K) [Vulkan0     ]  use=1,c=1: ...
NODE_RE = re.compile(r"^node #\s*(\d+) \(\s*([^)]*?)\s*\):\s*(.{1,20}?)\s*\(\s*[^)]*\)\s*\[\s*(\S*)")


class GraphLog:
    """Collects ggml's scheduler debug lines, one entry per graph the scheduler split."""

    def __init__(self) -> None:
        self.graphs: list[dict] = []
        self._current: dict | None = None
        self._partial = ""
        self.weights_off_device: list[str] = []  # llama.cpp's "cannot be used with preferred buffer type" lines

    def __call__(self, chunk: str) -> None:  # llama.cpp logs in pieces: whole lines here
        *lines, self._partial = (self._partial + chunk).split("\n")
        for line in lines:
            self._line(line.strip())

    def _line(self, line: str) -> None:
        if "cannot be used with preferred buffer type" in line:
            self.weights_off_device.append(line.split(": ", 1)[-1])
            return
        m = SPLIT_RE.match(line)
        if m:
            if m.group(1) == "0":
                self._current = {"splits": [], "nodes": collections.Counter(), "cpu": collections.Counter()}
                self.graphs.append(self._current)
            if self._current is not None:
                self._current["splits"].append((m.group(2), int(m.group(3))))
            return
        m = NODE_RE.match(line)
        if m and self._current is not None:
            op, name, backend = m.group(2), m.group(3), m.group(4)
            self._current["nodes"][backend] += 1
            if backend.upper().startswith("CPU"):
                # layer numbers folded: one line per kind of node, not per layer
                self._current["cpu"][f"{op} {re.sub(r'-[0-9]+$', '-N', name)}"] += 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=4, help="denoising steps to run (default 4)")
    ap.add_argument("--gen-length", type=int, default=32)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--planned", action="store_true",
                    help="load as placed by free memory ($DGCHAT_GPU_MEMORY), not every layer on the device")
    ap.add_argument("--experts-on", choices=("auto", "cpu", "gpu"), default=None,
                    help="with --planned: where the routed experts may go (default auto)")
    args = ap.parse_args()

    info = llamacpp.engine_info()
    gpus = llamacpp.local_gpu_devices()
    print(f"engine {info.llama_cpp_version} patch level {info.patch_level}; devices: "
          + (", ".join(f"{d.name} ({d.description})" for d in gpus) or "none"))
    if not gpus:
        print("no local GPU device: nothing is offloaded, so there are no device splits to count")
        return 0
    log = GraphLog()
    set_log_hook(log)
    try:
        with load_engine(args.model, n_gpu_layers=None if args.planned else 999, n_threads=args.threads,
                         experts_on=(args.experts_on or "auto") if args.planned else "gpu") as engine:
            print(f"placement: {engine.placement.summary()} ({engine.placement.reason})")
            warm = len(log.graphs)  # graphs split while loading (the reserve passes)
            prompt = engine.chat_prompt([{"role": "user", "content": "Say something to the guard at the gate."}])
            params = DiffusionParams(steps=args.steps, gen_length=args.gen_length, seed=1)
            steps = sum(isinstance(e, StepEvent) for e in engine.generate(prompt, params))
    finally:
        set_log_hook(None)
    run = log.graphs[warm:]
    if not run:
        print("ggml printed no split assignment (GGML_SCHED_DEBUG was not honoured?)")
        return 1
    splits = [len(g["splits"]) for g in run]
    cpu = collections.Counter()
    for g in run:
        cpu.update(g["cpu"])
    per_graph_cpu = {k: v / len(run) for k, v in cpu.items()}
    print(f"model {args.model.name}: {steps} denoising steps, {len(run)} graphs computed")
    print(f"splits per graph: min {min(splits)}, median {int(np.median(splits))}, max {max(splits)}")
    # a weight the device refused at load time (llama.cpp tries each weight's op with 512 rows first:
    # a Vulkan driver whose maxStorageBufferRange is under 512 x n_vocab x 4 bytes keeps the output
    # projection on the CPU) takes its op to the CPU in every graph
    for line in log.weights_off_device:
        print(f"weights kept off the device: {line}")
    last = run[-1]
    # ggml prints a node's backend cut to 5 characters ("Vulka"); the splits carry the whole name
    whole = {b[:5]: b for b, _ in last["splits"]}
    print("last graph: " + ", ".join(f"{whole.get(b, b)} {n} nodes" for b, n in sorted(last["nodes"].items())))
    print("  splits: " + " | ".join(f"{b}({n} in)" for b, n in last["splits"]))
    if per_graph_cpu:
        print("nodes on the CPU, per graph (op, name):")
        for key, n in sorted(per_graph_cpu.items(), key=lambda kv: -kv[1]):
            print(f"  {n:6.1f}  {key}")
    else:
        print("no node on the CPU")
    if args.json:
        args.json.write_text(json.dumps({"model": str(args.model), "steps": steps, "graphs": len(run),
                                         "splits": splits, "cpu_nodes_per_graph": per_graph_cpu,
                                         "weights_off_device": log.weights_off_device,
                                         "devices": [d.name for d in gpus]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
