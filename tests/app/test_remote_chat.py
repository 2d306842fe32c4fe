"""The chat app on a server (`dgchat --server URL`, `[server] url`): a real `dgchat serve` on
loopback with the live canvas, a scripted text-only OpenAI server (vLLM's wire format), and the
failures a user meets (server down, wrong key) with nothing they typed lost."""

from __future__ import annotations


import pytest
from fixtures.app_harness import SIZE, GatedEngine, make_app, setup_home, type_text, wait_for, wait_idle, wait_model
from fixtures.fake_openai import FakeServer, Reply

from dgchat.app import model_source
from dgchat.app.chat import answering
from dgchat.app.error_modal import ErrorModal
from dgchat.app.generation import ChatAnswer
from dgchat.app.store import Store
from dgchat.model_backend.canvas import Cell
from dgchat.model_backend.events import FinalEvent, StepEvent
from dgchat.server.app import ServeConfig, ServerThread

TOKEN = "app-remote-token"


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setattr(model_source, "SERVER_RETRIES", 0)  # a dead server fails at once, not after 3.5 s
    monkeypatch.delenv("DGCHAT_API_KEY", raising=False)
    return setup_home(tmp_path, monkeypatch)


@pytest.fixture
def answers(monkeypatch) -> list[ChatAnswer]:
    """Every ChatAnswer the chat screen starts (its messages and resolved settings)."""
    made: list[ChatAnswer] = []

    class Recorded(ChatAnswer):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(answering, "ChatAnswer", Recorded)
    return made


def _status(app) -> str:
    """The whole status line (at 110 columns the engine's label is left out: status_bar.fit_parts)."""
    from dgchat.app.widgets.status_bar import StatusBar

    return app.chat_screen.query_one(StatusBar).full_text


def _tokens(app) -> str | None:
    label = app.chat_screen.query_one("#status-tokens")
    return str(label.render()) if label.has_class("-shown") else None


async def _error(pilot) -> str:
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, ErrorModal), what="the error dialog")
    return str(pilot.app.screen.query_one("#error-message").render())


async def test_a_chat_on_dgchat_serve_draws_the_live_canvas(home, engine, answers) -> None:
    gated = GatedEngine(engine, hold_at=3)  # the server's engine holds at step 3 until released
    with ServerThread(gated, ServeConfig(port=0, quiet=True)) as server:
        await _chat_on_dgchat_serve(server, engine, gated, answers)


async def _chat_on_dgchat_serve(server, engine, gated, answers) -> None:
    app = make_app(server=server.url + "/v1")
    host = server.url.removeprefix("http://")
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        assert app.session.engine.model_id == "tiny-llada"
        status = _status(app)
        assert status.startswith(f"tiny-llada on {host} · remote (") and server.url in status
        assert "steps 8 · canvas 32" in status  # the config's [sampler], resolved as the server resolves it
        assert _tokens(app) is None  # no tokenizer here: no count before the first answer
        await type_text(pilot, "Halt, traveller!")
        await pilot.press("enter")
        screen = app.chat_screen
        # mid-answer: the live canvas draws the server's step 3, undecided positions and all
        await wait_for(pilot, lambda: screen.canvas is not None and screen.canvas.event is not None
                       and screen.canvas.event.step == 3, what="step 3 on the live canvas")
        event = screen.canvas.event
        assert event.canvas_length == 32 and (event.canvas.state == Cell.MASKED).any()
        assert (event.canvas.state != Cell.MASKED).any()
        await pilot.pause()
        shown = "".join(strip.text for strip in screen.canvas._strips)
        assert "step 3/8" in shown and "·" in shown  # the progress line, and undecided cells drawn as dots
        with Store(app.store.path) as other:  # the prompt is in the database while the server works
            assert [(m.role, m.status) for m in other.messages(screen.chat.id)] == [
                ("user", "done"), ("assistant", "generating")]
        gated.release.set()
        await wait_idle(pilot)
        (job,) = answers
        messages = app.store.messages(screen.chat.id)
        assert [(m.role, m.status) for m in messages] == [("user", "done"), ("assistant", "done")]
        # the same answer as the model itself gives for that conversation and those settings
        local = list(engine.generate(engine.chat_prompt(job.messages), job.params))
        local_final = local[-1]
        assert isinstance(local_final, FinalEvent) and local_final.text
        assert messages[1].content == local_final.text
        # every denoising step crossed the wire, and the live canvas drew them
        assert job.steps_seen == len(local) - 1 == 8
        assert isinstance(screen.last_canvas.event, StepEvent) and screen.last_canvas.event.step >= 3
        # the server's prompt count makes the status line's context count
        prompt_tokens = int(engine.chat_prompt(job.messages).size)
        stats = messages[1].meta["stats"]
        assert stats["prompt_tokens"] == prompt_tokens and messages[1].meta["model_path"] == server.url
        assert messages[1].meta["model"] == f"tiny-llada on {host}"
        expected = prompt_tokens + stats["tokens"]
        assert _tokens(app) is not None and f"{expected:,} /" in _tokens(app)


async def test_server_down_shows_the_error_and_keeps_the_prompt(home, engine) -> None:
    st = ServerThread(engine, ServeConfig(port=0, quiet=True)).start()
    url = st.url
    app = make_app(server=url)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await wait_model(pilot)
            st.stop()  # the server goes away while the app is connected
            await type_text(pilot, "Anyone there?")
            await pilot.press("enter")
            message = await _error(pilot)
            assert app.screen.title_text == "Generation failed"
            assert message == f"cannot reach {url}: connection refused"
            chat = app.chat_screen.chat
            stored = app.store.messages(chat.id)
            assert [(m.role, m.content) for m in stored] == [("user", "Anyone there?")]  # nothing typed is lost
            await pilot.press("enter")
            await pilot.pause()
            # the server is back on its port: Ctrl+R answers the saved prompt on the same connection
            port = int(url.rsplit(":", 1)[1])
            st = ServerThread(engine, ServeConfig(port=port, quiet=True)).start()
            await pilot.press("ctrl+r")
            await wait_idle(pilot)
            assert [(m.role, m.status) for m in app.store.messages(chat.id)] == [("user", "done"),
                                                                                 ("assistant", "done")]
    finally:
        st.stop()


async def test_a_server_that_is_not_there_at_start(home) -> None:
    from fixtures.fake_openai import free_port

    url = f"http://127.0.0.1:{free_port()}"
    app = make_app(server=url)
    async with app.run_test(size=SIZE) as pilot:
        message = await _error(pilot)
        assert app.screen.title_text == "Server not available"
        assert message == f"{url}\n\ncannot reach {url}: connection refused"
        await pilot.press("enter")
        await pilot.pause()
        assert f"server 127.0.0.1:{url.rsplit(':', 1)[1]} · failed to load: cannot reach" in _status(app)
        await type_text(pilot, "hello?")
        await pilot.press("enter")
        await _error(pilot)  # sending tries the server again
        assert [m.content for m in app.store.messages(app.chat_screen.chat.id)] == ["hello?"]


async def test_a_wrong_api_key_then_the_config_s_key(home, engine, tmp_path) -> None:
    with ServerThread(engine, ServeConfig(port=0, quiet=True, token=TOKEN)) as st:
        app = make_app(server=st.url, api_key="not-the-token")
        async with app.run_test(size=SIZE) as pilot:
            message = await _error(pilot)
            assert message == (f"{st.url}\n\nthe server rejected the API key (401) at {st.url}: check --api-key, "
                               "$DGCHAT_API_KEY or [server] api_key")
        app.store.close()
        # [server] in config.toml when no model is named, with its key
        (home / "config" / "config.toml").write_text(
            f'[sampler]\nsteps = 8\ngen_length = 32\n[server]\nurl = "{st.url}"\napi_key = "{TOKEN}"\n')
        app = make_app()
        async with app.run_test(size=SIZE) as pilot:
            await wait_model(pilot)
            assert app.session.engine.url == st.url
            await type_text(pilot, "Halt!")
            await pilot.press("enter")
            await wait_idle(pilot)
            messages = app.store.messages(app.chat_screen.chat.id)
            assert [(m.role, m.status) for m in messages] == [("user", "done"), ("assistant", "done")]
        app.store.close()


MODELS = {"object": "list", "data": [{"id": "big-model", "object": "model", "owned_by": "vllm",
                                      "max_model_len": 32768}]}


def _chunk(content: str | None, finish: str | None = None, usage=None) -> dict:
    choices = [] if content is None and finish is None else [
        {"index": 0, "delta": {"content": content} if content is not None else {}, "finish_reason": finish}]
    out = {"id": "c1", "object": "chat.completion.chunk", "model": "big-model", "choices": choices}
    if usage is not None:
        out["usage"] = usage
    return out


async def test_a_text_only_server_streams_the_answer(home, answers) -> None:
    # the config's [sampler] (steps, gen_length) is not for a server without diffusion settings: left out
    stream = [_chunk("Halt, "), _chunk("who goes "), _chunk("there?", "stop"),
              _chunk(None, usage={"prompt_tokens": 17, "completion_tokens": 5, "total_tokens": 22}), "[DONE]"]

    def handler(method: str, path: str, body) -> Reply:
        if path == "/v1/models":
            return Reply(body=MODELS)
        if path == "/v1/chat/completions":
            return Reply(events=list(stream))
        return Reply(404, {"detail": "Not Found"})

    with FakeServer(handler) as fake:
        app = make_app(server=fake.url)
        async with app.run_test(size=SIZE) as pilot:
            await wait_model(pilot)
            host = fake.url.removeprefix("http://")
            assert _status(app).startswith(f"big-model on {host} · remote ({fake.url}) · text only · max tokens ")
            await type_text(pilot, "Who are you?")
            await pilot.press("enter")
            await wait_idle(pilot)
            messages = app.store.messages(app.chat_screen.chat.id)
            assert [(m.role, m.content) for m in messages] == [("user", "Who are you?"),
                                                                ("assistant", "Halt, who goes there?")]
            assert answers[0].steps_seen == 3  # one progress step per text delta
            assert _tokens(app) is not None and "22 / 32,768" in _tokens(app)
            (_, path, body, _headers) = fake.requests[-1]
            assert path == "/v1/chat/completions" and body["stream"] is True and "dgchat" not in body
            assert body["messages"][-1] == {"role": "user", "content": "Who are you?"}
            # the chat's settings open on a server's model too, its model field naming the server
            from dgchat.app.settings_modal import SettingsModal

            await pilot.press("ctrl+o")
            await wait_for(pilot, lambda: isinstance(app.screen, SettingsModal), what="the settings")
            assert app.screen.query_one("#field-model").placeholder == f"default: server {host}"
            await pilot.press("escape")
            await wait_for(pilot, lambda: not isinstance(app.screen, SettingsModal), what="the settings to close")


GUARD = '''id = "gate_guard"
name = "Captain Brann"
role = "the night captain of the city gate"
examples = ["Move along, traveller."]
'''


async def _open_tool(pilot, key: str, screen_type):
    await wait_model(pilot)
    await pilot.press(key)
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, screen_type), what=screen_type.__name__)
    await pilot.pause()
    return pilot.app.screen


async def test_npc_lines_on_dgchat_serve(home, server) -> None:
    from dgchat.app.npc_screen import NpcScreen
    from dgchat.remote import RemoteEngine

    cards = home / "data" / "npc" / "cards"
    cards.mkdir(parents=True, exist_ok=True)
    (cards / "guard.toml").write_text(GUARD, encoding="utf-8")
    template = "Halt, {player}! None may pass the {___:2} after dark."
    app = make_app(server=server.url)
    async with app.run_test(size=SIZE) as pilot:
        screen = await _open_tool(pilot, "f3", NpcScreen)
        for widget_id, value in (("npc-template", template), ("npc-var-player", "Aria"), ("npc-count", "2"),
                                 ("npc-seed", "5")):
            await pilot.pause()
            screen.query_one(f"#{widget_id}").value = value
        await pilot.pause()
        await pilot.press("ctrl+g")
        await wait_for(pilot, lambda: screen.job is None and len(screen.batches) == 1, 30, "the variants")
        [batch] = screen.batches
        # the server's generator made them: the same lines as asking its /v1/infill directly
        with RemoteEngine.connect(server.url, retries=0) as remote:
            direct = remote.infill({"template": template, "variables": {"player": "Aria"}, "n": 2, "seed": 5,
                                    "character": {"id": "gate_guard", "name": "Captain Brann",
                                                  "role": "the night captain of the city gate",
                                                  "examples": ["Move along, traveller."]},
                                    "max_attempts": 4})
        assert [v.seed for v in batch.variants] == [5, 6]
        assert [v.text for v in batch.variants] == [c["text"] for c in direct["choices"]]
        assert all(v.text.startswith("Halt, Aria! None may pass the ") for v in batch.variants)
        assert batch.model.file == "tiny-llada.gguf"
        shown = [view.query_one(".variant--text").render().plain for view in screen.query("VariantView")]
        assert shown == [v.text for v in batch.variants]
        # drafting on a server: tests/app/test_remote_drafting.py


async def test_npc_lines_need_a_dgchat_server(home) -> None:
    from dgchat.app.npc_screen import NpcScreen

    cards = home / "data" / "npc" / "cards"
    cards.mkdir(parents=True, exist_ok=True)
    (cards / "guard.toml").write_text(GUARD, encoding="utf-8")
    with FakeServer(lambda m, p, b: Reply(body=MODELS) if p == "/v1/models" else Reply(404, {})) as fake:
        app = make_app(server=fake.url)
        async with app.run_test(size=SIZE) as pilot:
            screen = await _open_tool(pilot, "f3", NpcScreen)
            screen.query_one("#npc-template").value = "Halt, {___:2}!"
            await pilot.pause()
            await pilot.press("ctrl+g")
            await pilot.pause()
            assert screen.job is None and not screen.batches
            error = str(screen.query_one("#npc-spec-error").render())
            assert error.startswith(f"NPC lines are not available on {fake.url}: they need a dgchat serve server")
            assert [r[1] for r in fake.requests] == ["/v1/models"]  # nothing was sent for the line
