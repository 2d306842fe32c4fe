"""The drafting screen under Pilot, against the real tiny fixture model: a selected span infilled in
context (the text around it byte-identical), accepted as one undoable edit, rejected, stopped,
continued at the cursor; the draft autosaved and restored; snapshots of a proposal denoising in
place and of a finished one."""

from __future__ import annotations

import time

import numpy as np

from fixtures.app_harness import GatedEngine, make_app, wait_for, wait_model

from dgchat.app.drafting_plan import DraftRequest, plan_rewrite
from dgchat.model_backend.canvas import Cell

SIZE = (100, 24)
DOC = ("Halt, traveller! None may pass the gate after dark.\n"
       "The king sleeps, and the guards are weary — “quotes” and 東京 😀 stay.\n\n"
       "Good morrow, friend.")
SPAN = ((0, 35), (0, 39))  # "gate"


def _draft(home, text: str = DOC):
    path = home / "data" / "drafts" / "draft.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8", newline="")
    return path


async def _open(pilot):
    from dgchat.app.drafting_screen import DraftingScreen

    await wait_model(pilot)
    await pilot.press("f5")
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, DraftingScreen), what="the drafting screen")
    await pilot.pause()
    return pilot.app.screen


def _select(screen, start, end) -> None:
    from textual.widgets.text_area import Selection

    screen.editor.selection = Selection(start, end)


async def _propose(pilot, screen, key: str = "ctrl+r") -> str:
    await pilot.press(key)
    await wait_for(pilot, lambda: screen.proposal is not None and screen.proposal.text is not None and not screen.engine_busy,
                   30, "the proposal")
    await pilot.pause()
    return screen.proposal.text


async def test_infill_accept_is_one_undoable_edit_and_keeps_the_rest_byte_identical(home, llada_gguf):
    path = _draft(home)
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        screen = await _open(pilot)
        editor = screen.editor
        assert editor.text == DOC  # the saved draft is restored
        _select(screen, *SPAN)
        assert editor.selected_text == "gate"
        before, after = DOC[:35], DOC[39:]
        proposal = await _propose(pilot, screen)
        # while a proposal is open the editor is replaced by the preview, and the document is untouched
        assert screen.has_class("-proposing")
        assert editor.read_only and editor.text == DOC
        plan = screen.proposal.plan
        assert plan.kind == "rewrite" and plan.template is not None
        # the canvas: the span's positions free, the text after fixed and spelling its bytes exactly
        from dgchat.app.drafting_plan import vocab_for

        tok = vocab_for(app.session.engine).tokenizer
        fixed = plan.template.fixed
        assert not fixed[: plan.span].any() and fixed[plan.span:].all()
        assert tok.bytes_of(plan.template.tokens[plan.span:-1]) == after.encode("utf-8")
        assert tok.bytes_of(plan.prompt[1:]) == before.encode("utf-8")  # after the BOS
        assert plan.span == tok.tokenize("gate").size

        await pilot.press("enter")
        await pilot.pause()
        assert not screen.has_class("-proposing") and not editor.read_only
        text = editor.text
        assert text == before + proposal + after
        assert text.encode().startswith(before.encode()) and text.encode().endswith(after.encode())
        assert editor.selected_text == proposal  # the inserted text is selected

        # one undo restores the original exactly; redo brings the proposal back
        editor.focus()
        await pilot.press("ctrl+z")
        await pilot.pause()
        assert editor.text == DOC
        await pilot.press("ctrl+y")
        await pilot.pause()
        assert editor.text == before + proposal + after

        # autosave: the file follows the document within a second or so
        await wait_for(pilot, lambda: path.read_text(encoding="utf-8") == editor.text, 5, "the autosave")


def _status(screen) -> str:
    return str(screen.query_one("#draft-status #status-text").render())


async def test_the_status_follows_undo_and_says_a_fill_is_at_the_cursor(home, llada_gguf):
    """After Ctrl+Z the status line still said "accepted"; it says what the document holds now.
    Ctrl+R with nothing selected fills in at the cursor: the status line says so (it read
    "Rewriting", as for a selection)."""
    _draft(home)
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        screen = await _open(pilot)
        editor = screen.editor
        _select(screen, *SPAN)
        await _propose(pilot, screen)
        assert _status(screen).startswith("Proposal · ")
        await pilot.press("enter")
        await pilot.pause()
        accepted = editor.text
        assert "accepted · Ctrl+Z undoes it" in _status(screen)
        editor.focus()
        await pilot.press("ctrl+z")
        await pilot.pause()
        assert editor.text == DOC
        assert "accepted" not in _status(screen) and "undone · Ctrl+Y redoes it" in _status(screen)
        await pilot.press("ctrl+y")
        await pilot.pause()
        assert editor.text == accepted and "accepted · Ctrl+Z undoes it" in _status(screen)
        await pilot.press("x")  # typing after it: the note is about an earlier state now
        await pilot.pause()
        assert "accepted" not in _status(screen) and "undone" not in _status(screen)

        # nothing selected: a fill at the cursor, said while it runs and once it is proposed
        app.session.engine = gated = GatedEngine(app.session.engine, hold_at=2)
        editor.move_cursor((0, 5))
        await pilot.press("ctrl+r")
        await wait_for(pilot, gated.holding.is_set, what="the first steps")
        await pilot.pause()
        assert _status(screen).startswith("Filling in at the cursor"), _status(screen)
        gated.release.set()
        await wait_for(pilot, lambda: screen.proposal is not None and screen.proposal.text is not None
                       and not screen.engine_busy, 30, "the proposal")
        await pilot.pause()
        assert _status(screen).startswith("Fill-in · ") and "Enter accept · Esc reject" in _status(screen)


async def test_reject_and_stop_leave_the_document_unchanged(home, llada_gguf):
    _draft(home)
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        screen = await _open(pilot)
        editor = screen.editor
        _select(screen, *SPAN)
        await _propose(pilot, screen)
        await pilot.press("n")  # reject
        await pilot.pause()
        assert screen.proposal is None and editor.text == DOC and not editor.read_only
        assert editor.selected_text == "gate"  # the selection is where it was

        # the next request asks with the next seed; Esc also rejects
        await _propose(pilot, screen)
        assert screen.proposal.request.seed == 1
        await pilot.press("escape")
        await pilot.pause()
        assert screen.proposal is None and editor.text == DOC
        assert screen.app.screen is screen  # Esc rejected the proposal; it did not leave

        # stop mid-generation: the preview shows the span denoising in place, Esc stops it
        app.session.engine = gated = GatedEngine(app.session.engine, hold_at=2)
        _select(screen, (0, 6), (0, 15))  # "traveller"
        await pilot.press("ctrl+r")
        await wait_for(pilot, gated.holding.is_set, what="the first steps")
        preview = screen.preview
        await wait_for(pilot, lambda: preview.event is not None and preview.event.step == 2)
        shown = "".join(strip.text for strip in preview._strips)
        assert shown.startswith("Halt, ") and "! None may pass the gate after dark." in shown
        state = preview.event.canvas.state
        assert (state[: screen.proposal.plan.span] == Cell.MASKED).any()
        assert "·" in shown.split("! None")[0]  # undecided positions of the span, in place
        t0 = time.monotonic()
        await pilot.press("escape")
        await wait_for(pilot, lambda: not screen.engine_busy and screen.proposal is None, 10, "the stop")
        assert time.monotonic() - t0 < 5
        assert editor.text == DOC and not editor.read_only


async def test_continue_at_the_cursor_and_longer_proposals(home, llada_gguf):
    _draft(home, "Once upon a time")
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        screen = await _open(pilot)
        editor = screen.editor
        assert editor.cursor_location == (0, 16)  # reopened at the end
        proposal = await _propose(pilot, screen, "ctrl+g")
        assert screen.proposal.plan.kind == "continue" and screen.proposal.plan.template is None
        assert screen.proposal.plan.span == 32  # the config's canvas length
        # + on a continuation: 48 tokens, not a multiple of the model's block length 32 (one block)
        await pilot.press("plus")
        await wait_for(pilot, lambda: screen.proposal is not None and screen.proposal.text is not None
                       and not screen.engine_busy and screen.proposal.plan.span == 48, 30)
        await pilot.press("minus")
        await wait_for(pilot, lambda: screen.proposal is not None and screen.proposal.text is not None
                       and not screen.engine_busy and screen.proposal.plan.span < 48, 30)
        proposal = screen.proposal.text
        await pilot.press("enter")
        await pilot.pause()
        assert editor.text == "Once upon a time" + proposal

        # + asks for a longer span, r for another seed, both in place of the open proposal
        _select(screen, (0, 5), (0, 9))  # "upon"
        await _propose(pilot, screen)
        first = screen.proposal.plan.span
        await pilot.press("plus")
        await wait_for(pilot, lambda: screen.proposal is not None and screen.proposal.text is not None
                       and not screen.engine_busy and screen.proposal.plan.span > first, 30)
        assert screen.proposal.plan.span == first + max(1, first // 2)
        seed = screen.proposal.request.seed
        await pilot.press("r")
        await wait_for(pilot, lambda: screen.proposal is not None and screen.proposal.request.seed == seed + 1
                       and screen.proposal.text is not None and not screen.engine_busy, 30)
        await pilot.press("n")
        await pilot.pause()
        assert editor.text == "Once upon a time" + proposal


async def test_a_new_run_proposes_with_a_new_seed_unless_the_config_sets_one(home, llada_gguf, monkeypatch):
    """Issue 43, item 1: the first proposal's seed was the config's or 0, so every run of the app
    proposed the same continuation. Without a [sampler] seed it is newly drawn; the status line names
    it; a seed in the config is the person's choice and is kept."""
    from dgchat.model_backend import param_resolution

    seeds = iter([4242, 777])
    drawn: list[int] = []

    def draw() -> int:
        drawn.append(next(seeds))
        return drawn[-1]

    monkeypatch.setattr(param_resolution, "draw_seed", draw)
    _draft(home, "Once upon a time")

    async def first_proposal(expected: int) -> str:
        """A new run of the app: its first proposal (seed `expected`), then r (the next seed)."""
        app = make_app(llada_gguf)
        async with app.run_test(size=SIZE) as pilot:
            screen = await _open(pilot)
            text = await _propose(pilot, screen, "ctrl+g")
            assert screen.proposal.request.seed == expected
            assert f" · seed {expected} · " in _status(screen)
            await pilot.press("r")
            await wait_for(pilot, lambda: screen.proposal is not None and screen.proposal.text is not None
                           and not screen.engine_busy and screen.proposal.request.seed == expected + 1, 30)
        return text

    assert await first_proposal(4242) != await first_proposal(777)  # a new run, a new proposal

    config = home / "config" / "config.toml"
    config.write_text(config.read_text(encoding="utf-8") + "seed = 7\n", encoding="utf-8")  # in [sampler]
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        screen = await _open(pilot)
        await _propose(pilot, screen, "ctrl+g")
        assert screen.proposal.request.seed == 7
    assert drawn == [4242, 777]  # no draw where the config chose the seed


async def test_the_draft_survives_reopening(home, llada_gguf):
    path = _draft(home, "Chapter one.\r\nIt was a dark night.")  # Windows line ends stay as they are
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        screen = await _open(pilot)
        assert screen.editor.text == "Chapter one.\r\nIt was a dark night."
        screen.editor.insert(" Rain.")
        await pilot.pause()
        await pilot.press("escape")  # leaving the screen saves at once
        await pilot.pause()
        assert app.screen is not screen
        assert path.read_bytes() == b"Chapter one.\r\nIt was a dark night. Rain."
        await pilot.press("f5")
        await pilot.pause()
        assert app.screen is screen
        screen.editor.insert(" The end.")
        await pilot.pause()
        await app.action_quit()  # quitting saves too
    assert path.read_bytes() == b"Chapter one.\r\nIt was a dark night. Rain. The end."
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        screen = await _open(pilot)
        assert screen.editor.text == "Chapter one.\r\nIt was a dark night. Rain. The end."


def test_rewrite_plan_on_an_empty_document_and_a_small_context(small_ctx_gguf):
    """Planning only: no selection and no text still makes a prompt; the context bounds the window."""
    from dgchat.model_backend.loader import load_engine
    from dgchat.model_backend.params import DiffusionParams

    with load_engine(small_ctx_gguf, n_threads=1) as engine:
        empty = plan_rewrite(engine, DraftRequest("rewrite", "", "", "", seed=0), DiffusionParams())
        assert empty.prompt.size >= 1 and empty.span == 16
        long = "word " * 400
        plan = plan_rewrite(engine, DraftRequest("rewrite", long, "x", long, seed=0), DiffusionParams())
        assert plan.prompt.size + plan.template.tokens.size <= engine.n_ctx_max
        assert np.asarray(plan.template.fixed[plan.span:]).all()


def test_snapshot_proposal_denoising_in_place(snap_compare, home, llada_gguf):
    _draft(home)

    async def run_before(pilot):
        screen = await _open(pilot)
        app = pilot.app
        app.session.engine = gated = GatedEngine(app.session.engine, hold_at=3)
        _select(screen, (0, 35), (0, 50))  # "gate after dark"
        await pilot.press("ctrl+r")
        await wait_for(pilot, gated.holding.is_set)
        await wait_for(pilot, lambda: screen.preview.event is not None and screen.preview.event.step == 3)
        await pilot.pause(0.1)

    assert snap_compare(make_app(llada_gguf), terminal_size=SIZE, run_before=run_before)


def test_snapshot_finished_proposal(snap_compare, home, llada_gguf):
    _draft(home)

    async def run_before(pilot):
        screen = await _open(pilot)
        _select(screen, (1, 4), (1, 15))  # "king sleeps"
        await _propose(pilot, screen)
        await pilot.pause(0.1)

    assert snap_compare(make_app(llada_gguf), terminal_size=SIZE, run_before=run_before)
