"""The fuzz target: mutated GGUFs, safetensors checkpoints and chat templates against dgchat.

    python tests/fuzz/run.py                        # the CI subset: a fixed seed, a few hundred cases
    python tests/fuzz/run.py --cases 5000           # a longer local run (cases per kind)
    python tests/fuzz/run.py --kinds gguf --cases 1000 --seed 7 --keep /tmp/fuzz-failures

Every case runs in a worker process (tests/fuzz/worker.py), so a case that makes llama.cpp abort
(GGML_ASSERT -> SIGABRT) or hang is counted as a failure and the run goes on with a fresh worker.
A case passes when dgchat either uses the input or refuses it with a one-line DgchatError; it fails
on a crash, a hang (no answer within the timeout), a Python traceback or a multi-line error.
Failing inputs are copied to --keep. Exit status 1 if any case failed.

Seeds: the tiny GGUFs the test fixtures build (llada, dream, non-causal llama, converted llada-moe
and rnd1 and their KV-cache variants hy_v3 and qwen3moe), the bundled DiffusionGemma model; the
tiny llada and dream checkpoints; real chat templates plus known-hostile fragments.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
REPO = TESTS.parent
sys.path.insert(0, str(TESTS))
sys.path.insert(0, str(HERE))

TIMEOUTS = {"gguf": 30.0, "safetensors": 30.0, "template": 20.0}  # per case, generous for a loaded 2-core box
CI_CASES = {"gguf": 400, "safetensors": 150, "template": 80}


@dataclass
class Failure:
    kind: str
    case: int
    what: str  # "crash" | "hang" | "bug"
    detail: str
    kept: str | None = None


@dataclass
class Summary:
    cases: dict[str, int] = field(default_factory=dict)
    ok: dict[str, int] = field(default_factory=dict)
    refused: dict[str, int] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    max_seconds: dict[str, float] = field(default_factory=dict)
    max_rss_mb: dict[str, float] = field(default_factory=dict)
    elapsed_s: float = 0.0

    def line(self) -> str:
        parts = []
        for kind, n in self.cases.items():
            bad = sum(1 for f in self.failures if f.kind == kind)
            parts.append(f"{kind}: {n} cases, {self.ok.get(kind, 0)} ran, {self.refused.get(kind, 0)} refused, "
                         f"{bad} failed, slowest {self.max_seconds.get(kind, 0):.2f} s, "
                         f"peak RSS {self.max_rss_mb.get(kind, 0):.0f} MB")
        crashes = sum(1 for f in self.failures if f.what == "crash")
        hangs = sum(1 for f in self.failures if f.what == "hang")
        bugs = sum(1 for f in self.failures if f.what == "bug")
        return "; ".join(parts) + f" | crashes {crashes}, hangs {hangs}, tracebacks {bugs}, {self.elapsed_s:.0f} s"


class Worker:
    def __init__(self, kind: str, env: dict[str, str]) -> None:
        self.kind, self.env = kind, env
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, str(HERE / "worker.py"), self.kind], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=self.env,
                                     cwd=str(REPO))

    def stop(self) -> None:
        if self.proc is not None:
            try:
                self.proc.kill()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
            self.proc = None

    def ask(self, request: dict, timeout: float) -> tuple[str, dict]:
        """("answer", reply) or ("crash", {returncode}) or ("hang", {})."""
        import select

        if self.proc is None or self.proc.poll() is not None:
            self.start()
        assert self.proc is not None and self.proc.stdin and self.proc.stdout
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            code = self.proc.wait()
            self.proc = None
            return "crash", {"returncode": code}
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            self.stop()
            return "hang", {}
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            self.proc = None
            return "crash", {"returncode": code}
        return "answer", json.loads(line)


# -- seeds ----------------------------------------------------------------------------------------------
def gguf_seeds(cache: Path) -> list[Path]:
    from fixtures.gguf_models import TinySpec, write_tiny_gguf

    cache.mkdir(parents=True, exist_ok=True)
    seeds = []
    for name, spec in (("llada", TinySpec(arch="llada")), ("dream", TinySpec(arch="dream")),
                       ("llama-nc", TinySpec(arch="llama"))):
        path = cache / f"seed-{name}.gguf"
        if not path.exists():
            write_tiny_gguf(path, spec)
        seeds.append(path)
    from fixtures.convert_tiny import Spec, make_checkpoint

    from dgchat.convert import convert

    for family, spec in (("llada-moe", Spec("llada-moe", n_kv=4, seed=2)), ("rnd1", Spec("rnd1", head_dim=32, seed=3))):
        for cache_capable in (False, True):
            path = cache / f"seed-{family}{'-kv' if cache_capable else ''}.gguf"
            if not path.exists():
                ckpt = cache / f"ckpt-{family}"
                if not (ckpt / "config.json").exists():
                    make_checkpoint(ckpt, spec)
                convert(ckpt, path, cache_capable=cache_capable)
            seeds.append(path)
    from dgchat.assets import bundled_model_path

    bundled = bundled_model_path()
    if bundled is not None:
        seeds.append(Path(bundled))
    return seeds


def checkpoint_seeds(cache: Path) -> list[Path]:
    from fixtures.convert_tiny import Spec, make_checkpoint

    seeds = []
    for name, spec in (("llada", Spec("llada")), ("dream", Spec("dream", seed=1))):
        path = cache / f"ckpt-seed-{name}"
        if not (path / "config.json").exists():
            make_checkpoint(path, spec)
        seeds.append(path)
    return seeds


# -- the run --------------------------------------------------------------------------------------------
def worker_env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"DGCHAT_HOME": str(home), "XDG_CONFIG_HOME": str(home / "config"), "XDG_DATA_HOME": str(home / "data"),
                "XDG_CACHE_HOME": str(home / "cache"), "HF_HUB_OFFLINE": "1", "GGML_NO_BACKTRACE": "1",
                "OMP_NUM_THREADS": "1"})
    env.pop("DGCHAT_MODEL", None)
    return env


def run(kinds: list[str], cases: dict[str, int], seed: int, cache: Path, keep: Path | None = None,
        progress: bool = False) -> Summary:
    summary = Summary()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dgchat-fuzz-") as tmp_name:
        tmp = Path(tmp_name)
        env = worker_env(tmp / "home")
        for kind in kinds:
            n = cases[kind]
            summary.cases[kind] = n
            worker = Worker(kind, env)
            try:
                _run_kind(kind, n, seed, cache, tmp, worker, summary, keep, progress)
            finally:
                worker.stop()
    summary.elapsed_s = time.monotonic() - started
    return summary


def _run_kind(kind: str, n: int, seed: int, cache: Path, tmp: Path, worker: Worker, summary: Summary,
              keep: Path | None, progress: bool) -> None:
    if kind == "gguf":
        from gguf_mutate import mutate, parse

        parsed = [(p, parse(p.read_bytes())) for p in gguf_seeds(cache)]
    elif kind == "safetensors":
        from safetensors_mutate import mutate_folder

        folders = checkpoint_seeds(cache)
    else:
        from template_gen import make_messages, make_template
    for i in range(n):
        rng = random.Random(f"{seed}:{kind}:{i}")
        case_input: Path | None = None
        if kind == "gguf":
            source, g = parsed[i % len(parsed)]
            case_input = tmp / f"case-{i}.gguf"
            case_input.write_bytes(mutate(g, rng))
            request: dict = {"path": str(case_input), "seed": i}
        elif kind == "safetensors":
            case_input = tmp / f"case-{i}"
            mutate_folder(folders[i % len(folders)], case_input, rng)
            request = {"path": str(case_input), "tmp": str(tmp)}
        else:
            request = {"template": make_template(rng), "messages": make_messages(rng)}
        how, reply = worker.ask(request, TIMEOUTS[kind])
        if how == "answer":
            status = reply["status"]
            summary.max_seconds[kind] = max(summary.max_seconds.get(kind, 0.0), reply.get("seconds", 0.0))
            summary.max_rss_mb[kind] = max(summary.max_rss_mb.get(kind, 0.0), reply.get("max_rss_mb", 0.0))
            if status == "ok":
                summary.ok[kind] = summary.ok.get(kind, 0) + 1
            elif status == "refused":
                summary.refused[kind] = summary.refused.get(kind, 0) + 1
            else:
                summary.failures.append(Failure(kind, i, "bug", reply.get("detail", "")))
        elif how == "crash":
            summary.failures.append(Failure(kind, i, "crash", f"worker exit status {reply.get('returncode')}"))
        else:
            summary.failures.append(Failure(kind, i, "hang", f"no answer within {TIMEOUTS[kind]:g} s"))
        if summary.failures and summary.failures[-1].case == i and summary.failures[-1].kind == kind and keep:
            keep.mkdir(parents=True, exist_ok=True)
            dest = keep / f"{kind}-{seed}-{i}"
            if case_input is not None and case_input.is_dir():
                shutil.copytree(case_input, dest, symlinks=True, dirs_exist_ok=True)
            elif case_input is not None:
                shutil.copy(case_input, dest.with_suffix(".gguf"))
            else:
                dest.with_suffix(".json").write_text(json.dumps(request))
            summary.failures[-1].kept = str(dest)
        if case_input is not None:
            shutil.rmtree(case_input, ignore_errors=True) if case_input.is_dir() else case_input.unlink(missing_ok=True)
        if progress and (i + 1) % 50 == 0:
            print(f"  {kind}: {i + 1}/{n}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kinds", default="gguf,safetensors,template")
    parser.add_argument("--cases", type=int, help="cases per kind (default: the CI subset's counts)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "dgchat-fuzz-seeds",
                        help="where the seed models are built once")
    parser.add_argument("--keep", type=Path, help="copy failing inputs here")
    args = parser.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    cases = {k: args.cases or CI_CASES[k] for k in kinds}
    summary = run(kinds, cases, args.seed, args.cache, args.keep, progress=True)
    for f in summary.failures[:50]:
        print(f"FAIL {f.kind} case {f.case}: {f.what}: {f.detail.strip().splitlines()[-1] if f.detail.strip() else ''}"
              + (f" (kept: {f.kept})" if f.kept else ""))
    print(summary.line())
    return 1 if summary.failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
