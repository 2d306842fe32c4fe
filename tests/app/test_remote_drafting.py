"""The drafting screen on a server (`dgchat --server URL`): against a real `dgchat serve` on loopback
a selection is rewritten in context (a completion with the text after as its suffix, the server's
canvas streaming into the preview), accepted as one undoable edit, made longer, and text is
continued at the cursor; against a text-only OpenAI server (vLLM's wire format) continuing works and
a rewrite says clearly why it cannot be done, without sending anything."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures.app_harness import GatedEngine, make_app, setup_home, wait_for, wait_model
from fixtures.fake_openai import FakeServer, Reply

from dgchat.app import model_source
from dgchat.app.drafting_plan import clean_text, no_infill_message
from dgchat.model_backend.canvas import Cell
from dgchat.model_backend.loader import load_engine
from dgchat.server.app import ServeConfig, ServerThread

SIZE = (100, 24)
DOC = "Halt, traveller! None may pass the gate after dark.\nThe king sleeps.\n"
SPAN = ((0, 35), (0, 50))  # "gate after dark"


@pytest.fixture(scope="module")
def gated(llada_gguf: Path) -> Iterator[GatedEngine]:
    """The server's engine: it runs freely while `release` is set; a test clears it to hold an
    answer at step 2."""
    with load_engine(llada_gguf, n_threads=1) as engine:
        gate = GatedEngine(engine, hold_at=2)
        gate.release.set()
        yield gate


@pytest.fixture(scope="module")
def server(gated) -> Iterator[ServerThread]:
    with ServerThread(gated, ServeConfig(port=0, quiet=True)) as st:
        yield st


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setattr(model_source, "SERVER_RETRIES", 0)
    monkeypatch.delenv("DGCHAT_API_KEY", raising=False)
    home = setup_home(tmp_path, monkeypatch)
    path = home / "data" / "drafts" / "draft.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(DOC, encoding="utf-8", newline="")
    return home


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


def _done(screen) -> bool:
    return screen.proposal is not None and screen.proposal.text is not None and not screen.engine_busy


async def _propose(pilot, screen, key: str) -> str:
    await pilot.press(key)
    await wait_for(pilot, lambda: _done(screen), 30, "the proposal")
    await pilot.pause()
    return screen.proposal.text


def _status(screen) -> str:
    return str(screen.query_one("#draft-status #status-text").render())


async def test_rewrite_accept_longer_and_continue_on_dgchat_serve(home, server, gated) -> None:
    from dgchat.remote import RemoteEngine

    app = make_app(server=server.url)
    async with app.run_test(size=SIZE) as pilot:
        screen = await _open(pilot)
        editor = screen.editor
        assert editor.text == DOC
        _select(screen, *SPAN)
        assert editor.selected_text == "gate after dark"
        gated.release.clear()  # the server holds the rewrite at step 2
        try:
            await pilot.press("ctrl+r")
            preview = screen.preview
            await wait_for(pilot, lambda: preview.event is not None and preview.event.step == 2, 20, "step 2")
            # the server's canvas in place: the span's positions (some undecided), then the fixed text after
            event = preview.event
            assert event.canvas_length > 4 and (event.canvas.state[:4] == Cell.MASKED).any()
            await pilot.pause()
            shown = "".join(strip.text for strip in preview._strips)
            assert shown.startswith("Halt, traveller! None may pass the ") and "The king sleeps." in shown
            assert "·" in shown.split("The king")[0]
            assert "Rewriting · 4 tokens · seed 0 · step 2/4 · Esc stops" in _status(screen)
        finally:
            gated.release.set()
        await wait_for(pilot, lambda: _done(screen), 30, "the proposal")
        await pilot.pause()
        proposal = screen.proposal.text
        plan = screen.proposal.plan
        # the text before as the prompt, the text after as the suffix; the span estimated from the selection
        assert plan.kind == "rewrite" and plan.span == 4 and plan.params.max_tokens == 4
        assert plan.prompt.text == DOC[:35] and plan.prompt.suffix == DOC[50:]
        # the proposal is the server's fill for that request (same seed, same settings)
        with RemoteEngine.connect(server.url, retries=0) as remote:
            direct = list(remote.generate(plan.prompt, plan.params))[-1]
        assert direct.stop_reason == "complete" and direct.tokens.size == 4  # exactly the span
        assert proposal == clean_text(direct.text) and proposal.strip()
        assert editor.text == DOC and editor.read_only  # untouched until accepted
        assert "Proposal · 4 tokens" in _status(screen)

        # + asks for a longer span: the server fills max_tokens = the new length
        await pilot.press("plus")
        await wait_for(pilot, lambda: _done(screen) and screen.proposal.plan.span > 4, 30, "the longer one")
        assert screen.proposal.plan.span == 6 and screen.proposal.plan.params.max_tokens == 6
        longer = screen.proposal.text
        await pilot.press("enter")
        await pilot.pause()
        assert editor.text == DOC[:35] + longer + DOC[50:]
        await pilot.press("ctrl+z")  # one edit
        await pilot.pause()
        assert editor.text == DOC

        # continue at the cursor: a plain completion of everything before it
        editor.move_cursor(editor.document.end)
        added = await _propose(pilot, screen, "ctrl+g")
        plan = screen.proposal.plan
        assert plan.kind == "continue" and plan.prompt.text == DOC and plan.prompt.suffix is None
        assert plan.span == 32  # the config's canvas length, as locally
        await pilot.press("enter")
        await pilot.pause()
        assert editor.text == DOC + added


MODELS = {"object": "list", "data": [{"id": "big-model", "object": "model", "owned_by": "vllm",
                                      "max_model_len": 32768}]}


def _text_chunk(text: str | None, finish: str | None = None) -> dict:
    choices = [] if text is None else [{"index": 0, "text": text, "finish_reason": finish}]
    return {"id": "cmpl-1", "object": "text_completion", "model": "big-model", "choices": choices}


async def test_a_text_only_server_continues_and_says_why_it_cannot_rewrite(home) -> None:
    answer = threading.Event()  # the server holds its answer until the test has seen the waiting state

    def handler(method: str, path: str, body) -> Reply:
        if path == "/v1/models":
            return Reply(body=MODELS)
        if path == "/v1/completions":
            answer.wait(10)
            return Reply(events=[_text_chunk(" The moon"), _text_chunk(" is high.", "stop"),
                                 _text_chunk(None), "[DONE]"])
        return Reply(404, {"detail": "Not Found"})

    with FakeServer(handler) as fake:
        app = make_app(server=fake.url)
        async with app.run_test(size=SIZE) as pilot:
            screen = await _open(pilot)
            editor = screen.editor
            _select(screen, *SPAN)
            await pilot.press("ctrl+r")
            await pilot.pause()
            assert screen.proposal is None and not screen.engine_busy and editor.text == DOC
            message = no_infill_message(fake.url)
            assert message.startswith(f"{fake.url} is not a dgchat serve server: it has no infill")
            assert "rewriting a selection needs a dgchat serve server" in message
            assert any(n.message == message for n in app._notifications)
            assert [r[1] for r in fake.requests] == ["/v1/models"]  # nothing was sent for the rewrite

            editor.move_cursor(editor.document.end)
            await pilot.press("ctrl+g")
            await wait_for(pilot, lambda: "waiting for the server…" in _status(screen), 10, "the waiting state")
            assert screen.has_class("-proposing") and editor.read_only
            answer.set()
            await wait_for(pilot, lambda: _done(screen), 10, "the proposal")
            assert screen.proposal.text == " The moon is high."
            (_, path, body, _headers) = fake.requests[-1]
            # text only: no diffusion settings, no suffix; the answer's length is the config's canvas
            assert path == "/v1/completions" and body["prompt"] == DOC and "suffix" not in body
            assert "dgchat" not in body and body["max_tokens"] == 32 and body["stream"] is True
            await pilot.press("enter")
            await pilot.pause()
            assert editor.text == DOC + " The moon is high."
