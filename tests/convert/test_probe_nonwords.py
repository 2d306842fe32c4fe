"""tests/bench/probe_nonwords.py: its classification of copied noise and its copy-guard experiment,
on hand-made steps (no model), and the wrapper leaves the engine's sampler as it found it."""

from __future__ import annotations

import numpy as np

import bench.probe_nonwords as probe
from dgchat.model_backend import diffusion_gemma_denoiser as diffusion_gemma
from dgchat.model_backend.entropy_bound import EntropyBoundConfig
from dgchat.model_backend.sampling import RowStats

CFG = EntropyBoundConfig(steps=4, entropy_bound=10.0, t_min=0.4, t_max=0.8, stability_threshold=1,
                         confidence_threshold=0.1)


def _row(drawn, entropy) -> RowStats:
    drawn = np.asarray(drawn, np.int32)
    zeros = np.zeros(drawn.shape, np.float32)
    return RowStats(drawn=drawn, argmax=drawn.copy(), entropy=np.asarray(entropy, np.float32), p_drawn=zeros,
                    p_argmax=zeros, p_second=zeros)


def test_token_flags_tell_copied_noise_from_predictions():
    a, acc, no = np.array, np.array([True, True, True]), np.array([False, False, False])
    steps = [
        # step 0: input = the starting random canvas [7, 8, 9]; position 0 keeps its random 7
        (a([7, 8, 9]), a([True, False, False]), a([7, 5, 6])),
        # step 1: position 1 was re-randomised to 4, the decoder draws 4 again: copied noise;
        # position 2 was re-randomised to 3, the decoder draws 6: a prediction
        (a([7, 4, 3]), acc, a([7, 4, 6])),
        (a([7, 4, 6]), acc, a([7, 4, 6])),
    ]
    flags = probe.token_flags(steps, a([7, 4, 6]))
    assert flags == [(True, True), (True, True), (True, False)]
    # a token accepted, then dropped and drawn again from other input, counts from its last acceptance
    steps2 = [(a([1, 2, 3]), acc, a([1, 2, 5])), (a([1, 2, 5]), no, a([1, 2, 5])), (a([1, 2, 0]), acc, a([1, 2, 5]))]
    assert [c for _, c in probe.token_flags(steps2, a([1, 2, 5]))] == [True, True, False]


def test_copy_guard_refuses_copied_noise_and_wrapper_restores_the_sampler():
    original = diffusion_gemma.entropy_bound_update
    current = np.array([10, 11, 12, 13], np.int32)
    renoise = np.array([20, 21, 22, 23], np.int32)
    row = _row([10, 5, 12, 6], [0.1, 0.1, 0.1, 0.1])  # positions 0 and 2 draw the token they were shown
    with probe.recording(probe.StepRecorder(guard=True)) as rec:
        assert diffusion_gemma.entropy_bound_update is rec
        result = diffusion_gemma.entropy_bound_update(current, row, CFG, renoise)
        assert result.accepted.tolist() == [False, True, False, True]
        assert result.canvas.tolist() == [20, 5, 22, 6]
        # next step: position 1 was accepted last step, so drawing its own token again is not a copy
        row2 = _row([30, 5, 31, 6], [0.1, 0.1, 0.1, 0.1])
        result2 = diffusion_gemma.entropy_bound_update(result.canvas, row2, CFG, renoise)
        assert result2.accepted.all()
    assert diffusion_gemma.entropy_bound_update is original
    with probe.recording(probe.StepRecorder(guard=False)) as rec:
        plain = diffusion_gemma.entropy_bound_update(current, row, CFG, renoise)
    assert plain.accepted.all() and len(rec.steps) == 1
