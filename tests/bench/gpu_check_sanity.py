"""Stage (a) of the offline GPU check (tests/bench/gpu_check.sh): is the engine just built the one
we mean, and does it run on the GPU?

Prints llama-cpp-python's version, the patch level (must equal the slim archive's), whether the
build supports GPU offload, then loads a tiny causal llama GGUF (tests/fixtures/gguf_models.py)
twice - every layer on the CPU, then every layer on the GPU - decodes the same tokens, and prints
the largest |logit difference| with llama.cpp's own lines about offloading and the CUDA device.
Exit status 1 when the patch level is wrong, offload is unsupported or nothing was offloaded.

    python tests/bench/gpu_check_sanity.py --expect-patch-level 3 [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))

from dgchat.model_backend import llamacpp as L  # noqa: E402


def logits(path: Path, n_gpu_layers: int, tokens: np.ndarray) -> tuple[np.ndarray, list[str]]:
    before = len(L.recent_log(100000))
    with L.LlamaModel(path, n_gpu_layers=n_gpu_layers) as model:
        ctx = L.LlamaContext(model, n_ctx=256, max_tokens=64, exact_kv=True, n_threads=4)
        try:
            out = np.array(ctx.decode_tokens(tokens, np.arange(tokens.size)), dtype=np.float32, copy=True)
        finally:
            ctx.close()
    lines = L.recent_log(100000)[before:]
    keep = [ln.strip() for ln in lines
            if any(k in ln for k in ("offload", "CUDA", "cuda", "Vulkan", "GPU", "VRAM", "compute capability"))]
    return out, keep


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--expect-patch-level", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    info = L.engine_info()
    print(f"llama-cpp-python {info.llama_cpp_version}, patch level {info.patch_level}, "
          f"gpu_offload {info.gpu_offload}")
    problems = []
    if args.expect_patch_level is not None and info.patch_level != args.expect_patch_level:
        problems.append(f"patch level {info.patch_level} != {args.expect_patch_level}")
    if not info.gpu_offload:
        problems.append("this build cannot offload to a GPU")

    result: dict = {"llama_cpp_version": info.llama_cpp_version, "patch_level": info.patch_level,
                    "gpu_offload": info.gpu_offload}
    try:
        from fixtures.gguf_models import TinySpec, write_tiny_gguf

        with tempfile.TemporaryDirectory() as tmp:
            path = write_tiny_gguf(Path(tmp) / "tiny-causal.gguf", TinySpec(arch="llama", diffusion=False))
            tokens = np.random.default_rng(0).integers(3, 200, 48).astype(np.int32)
            cpu, _ = logits(path, 0, tokens)
            gpu, log = logits(path, 999, tokens)
        diff = float(np.abs(cpu - gpu).max())
        print(f"tiny llama, {tokens.size} tokens: max |logit CPU - GPU| = {diff:.3g} (logits up to "
              f"{float(np.abs(cpu).max()):.3g})")
        for line in log:
            print(f"  llama.cpp: {line}")
        offloaded = any("offloaded" in ln and "GPU" in ln for ln in log)
        result.update(tiny_cpu_gpu_max_diff=diff, offload_log=log, offloaded=offloaded)
        if info.gpu_offload and not offloaded:
            problems.append("llama.cpp did not report offloading the tiny model's layers")
    except Exception as exc:  # report, do not hide the engine facts printed above
        problems.append(f"tiny model check failed: {type(exc).__name__}: {exc}")
    result["problems"] = problems
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    for p in problems:
        print(f"PROBLEM: {p}")
    print("sanity: " + ("ok" if not problems else "FAILED"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
