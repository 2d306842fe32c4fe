"""The setup wizard's test answer: the chat's settings for a model, made short.

`trial_params` gives the settings of the short answer the wizard's last step shows on the live
canvas (app/wizard_screen.py): long enough to watch, short enough on a CPU.

- A canvas model (masked diffusion, DiffusionGemma) with a canvas of more than TEST_TOKENS positions
  gets a canvas of TEST_TOKENS with proportionally fewer steps (a multiple of its number of blocks;
  param_resolution.short_answer); a canvas at most that long keeps the chat's settings.
- A block-diffusion model (SDAR, BD3LM) writes block after block: its canvas is one block (4-32
  tokens), always short, but its answer runs to max_tokens (512 by default), which on a CPU is far
  from a short test. Its test answer is TEST_TOKENS tokens, the model's own blocks and steps per block.
- A server that is not dgchat serve samples with its own settings: only the answer's length is ours.

The full settings are used when the shortened ones do not validate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from dgchat.model_backend.engine_protocol import Engine
from dgchat.model_backend.errors import InvalidParameterError
from dgchat.model_backend.param_resolution import CONFIG, Layer, resolved_for, short_answer
from dgchat.model_backend.params import DiffusionParams
from dgchat.recording.blocks import block_size_of

TEST_TOKENS = 32  # the test answer's canvas (a block model: its length): long enough to watch, short on a CPU


def trial_params(engine: Engine, base: Mapping[str, Any]) -> DiffusionParams:
    """The chat's settings (`base`: the config's [sampler] table as written) for this model, shortened
    to a test answer of at most TEST_TOKENS tokens (see the module docstring)."""
    # what a server cannot take of the config's settings, its engine's resolve leaves out
    full = resolved_for(engine, [Layer.of(CONFIG, base)]).params  # model_backend/param_resolution
    if full.gen_length is None:  # no canvas (a server that samples by its own settings): only the length is ours
        return engine.resolve(DiffusionParams(**{**base, "max_tokens": TEST_TOKENS}))
    short = short_answer(full, TEST_TOKENS, block_diffusion=bool(block_size_of(engine)))
    if not short.values:
        return full
    try:
        return engine.resolve(replace(full, **short.values))
    except InvalidParameterError:
        return full
