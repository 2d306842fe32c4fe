"""The app's `model: info` shows the chat's settings with where each came from (the table
`dgchat generate --json` prints), and config.toml's [engine] precise loads the exact engine."""

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
        assert not any("seed" in line for line in lines)  # nobody chose it: dgchat's default
