"""Conversion throughput and peak memory of `dgchat convert` on a generated checkpoint.

Writes a LLaDA-layout bf16 checkpoint of a few hundred MB (two shards + index; random weights; the
tiny test tokenizer padded to the embedding rows), then runs each conversion in a child process and
reports wall time, throughput (source MB / s) and the child's peak resident set: ru_maxrss from
wait4, and the child's own VmHWM (/proc/self/status, its address space only). This process stays
small (the checkpoint is written by a child too) because a forked child's ru_maxrss starts from
its parent's resident set. The first row is a child that only imports the converter: the
interpreter baseline. Numbers are warm-cache (the checkpoint was just written) and from a shared
machine: indicative.

    python tests/bench/bench_convert.py [--dir DIR] [--layers 8] [--d-model 1024] [--quant-table]

--quant-table also quantizes the bf16 GGUF to each llama.cpp type and reports file size, bits per
weight, and the logit difference against the f32 GGUF (rms(diff) / rms(logits), mean KL(f32 || q)
of the per-position token distributions, and how often the top-1 token agrees) over a 48-token
prompt + canvas, f32 KV cache. Random weights have no structure for a quantizer to exploit and
near-uniform token distributions, so these differences are much larger than on trained models.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fixtures.convert_tiny import TOKENIZERS, bf16_bits, make_config, n_tokens, token_id, tokenizer_json  # noqa: E402
from fixtures.convert_tiny import Spec  # noqa: E402

QUANT_TABLE = ["Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q5_0", "Q4_K_M", "Q4_K_S", "Q4_0", "IQ4_NL", "IQ4_XS",
               "Q3_K_L", "Q3_K_M", "Q3_K_S", "Q2_K"]


def write_checkpoint(folder: Path, spec: Spec, shards: int = 2) -> tuple[int, int]:
    """Stream a bf16 LLaDA checkpoint to disk one tensor at a time. Returns (bytes, largest tensor bytes)."""
    import struct

    folder.mkdir(parents=True, exist_ok=True)
    tj = tokenizer_json("llada")
    tk = TOKENIZERS["llada"]
    ids = {"mask": token_id(tj, tk.mask), "eos": token_id(tj, tk.eos), "bos": token_id(tj, tk.bos)}
    assert n_tokens(tj) <= spec.rows
    (folder / "tokenizer.json").write_text(tj)
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": tk.eos, "bos_token": tk.bos,
                                                              "mask_token": tk.mask, "chat_template": tk.template}))
    (folder / "config.json").write_text(json.dumps(make_config(spec, ids)))
    P, h, ff, rows = "model.transformer.", spec.hidden, spec.ff, spec.rows
    shapes: dict[str, tuple[int, ...]] = {P + "wte.weight": (rows, h)}
    for i in range(spec.n_layer):
        b = f"{P}blocks.{i}."
        shapes.update({b + "attn_norm.weight": (h,), b + "q_proj.weight": (h, h), b + "k_proj.weight": (h, h),
                       b + "v_proj.weight": (h, h), b + "attn_out.weight": (h, h), b + "ff_norm.weight": (h,),
                       b + "ff_proj.weight": (ff, h), b + "up_proj.weight": (ff, h), b + "ff_out.weight": (h, ff)})
    shapes.update({P + "ln_f.weight": (h,), P + "ff_out.weight": (rows, h)})
    names = list(shapes)
    per = -(-len(names) // shards)
    rng = np.random.default_rng(0)
    weight_map, total = {}, 0
    for k in range(shards):
        part = names[k * per:(k + 1) * per]
        fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        header, off = {}, 0
        for n in part:
            nb = int(np.prod(shapes[n])) * 2
            header[n] = {"dtype": "BF16", "shape": list(shapes[n]), "data_offsets": [off, off + nb]}
            off += nb
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        with open(folder / fname, "wb") as fh:
            fh.write(struct.pack("<Q", len(raw)) + raw)
            for n in part:
                shape = shapes[n]
                if len(shape) == 1:
                    arr = 1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)
                else:
                    # input embedding std 1; every matrix 1/sqrt(fan-in), the head 3/sqrt(d): logits of rms ~3,
                    # the spread of a trained LM's (std-1 head rows would make them ~sqrt(d) and one-hot)
                    std = 1.0 if n == P + "wte.weight" else (3.0 if n == P + "ff_out.weight" else 1.0) / np.sqrt(shape[1])
                    arr = rng.standard_normal(shape, dtype=np.float32) * np.float32(std)
                fh.write(bf16_bits(arr).tobytes())
                del arr
        weight_map.update({n: fname for n in part})
        total += off
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    largest = max(int(np.prod(s)) * 2 for s in shapes.values())
    return total, largest


HWM = ("\nfor line in open('/proc/self/status'):\n"
       "    if line.startswith('VmHWM'): print('HWM', int(line.split()[1]))")


def run_child(code: str) -> tuple[float, float, float, str]:
    """(wall seconds, ru_maxrss MiB, VmHWM MiB, stdout) of `python -c code` in a fresh process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code + HWM], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=Path(__file__).resolve().parents[1])
    out_text = proc.stdout.read()
    err_text = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"child failed:\n{err_text[-3000:]}")
    hwm = next((int(ln.split()[1]) for ln in out_text.splitlines() if ln.startswith("HWM ")), 0)
    out = "\n".join(ln for ln in out_text.splitlines() if not ln.startswith("HWM "))
    return wall, usage.ru_maxrss / 1024, hwm / 1024, out


def convert_code(src: Path, out: Path, **kwargs) -> str:
    args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    return (f"from dgchat.convert import convert; r = convert({str(src)!r}, {str(out)!r}{', ' if args else ''}{args}); "
            "print(r.n_bytes)")


def log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(axis=1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))


def softmax(x: np.ndarray) -> np.ndarray:
    return np.exp(log_softmax(x))


def logits(path: Path, tokens: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    from dgchat.model_backend.llamacpp import LlamaContext, LlamaModel

    with LlamaModel(path, n_gpu_layers=0) as m:
        if tokens is None:
            tokens = np.concatenate([m.tokenize("Halt, traveller! None may pass the gate after dark.", add_special=False),
                                     np.full(32, m.mask, np.int32)])[:48]
        ctx = LlamaContext(m, n_ctx=256, max_tokens=256, exact_kv=True, n_threads=2)
        ctx.set_causal(False)
        out = ctx.decode_tokens(tokens, np.arange(tokens.size)).astype(np.float64)
        ctx.close()
    return tokens, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", type=Path, help="work folder (default: a temporary one, removed afterwards)")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--d-model", type=int, default=1024)
    ap.add_argument("--ff", type=int, default=4096)
    ap.add_argument("--rows", type=int, default=32768)
    ap.add_argument("--quant-table", action="store_true")
    args = ap.parse_args()
    work = args.dir or Path(tempfile.mkdtemp(prefix="dgchat-bench-convert-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        spec = Spec("llada", hidden=args.d_model, n_layer=args.layers, n_head=16, n_kv=16, ff=args.ff, rows=args.rows)
        ckpt = work / "LLaDA-bench"
        spec_args = dict(hidden=spec.hidden, n_layer=spec.n_layer, n_head=spec.n_head, n_kv=spec.n_kv, ff=spec.ff,
                         rows=spec.rows)
        wall, _, _, out = run_child(
            "import sys; from pathlib import Path; sys.path.insert(0, '.'); "
            "from bench.bench_convert import write_checkpoint; from fixtures.convert_tiny import Spec; "
            f"print(*write_checkpoint(Path({str(ckpt)!r}), Spec('llada', **{spec_args!r})))")
        src_bytes, largest = (int(x) for x in out.split())
        print(f"checkpoint: {src_bytes / 1e6:.0f} MB bf16 in 2 shards, largest tensor {largest / 1e6:.0f} MB "
              f"(written in {wall:.1f} s)\n")
        base_gguf = work / "bench-bf16.gguf"
        runs = [
            ("import only (baseline)", "import dgchat.convert.api, dgchat.convert.families; print(0)", None),
            ("HF -> llada, bf16 kept", convert_code(ckpt, base_gguf), src_bytes),
            ("HF -> llada, --outtype f32", convert_code(ckpt, work / "bench-f32.gguf", outtype="f32"), src_bytes),
            ("HF -> llada, --outtype q8_0 (numpy)", convert_code(ckpt, work / "bench-q8np.gguf", outtype="q8_0"), src_bytes),
            ("HF -> llama --cache-capable, bf16", convert_code(ckpt, work / "bench-kv.gguf", cache_capable=True), src_bytes),
            ("GGUF llada -> llama (remap, byte copy)", convert_code(base_gguf, work / "bench-remap.gguf", cache_capable=True),
             src_bytes),
            ("HF -> --quantize Q4_K_M (llama.cpp)", convert_code(ckpt, work / "bench-q4.gguf", quantize="Q4_K_M",
                                                                  n_threads=2), src_bytes),
            ("GGUF bf16 -> --quantize Q8_0 (llama.cpp)", convert_code(base_gguf, work / "bench-q8.gguf", quantize="Q8_0",
                                                                      n_threads=2), src_bytes),
        ]
        print(f"{'run':42s} {'wall s':>7s} {'MB/s':>7s} {'ru_maxrss MiB':>14s} {'VmHWM MiB':>10s} {'output MB':>10s}")
        for label, code, nbytes in runs:
            wall, rss, hwm, out = run_child(code)
            size = int(out.strip().splitlines()[-1]) if out.strip() else 0
            rate = f"{nbytes / 1e6 / wall:7.1f}" if nbytes else "      -"
            print(f"{label:42s} {wall:7.2f} {rate} {rss:14.0f} {hwm:10.0f} {size / 1e6 if size else 0:10.1f}",
                  flush=True)
        if args.quant_table:
            from dgchat.convert import convert

            tokens, ref = logits(work / "bench-f32.gguf")
            n_weights = sum(int(np.prod(s)) for s in [(spec.rows, spec.hidden)] * 2) + spec.n_layer * (
                4 * spec.hidden ** 2 + 3 * spec.hidden * spec.ff)
            print(f"\nquantization table (reference: f32 GGUF; {tokens.size} tokens, f32 KV cache)")
            print(f"{'type':8s} {'MB':>8s} {'bpw':>6s} {'rel rms diff':>13s} {'mean KL':>9s} {'top-1 agree':>12s} "
                  f"{'seconds':>8s}")
            rows = [("F32", work / "bench-f32.gguf", 0.0), ("BF16", base_gguf, 0.0)]
            for q in QUANT_TABLE:
                t0 = time.perf_counter()
                r = convert(base_gguf, work / f"bench-{q}.gguf", quantize=q, n_threads=2)
                rows.append((q, r.output, time.perf_counter() - t0))
            for q, path, secs in rows:
                _, out = logits(path, tokens)
                rel = np.sqrt(((out - ref) ** 2).mean() / (ref ** 2).mean())
                kl = float(np.mean(np.sum(softmax(ref) * (log_softmax(ref) - log_softmax(out)), axis=1)))
                agree = (out.argmax(1) == ref.argmax(1)).mean()
                size = path.stat().st_size
                print(f"{q:8s} {size / 1e6:8.1f} {8 * size / n_weights:6.2f} {rel:13.4f} {kl:9.4f} {agree:12.2f} "
                      f"{secs:8.1f}", flush=True)
                if q not in ("F32", "BF16"):
                    path.unlink()
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
