"""The app's `model: info` shows the chat's settings with where each came from (the table
`dgchat generate --json` prints), and config.toml's [engine] precise loads the engine in exact mode."""

from __future__ import annotations

import pytest

from fixtures.app_harness import SIZE, make_app, setup_home, wait_model

from dgchat.app.store import Store

CONFIG = """
[sampler]
steps = 8
gen_length = 16

[engine]
precise = true
"""


@pytest.fixture
def home(tmp_path, monkeypatch):
    return setup_home(tmp_path, monkeypatch, config=CONFIG)


async def test_model_info_lists_each_setting_with_its_source(home, llada_gguf):
    from dgchat.app.error_modal import ErrorModal
    from dgchat.model_backend.param_resolution import CHAT, CONFIG as FROM_CONFIG, FAMILY_DEFAULT

    with Store(home / "data" / "chats.db") as store:
        chat = store.create_chat("c")
        store.update_chat_settings(chat.id, model=None, system_prompt="", params={"steps": 4})
    app = make_app(llada_gguf, chat=chat.id)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        screen = app.chat_screen
        engine = app.session.engine
        assert engine.precise is True
        resolved = screen.resolved_params(engine)
        assert resolved.params == screen.effective_params(engine)
        assert resolved.source("steps") == CHAT and resolved.params.steps == 4
        assert resolved.source("gen_length") == FROM_CONFIG and resolved.source("algorithm") == FAMILY_DEFAULT
        assert resolved.table()["precise"] == {"value": True, "source": FROM_CONFIG}
        screen.action_model_info()
        await pilot.pause()
        assert isinstance(app.screen, ErrorModal)
        text = str(app.screen.query_one("#error-message").render())
        lines = [line.split() for line in text.splitlines()]
        assert ["steps", "4", "(chat)"] in lines
        assert ["canvas", "length", "16", "(config)"] in lines
        assert ["exact", "mode", "(--precise)", "true", "(config)"] in lines
        # nobody chose it: every answer draws its own (shown on the answer)
        assert [line for line in lines if "seed" in line] == [
            ["seed", "new", "for", "each", "answer", "(shown", "on", "the", "answer)"]]


def test_save_precise_keeps_the_rest_of_the_file(tmp_path):
    from dgchat.config import save_precise
    from dgchat.config import load_config

    path = tmp_path / "config.toml"
    path.write_text("# mine\ntheme = \"dark\"\n\n[engine]  # how models run\nprecise = false\n\n[sampler]\nsteps = 8\n")
    save_precise(path, True)
    text = path.read_text()
    assert "# mine" in text and "# how models run" in text and text.count("precise") == 1
    config = load_config(path)
    assert config.precise is True and config.sampler == {"steps": 8} and config.theme == "textual-dark"
    fresh = tmp_path / "new.toml"
    save_precise(fresh, False)
    assert load_config(fresh).precise is False


async def test_the_precise_command_saves_the_setting_and_reloads_the_model(tmp_path, monkeypatch, llada_gguf):
    from fixtures.app_harness import wait_for

    from dgchat.config import load_config

    home = setup_home(tmp_path, monkeypatch)  # no [engine] table: off
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        assert app.session.engine.precise is False
        first = app.session.engine
        app.chat_screen.action_toggle_precise()
        await wait_for(pilot, lambda: app.session.engine is not None and app.session.engine is not first
                       and app.session.engine.precise, what="the model loaded again, precise")
        assert load_config(home / "config" / "config.toml").precise is True
        table = app.chat_screen.resolved_params(app.session.engine).table()
        assert table["precise"] == {"value": True, "source": "config"}
