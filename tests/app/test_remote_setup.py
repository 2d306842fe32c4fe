"""Setting the app up on a server: the wizard's "Use a server…" form against a real `dgchat serve` on
loopback (checked on a worker thread, tested on the live canvas, saved as [server] url), a refused
address and a wrong key with nothing saved; the Models screen's server line and its question when a
local model is chosen while the config names a server."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from dgchat.app import model_source
from dgchat.config import load_config
from dgchat.app.confirm_modal import ConfirmModal
from dgchat.app.model_source import ServerSource
from dgchat.app.models_screen import ModelsScreen
from dgchat.server.app import ServeConfig, ServerThread
from fixtures.app_harness import (
    FAST_SAMPLER,
    make_app,
    type_text,
    wait_for,
    wait_idle,
    wait_model,
)
from fixtures.fake_openai import free_port
from fixtures.wizard_harness import SIZE, first_run_home, press, to_model_step
from textual.widgets import Checkbox, Input

TOKEN = "setup-token"


@pytest.fixture
def home(tmp_path, monkeypatch, hub, hf_home):
    monkeypatch.setattr(model_source, "SERVER_RETRIES", 0)
    monkeypatch.delenv("DGCHAT_API_KEY", raising=False)
    return first_run_home(tmp_path, monkeypatch, hub=hub)


def _config(home: Path) -> Path:
    return home / "config" / "config.toml"


def _text(screen, selector: str) -> str:
    return str(screen.query_one(selector).render())


async def _server_form(pilot, url: str, key: str = "") -> object:
    wiz = await to_model_step(pilot)
    assert wiz.query_one("#wiz-server").display
    await press(pilot, "#wiz-server")
    assert wiz.step == "server"
    assert "$DGCHAT_API_KEY" in _text(wiz, "#srv-key-note")  # where the key comes from when it is not saved
    assert wiz.query_one("#srv-key", Input).password
    wiz.query_one("#srv-url", Input).value = url
    wiz.query_one("#srv-key", Input).value = key
    await pilot.pause()
    assert wiz.query_one("#wiz-next").label.plain == "Check the server"
    return wiz


async def _check(pilot, wiz) -> None:
    await press(pilot, "#wiz-next")
    await wait_for(pilot, lambda: wiz.server_task is None, what="the server check")
    await pilot.pause()


async def test_the_wizard_sets_up_a_dgchat_server_and_the_chat_answers_through_it(home, server) -> None:
    app = make_app(None)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        wiz = await _server_form(pilot, server.url + "/v1/")
        await _check(pilot, wiz)
        assert wiz.server_checked == ServerSource(server.url)
        result = _text(wiz, "#srv-result")
        assert f"{server.url} serves tiny-llada · a dgchat server: answers draw on the live canvas" in result
        assert not _config(home).exists()  # checked, nothing saved yet
        assert wiz.query_one("#wiz-next").label.plain == "Next: test it"
        await press(pilot, "#wiz-next")
        assert wiz.step == "ready"
        assert f"Ready: tiny-llada on {server.url.removeprefix('http://')}" in _text(wiz, "#ready-title")
        assert "[server] url" in _text(wiz, "#ready-note")
        await wait_for(pilot, lambda: wiz.load_state == "loaded", what="the connection")
        # the test answer runs on the server, drawn on the live canvas while it runs
        await wait_for(pilot, lambda: wiz.canvas is not None or bool(wiz.query("#ready-text")), what="the test")
        await wait_for(pilot, lambda: wiz.generation is None and bool(wiz.query("#ready-text")), timeout=30,
                       what="the test answer")
        assert "runs as remote (" in _text(wiz, "#ready-model")
        assert "tokens/s" in _text(wiz, "#ready-stats")
        await press(pilot, "#wiz-next")  # Start chatting
        await wait_for(pilot, lambda: app.screen is app.chat_screen, what="the chat")
        raw = tomllib.loads(_config(home).read_text(encoding="utf-8"))
        assert raw["server"] == {"url": server.url}  # no key was typed: none is written
        assert "default_model" not in raw
        assert load_config().server_url == server.url
        assert app.session.default_path == ServerSource(server.url)
        await type_text(pilot, "Halt!")
        await pilot.press("enter")
        await wait_idle(pilot)
        messages = app.store.messages(app.chat_screen.chat.id)
        assert [(m.role, m.status) for m in messages] == [("user", "done"), ("assistant", "done")]
        assert messages[1].meta["model_path"] == server.url and messages[1].content


async def test_a_refused_address_says_so_and_saves_nothing(home) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    app = make_app(None)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        wiz = await _server_form(pilot, url)
        await _check(pilot, wiz)
        assert _text(wiz, "#srv-error") == f"cannot reach {url}: connection refused"
        assert wiz.server_checked is None and wiz.step == "server"
        assert wiz.query_one("#wiz-next").label.plain == "Check the server"
        # not a URL at all: said before anything is asked
        wiz.query_one("#srv-url", Input).value = "gpu-box:8765"
        await pilot.pause()
        await press(pilot, "#wiz-next")
        assert "such as http://127.0.0.1:8765" in _text(wiz, "#srv-error")
        await press(pilot, "#wiz-back")
        assert wiz.step == "model"
    assert not _config(home).exists()


async def test_a_wrong_key_then_the_right_one_saved_on_request(home, engine) -> None:
    with ServerThread(engine, ServeConfig(port=0, quiet=True, token=TOKEN)) as st:
        app = make_app(None)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            wiz = await _server_form(pilot, st.url, key="not-the-token")
            await _check(pilot, wiz)
            assert _text(wiz, "#srv-error").startswith(f"the server rejected the API key (401) at {st.url}")
            assert wiz.server_checked is None
            wiz.query_one("#srv-key", Input).value = TOKEN
            wiz.query_one("#srv-save-key", Checkbox).value = True
            await pilot.pause()
            assert "saved in the config file" in _text(wiz, "#srv-key-note")
            await _check(pilot, wiz)
            assert _text(wiz, "#srv-error") == "" and wiz.server_checked == ServerSource(st.url, TOKEN)
            await press(pilot, "#wiz-next")
            await wait_for(pilot, lambda: wiz.generation is None and bool(wiz.query("#ready-text")), timeout=30,
                           what="the test answer")
            await press(pilot, "#wiz-next")
            await wait_for(pilot, lambda: app.screen is app.chat_screen, what="the chat")
        assert tomllib.loads(_config(home).read_text(encoding="utf-8"))["server"] == {"url": st.url,
                                                                                       "api_key": TOKEN}
        app.store.close()


def _set_up(home: Path, server_url: str | None = None) -> None:
    text = "# mine\n" + FAST_SAMPLER
    if server_url:
        text += f'\n[server]  # the GPU box\nurl = "{server_url}"\n'
    _config(home).write_text(text, encoding="utf-8")


async def _models(pilot) -> ModelsScreen:
    await pilot.press("f4")
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, ModelsScreen) and bool(pilot.app.screen.rows),
                   what="the Models screen")
    await pilot.pause()
    return pilot.app.screen


async def test_models_screen_names_the_server_and_asks_before_a_local_model(home, server) -> None:
    _set_up(home, server.url)
    app = make_app(None)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        assert app.session.default_path == ServerSource(server.url)
        screen = await _models(pilot)
        line = _text(screen, "#models-server-text")
        assert line == f"● Served by {server.url}: tiny-llada · live canvas · in use · [server] url in the config"
        assert screen.query_one("#m-server").display
        # Use on the bundled model: the config's server would win at the next start, so it asks
        index = next(i for i, r in enumerate(screen.rows) if r.name == "dgchat-tiny-plays")
        screen.query_one("#models-table").move_cursor(row=index)
        await pilot.pause()
        await press(pilot, "#m-use")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmModal), what="the question")
        body = _text(app.screen, ".dialog--body")
        assert f"[server] url = {server.url}" in body and "wins over the default model" in body
        await press(pilot, "#no")  # nothing changes
        assert isinstance(app.screen, ModelsScreen) and load_config().server_url == server.url
        await press(pilot, "#m-use")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmModal), what="the question")
        await press(pilot, "#yes")
        await wait_for(pilot, lambda: app.screen is app.chat_screen, what="the chat")
        config = load_config()
        bundled = screen.rows[index].path
        assert config.server_url is None and config.default_model == str(bundled)
        text = _config(home).read_text(encoding="utf-8")
        assert text.startswith("# mine\n") and "[server]" not in text and "steps = 8" in text
        await wait_model(pilot)
        assert app.session.path == bundled and app.session.default_path == bundled
        # the server is no longer named anywhere: the Models screen shows no server line
        screen = await _models(pilot)
        assert not screen.query_one("#models-server").display


async def test_models_screen_use_this_server_from_the_command_line(home, server) -> None:
    _set_up(home)  # no [server] in the config: the server comes from --server
    app = make_app(None)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        local = app.session.path
        assert isinstance(local, Path)
        app.session.use_default(ServerSource(server.url))  # as `dgchat --server URL` would start it
        screen = await _models(pilot)
        assert _text(screen, "#models-server-text") == f"● Server {server.url}: not connected · in use"
        await press(pilot, "#m-server")
        await wait_for(pilot, lambda: app.screen is app.chat_screen, what="the chat")
        await wait_for(pilot, lambda: app.session.path == ServerSource(server.url), what="the server")
        assert tomllib.loads(_config(home).read_text(encoding="utf-8"))["server"] == {"url": server.url}
        screen = await _models(pilot)
        assert _text(screen, "#models-server-text").startswith(f"● Served by {server.url}: tiny-llada · live canvas")


async def test_a_chat_s_own_diffusion_settings_on_a_text_only_server_name_the_settings_fields(home) -> None:
    from dgchat.app.error_modal import ErrorModal
    from dgchat.app.settings_modal import ChatSettings
    from fixtures.fake_openai import FakeServer, Reply

    models = {"object": "list", "data": [{"id": "big-model", "object": "model", "owned_by": "vllm"}]}
    _set_up(home)
    with FakeServer(lambda m, p, b: Reply(body=models) if p == "/v1/models" else Reply(404, {})) as fake:
        app = make_app(server=fake.url)
        async with app.run_test(size=SIZE) as pilot:
            await wait_model(pilot)
            app.chat_screen.apply_settings(ChatSettings(None, "", {"steps": 16, "gen_length": 64}), quiet=True)
            await type_text(pilot, "Who goes there?")
            await pilot.press("enter")
            await wait_for(pilot, lambda: isinstance(app.screen, ErrorModal), what="the error")
            assert app.screen.title_text == "Cannot generate"
            assert _text(app.screen, "#error-message") == (
                "this server takes no Steps, Canvas length; reset them in Settings (Ctrl+O)")
            assert [r[1] for r in fake.requests] == ["/v1/models"]  # nothing was sent
            assert [m.content for m in app.store.messages(app.chat_screen.chat.id)] == ["Who goes there?"]
