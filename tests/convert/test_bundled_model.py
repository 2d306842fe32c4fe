"""The model shipped in assets/ (issue 4): it loads on the patched engine, generates by block
diffusion and left to right, is deterministic under a seed, round-trips text, and has learned
the plays (held-out loss well under the unigram baseline)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from dgchat.assets import bundled_model_path
from dgchat.model_backend.loader import load_engine
from dgchat.model_backend.events import FinalEvent
from dgchat.model_backend.gguf_file import read_gguf_header
from dgchat.model_backend.llamacpp import engine_info
from dgchat.model_backend.params import DiffusionParams

MODEL = bundled_model_path()
pytestmark = pytest.mark.skipif(MODEL is None, reason="this installation has no bundled model")

# Coriolanus I.1, one of the two plays held out of training (Project Gutenberg text, public domain),
# in the chat layout the model was trained on.
HELD_OUT = (
    "<bos><start_of_turn>system\nYou are MENENIUS, Friend to Coriolanus. Scene: Rome. A street.<end_of_turn>\n"
    "<start_of_turn>FIRST CITIZEN\nSoft! who comes here?<end_of_turn>\n"
    "<start_of_turn>SECOND CITIZEN\nWorthy Menenius Agrippa; one that hath always loved the people.<end_of_turn>\n"
    "<start_of_turn>FIRST CITIZEN\nHe's one honest enough; would all the rest were so!<end_of_turn>\n"
    "<start_of_turn>MENENIUS\nWhat work's, my countrymen, in hand? where go you\n"
    "With bats and clubs? the matter? speak, I pray you.<end_of_turn>\n"
)
UNIGRAM_NATS = 6.60  # `train_default baselines` (v2 tokenizer, 16,384 entries): unigram cross-entropy of the held-out plays

NPC = [
    {"role": "system", "name": "INNKEEPER", "content": "You are INNKEEPER. Scene: A tavern in Eastcheap."},
    {"role": "user", "name": "TRAVELLER", "content": "Good evening. Have you a bed for the night?"},
]


@pytest.fixture(scope="module")
def engine():
    eng = load_engine(MODEL)
    yield eng
    eng.close()


def _run(engine, params: DiffusionParams) -> FinalEvent:
    final = None
    for event in engine.generate(engine.chat_prompt(NPC), params):
        if isinstance(event, FinalEvent):
            final = event
    assert final is not None
    return final


def test_file_is_small_and_a_text_only_diffusion_gemma() -> None:
    assert MODEL.stat().st_size < 30e6
    header = read_gguf_header(MODEL)
    assert header.metadata["general.architecture"] == "gemma4"
    assert header.metadata["dgchat.family"] == "diffusion-gemma"
    assert not any(name.startswith(("v.", "mm.")) for name in header.tensors)  # no vision tower


def test_loads_on_the_patched_engine(engine) -> None:
    assert engine.info.family == "diffusion_gemma"
    final = _run(engine, DiffusionParams(seed=0))
    if engine_info().exact_diffusion_gemma:
        assert final.engine_label == "DiffusionGemma, patched engine"


def test_diffusion_and_ar_generate_words(engine) -> None:
    for ar in (False, True):
        final = _run(engine, DiffusionParams(seed=3, autoregressive=ar))
        assert final.stop_reason in ("eos", "max_tokens") and final.tokens.size > 0
        words = final.text.split()
        assert words, final.text
        # the plays' English: mostly letters, not byte soup
        letters = sum(ch.isalpha() or ch.isspace() for ch in final.text)
        assert letters / len(final.text) > 0.75, final.text


def test_its_pad_bias_default_gives_answers_their_length(engine) -> None:
    """The shipped rollout-trained weights close a short answer's canvas with pads first, from its
    end backwards (model card, "the pad chain"); the file's pad bias of -1 is what lets the content
    in. Measured on the card's 8 first NPC exchanges: 198 answer tokens with it, 61 without."""
    from dgchat.convert.default_model.bundle_default import EXCHANGES
    from dgchat.convert.default_model.bundle_default import messages_for as exchange_messages

    assert engine.resolve().pad_bias == -1.0
    total = {}
    for pad_bias in (None, 0.0):
        total[pad_bias] = 0
        for i, exchange in enumerate(EXCHANGES[:8]):
            events = engine.generate(engine.chat_prompt(exchange_messages(exchange)),
                                     DiffusionParams(seed=i, pad_bias=pad_bias))
            total[pad_bias] += [e for e in events if isinstance(e, FinalEvent)][0].tokens.size
    assert total[None] >= 2 * total[0.0], total


def test_deterministic_under_a_seed(engine) -> None:
    a = _run(engine, DiffusionParams(seed=11))
    b = _run(engine, DiffusionParams(seed=11))
    assert np.array_equal(a.tokens, b.tokens) and a.text == b.text
    others = {_run(engine, DiffusionParams(seed=s)).text for s in (12, 13, 14)}
    assert len(others | {a.text}) > 1  # a seed changes the answer


@pytest.mark.parametrize("text", [
    "Now is the winter of our discontent\nMade glorious summer by this sun of York;",
    "What's in a name? That which we call a rose / By any other word would smell as sweet.",
    "  odd   spacing, digits 1603, ‘curly quotes’ — and a dash; café, naïve, 日本",
])
def test_tokenizer_round_trips(engine, text: str) -> None:
    tokens = engine.model.tokenize(text, add_special=False, parse_special=False)
    assert tokens.size > 0
    assert engine.detokenize(tokens) == text


def test_chat_turns_tokenize_to_the_special_tokens(engine) -> None:
    # a raw prompt's author opts in to markers; by default the same text stays plain text
    tokens = engine.encode("<start_of_turn>HOST\nWell met.<end_of_turn>\n", special=True)
    pieces = [engine.piece(int(t)) for t in tokens]
    assert "<start_of_turn>" in pieces and "<end_of_turn>" in pieces
    plain = [engine.piece(int(t)) for t in engine.encode("<start_of_turn>HOST\nWell met.<end_of_turn>\n")]
    assert "<start_of_turn>" not in plain and "<end_of_turn>" not in plain


def test_held_out_loss_is_far_below_unigram(engine) -> None:
    ids = engine.encode(HELD_OUT, special=True)  # a rendered conversation: its markers are control tokens
    nll = -float(engine.pseudo_log_likelihood(ids[:1], ids[1:]).mean())
    assert nll < UNIGRAM_NATS - 1.5, nll  # random weights give ~ln(16384) = 9.7


def test_generate_defaults_to_the_bundled_model(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DGCHAT_MODEL"} | {"DGCHAT_HOME": str(tmp_path)}
    for ar in ([], ["--ar"]):
        res = subprocess.run([sys.executable, "-m", "dgchat", "generate", "-p", "Good morrow, sir.", "--seed", "1",
                              "--json", *ar], capture_output=True, text=True, env=env, timeout=120)
        assert res.returncode == 0, res.stderr
        out = json.loads(res.stdout)
        assert out["model"] == str(MODEL) and out["architecture"] == "gemma4" and out["text"].strip()


async def test_the_app_opens_on_the_bundled_model_and_answers(tmp_path, monkeypatch) -> None:
    from fixtures.app_harness import SIZE, make_app, setup_home, type_text, wait_idle, wait_model

    setup_home(tmp_path, monkeypatch, config="")  # a config without a model: the bundled one is used
    app = make_app(None)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        assert app.session.path == MODEL
        await type_text(pilot, "Good evening. Have you a bed for the night?")
        await pilot.press("enter")
        await wait_idle(pilot, timeout=60)
        messages = app.store.messages(app.chat_screen.chat.id)
        assert [m.role for m in messages] == ["user", "assistant"]
        assert messages[1].status == "done" and messages[1].content.strip()


def test_sampler_blas_runs_single_threaded_for_a_small_model(engine) -> None:
    """The bundled model's numpy products are tiny: one BLAS thread (a second one stalls the step
    whenever another process holds a core; see llamacpp.set_blas_threads)."""
    from threadpoolctl import threadpool_info

    assert engine._sampler_blas_threads() == 1
    blas = [p for p in threadpool_info() if p["user_api"] == "blas"]
    assert blas and all(p["num_threads"] == 1 for p in blas)


def test_early_stop_off_gives_answers_of_exactly_max_tokens(engine) -> None:
    """What `dgchat bench` relies on to compare like with like, in both decoding modes."""
    for ar in (False, True):
        final = _run(engine, DiffusionParams(seed=5, max_tokens=70, early_stop=False, autoregressive=ar))
        assert final.tokens.size == 70 and final.stop_reason == "max_tokens"
