"""Reference mode against llama.cpp's own `llama-diffusion-cli`: speed and tokens, side by side.

Both run the same GGUF, prompt, sequence length, steps, sampler parameters, seed and thread count;
the CLI gets every sampler flag explicitly (its defaults are top-k 40 / top-p 0.95 / temp 0.8).
Without --model a masked-diffusion fixture with a realistic vocabulary is written first
(llada, hidden 256, 6 layers, random weights, `--n-vocab` tokens; tests/fixtures/wide_vocab.py).

    LLAMA_CPP_LIB_PATH=/path/to/llama.cpp/build/bin \\
    python tests/bench/bench_reference_vs_cli.py --cli /path/to/llama-diffusion-cli --threads 1,2 --repeat 5

Per run it prints reference mode's ms/step split into model (llama.cpp decode) and sampler, the
CLI's ms/step (its own "time per step", which covers decode and sampling) and tokens/s, their
ratio (CLI ms/step / reference ms/step: >= 1 means reference mode is at least as fast), and whether
the answers are identical (the CLI prints only the generated text; the fixture's filler tokens
each have a distinct text, so equal text means equal tokens). Runs alternate which side goes
first; the summary gives the median ratio per thread count, since a shared machine is noisy.

OpenMP's wait policy matters with several threads: dgchat sets GOMP_SPINCOUNT=2000 (a short bounded
spin) when OMP_WAIT_POLICY is unset (model_backend/llamacpp/library.py), while the CLI runs with the
environment this script was started with (libgomp's default spins for a long while). Set
OMP_WAIT_POLICY yourself to give both the same, or pass --libgomp-default to run reference mode with
libgomp's default too, or --gomp-spincount N for another bounded spin.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# the caller's OpenMP settings, before dgchat's import sets its own default
USER_OMP_WAIT_POLICY = os.environ.get("OMP_WAIT_POLICY")
USER_GOMP_SPINCOUNT = os.environ.get("GOMP_SPINCOUNT")


def _early_option(name: str) -> str | None:
    """An option that must act before llama_cpp (and with it libgomp) is loaded."""
    for i, arg in enumerate(sys.argv):
        if arg == name:
            return sys.argv[i + 1] if i + 1 < len(sys.argv) and not sys.argv[i + 1].startswith("--") else ""
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


_SPIN = _early_option("--gomp-spincount")
if _early_option("--libgomp-default") is not None or _SPIN:
    # libgomp reads its environment once, when it is loaded: load it (through llama_cpp) before
    # dgchat sets its bounded spin, so reference mode runs with libgomp's default spinning (or the
    # given GOMP_SPINCOUNT; libgomp ignores it once OMP_WAIT_POLICY is set)
    os.environ.pop("OMP_WAIT_POLICY", None)
    os.environ.pop("GOMP_SPINCOUNT", None)
    if _SPIN:
        os.environ["GOMP_SPINCOUNT"] = _SPIN
    import llama_cpp  # noqa: F401

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from fixtures.wide_vocab import write_wide_vocab_gguf  # noqa: E402
from dgchat.model_backend import reference_sampler  # noqa: E402
from dgchat.model_backend.engine import DiffusionEngine  # noqa: E402
from dgchat.model_backend.loader import load_engine  # noqa: E402
from dgchat.model_backend.events import FinalEvent  # noqa: E402
from dgchat.model_backend.params import DiffusionParams  # noqa: E402
from dgchat.model_backend.reference_sampler import ALGORITHM_IDS  # noqa: E402

if _SPIN:
    REFERENCE_OMP = f"unset, GOMP_SPINCOUNT={_SPIN}"
elif _early_option("--libgomp-default") is not None:
    REFERENCE_OMP = "unset (libgomp default)"
else:
    REFERENCE_OMP = os.environ.get("OMP_WAIT_POLICY")

PROMPT = "Halt, traveller! None may pass the gate after dark."
_CLI_TIMES = re.compile(r"total time: ([0-9.]+)ms, time per step: ([0-9.]+)ms, sampling time per step: ([0-9.]+)ms")
_LOG_PREFIX = re.compile(r"^\d+\.\d+\.\d+\.\d+ [A-Z] ")


def _cli_answer(text: str) -> str | None:
    """The generated text the CLI logs after its timing line (`LOG_INF("\\n%s\\n")`)."""
    m = _CLI_TIMES.search(text)
    if m is None:
        return None
    rest = text[m.end():]
    rest = rest[rest.index("\n") + 1:] if "\n" in rest else ""
    rest = _LOG_PREFIX.sub("", rest, count=1)  # the logger's timestamp prefix, when it prints one
    if rest.startswith("\n"):
        rest = rest[1:]
    return rest[:-1] if rest.endswith("\n") else rest


def run_cli(cli: Path, model: Path, a: argparse.Namespace, threads: int) -> dict:
    cmd = [str(cli), "-m", str(model), "-p", a.prompt, "-ub", str(a.length), "-b", str(a.length), "-c", str(a.length),
           "--diffusion-steps", str(a.steps), "--diffusion-algorithm", str(ALGORITHM_IDS[a.algorithm]),
           "--temp", str(a.temp), "--top-k", str(a.top_k), "--top-p", str(a.top_p), "-s", str(a.seed),
           "-t", str(threads)]
    cmd += ["--diffusion-block-length", str(a.block_length)] if a.block_length else ["--diffusion-eps", str(a.eps)]
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(cli.parent), env.get("LD_LIBRARY_PATH")]))
    for key, value in (("OMP_WAIT_POLICY", USER_OMP_WAIT_POLICY), ("GOMP_SPINCOUNT", USER_GOMP_SPINCOUNT)):
        env.pop(key, None)  # the CLI runs as the caller would run it
        if value is not None:
            env[key] = value
    res = subprocess.run(cmd, capture_output=True, text=True, encoding="utf-8", errors="replace", env=env)
    text = res.stderr + res.stdout
    m = _CLI_TIMES.search(text)
    if res.returncode != 0 or m is None:
        raise RuntimeError(f"llama-diffusion-cli failed ({res.returncode}): {text[-1500:]}")
    total_ms, step_ms, sampling_ms = (float(x) for x in m.groups())
    return dict(ms_step=step_ms, sampler_ms=sampling_ms, total_s=total_ms / 1000, answer=_cli_answer(text))


def run_reference(engine: DiffusionEngine, prompt: np.ndarray, a: argparse.Namespace) -> dict:
    schedule = dict(block_length=a.block_length) if a.block_length else dict(eps=a.eps)
    params = DiffusionParams(steps=a.steps, gen_length=a.length - int(prompt.size), mode="reference", seed=a.seed,
                             temperature=a.temp, top_k=a.top_k, top_p=a.top_p, algorithm=a.algorithm, **schedule)
    final = next(e for e in engine.generate(prompt, params) if isinstance(e, FinalEvent))
    s = final.stats
    return dict(ms_step=1000 * s.elapsed_s / a.steps, model_ms=1000 * s.model_s / a.steps,
                sampler_ms=1000 * s.sampler_s / a.steps, total_s=s.elapsed_s,
                answer=engine.detokenize(final.extra["sequence"]).split("\x00", 1)[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cli", type=Path, default=os.environ.get("LLAMA_DIFFUSION_CLI"),
                    help="llama-diffusion-cli (its shared libraries next to it); default $LLAMA_DIFFUSION_CLI")
    ap.add_argument("--model", type=Path, help="a masked-diffusion GGUF; default: write the fixture")
    ap.add_argument("--n-vocab", type=int, default=32768, help="the fixture's vocabulary size")
    ap.add_argument("--fixture-dir", type=Path, default=Path(tempfile.gettempdir()) / "dgchat-bench")
    ap.add_argument("--threads", default="1", help="comma-separated thread counts, each run on both sides")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--length", type=int, default=192, help="prompt + canvas (the CLI's -ub)")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--eps", type=float, default=0.001)
    ap.add_argument("--block-length", type=int, default=0)
    ap.add_argument("--algorithm", default="confidence", choices=sorted(ALGORITHM_IDS))
    ap.add_argument("--temp", type=float, default=0.8)
    ap.add_argument("--top-k", type=int, default=40)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--chain", default="auto", choices=reference_sampler.CHAINS,
                    help="reference mode's sampler chain (numpy: the re-implementation, for comparison)")
    ap.add_argument("--libgomp-default", action="store_true",
                    help="run reference mode with libgomp's default wait policy instead of dgchat's bounded spin")
    ap.add_argument("--gomp-spincount", metavar="N",
                    help="run reference mode with OMP_WAIT_POLICY unset and GOMP_SPINCOUNT=N (bounded spinning)")
    a = ap.parse_args()
    if a.cli is None or not a.cli.exists():
        ap.error("give --cli PATH to llama-diffusion-cli (or set LLAMA_DIFFUSION_CLI)")
    if a.chain == "numpy":
        reference_sampler._llama_chain_available = lambda: False
    elif a.chain == "llama.cpp" and not reference_sampler._llama_chain_available():
        ap.error("this llama-cpp-python has no usable sampler chain API")
    model = a.model
    if model is None:
        a.fixture_dir.mkdir(parents=True, exist_ok=True)
        model = a.fixture_dir / f"llada-h256-l6-v{a.n_vocab}.gguf"
        if not model.exists():
            write_wide_vocab_gguf(model, a.n_vocab)

    thread_counts = [int(t) for t in a.threads.split(",")]
    sched = f"block {a.block_length}" if a.block_length else f"eps {a.eps}"
    print(f"model {model.name}; sequence {a.length} tokens, {a.steps} steps, {sched}, {a.algorithm}, "
          f"temp {a.temp}, top-k {a.top_k}, top-p {a.top_p}, seed {a.seed}; chain {a.chain}")
    cli_omp = USER_OMP_WAIT_POLICY or "unset (libgomp default)"
    if USER_GOMP_SPINCOUNT:
        cli_omp += f", GOMP_SPINCOUNT={USER_GOMP_SPINCOUNT}"
    print(f"OMP_WAIT_POLICY: reference mode {REFERENCE_OMP}, CLI {cli_omp}")
    print(f"{'thr':>3} {'run':>3} | {'ref ms/step':>11} {'model':>7} {'sampler':>7} {'tok/s':>7} | "
          f"{'CLI ms/step':>11} {'sampling':>8} {'tok/s':>7} | {'ratio':>5} same")
    summary = []
    for threads in thread_counts:
        ratios, same_all = [], True
        with load_engine(model, n_threads=threads) as engine:
            prompt = engine.chat_prompt([{"role": "user", "content": a.prompt}])
            n_gen = a.length - int(prompt.size)
            run_reference(engine, prompt, a)  # warm-up: page in the weights, allocate the context
            for r in range(a.repeat):
                if r % 2 == 0:  # alternate the order: a slow spell on a shared machine hits both sides
                    ours, cli = run_reference(engine, prompt, a), run_cli(a.cli, model, a, threads)
                else:
                    cli, ours = run_cli(a.cli, model, a, threads), run_reference(engine, prompt, a)
                ratio = cli["ms_step"] / ours["ms_step"]
                same = cli["answer"] is not None and cli["answer"] == ours["answer"]
                ratios.append(ratio)
                same_all &= same
                print(f"{threads:>3} {r + 1:>3} | {ours['ms_step']:11.2f} {ours['model_ms']:7.2f} "
                      f"{ours['sampler_ms']:7.2f} {n_gen / ours['total_s']:7.1f} | {cli['ms_step']:11.2f} "
                      f"{cli['sampler_ms']:8.2f} {n_gen / cli['total_s']:7.1f} | {ratio:5.2f} "
                      f"{'yes' if same else 'NO'}", flush=True)
        summary.append((threads, statistics.median(ratios), same_all))
    print()
    for threads, ratio, same in summary:
        print(f"threads {threads}: median ratio {ratio:.2f}x (reference mode vs llama-diffusion-cli, tok/s), "
              f"identical answers: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"({time.perf_counter() - t0:.0f} s)")
