"""NPC lines on a block-diffusion model (SDAR, BD3LM; the tiny random-weight conversions of
fixtures.block_tiny): free lines in one batched decode, block by block; variants differ because the
NPC layer samples (the family decodes greedily by default); templates refused with the reason."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures.block_tiny import converted

from dgchat.model_backend.engine import DiffusionEngine
from dgchat.model_backend.errors import GenerationCancelled
from dgchat.model_backend.events import FinalEvent
from dgchat.model_backend.loader import load_engine
from dgchat.model_backend.param_resolution import resolved_for
from dgchat.model_backend.params import DiffusionParams
from dgchat.npc.cards import parse_card
from dgchat.npc.errors import TemplateError
from dgchat.npc.export import build_export, validate_export
from dgchat.npc.generator import DEFAULT_TEMPERATURE, LineSpec, NpcGenerator

NPC = parse_card({"name": "NPC"})
BLOCK = {"sdar": 4, "bd3lm": 32}
STEPS = {"sdar": 4, "bd3lm": 32}


@pytest.fixture(scope="module", params=["sdar", "bd3lm"])
def variant(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def engine(base: Path, variant: str) -> Iterator[DiffusionEngine]:
    # precise: a variant's line does not depend on what else is in its batch
    with load_engine(converted(base, variant), precise=True, n_threads=1) as e:
        yield e


@pytest.fixture(scope="module")
def generator(engine) -> NpcGenerator:
    return NpcGenerator(engine)


def _layers(generator: NpcGenerator, spec: LineSpec, length: int):
    return generator.layers_for(spec, canvas=length, to_fill=length, template=False,
                                bias=generator.bias_for(spec, template=False))


def test_a_line_s_settings_and_their_sources(generator, engine, variant: str) -> None:
    spec = LineSpec(card=NPC, length="bark", count=2, seed=3)
    table = resolved_for(engine, _layers(generator, spec, 12)).table()
    # the NPC layer samples (the family's own default is greedy: every seed would give the same line)
    assert table["temperature"] == {"value": DEFAULT_TEMPERATURE, "source": "npc"}
    assert table["max_tokens"] == {"value": 12, "source": "npc"}  # the line's budget
    # the block and the steps per block are the model's: nothing is fitted to the line
    assert table["gen_length"] == {"value": BLOCK[variant], "source": "model file"}
    assert table["block_length"] == {"value": BLOCK[variant], "source": "model file"}
    assert table["steps"] == {"value": STEPS[variant], "source": "model file"}
    assert "eps" not in table and table["cache"]["value"] == "none"
    params = generator.params_for(spec, canvas=12, to_fill=12, template=False, bias=())
    assert params == resolved_for(engine, _layers(generator, spec, 12)).params.updated(logit_bias=())
    # the card's (or line's) own settings win over the NPC layer's
    own = LineSpec(card=NPC, length="bark", params=DiffusionParams(temperature=0.3, steps=2))
    table = resolved_for(engine, _layers(generator, own, 12)).table()
    assert table["temperature"] == {"value": 0.3, "source": "card"}
    assert table["steps"] == {"value": 2, "source": "card"}
    # a card's block length cannot change the model's block
    sized = LineSpec(card=NPC, length="bark", params=DiffusionParams(block_length=8))
    assert generator.params_for(sized, canvas=12, to_fill=12, template=False, bias=()).block_length == BLOCK[variant]


def test_free_lines_in_one_batch_differ_and_reproduce(generator, engine, variant: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = engine.generate_batch

    def spy(prompts, params, **kw):
        calls.append(len(prompts))
        return real(prompts, params, **kw)

    monkeypatch.setattr(engine, "generate_batch", spy)
    progress = []
    spec = LineSpec(card=NPC, length="bark", count=4, seed=5)
    batch = generator.generate(spec, progress=progress.append)
    assert calls == [4]  # the variants in one batched decode
    assert [v.seed for v in batch.variants] == [5, 6, 7, 8]
    assert all(len(v.tokens) <= 12 and v.holes == [] for v in batch.variants)
    assert len({tuple(v.tokens) for v in batch.variants}) > 1  # variants differ
    assert all(v.settings["temperature"] == DEFAULT_TEMPERATURE and v.settings["steps"] == STEPS[variant]
               for v in batch.variants)
    assert batch.settings == {"length": "bark", "canvas_tokens": BLOCK[variant], "max_tokens": 12}
    # the progress counts steps per block over the line's blocks, and ends full
    assert progress and all(a.done <= b.done for a, b in zip(progress, progress[1:]))
    assert progress[-1].done == progress[-1].total > 0
    assert any(p.event is not None and not isinstance(p.event, FinalEvent) for p in progress)
    # the same spec gives the same lines; a variant alone is the variant in the batch (precise)
    monkeypatch.undo()
    again = generator.generate(spec)
    assert [v.tokens for v in again.variants] == [v.tokens for v in batch.variants]
    alone = generator.generate(LineSpec(card=NPC, length="bark", count=1, seed=6))
    assert alone.variants[0].tokens == batch.variants[1].tokens
    batch.keep_all()
    document = build_export([batch])
    validate_export(document)
    assert document["lines"][0]["settings"]["canvas_tokens"] == BLOCK[variant]


def test_a_greedy_card_gives_one_line_and_no_retries(generator) -> None:
    spec = LineSpec(card=NPC, length="bark", count=3, seed=1, params=DiffusionParams(temperature=0.0))
    batch = generator.generate(spec)
    assert len({tuple(v.tokens) for v in batch.variants}) == 1
    assert all(v.attempt == 0 and v.settings["temperature"] == 0.0 for v in batch.variants)


def test_templates_are_refused_with_the_reason(generator, engine, monkeypatch: pytest.MonkeyPatch) -> None:
    def never(*_a, **_kw):
        raise AssertionError("generated")

    monkeypatch.setattr(engine, "generate_batch", never)
    spec = LineSpec(card=NPC, template="Halt, {player}! None may pass the {___} after dark.",
                    variables={"player": "Aria"})
    with pytest.raises(TemplateError, match="cannot see the text after a hole.*give the line a `length`"):
        generator.generate(spec)
    with pytest.raises(TemplateError, match="cannot fill line templates"):
        generator.params_for(spec, canvas=12, to_fill=2, template=True, bias=())


def test_cancel_stops_a_batch(generator) -> None:
    cancel = threading.Event()

    def progress(p) -> None:
        if p.done >= 2:
            cancel.set()

    with pytest.raises(GenerationCancelled):
        generator.generate(LineSpec(card=NPC, length="long", count=2, seed=1), progress=progress, cancel=cancel)
