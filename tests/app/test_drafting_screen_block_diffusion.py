"""The drafting screen with a block-diffusion model (SDAR; docs/BLOCK_DIFFUSION.md), under Pilot on
the tiny random-weight model of tests/fixtures/block_tiny.py.

A block-causal model cannot see text to the right of a hole (the engine refuses a canvas template:
model_backend.block_diffusion.NO_INFILL). So a rewrite is a left-to-right regeneration of the
selection's length from the text before it, without a template, and the screen says so where the
proposal appears; a continuation runs over several blocks, not one 4-token canvas. Nothing raises
the engine's infill error at the user.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest
from dgchat.app.drafting_plan import (
    DEFAULT_CONTINUE_TOKENS,
    DEFAULT_FILL_TOKENS,
    DraftRequest,
    count_tokens,
    plan,
    plan_remote,
    vocab_for,
    writes_left_to_right,
)
from dgchat.app.error_modal import ErrorModal
from dgchat.app.widgets.draft_preview import DraftPreview
from dgchat.model_backend.block_diffusion import NO_INFILL
from dgchat.model_backend.canvas import CanvasSnapshot, Cell
from dgchat.model_backend.errors import InvalidParameterError
from dgchat.model_backend.events import FinalEvent, StepEvent, StepTiming
from dgchat.model_backend.loader import load_engine
from dgchat.model_backend.requests import CanvasTemplate
from dgchat.remote import wire
from dgchat.remote.engine import RemoteEngine
from fixtures.app_harness import GatedEngine, make_app, setup_home, wait_for, wait_model
from fixtures.block_tiny import converted
from textual.widgets.text_area import Selection

SIZE = (100, 24)
DOC = "The old castle stood on the hill. None may pass the gate after dark.\n\nGood morrow, friend."
GATE = ((0, 52), (0, 56))  # "gate"
NOTE_REWRITE = ("SDAR writes left to right: this rewrite continues from the text before the selection and "
                "does not see the text after it.")
NOTE_FILL = ("SDAR writes left to right: this fill-in continues from the text before the cursor and does "
             "not see the text after it.")


@pytest.fixture
def home(tmp_path, monkeypatch):
    return setup_home(tmp_path, monkeypatch, config="")


@pytest.fixture
def sdar(base):
    return converted(base, "sdar")


def _draft(home, text: str = DOC) -> None:
    path = home / "data" / "drafts" / "draft.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8", newline="")


async def _open(pilot):
    from dgchat.app.drafting_screen import DraftingScreen

    await wait_model(pilot)
    await pilot.press("f5")
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, DraftingScreen), what="the drafting screen")
    await pilot.pause()
    return pilot.app.screen


async def _proposed(pilot, screen) -> str:
    await wait_for(pilot, lambda: screen.proposal is not None and screen.proposal.text is not None
                   and not screen.engine_busy, 30, "the proposal")
    await pilot.pause()
    return screen.proposal.text


def _note(screen) -> tuple[bool, str]:
    label = screen.query_one("#draft-note")
    return label.display, str(label.render())


def _status(screen) -> str:
    return str(screen.query_one("#draft-status #status-text").render())


def _no_error(app) -> None:
    assert not any(isinstance(s, ErrorModal) for s in app.screen_stack), "an error dialog opened"


async def test_a_rewrite_is_written_after_the_text_before_it_and_says_so(home, sdar):
    _draft(home)
    app = make_app(sdar)
    async with app.run_test(size=SIZE) as pilot:
        screen = await _open(pilot)
        engine = app.session.engine
        editor = screen.editor
        screen.editor.selection = Selection(*GATE)
        assert editor.selected_text == "gate"
        before, after = DOC[:52], DOC[56:]
        app.session.engine = gated = GatedEngine(engine, hold_at=2)
        await pilot.press("ctrl+r")
        await wait_for(pilot, gated.holding.is_set, what="the first steps")
        await pilot.pause()
        # said where the proposal appears, while it is written
        assert _note(screen) == (True, NOTE_REWRITE)
        assert re.match(r"Rewriting · \d+ tokens · seed 0 · \d+/\d+ decided · Esc stops", _status(screen)), \
            _status(screen)
        gated.release.set()
        proposal = await _proposed(pilot, screen)
        _no_error(app)
        draft = screen.proposal.plan
        span = count_tokens(engine, "gate")
        assert draft.left_to_right and draft.template is None and draft.kind == "rewrite"
        assert draft.span == span and draft.params.max_tokens == span and draft.params.gen_length == 4
        tok = vocab_for(engine).tokenizer
        assert tok.bytes_of(draft.prompt) == before.encode()  # the text before it, and nothing after
        assert _note(screen) == (True, NOTE_REWRITE)
        assert _status(screen).startswith(f"Proposal · {span} tokens · seed 0 · Enter accept")
        await pilot.press("enter")
        await pilot.pause()
        assert editor.text == before + proposal + after
        assert not _note(screen)[0]  # gone with the proposal


async def test_a_fill_at_the_cursor_spans_several_blocks(home, sdar):
    _draft(home)
    app = make_app(sdar)
    async with app.run_test(size=SIZE) as pilot:
        screen = await _open(pilot)
        engine = app.session.engine
        screen.editor.move_cursor((0, 33))
        finals: list[FinalEvent] = []

        class Keep:
            def __getattr__(self, name):
                return getattr(engine, name)

            def generate(self, prompt, params=None, **kwargs):
                for ev in engine.generate(prompt, params, **kwargs):
                    if isinstance(ev, FinalEvent):
                        finals.append(ev)
                    yield ev

        app.session.engine = Keep()
        await pilot.press("ctrl+r")
        proposal = await _proposed(pilot, screen)
        _no_error(app)
        assert _note(screen) == (True, NOTE_FILL)
        draft = screen.proposal.plan
        assert draft.span == DEFAULT_FILL_TOKENS and draft.template is None
        # 16 tokens, no end token inside them (the text after the cursor goes on): 4+ blocks of 4
        assert finals[-1].stats.tokens == DEFAULT_FILL_TOKENS and finals[-1].stats.canvases >= 4
        assert proposal == screen.preview.text
        await pilot.press("escape")
        await pilot.pause()
        assert screen.editor.text == DOC


async def test_continue_runs_over_several_blocks_and_resizes(home, sdar):
    _draft(home)
    app = make_app(sdar)
    async with app.run_test(size=SIZE) as pilot:
        screen = await _open(pilot)
        engine = app.session.engine
        screen.editor.move_cursor(screen.editor.document.end)
        await pilot.press("ctrl+g")
        await _proposed(pilot, screen)
        _no_error(app)
        draft = screen.proposal.plan
        assert draft.kind == "continue" and draft.left_to_right and draft.template is None
        assert draft.span == draft.params.max_tokens == DEFAULT_CONTINUE_TOKENS  # not capped to the 4-token canvas
        assert not _note(screen)[0]  # a continuation is left to right anyway
        assert _status(screen).startswith(f"Proposal · {DEFAULT_CONTINUE_TOKENS} tokens")
        await pilot.press("plus")
        await _proposed(pilot, screen)
        assert screen.proposal.plan.span == DEFAULT_CONTINUE_TOKENS + DEFAULT_CONTINUE_TOKENS // 2
        await pilot.press("enter")
        await pilot.pause()
        assert screen.editor.text.startswith(DOC)
        assert engine is app.session.engine


def test_plans_never_ask_the_engine_for_infill(base):
    """Every request kind, planned for the engine and run through it: no template, so the engine's
    NO_INFILL refusal is never raised (it would be, for a template)."""
    with load_engine(converted(base, "sdar")) as engine:
        assert writes_left_to_right(engine)
        for kind, selected, length in (("rewrite", "gate", None), ("rewrite", "", None), ("rewrite", "gate", 9),
                                       ("continue", "", None), ("continue", "", 7)):
            request = DraftRequest(kind, DOC[:52], selected, DOC[56:], seed=1, length=length)
            draft = plan(engine, request, {"steps": 8, "gen_length": 32})  # an app test's [sampler]
            assert draft.template is None and draft.left_to_right
            events = list(engine.generate(draft.prompt, draft.params, template=draft.template))
            assert isinstance(events[-1], FinalEvent) and events[-1].stats.tokens <= draft.span
        with pytest.raises(InvalidParameterError, match=re.escape(NO_INFILL)):  # what the plans avoid
            list(engine.generate(draft.prompt, draft.params,
                                 template=CanvasTemplate(np.zeros(4, np.int32), np.zeros(4, bool))))


def test_a_dgchat_server_of_a_block_model_gets_no_suffix():
    """On `dgchat serve` of a block model the rewrite goes as a plain completion of the text before
    it (a suffix would be refused by the server's engine), `max_tokens` the span."""
    details = wire.DgchatDetails(name="sdar", family="block_diffusion", end_tokens=(1,), n_vocab=500,
                                 context_length=4096, defaults={"max_tokens": 512, "steps": 4})
    engine = RemoteEngine(SimpleNamespace(url="http://127.0.0.1:1"), wire.ServerModel("sdar", details=details))
    assert writes_left_to_right(engine)
    request = DraftRequest("rewrite", "The old castle stood", "on the hill", ". None may pass.", seed=2)
    draft = plan_remote(engine, request, {})
    assert draft.left_to_right and draft.prompt.suffix is None and draft.prompt.text == "The old castle stood"
    assert draft.params.max_tokens == draft.span == 3  # 11 characters at ~4 a token
    assert draft.params.eps is None and draft.params.gen_length is None
    cont = plan_remote(engine, DraftRequest("continue", "The old castle", "", "", seed=2), {})
    assert cont.params.max_tokens == DEFAULT_CONTINUE_TOKENS and cont.prompt.suffix is None


def test_the_preview_of_a_left_to_right_rewrite_stops_at_the_span():
    """Its last block may run past the span (SDAR's blocks are counted from the prompt's start): those
    positions are not part of the proposal and are not drawn; the finished blocks are."""
    words = {1: " one", 2: " two", 3: " three"}
    preview = DraftPreview(SimpleNamespace(piece=words.get, eog_ids=lambda: [9]))
    preview.kind, preview.span, preview.left_to_right = "rewrite", 6, True
    state = np.array([Cell.DONE, Cell.NEW, Cell.MASKED, Cell.MASKED], np.int8)
    preview.event = StepEvent(step=5, total_steps=4, canvas_index=1, canvas_step=2,
                              canvas=CanvasSnapshot(np.array([2, 3, 3, 3], np.int32), state, np.zeros(4, np.float32)),
                              answer_tokens=np.array([1, 1, 1, 1], np.int32), committed=2, canvas_length=4,
                              timing=StepTiming(0, 0), elapsed_s=0.1)
    runs = preview._proposal_runs()
    assert [text for text, _, _ in runs] == [" one"] * 4 + [" two", " three"]
    preview.left_to_right = False  # a canvas model's rewrite: the span is the canvas's first positions
    assert len(preview._proposal_runs()) == 4 + 4


def test_a_server_block_model_the_client_knows_drafts_with_its_blocks():
    """dgchat serve reports a block model's block size and variant (remote/wire.py): the client's
    engine is then of the family (SDAR, blocks of 4), and the plan is left to right with the model's
    block as its canvas."""
    from dgchat.recording.blocks import block_size_of

    details = wire.DgchatDetails(name="sdar", family="block_diffusion", end_tokens=(1,), n_vocab=500,
                                 context_length=4096, defaults={"max_tokens": 512, "steps": 4},
                                 model_defaults={"steps": 4, "threshold": 0.85, "max_tokens": 512},
                                 attention_block=4, variant="sdar")
    engine = RemoteEngine(SimpleNamespace(url="http://127.0.0.1:1"), wire.ServerModel("sdar", details=details))
    assert block_size_of(engine) == 4 and writes_left_to_right(engine)
    draft = plan_remote(engine, DraftRequest("rewrite", "The old castle", "stood", " on the hill.", seed=0),
                        {"steps": 8, "gen_length": 32})
    assert draft.left_to_right and draft.prompt.suffix is None
    assert (draft.params.gen_length, draft.params.max_tokens) == (4, 2)  # the config's canvas is replaced
