"""DiffusionGemma at full size: where a denoising step's time goes, and diffusion vs left-to-right.

Runs a random-weight GGUF with DiffusionGemma 26B-A4B's real dimensions (tests/bench/
make_fullshape_dg.py writes one; `--layers 2` keeps every width and the full vocabulary) and prints,
from one run of one loaded engine, side by side:

- diffusion at fixed steps per canvas (16 / 24 / 32 / 48 by default): ms per step split into
  backend (llama.cpp: `stats.model_s`) and host (Python/numpy: `stats.sampler_s`), the host share,
  and tok/s;
- left-to-right decoding with the causal encoder (`--ar`) on the same file: tok/s;
- the ratio of each diffusion tok/s to the autoregressive one, peak RSS, the options used.

Random weights make the entropy-bound stopping rule meaningless, so every canvas runs exactly its
steps: early stop off and a confidence threshold of -1 (the stability rule needs the mean entropy
below it, which never happens). Every configuration is warmed up first (a 2-step / 4-token run of
the same shapes: graph allocation, page faults), then measured once.

`--param KEY=VALUE` passes a DiffusionParams field to every run (e.g. `sampler_on=host`);
`--canvas N` shortens the canvas for smoke runs on a CPU.

    python tests/bench/bench_dg_fullshape.py --write /data/dg-L30-q4_0.gguf          # writes, then runs
    python tests/bench/bench_dg_fullshape.py --model /data/dg-L30-q4_0.gguf --json out.json
    python tests/bench/bench_dg_fullshape.py --tiny --steps 2 --ar-tokens 4          # smoke test
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.make_fullshape_dg import (  # noqa: E402
    WRITER_OPTIONS,
    ProgressLine,
    add_shape_args,
    shape_from_args,
    write_fullshape_dg,
)
from dgchat.model_backend.engine import DiffusionEngine  # noqa: E402
from dgchat.model_backend.loader import load_engine  # noqa: E402
from dgchat.model_backend.events import FinalEvent  # noqa: E402
from dgchat.model_backend.gguf_file import read_gguf_header  # noqa: E402
from dgchat.model_backend.llamacpp import engine_info  # noqa: E402
from dgchat.model_backend.params import DiffusionParams  # noqa: E402

PROMPT_TEXT = "Halt, traveller! None may pass the gate after dark. The king sleeps and the guards are weary. "
FIXED_STEPS = dict(early_stop=False, confidence_threshold=-1.0)  # see the module docstring


@dataclass
class Row:
    configuration: str
    steps: int
    tokens: int
    elapsed_s: float
    model_s: float
    sampler_s: float
    sampler_on: Any = "?"
    soft_embedding: Any = "?"
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def per_step_ms(self, seconds: float) -> float:
        return 1000 * seconds / self.steps if self.steps else 0.0

    @property
    def host_share(self) -> float:
        busy = self.model_s + self.sampler_s
        return self.sampler_s / busy if busy > 0 else 0.0


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def _run(engine: DiffusionEngine, prompt: np.ndarray, params: DiffusionParams) -> FinalEvent:
    return [e for e in engine.generate(prompt, params) if isinstance(e, FinalEvent)][0]


def measure(engine: DiffusionEngine, prompt: np.ndarray, name: str, params: DiffusionParams,
            warm: DiffusionParams) -> Row:
    """A warm-up run, then the measured one."""
    _run(engine, prompt, warm)
    final = _run(engine, prompt, params)
    s = final.stats
    return Row(name, s.steps, s.tokens, s.elapsed_s, s.model_s, s.sampler_s,
               sampler_on=getattr(s, "sampler_on", "?"), soft_embedding=getattr(s, "soft_embedding", "?"),
               stats=s.as_dict())


def diffusion_params(steps: int, canvas: int, extra: dict[str, Any]) -> DiffusionParams:
    return DiffusionParams(steps=steps, gen_length=canvas, max_tokens=canvas, seed=0, **FIXED_STEPS, **extra)


def ar_params(tokens: int, extra: dict[str, Any]) -> DiffusionParams:
    return DiffusionParams(autoregressive=True, max_tokens=tokens, seed=0, early_stop=False, **extra)


def parse_params(items: list[str]) -> dict[str, Any]:
    """--param KEY=VALUE pairs (DiffusionParams fields); values are JSON where they parse as JSON."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--param expects KEY=VALUE (got {item!r})")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def make_prompt(engine: DiffusionEngine, n_tokens: int) -> np.ndarray:
    text = PROMPT_TEXT
    tokens = engine.encode(text)
    while tokens.size < n_tokens:
        text += PROMPT_TEXT
        tokens = engine.encode(text)
    return tokens[:n_tokens]


def describe(path: Path) -> str:
    """The file's shape in one line, from its header."""
    h = read_gguf_header(path)
    key = lambda suffix: h.arch_key(suffix)  # noqa: E731
    embd = h.tensors["token_embd.weight"]
    matrices: dict[str, int] = {}
    for t in h.tensors.values():
        if len(t.shape) > 1 and t.name != embd.name:
            matrices[t.type_name] = matrices.get(t.type_name, 0) + 1
    return (f"{key('block_count')} layers, d {key('embedding_length')}, vocab {embd.shape[1]}, "
            f"{key('expert_count')} experts top-{key('expert_used_count')} (expert ff "
            f"{key('expert_feed_forward_length')}, dense ff {key('feed_forward_length')}), matrices "
            f"{', '.join(f'{n} {k}' for k, n in sorted(matrices.items()))}, token_embd {embd.type_name}, "
            f"{path.stat().st_size / 1e9:.2f} GB")


def print_table(rows: list[Row], ar: Row) -> None:
    head = (f"{'configuration':22} {'steps':>5} {'tokens':>6} {'ms/step':>9} {'backend':>9} {'host':>8} "
            f"{'host %':>6} {'tok/s':>8} {'/ AR':>6}  sampler_on  soft_embedding")
    print(head)
    for r in rows + [ar]:
        ratio = r.tokens_per_s / ar.tokens_per_s if ar.tokens_per_s > 0 else float("nan")
        print(f"{r.configuration:22} {r.steps:5d} {r.tokens:6d} {r.per_step_ms(r.elapsed_s):9.1f} "
              f"{r.per_step_ms(r.model_s):9.1f} {r.per_step_ms(r.sampler_s):8.1f} {100 * r.host_share:5.1f}% "
              f"{r.tokens_per_s:8.2f} {ratio:6.2f}  {str(r.sampler_on):10}  {r.soft_embedding}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--model", type=Path, help="an existing GGUF (random full-shape, or a real DiffusionGemma)")
    src.add_argument("--write", type=Path, help="write the random full-shape file here first (kept)")
    add_shape_args(ap)  # --layers, --qtype, --tiny, ... for --write (or a temporary file)
    ap.add_argument("--steps", default="16,24,32,48", help="steps per canvas, comma separated")
    ap.add_argument("--ar-tokens", type=int, default=64, help="tokens decoded left to right for the --ar row")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--canvas", type=int, default=None, help="canvas length (default: the model's, 256)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--n-gpu-layers", type=int, default=None,
                    help="default: placed by the GPU's free memory (model_backend/placement.py)")
    ap.add_argument("--experts-on", choices=("auto", "cpu", "gpu"), default="auto",
                    help="where the routed experts may go (cpu: every layer's in RAM, the rest on the GPU)")
    ap.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                    help="extra DiffusionParams field for every run, e.g. sampler_on=host (repeatable)")
    ap.add_argument("--host-steps", type=int, default=None, metavar="S",
                    help="also run S steps with the sampler on the host (numpy), for the backend/host split side by "
                         "side (costs the float32 token_embd copy: ~3 GB at the full vocabulary)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    steps = [int(s) for s in args.steps.split(",") if s.strip()]
    args.extra = parse_params(args.param)

    tmp = None
    path = args.model
    write_s = None
    if path is None:
        if args.write is None:
            tmp = tempfile.TemporaryDirectory()
        path = args.write or Path(tmp.name) / "dg-fullshape.gguf"
        t0 = time.perf_counter()
        write_fullshape_dg(path, qtype=args.qtype, embd_qtype=args.embd_qtype, seed=args.seed,
                           progress=ProgressLine(), **shape_from_args(args))
        write_s = time.perf_counter() - t0
        print(f"wrote {path} in {write_s:.1f} s")
    try:
        result = run(path, args, steps)
    finally:
        if tmp is not None:
            tmp.cleanup()
    result["write_s"] = write_s
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))
        print(f"wrote {args.json}")


def run(path: Path, args: argparse.Namespace, steps: list[int]) -> dict[str, Any]:
    info = engine_info()
    t0 = time.perf_counter()
    engine = load_engine(path, n_threads=args.threads, n_gpu_layers=args.n_gpu_layers, experts_on=args.experts_on)
    load_s = time.perf_counter() - t0
    rss_loaded = peak_rss_mb()
    with engine:
        canvas = args.canvas or int(engine.resolve().gen_length)
        prompt = make_prompt(engine, args.prompt_tokens)
        print(f"{path.name}: {describe(path)}")
        print(f"engine {info.llama_cpp_version}, patch level {info.patch_level}, gpu offload {info.gpu_offload}, "
              f"{engine.label}; loaded in {load_s:.1f} s")
        print(f"placement: {engine.placement.summary()} ({engine.placement.reason})")
        print(f"prompt {prompt.size} tokens, canvas {canvas}; diffusion runs exactly S steps on one canvas "
              f"(early_stop off, confidence_threshold -1: no early stop); --ar decodes {args.ar_tokens} tokens")
        print("backend = llama.cpp (stats.model_s), host = Python (stats.sampler_s), per step, the prompt "
              "prefill included; tok/s = answer tokens / wall time of generate(); / AR = tok/s over --ar's")
        rows = []
        for s in steps:
            rows.append(measure(engine, prompt, f"diffusion {s} steps", diffusion_params(s, canvas, args.extra),
                                diffusion_params(min(s, 2), canvas, args.extra)))
            if rows[-1].steps != s:
                print(f"warning: {rows[-1].configuration} ran {rows[-1].steps} steps", file=sys.stderr)
        ar = measure(engine, prompt, "autoregressive (--ar)", ar_params(args.ar_tokens, args.extra),
                     ar_params(min(args.ar_tokens, 4), args.extra))
        rss_backend = peak_rss_mb()  # before any host-path run: the backend path never copies token_embd
        if args.host_steps:  # last: it makes the engine build its float32 embedding copy
            host = {**args.extra, "sampler_on": "host"}
            rows.append(measure(engine, prompt, f"diffusion {args.host_steps} steps",
                                diffusion_params(args.host_steps, canvas, host),
                                diffusion_params(min(args.host_steps, 2), canvas, host)))
    print_table(rows, ar)
    peak = peak_rss_mb()
    print(f"peak RSS {peak:.0f} MB (after loading {rss_loaded:.0f} MB; after the backend-path runs {rss_backend:.0f} MB)")
    # the writer's options only mean something when this run wrote the file
    options = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
               if k != "extra" and not (args.model and k in WRITER_OPTIONS)}
    given = {k: v for k, v in options.items() if v is not None and v is not False and v != []}
    print("options: " + " ".join(f"{k}={v}" for k, v in given.items()))
    return {
        "model": str(path), "file": describe(path), "engine": asdict(info), "label": engine.label,
        "load_s": round(load_s, 3), "prompt_tokens": int(prompt.size), "canvas": canvas,
        "peak_rss_mb": round(peak, 1), "rss_after_load_mb": round(rss_loaded, 1),
        "peak_rss_backend_runs_mb": round(rss_backend, 1), "options": options,
        "rows": [dict(asdict(r), tokens_per_s=round(r.tokens_per_s, 3),
                      ms_per_step=round(r.per_step_ms(r.elapsed_s), 3),
                      backend_ms_per_step=round(r.per_step_ms(r.model_s), 3),
                      host_ms_per_step=round(r.per_step_ms(r.sampler_s), 3),
                      host_share=round(r.host_share, 4),
                      ratio_to_ar=round(r.tokens_per_s / ar.tokens_per_s, 4) if ar.tokens_per_s else None)
                 for r in rows + [ar]],
    }


if __name__ == "__main__":
    main()
