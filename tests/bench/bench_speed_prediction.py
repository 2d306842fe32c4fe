"""Predicted against measured speed, side by side in one run, on every model this machine can run.

    python tests/bench/bench_speed_prediction.py [--threads 2] [--work /tmp/dgchat-speed] [--remeasure]
                                                 [--skip-fullshape] [--prompts 8] [--json out.json]

The prediction (dgchat.hub.speed) comes from the machine profile (dgchat.hub.machine_profile: the
saved one, else measured now; --remeasure measures again first) and each model's shape read from
its file; the measurement runs the model with dgchat's engine in this process. Every row compares
the same work: the prediction is given the run's own prompt length, canvases and steps, so the
ratio checks the cost model, not a guess of how many steps a model takes. Rows:

- the bundled model (trained, 16,384 tokens) at its defaults on the held-out prompts of the
  word-validity measure, plus the headline figure: the tokens/s the wizard predicts before any
  run (256 tokens, its typical 23 steps a canvas) against the tokens/s these `generate` runs made;
- its masked-diffusion sibling (trained, LLaDA layout, cache-capable) at its defaults;
- random-weight full-shape slices of DiffusionGemma 26B-A4B (make_fullshape_dg.py, q4_0): 2 and 4
  layers, a 256-token canvas of 4 steps and 64 `--ar` tokens each; then the 30-layer model: the
  two measurements extrapolated by layer count against the prediction for the 30-layer file;
- a random-weight LLaDA-8B-shaped slice (2 layers, hidden 4096, MLP 12288, 126,464 tokens, q4_K
  with a q6_K head), 4 steps over a 128-token canvas in blocks of 32.

Target (issue 29): predicted / measured within 0.5-2x on every row. Files are written once into
--work and reused (the 4-layer slice is ~2.7 GB).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_dg_fullshape import make_prompt  # noqa: E402
from dgchat.hub.machine_profile import cached_profile, ensure_profile, write_probe  # noqa: E402
from dgchat.hub.speed import predict, shape_from_header, shape_from_tensors  # noqa: E402
from dgchat.model_backend.engine import DiffusionEngine  # noqa: E402
from dgchat.model_backend.loader import load_engine  # noqa: E402
from dgchat.model_backend.events import FinalEvent  # noqa: E402
from dgchat.model_backend.params import DiffusionParams  # noqa: E402

REPO = HERE.parent.parent
BUNDLED = REPO / "assets" / "dgchat-tiny-plays.gguf"
MASKED = REPO / "tests" / "models" / "dgchat-tiny-plays-masked.gguf"
FIXED_STEPS = dict(early_stop=False, confidence_threshold=-1.0)  # every step runs (random weights)


def final_of(events) -> FinalEvent:
    return [e for e in events if isinstance(e, FinalEvent)][-1]


def shape_of(engine: DiffusionEngine, typical_steps: float | None = None):
    header = engine.model.header
    return shape_from_header(header, family=engine.info.family, kv_memory=engine.info.has_kv_memory,
                             sampler=engine.info.defaults, typical_steps=typical_steps)


def predicted_run(shape, dev, final: FinalEvent, params: DiffusionParams) -> float:
    """The prediction for exactly what the run did: its prompt, canvases and steps."""
    s = final.stats
    canvases = max(1, s.canvases)
    shape = replace(shape, sampler={**shape.sampler, "gen_length": params.gen_length, "steps": params.steps,
                                    "block_length": params.block_length, "cache": params.cache})
    return predict(shape, dev, prompt_tokens=s.prompt_tokens, answer_tokens=canvases * params.gen_length,
                   steps=s.steps / canvases).seconds_per_answer


class Table:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def add(self, name: str, what: str, measured: float, predicted: float, unit: str = "s") -> None:
        ratio = predicted / measured if measured > 0 else float("nan")
        self.rows.append(dict(model=name, what=what, measured=measured, predicted=predicted, unit=unit, ratio=ratio))
        ok = "ok" if 0.5 <= ratio <= 2.0 else "OUT OF RANGE"
        print(f"  {name:<34} {what:<44} measured {fmt(measured, unit):>10}  predicted {fmt(predicted, unit):>10}"
              f"  {ratio:5.2f}x  {ok}", flush=True)

    def markdown(self) -> str:
        lines = ["| model | what | measured | predicted | predicted / measured |", "|---|---|---|---|---|"]
        for r in self.rows:
            lines.append(f"| {r['model']} | {r['what']} | {fmt(r['measured'], r['unit'])} | "
                         f"{fmt(r['predicted'], r['unit'])} | {r['ratio']:.2f}x |")
        return "\n".join(lines)


def fastest(rounds: int, run) -> tuple[float, FinalEvent]:
    """The shortest of `rounds` runs (seconds, and that run's final event): the machine profile
    keeps the fastest of its timings too, so both sides describe the machine when nothing else
    interferes (this VM's speed drifts by up to 2x between runs a few seconds apart)."""
    best: tuple[float, FinalEvent] | None = None
    for _ in range(rounds):
        t0 = time.perf_counter()
        final = run()
        took = time.perf_counter() - t0
        if best is None or took < best[0]:
            best = (took, final)
    assert best is not None
    return best


def fmt(x: float, unit: str) -> str:
    if unit == "tok/s":
        return f"{x:.1f} tok/s" if x < 100 else f"{x:.0f} tok/s"
    return f"{x * 1000:.1f} ms" if x < 1 else f"{x:.2f} s"


def trained_rows(table: Table, dev, path: Path, name: str, args, *, typical_steps: float | None) -> None:
    from dgchat.convert.default_model.word_validity import read_prompts

    prompts = read_prompts()[: args.prompts]
    with load_engine(path, n_threads=args.threads) as engine:
        shape = shape_of(engine, typical_steps)
        params = engine.resolve(DiffusionParams(seed=0))
        final_of(engine.generate(engine.chat_prompt([{"role": "user", "content": "Who goes there?"}]), params))
        prompts = [engine.chat_prompt([{"role": "system", "content": p["system"]}, {"role": "user", "content": p["line"]}])
                   for p in prompts]
        rounds = []
        for _ in range(args.rounds):  # the same answers each round (same seeds): the fastest round counts
            measured = predicted = 0.0
            tokens = steps = 0
            for i, prompt in enumerate(prompts):
                run_params = replace(params, seed=i)
                t0 = time.perf_counter()
                final = final_of(engine.generate(prompt, run_params))
                measured += time.perf_counter() - t0
                predicted += predicted_run(shape, dev, final, run_params)
                tokens += final.stats.tokens
                steps += final.stats.steps
            rounds.append(measured)
        measured = min(rounds)
        table.add(name, f"{len(prompts)} answers at its defaults ({steps} steps)", measured, predicted)
        if typical_steps is not None:
            before = predict(shape, dev).tokens_per_s
            table.add(name, "tok/s: wizard's prediction vs these runs", tokens / measured, before, unit="tok/s")


def fullshape_rows(table: Table, dev, args) -> None:
    import make_fullshape_dg as fs

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    measured: dict[int, tuple[float, float]] = {}
    for layers in (2, 4):
        path = work / f"dg-fullshape-L{layers}-q4_0.gguf"
        if not path.exists():
            print(f"  writing {path} ...", flush=True)
            fs.write_fullshape_dg(path, n_layer=layers, qtype="q4_0")
        with load_engine(path, n_threads=args.threads) as engine:
            shape = shape_of(engine)
            prompt = make_prompt(engine, 64)
            params = engine.resolve(DiffusionParams(steps=4, gen_length=256, max_tokens=256, seed=0, **FIXED_STEPS))
            final_of(engine.generate(prompt, replace(params, steps=1)))  # warm-up
            diff_s, final = fastest(args.rounds, lambda: final_of(engine.generate(prompt, params)))
            table.add(f"26B-A4B shape, {layers} layers (random)", "a 256-token canvas, 4 steps", diff_s,
                      predicted_run(shape, dev, final, params))
            ar = engine.resolve(DiffusionParams(autoregressive=True, max_tokens=64, seed=0, early_stop=False))
            final_of(engine.generate(prompt, replace(ar, max_tokens=2)))
            ar_s, final = fastest(args.rounds, lambda: final_of(engine.generate(prompt, ar)))
            pred_ar = predict(shape, dev, prompt_tokens=prompt.size, answer_tokens=final.stats.tokens)
            table.add(f"26B-A4B shape, {layers} layers (random)", f"--ar, {final.stats.tokens} tokens", ar_s,
                      pred_ar.ar_seconds_per_answer)
            measured[layers] = (diff_s, ar_s)
    # the 30-layer model: measurements extrapolated by layer count, the prediction from its tensor list
    per_layer = [(measured[4][i] - measured[2][i]) / 2 for i in range(2)]
    full = [measured[2][i] + 28 * per_layer[i] for i in range(2)]
    plan, _ = fs.build_plan(fs.FullShapeSpec(), fs.QTYPES["q4_0"], fs.embedding_qtype(fs.QTYPES["q4_0"], 2816), 0)
    tensors = {t.name: (tuple(reversed(t.shape)), t.qtype.name) for t in plan.tensors}
    keys = {"embedding_length": 2816, "attention.head_count": 16, "attention.key_length": 512, "block_count": 30,
            "expert_used_count": 8, "self_cond_inter": 2112}
    shape30 = shape_from_tensors(tensors, keys, family="diffusion_gemma", kv_memory=True,
                                 sampler={"steps": 4, "gen_length": 256})
    p30 = predict(shape30, dev, prompt_tokens=64, answer_tokens=256, steps=4)
    table.add("26B-A4B, 30 layers (extrapolated)", "a 256-token canvas, 4 steps", full[0], p30.seconds_per_answer)
    p30ar = predict(shape30, dev, prompt_tokens=64, answer_tokens=64)
    table.add("26B-A4B, 30 layers (extrapolated)", "--ar, 64 tokens", full[1], p30ar.ar_seconds_per_answer)


def llada_rows(table: Table, dev, args) -> None:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    path = work / "llada-8b-shape-L2-q4_k.gguf"
    if not path.exists():
        print(f"  writing {path} ...", flush=True)
        write_probe(path, qtype="q4_k", n_layer=2, n_embd=4096, n_ff=12288, n_head=32, n_vocab=126464,
                    output_type="q6_k", arch="llada")
    with load_engine(path, n_threads=args.threads) as engine:
        shape = shape_of(engine)
        prompt = (np.arange(64) % 1000 + 3).astype(np.int32)
        params = engine.resolve(DiffusionParams(steps=4, gen_length=128, block_length=32, seed=0, early_stop=False))
        final_of(engine.generate(prompt, params))
        seconds, final = fastest(args.rounds, lambda: final_of(engine.generate(prompt, params)))
        table.add("LLaDA-8B shape, 2 layers (random)", f"a 128-token canvas, {final.stats.steps} steps",
                  seconds, predicted_run(shape, dev, final, params))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--work", default="/tmp/dgchat-speed-bench", help="folder for the random-weight slices")
    ap.add_argument("--remeasure", action="store_true", help="measure the machine profile again first")
    ap.add_argument("--skip-fullshape", action="store_true", help="no 26B-A4B or LLaDA-8B slices (quick)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3, help="runs of each measurement; the fastest counts")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    t0 = time.perf_counter()
    profile = None if args.remeasure else cached_profile(args.threads)
    if profile is None:
        print("measuring the machine profile ...", flush=True)
        profile = ensure_profile(args.threads, remeasure=True)
    dev = profile.cpu
    print(f"profile: {dev.name}, {profile.threads} threads, measured {profile.measured_at} in {profile.seconds:.1f} s")
    table = Table()
    trained_rows(table, dev, BUNDLED, "bundled dgchat-tiny-plays (trained)", args, typical_steps=23)
    trained_rows(table, dev, MASKED, "masked sibling (trained)", args, typical_steps=None)
    if not args.skip_fullshape:
        fullshape_rows(table, dev, args)
        llada_rows(table, dev, args)
    print()
    print(table.markdown())
    worst = max((max(r["ratio"], 1 / r["ratio"]) for r in table.rows if math.isfinite(r["ratio"])), default=1.0)
    print(f"\nworst row off by {worst:.2f}x (target: within 2x); {time.perf_counter() - t0:.0f} s in all")
    if args.json:
        args.json.write_text(json.dumps({"profile": profile.as_dict(), "rows": table.rows}, indent=1))


if __name__ == "__main__":
    main()
