"""Samplers are pure functions of logits and state: tested here without a model."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from dgchat.model_backend import sampling, schedules
from dgchat.model_backend.canvas import Canvas, Cell
from dgchat.model_backend.events import FinalEvent, StepEvent
from dgchat.model_backend.masked_diffusion import first_end, run_masked
from dgchat.model_backend.requests import MaskedSetup
from dgchat.model_backend.params import DiffusionParams
from dgchat.model_backend.errors import InvalidParameterError

V = 50
MASK, EOS = 49, 48


def test_timestep_schedule_commits_everything_once() -> None:
    for n, steps, eps in [(256, 64, 1e-3), (37, 10, 0.0), (5, 8, 1e-3), (128, 128, 1e-3)]:
        remaining, total = n, 0
        for s in range(steps):
            k = schedules.timestep_transfer_count(s, steps, remaining, eps)
            assert 0 <= k <= remaining
            remaining -= k
            total += k
        assert remaining == 0 and total == n


def test_even_split_and_blocks() -> None:
    assert schedules.even_split(10, 4) == [3, 3, 2, 2]
    assert sum(schedules.even_split(33, 8)) == 33
    assert schedules.blocks(64, 16) == [(0, 16), (16, 32), (32, 48), (48, 64)]
    assert schedules.blocks(64, None) == [(0, 64)]


def test_greedy_proposal_is_argmax_and_confidences() -> None:
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((7, V)).astype(np.float32) * 3
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    p = sampling.propose(logits, temperature=0.0, top_k=0, top_p=1.0, algorithm="confidence", rng=rng)
    np.testing.assert_array_equal(p.tokens, logits.argmax(1))
    np.testing.assert_allclose(p.confidence, probs.max(1), rtol=1e-5)
    m = sampling.propose(logits, temperature=0.0, top_k=0, top_p=1.0, algorithm="margin", rng=rng)
    top2 = np.sort(probs, 1)[:, -2:]
    np.testing.assert_allclose(m.confidence, top2[:, 1] - top2[:, 0], rtol=1e-4, atol=1e-6)
    e = sampling.propose(logits, temperature=0.0, top_k=0, top_p=1.0, algorithm="entropy", rng=rng)
    np.testing.assert_allclose(e.confidence, (probs * np.log(probs)).sum(1), rtol=1e-4)


def test_sampling_is_deterministic_and_follows_the_distribution() -> None:
    logits = np.log(np.array([[0.7, 0.2, 0.1] + [1e-9] * (V - 3)], dtype=np.float32)).repeat(4000, 0)
    a = sampling.propose(logits, temperature=1.0, top_k=0, top_p=1.0, algorithm="confidence",
                         rng=np.random.default_rng(5)).tokens
    b = sampling.propose(logits, temperature=1.0, top_k=0, top_p=1.0, algorithm="confidence",
                         rng=np.random.default_rng(5)).tokens
    np.testing.assert_array_equal(a, b)
    freq = np.bincount(a, minlength=V)[:3] / a.size
    np.testing.assert_allclose(freq, [0.7, 0.2, 0.1], atol=0.03)
    k1 = sampling.propose(logits, temperature=1.0, top_k=1, top_p=1.0, algorithm="confidence",
                          rng=np.random.default_rng(1)).tokens
    assert (k1 == 0).all()
    p = sampling.propose(logits, temperature=1.0, top_k=0, top_p=0.75, algorithm="confidence",
                         rng=np.random.default_rng(1)).tokens
    assert set(np.unique(p)) == {0, 1}


def test_threshold_and_factor_rules() -> None:
    conf = np.array([0.95, 0.5, 0.91, 0.2, 0.99], dtype=np.float32)
    assert sorted(sampling.choose_threshold(conf, 0.9).tolist()) == [0, 2, 4]
    assert sampling.choose_threshold(np.array([0.1, 0.3, 0.2]), 0.9).tolist() == [1]  # at least one
    # factor 1: the n best are kept while (n + 1) (1 - c_n) <= 1
    picked = sampling.choose_factor(np.array([0.99, 0.9, 0.8, 0.3]), 1.0)
    assert picked.tolist() == [0, 1, 2]  # 4 * (1 - 0.8) <= 1 < 5 * (1 - 0.3)
    assert sampling.choose_factor(np.array([0.1, 0.2]), 1.0).tolist() == [1]


def test_choose_top_ties_go_left_and_alg_temp_is_seeded() -> None:
    assert sampling.choose_top(np.array([0.5, 0.9, 0.9, 0.1]), 2, 0.0, np.random.default_rng(0)).tolist() == [1, 2]
    c = np.linspace(0, 1, 20)
    a = sampling.choose_top(c, 5, 0.3, np.random.default_rng(7))
    b = sampling.choose_top(c, 5, 0.3, np.random.default_rng(7))
    assert a.tolist() == b.tolist() and len(set(a.tolist())) == 5


def test_first_end_requires_decided_prefix() -> None:
    is_eog = np.zeros(V, bool)
    is_eog[EOS] = True
    c = Canvas.blank(6, MASK)
    c.commit(np.array([3]), np.array([EOS]), np.array([1.0], np.float32), 1)
    assert first_end(c, is_eog) is None  # positions 0..2 still masked
    c.commit(np.array([0, 1, 2]), np.array([1, 2, 3]), np.ones(3, np.float32), 2)
    assert first_end(c, is_eog) == 3


class ScriptedLogits:
    """Logits that make position p of the answer prefer script[p] (strongly), else token 1."""

    def __init__(self, prompt_len: int, script: list[int], shift: bool = False) -> None:
        self.prompt_len, self.script, self.shift = prompt_len, script, shift
        self.calls: list[tuple[np.ndarray, np.ndarray]] = []

    def answer(self, requests):
        return [self.logits(r) for _, r in requests]

    def logits(self, request) -> np.ndarray:
        sequence, rows = request.sequence, request.rows
        self.calls.append((sequence.copy(), rows.copy()))
        out = np.zeros((rows.size, V), np.float32)
        for i, r in enumerate(rows):
            pos = r + (1 if self.shift else 0) - self.prompt_len
            tok = self.script[pos] if 0 <= pos < len(self.script) else 1
            out[i, tok] = 8.0 + 0.01 * (len(self.script) - pos)  # earlier positions slightly surer
        return out


def _run(source, prompt, params, **kw):
    setup = MaskedSetup(MASK, np.array([EOS]), kw.pop("shift", False))
    return list(run_masked(source, prompt, params, setup, n_vocab=V, **kw))


def _params(**kw) -> DiffusionParams:
    base = dict(steps=8, gen_length=8, algorithm="confidence", temperature=0.0, eps=1e-3, max_tokens=8)
    base.update(kw)
    return DiffusionParams(**base)


def test_early_stop_cuts_at_end_token_and_saves_steps() -> None:
    prompt = np.array([5, 6, 7], np.int32)
    script = [10, 11, EOS, EOS, EOS, EOS, EOS, EOS]
    events = _run(ScriptedLogits(3, script), prompt, _params(steps=8, threshold=0.9, max_tokens=8))
    final = events[-1]
    assert isinstance(final, FinalEvent) and final.stop_reason == "eos"
    assert final.tokens.tolist() == [10, 11]
    assert final.stats.steps == 1  # every position is confident: one parallel step, then stop
    # without early stop the run spends its scheduled steps
    events = _run(ScriptedLogits(3, script), prompt, _params(early_stop=False))
    assert events[-1].tokens.tolist() == [10, 11] and events[-1].stats.steps == 8


def test_multi_canvas_continues_until_end() -> None:
    prompt = np.array([5], np.int32)
    script = list(range(10, 30)) + [EOS] + [EOS] * 11  # 20 tokens then the end: needs 3 canvases of 8
    src = ScriptedLogits(1, script)
    events = _run(src, prompt, _params(max_tokens=64))
    final = events[-1]
    assert final.stop_reason == "eos" and final.tokens.tolist() == list(range(10, 30))
    assert final.stats.canvases == 3
    # later canvases see earlier ones as context
    seq, rows = src.calls[-1]
    assert seq[: 1 + 16].tolist() == [5] + list(range(10, 26))
    # max_tokens caps the answer
    final = _run(ScriptedLogits(1, script), prompt, _params(max_tokens=12))[-1]
    assert final.stop_reason == "max_tokens" and final.tokens.tolist() == list(range(10, 22))


def test_block_schedule_fills_blocks_left_to_right() -> None:
    prompt = np.array([5], np.int32)
    script = list(range(10, 18))
    events = _run(ScriptedLogits(1, script), prompt, _params(steps=8, block_length=4))
    steps = [e for e in events if isinstance(e, StepEvent)]
    assert len(steps) == 8
    # the first 4 steps only commit positions 0..3
    for e in steps[:4]:
        assert (e.canvas.state[4:] == Cell.MASKED).all()
    assert events[-1].tokens.tolist() == script


def test_shift_logits_reads_previous_row() -> None:
    prompt = np.array([5, 6], np.int32)
    src = ScriptedLogits(2, list(range(10, 18)), shift=True)
    final = _run(src, prompt, _params(), shift=True)[-1]
    assert final.tokens.tolist() == list(range(10, 18))
    assert src.calls[0][1].tolist() == list(range(1, 9))  # rows prompt_len-1 ...


def test_cancel_keeps_decided_prefix() -> None:
    cancel = threading.Event()
    prompt = np.array([5], np.int32)
    gen = run_masked(ScriptedLogits(1, list(range(10, 18))), prompt, _params(steps=4),
                     MaskedSetup(MASK, np.array([EOS]), False), n_vocab=V, cancel=cancel)
    first = next(gen)
    assert isinstance(first, StepEvent)
    cancel.set()
    rest = list(gen)
    final = rest[-1]
    assert final.stop_reason == "cancelled" and final.tokens.tolist() == [10]


def test_cfg_combines_conditional_and_unconditional() -> None:
    class Src:
        def __init__(self):
            self.seqs = []

        def answer(self, requests):
            return [self.logits(r) for _, r in requests]

        def logits(self, request):
            sequence, rows = request.sequence, request.rows
            self.seqs.append(sequence.copy())
            out = np.zeros((rows.size, V), np.float32)
            # conditional pass (prompt visible) prefers 3, unconditional prefers 4 more weakly
            out[:, 3 if sequence[0] != MASK else 4] = 1.0
            return out

    src = Src()
    final = _run(src, np.array([5], np.int32), _params(cfg_scale=1.0, steps=1))[-1]
    assert src.seqs[1][0] == MASK  # second pass has the prompt masked
    assert (final.tokens == 3).all()


@pytest.mark.parametrize(
    "kw, msg",
    [
        (dict(steps=0), "--steps"),
        (dict(gen_length=30, block_length=8), "not divisible"),
        (dict(threshold=1.5), "--threshold"),
        (dict(algorithm="nope"), "--algorithm"),
        (dict(top_p=0.0), "--top-p"),
        (dict(threshold=0.9, factor=1.0), "alternatives"),
        (dict(gen_length=64, block_length=16, steps=10), "multiple of the number of blocks"),
    ],
)
def test_parameter_validation(kw, msg) -> None:
    with pytest.raises(InvalidParameterError, match=msg):
        DiffusionParams(**kw).validate()


def test_tiny_alg_temp_falls_back_to_the_most_confident() -> None:
    # confidences 0.1 apart at alg_temp 1e-6: every weight but the top one underflows to 0, and a
    # draw of 3 distinct positions from one non-zero weight would fail
    conf = np.array([0.2, 0.9, 0.5, 0.8, 0.1], dtype=np.float32)
    picked = sampling.choose_top(conf, 3, 1e-6, np.random.default_rng(0))
    assert picked.tolist() == [1, 3, 2]
    # a usable alg_temp still draws (and may differ from the top 3)
    draws = {tuple(sorted(sampling.choose_top(conf, 3, 1.0, np.random.default_rng(s)).tolist())) for s in range(20)}
    assert len(draws) > 1
