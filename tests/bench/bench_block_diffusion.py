"""Block diffusion on a CPU: a block step, the prompt, and tokens/s against left-to-right decoding.

Runs full-shape block-diffusion GGUFs (tests/bench/make_fullshape_block.py writes Qwen3-1.7B-shaped
SDAR and Qwen3-0.6B-shaped BD3LM files with random weights and the real 151,936-token vocabulary)
and prints, from one loaded engine per file, side by side:

- the prompt: seconds for a chat prompt's whole blocks in one decode (PROMPT_TOKENS and 4x that);
- a block step: seconds for one decode of a block (B tokens, every position asking for logits)
  against a cache of N tokens, of the merged pass (the finished block stored + the next block's
  first step: 2B tokens), and of the store pass alone (what merging saves);
- answers of ANSWER tokens at 1, 2 and 4 tokens committed per step (steps per block = B, B/2, B/4
  with the dynamic threshold off, early stop off: random weights would stop anywhere), tokens/s
  counted from the first answer step (the prompt excluded; listed separately);
- the same file decoded left to right by dgchat (`--ar`: causal attention, the head's argmax), by a
  bare llama.cpp loop (one llama_decode a token, logits of the last row, numpy argmax: no dgchat
  sampler), and with `--llama-bench PATH` by llama.cpp's own llama-bench (`tg`, the same threads) —
  the ratio of each block-diffusion tokens/s to them. llama-bench is not part of dgchat's engine;
  build it from the same patched source: unpack the sdist (~/.cache/dgchat/engine/sdist/, or `pip
  download --no-binary :all: --no-deps llama-cpp-python==0.3.36`), in its vendor/llama.cpp run
  `for p in engine/patches/*.patch; do patch -p1 < $p; done` (paths from dgchat's checkout), then
  `cmake -B build -DLLAMA_CURL=OFF && cmake --build build --target llama-bench -j 2` (about 5
  minutes on 2 cores);
- the speed prediction (dgchat.hub.speed, on this machine's profile for the engine build and thread
  count: measured first when there is none) next to each number, and measured / predicted.

Every configuration is warmed up once (graph allocation, page faults), then measured `--runs` times
(the median is printed). Random weights: tokens per step are forced through the step count, which is
what the published dynamic threshold would give on real weights at that rate.

    python tests/bench/make_fullshape_block.py --out /tmp/bd-full          # writes the two files
    python tests/bench/bench_block_diffusion.py /tmp/bd-full/*.gguf [--runs 3] [--threads 2] [--remeasure]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dgchat.hub import machine_profile, speed  # noqa: E402
from dgchat.model_backend.block_diffusion import BlockDiffusionEngine  # noqa: E402
from dgchat.model_backend.gguf_file import read_gguf_header  # noqa: E402
from dgchat.model_backend.block_source import BlockLlamaSource  # noqa: E402
from dgchat.model_backend.events import FinalEvent  # noqa: E402
from dgchat.model_backend.loader import load_engine  # noqa: E402
from dgchat.model_backend.params import DiffusionParams  # noqa: E402
from dgchat.model_backend.requests import DenoiseRequest, EncodeRequest  # noqa: E402

PROMPT_TOKENS = 64
ANSWER_TOKENS = 64
CHAT = ("You are a helpful assistant who writes short, friendly emails.",
        "Write a two-line email to my landlord saying the kitchen tap has been dripping since Monday and "
        "asking when someone could come to fix it. Keep it polite and plain, and sign it with my name.")


def median_time(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def chat_prompt(engine: BlockDiffusionEngine, n: int) -> np.ndarray:
    """A real chat prompt cut or repeated to n tokens."""
    system, user = CHAT
    ids = engine.chat_prompt([{"role": "system", "content": system}, {"role": "user", "content": user}])
    reps = -(-n // ids.size)
    return np.tile(ids, reps)[:n].astype(np.int32)


@dataclass
class FileResult:
    model: str
    variant: str
    block: int
    threads: int
    prompt_s: dict[int, float] = field(default_factory=dict)  # prompt tokens -> seconds
    step_s: dict[str, float] = field(default_factory=dict)  # "block@ctx" / "merged@ctx" -> seconds
    answer_tok_s: dict[int, float] = field(default_factory=dict)  # tokens per step -> decode tok/s
    answer_steps: dict[int, int] = field(default_factory=dict)
    ar_tok_s: float = 0.0  # dgchat --ar
    llama_ar_tok_s: float = 0.0  # bare llama.cpp loop
    llama_bench_tok_s: float = 0.0  # llama.cpp's llama-bench tg (0: not run)
    predicted: dict[str, float] = field(default_factory=dict)


def time_prompt(engine: BlockDiffusionEngine, n: int, runs: int) -> float:
    B = engine.block_size
    n = (n // B) * B
    tokens = chat_prompt(engine, n)
    source = BlockLlamaSource(engine, 1, n + 4 * B, on_backend=engine.on_backend(engine.resolve()))

    def once() -> None:
        source.ctx.clear()
        source.answer([(0, EncodeRequest(tokens, np.arange(n, dtype=np.int32), np.empty(0, np.int64)))])

    once()  # warm-up
    return median_time(once, runs)


def time_block_step(engine: BlockDiffusionEngine, ctx_tokens: int, merged: bool, runs: int) -> float:
    """One denoising decode of a fully masked block (every row asking for logits) after ctx_tokens
    cached tokens; merged: with the previous block stored in the same pass."""
    B = engine.block_size
    ctx_tokens = (ctx_tokens // B) * B
    cached = chat_prompt(engine, ctx_tokens)
    source = BlockLlamaSource(engine, 1, ctx_tokens + 4 * B, on_backend=False)
    mask = int(engine.info.mask_token)
    stored_end = ctx_tokens - (B if merged else 0)
    source.answer([(0, EncodeRequest(cached[:stored_end], np.arange(stored_end, dtype=np.int32),
                                     np.empty(0, np.int64)))])
    canvas = np.full(B, mask, np.int32)
    positions = np.arange(ctx_tokens, ctx_tokens + B, dtype=np.int32)
    commit = (cached[stored_end:], np.arange(stored_end, ctx_tokens, dtype=np.int32)) if merged else None

    def once() -> None:
        source.answer([(0, DenoiseRequest(canvas, positions, None, True, rows=np.arange(B), commit=commit))])
        if merged:
            source.ctx.seq_rm(0, stored_end)  # undo the store, so the next run stores again

    once()
    return median_time(once, runs)


def time_store(engine: BlockDiffusionEngine, ctx_tokens: int, runs: int) -> float:
    """A finished block's store pass on its own (B tokens appended, no logits) after ctx_tokens - B
    cached tokens: what merging it into the next block's first step saves."""
    B = engine.block_size
    ctx_tokens = (ctx_tokens // B) * B
    cached = chat_prompt(engine, ctx_tokens)
    source = BlockLlamaSource(engine, 1, ctx_tokens + 4 * B, on_backend=False)
    stored_end = ctx_tokens - B
    source.answer([(0, EncodeRequest(cached[:stored_end], np.arange(stored_end, dtype=np.int32),
                                     np.empty(0, np.int64)))])
    block = (cached[stored_end:], np.arange(stored_end, ctx_tokens, dtype=np.int32))

    def once() -> None:
        source.answer([(0, EncodeRequest(block[0], block[1], np.empty(0, np.int64)))])
        source.ctx.seq_rm(0, stored_end)

    once()
    return median_time(once, runs)


def time_answer(engine: BlockDiffusionEngine, prompt: np.ndarray, params: DiffusionParams,
                runs: int) -> tuple[float, int]:
    """Decode tokens/s of one answer (its time without the prompt's pass) and its steps (median run)."""
    results = []
    for i in range(runs + 1):  # the first run warms up
        final = None
        for event in engine.generate(prompt, params):
            if isinstance(event, FinalEvent):
                final = event
        st = final.stats
        # left to right, the prompt's pass also gives the first token: count the tokens after it
        tokens = st.tokens - 1 if params.autoregressive else st.tokens
        if i:
            results.append((tokens / (st.elapsed_s - st.prompt_s), st.steps))
    results.sort()
    return results[len(results) // 2]


def time_llama_ar(engine: BlockDiffusionEngine, prompt: np.ndarray, n: int, runs: int) -> float:
    """A bare llama.cpp left-to-right loop on the same file: tokens/s of n tokens after the prompt."""
    ctx = engine.context_for(int(prompt.size) + n + 8, batch_tokens=512)
    rates = []
    for i in range(runs + 1):
        ctx.clear()
        ctx.set_causal(True)
        logits = ctx.decode_tokens(prompt, np.arange(prompt.size, dtype=np.int32), outputs=[prompt.size - 1])
        tok = int(np.argmax(logits[0]))
        t0 = time.perf_counter()
        for k in range(n):
            logits = ctx.decode_tokens([tok], [prompt.size + k], outputs=[0])
            tok = int(np.argmax(logits[0]))
        if i:
            rates.append(n / (time.perf_counter() - t0))
    ctx.clear()
    ctx.set_causal(False)
    return statistics.median(rates)


def predictions(path: Path, res: FileResult, args: argparse.Namespace, dev) -> None:
    """dgchat.hub.speed's figures for every measured number (the machine profile of this engine
    build and thread count: measured first if there is none)."""
    shape = speed.block_diffusion_shape(read_gguf_header(path))
    B, P, A = res.block, args.prompt_tokens, args.answer_tokens
    for n in (P, 4 * P):
        res.predicted[f"prompt {n}"] = speed.predict_prompt_s(shape, dev, (n // B) * B)
    for ctx_tokens in (P, P + A):
        c = (ctx_tokens // B) * B
        res.predicted[f"block@{ctx_tokens}"] = speed.predict_block_step_s(shape, dev, B, c + B, B)
        res.predicted[f"merged@{ctx_tokens}"] = speed.predict_block_step_s(shape, dev, 2 * B, c + B, B)
    for per_step in (1, 2, 4):
        p = speed.predict_block_diffusion(shape, dev, prompt_tokens=P, answer_tokens=A, tokens_per_step=per_step)
        res.predicted[f"{per_step} tok/step"] = A / (p.seconds_per_answer - p.prompt_seconds)
    res.predicted["ar"] = 1.0 / speed.predict_ar_token_s(shape, dev, P + A // 2)


def time_llama_bench(binary: Path, path: Path, n: int, threads: int | None, runs: int) -> float:
    """llama.cpp's own token generation rate (llama-bench `tg N`) on the same file and threads."""
    import subprocess

    cmd = [str(binary), "-m", str(path), "-p", "0", "-n", str(n), "-r", str(max(1, runs)), "-o", "json"]
    if threads:
        cmd += ["-t", str(threads)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=1800).stdout
    rows = [r for r in json.loads(out) if r.get("n_gen") == n]
    return float(rows[0]["avg_ts"])


def run_file(path: Path, args: argparse.Namespace, dev) -> FileResult:
    engine = load_engine(path, n_threads=args.threads)
    assert isinstance(engine, BlockDiffusionEngine), f"{path} is not a block-diffusion model"
    B = engine.block_size
    res = FileResult(path.name, engine.variant, B, args.threads or 0)
    predictions(path, res, args, dev)
    for n in (args.prompt_tokens, 4 * args.prompt_tokens):
        res.prompt_s[n] = time_prompt(engine, n, args.runs)
        print(f"  prompt {n}: {res.prompt_s[n]:.3f} s", flush=True)
    for ctx_tokens in (args.prompt_tokens, args.prompt_tokens + args.answer_tokens):
        for merged in (False, True):
            key = f"{'merged' if merged else 'block'}@{ctx_tokens}"
            res.step_s[key] = time_block_step(engine, ctx_tokens, merged, args.runs)
            print(f"  step {key}: {1000 * res.step_s[key]:.1f} ms", flush=True)
        res.step_s[f"store@{ctx_tokens}"] = time_store(engine, ctx_tokens, args.runs)
    prompt = chat_prompt(engine, args.prompt_tokens)
    for per_step in (1, 2, 4):
        steps = max(1, B // per_step)
        params = DiffusionParams(steps=steps, threshold=1.0, max_tokens=args.answer_tokens, early_stop=False)
        rate, n_steps = time_answer(engine, prompt, params, args.runs)
        res.answer_tok_s[per_step], res.answer_steps[per_step] = rate, n_steps
        print(f"  {per_step} tok/step: {rate:.2f} tok/s ({n_steps} steps)", flush=True)
    ar = DiffusionParams(autoregressive=True, max_tokens=args.answer_tokens, early_stop=False)
    res.ar_tok_s, _ = time_answer(engine, prompt, ar, args.runs)
    print(f"  --ar: {res.ar_tok_s:.2f} tok/s", flush=True)
    res.llama_ar_tok_s = time_llama_ar(engine, prompt, args.answer_tokens, args.runs)
    print(f"  llama.cpp loop: {res.llama_ar_tok_s:.2f} tok/s", flush=True)
    if args.llama_bench:
        engine.close()  # llama-bench loads the file itself: one copy in memory at a time
        res.llama_bench_tok_s = time_llama_bench(args.llama_bench, path, args.answer_tokens, args.threads, args.runs)
        print(f"  llama-bench tg{args.answer_tokens}: {res.llama_bench_tok_s:.2f} tok/s", flush=True)
        return res
    engine.close()
    return res


def _vs(measured: float, predicted: float | None, *, rate: bool = False) -> str:
    """'predicted X, measured/predicted R' (for a rate, predicted/measured: >1 means optimistic)."""
    if not predicted:
        return ""
    ratio = measured / predicted
    return f"   predicted {predicted:8.3f}, measured/predicted {ratio:4.2f}"


def table(results: list[FileResult]) -> str:
    lines = []
    for r in results:
        lines.append(f"{r.model} ({r.variant}, blocks of {r.block}, threads {r.threads or 'all'})")
        for n, s in r.prompt_s.items():
            lines.append(f"  prompt {n:4d} tokens          {s:8.3f} s  ({n / s:6.1f} tok/s)"
                         + _vs(s, r.predicted.get(f"prompt {n}")))
        for key, s in r.step_s.items():
            lines.append(f"  step {key:22s} {s:8.3f} s" + _vs(s, r.predicted.get(key)))
        for ctx in sorted({int(k.split("@")[1]) for k in r.step_s}):
            block, merged, store = (r.step_s[f"{k}@{ctx}"] for k in ("block", "merged", "store"))
            lines.append(f"  merging the store into the next step at {ctx}: {merged:.3f} s instead of "
                         f"{store:.3f} + {block:.3f} s (saves {1 - merged / (store + block):.0%} of those passes)")
        for k, rate in r.answer_tok_s.items():
            bench = f", x{rate / r.llama_bench_tok_s:.2f} of llama-bench" if r.llama_bench_tok_s else ""
            lines.append(f"  block diffusion, {k} tok/step  {rate:6.2f} tok/s  x{rate / r.ar_tok_s:.2f} of --ar, "
                         f"x{rate / r.llama_ar_tok_s:.2f} of llama.cpp AR{bench} ({r.answer_steps[k]} steps)"
                         + _vs(rate, r.predicted.get(f"{k} tok/step")))
        lines.append(f"  dgchat --ar                 {r.ar_tok_s:6.2f} tok/s" + _vs(r.ar_tok_s, r.predicted.get("ar")))
        lines.append(f"  llama.cpp AR loop           {r.llama_ar_tok_s:6.2f} tok/s")
        if r.llama_bench_tok_s:
            lines.append(f"  llama-bench tg              {r.llama_bench_tok_s:6.2f} tok/s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", type=Path)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--prompt-tokens", type=int, default=PROMPT_TOKENS)
    ap.add_argument("--answer-tokens", type=int, default=ANSWER_TOKENS)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--remeasure", action="store_true", help="measure the machine profile again first")
    ap.add_argument("--llama-bench", type=Path, help="llama.cpp's llama-bench binary, run on each file too")
    args = ap.parse_args(argv)
    profile = machine_profile.ensure_profile(args.threads, remeasure=args.remeasure)
    print(f"machine profile: {profile.measured_at}, {profile.threads} threads", flush=True)
    results = []
    for path in args.models:
        print(f"{path} ...", flush=True)
        results.append(run_file(path, args, profile.cpu))
    print()
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in results], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
