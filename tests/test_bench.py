"""`dgchat bench` runs every configuration side by side and writes JSON and a chart."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_bench_writes_results_and_chart(llama_nc_gguf: Path, tmp_path: Path) -> None:
    out = tmp_path / "bench"
    res = subprocess.run(
        [sys.executable, "-m", "dgchat", "bench", "-m", str(llama_nc_gguf), "--lengths", "32", "--prompt-tokens", "48",
         "--concurrency", "1,2", "--canvas", "32", "--configs", "dgchat,prefix cache,prefix + threshold 0.9",
         "--out", str(out), "--threads", "2"],
        capture_output=True, text=True, timeout=600,
    )
    assert res.returncode == 0, res.stderr
    data = json.loads((out / "results.json").read_text())
    rows = data["results"]
    names = {r["configuration"] for r in rows}
    assert {"reference", "dgchat", "prefix cache", "prefix + threshold 0.9"} <= names
    for r in rows:
        assert r["tokens"] == r["length"] * r["concurrency"]  # answers have exactly the asked length
        assert r["tokens_per_s"] > 0 and r["peak_rss_mb"] > 10 and r["steps"] > 0
        assert 0.0 <= r["sampler_share"] <= 1.0
        assert r["score"] is not None and r["score"] < 0  # a log-likelihood
    ref = [r for r in rows if r["configuration"] == "reference"]
    assert all(r["agreement"] == 1.0 and r["concurrency"] == 1 for r in ref)
    assert any(r["concurrency"] == 2 for r in rows)  # batched runs happened
    png = (out / "chart.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert "reference" in res.stdout and "tok/s" in res.stdout
