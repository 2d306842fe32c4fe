"""The setup wizard's test answer (app/trial.py): short on every family. A block-diffusion model's
canvas is one block (4 tokens here), so the canvas rule alone kept its full settings: a 512-token
answer as the "short test"."""

from __future__ import annotations

from dgchat.app.trial import TEST_TOKENS, trial_params
from dgchat.model_backend.loader import load_engine
from dgchat.model_backend.params import DiffusionParams
from fixtures.block_tiny import converted


def test_a_block_model_tests_with_a_short_answer_of_its_own_blocks(base):
    for name, block in (("sdar", 4), ("bd3lm", 32)):
        with load_engine(converted(base, name)) as engine:
            full = engine.resolve(DiffusionParams())
            assert full.max_tokens == 512  # the model's answer length: far from a short test
            params = trial_params(engine, {})
            assert params.max_tokens == TEST_TOKENS
            assert (params.gen_length, params.block_length, params.steps) == (block, block, full.steps)
            assert params.threshold == full.threshold and params.temperature == full.temperature
            # the config's canvas settings are replaced by the model's block, as in the chat
            params = trial_params(engine, {"steps": 2, "gen_length": 64, "max_tokens": 20})
            assert (params.gen_length, params.steps, params.max_tokens) == (block, 2, 20)


def test_canvas_models_keep_their_rule(llada_gguf):
    with load_engine(llada_gguf) as engine:
        short = trial_params(engine, {"steps": 8, "gen_length": 32})
        assert (short.gen_length, short.steps, short.max_tokens) == (32, 8, 32)
        cut = trial_params(engine, {"steps": 64, "gen_length": 128, "block_length": 32})
        # one block covers the shortened canvas: no block schedule (the resolution's rule)
        assert (cut.gen_length, cut.block_length, cut.steps, cut.max_tokens) == (32, None, 16, 32)
