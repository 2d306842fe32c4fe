"""The fuzz target's CI subset (tests/fuzz/run.py): a fixed seed, a few hundred cases, well under a minute.

Mutated GGUFs (every seed model, the bundled one included) are loaded and generated from in worker
processes, mutated safetensors checkpoints are converted, hostile templates are rendered. A case
passes when dgchat uses the input or refuses it with one line; a crash (SIGABRT from llama.cpp), a
hang or a traceback fails the test and names the case (rerun it with `python tests/fuzz/run.py
--kinds KIND --cases N --seed 1 --keep DIR`). The longer local run is documented in docs/SECURITY.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fuzz.run import CI_CASES, run


@pytest.fixture(scope="module")
def seeds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz-seeds")


@pytest.mark.parametrize("kind", ["gguf", "safetensors", "template"])
def test_fuzz_ci_subset(kind: str, seeds: Path, tmp_path: Path) -> None:
    summary = run([kind], {kind: CI_CASES[kind]}, seed=1, cache=seeds, keep=tmp_path / "failures")
    print(summary.line())
    assert not summary.failures, "\n".join(f"case {f.case}: {f.what}: {f.detail.strip()[-1500:]}"
                                            for f in summary.failures[:5])
    assert summary.cases[kind] == CI_CASES[kind]
    # both outcomes occur: the mutations reach code that runs, not only the first check
    assert summary.ok.get(kind, 0) > 0 and summary.refused.get(kind, 0) > 0
    # every case was answered well within the 5 s the issue asks for (a template's deadline is 2 s)
    assert summary.max_seconds[kind] < 5.0, summary.max_seconds
