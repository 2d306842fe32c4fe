"""The chat app end to end under Textual's Pilot, against a real tiny fixture model."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fixtures.app_harness import (
    SIZE,
    GatedEngine,
    make_app,
    setup_home,
    type_text,
    wait_for,
    wait_idle,
    wait_model,
    without_bundled_model,
)

from dgchat.app.store import Store
from dgchat.model_backend.errors import DgchatError


def _db(home: Path) -> Store:
    return Store(home / "data" / "chats.db")


async def test_send_stores_prompt_first_then_answers_like_the_engine(home, llada_gguf):
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        screen = app.chat_screen
        app.session.engine = gated = GatedEngine(app.session.engine, hold_at=2)
        await type_text(pilot, "Halt, traveller!")
        await pilot.press("enter")
        await wait_for(pilot, gated.holding.is_set, what="the first steps")
        # while the answer is still running, the prompt is already committed to the database
        with _db(home) as other:
            rows = other.messages(screen.chat.id)
        assert [(m.role, m.status) for m in rows] == [("user", "done"), ("assistant", "generating")]
        assert rows[0].content == "Halt, traveller!"
        assert screen.query_one("#prompt").text == ""
        gated.release.set()
        await wait_idle(pilot)
        messages = app.store.messages(screen.chat.id)
        assert [m.role for m in messages] == ["user", "assistant"]
        answer = messages[1]
        assert answer.status == "done"
        assert answer.meta["stats"]["steps"] == 8
        assert answer.meta["params"]["gen_length"] == 32
        # the same text as the engine gives directly for the same conversation and settings
        engine = app.session.engine._engine
        prompt = engine.chat_prompt([{"role": "user", "content": "Halt, traveller!"}])
        params = screen.effective_params(engine)
        final = list(engine.generate(prompt, params))[-1]
        assert answer.content == final.text
        assert screen.view_for(answer.id) is not None
        assert not screen.query("#live-canvas")
        assert screen.chat.title == "Halt, traveller!"


async def test_live_canvas_shows_steps_and_is_throttled(home, llada_gguf):
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        screen = app.chat_screen
        app.session.engine = gated = GatedEngine(app.session.engine, hold_at=3)
        await type_text(pilot, "hello")
        await pilot.press("enter")
        await wait_for(pilot, gated.holding.is_set)
        canvas = screen.query_one("#live-canvas")
        # the repaint timer shows the held step (under load, later than a fixed pause: seen in CI)
        await wait_for(pilot, lambda: canvas.event is not None and canvas.event.step == 3, 5.0, "step 3 shown")
        text = canvas.canvas_text().plain
        assert text.count("·") == 32 - canvas.event.committed  # undecided positions are placeholders
        from dgchat.app.widgets.canvas import progress_text

        line = progress_text(canvas.event)
        assert line.startswith("step 3/8 · ") and "tok/s" in line
        # the generation thread only stores the latest event; repaints follow the timer (~30 Hz)
        t0, frames0 = time.monotonic(), canvas.frames
        await pilot.pause(0.5)
        repaints = canvas.frames - frames0
        assert repaints <= 4  # nothing new to show while held: no repaint storm
        gated.release.set()
        await wait_idle(pilot)
        assert time.monotonic() - t0 < 20


async def test_escape_stops_at_once_and_keeps_the_partial_answer(home, llada_gguf):
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        screen = app.chat_screen
        app.session.engine = gated = GatedEngine(app.session.engine, hold_at=4)
        await type_text(pilot, "tell me a long story")
        await pilot.press("enter")
        await wait_for(pilot, gated.holding.is_set)
        await pilot.pause(0.1)
        partial = screen.generation.partial_text()
        t0 = time.monotonic()
        await pilot.press("escape")
        await wait_idle(pilot)
        assert time.monotonic() - t0 < 2.0
        answer = app.store.messages(screen.chat.id)[-1]
        assert answer.role == "assistant"
        assert answer.status == "stopped"
        assert answer.meta["stop_reason"] == "cancelled"
        assert answer.content == partial
        view = screen.view_for(answer.id)
        assert "stopped" in str(view.query_one(".message--header").render())


async def test_regenerate_shows_a_new_version_and_keeps_the_old(home, llada_gguf):
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        screen = app.chat_screen
        await type_text(pilot, "first")
        await pilot.press("enter")
        await wait_idle(pilot)
        before = app.store.messages(screen.chat.id)
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: screen.generation is not None or len(app.store.messages(screen.chat.id)) == 2)
        await wait_idle(pilot)
        after = app.store.messages(screen.chat.id)
        assert [m.role for m in after] == ["user", "assistant"]
        assert after[0].id == before[0].id
        assert after[1].id != before[1].id
        assert after[1].content == before[1].content  # temperature 0: the same answer again
        assert (after[1].version, after[1].versions) == (2, 2)
        assert [v.id for v in app.store.versions(after[1].id)] == [before[1].id, after[1].id]
        assert len(screen.query(".message")) == 2
        assert "‹ 2/2 ›" in str(screen.view_for(after[1].id).query_one(".message--header").render())


async def test_edit_an_earlier_prompt_and_rerun(home, llada_gguf):
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        screen = app.chat_screen
        for text in ("one", "two"):
            await type_text(pilot, text)
            await pilot.press("enter")
            await wait_idle(pilot)
        messages = app.store.messages(screen.chat.id)
        assert [m.content for m in messages if m.role == "user"] == ["one", "two"]
        first = screen.view_for(messages[0].id)
        first.focus()
        await pilot.press("e")
        await pilot.pause()
        from dgchat.app.edit_modal import EditModal

        assert isinstance(app.screen, EditModal)
        assert "keeps the earlier version" in str(app.screen.query_one(".dialog--help").render())
        area = app.screen.query_one("#edit-text")
        area.load_text("one, edited")
        await pilot.press("ctrl+s")
        await pilot.pause()
        await wait_idle(pilot)
        after = app.store.messages(screen.chat.id)
        assert [(m.role, m.content if m.role == "user" else "") for m in after] == [
            ("user", "one, edited"), ("assistant", "")]
        assert (after[0].version, after[0].versions) == (2, 2)
        assert after[1].status == "done"
        assert len(screen.query(".message")) == 2
        # the prompt box has the focus again (not the message the edit started from, now gone)
        await pilot.pause()
        assert app.focused is screen.query_one("#prompt")
        # the edited prompt is a new version: the old one and its whole continuation are kept
        edited = screen.view_for(after[0].id)
        assert "‹ 2/2 ›" in str(edited.query_one(".message--header").render())
        edited.focus()
        await pilot.press("left_square_bracket")
        await pilot.pause()
        assert [m.id for m in app.store.messages(screen.chat.id)] == [m.id for m in messages]
        assert [v.message.id for v in screen.query(".message")] == [m.id for m in messages]
        assert app.focused is screen.view_for(messages[0].id)


async def test_up_recalls_earlier_prompts(home, llada_gguf):
    with Store(home / "data" / "chats.db") as store:
        chat = store.create_chat()
        store.add_message(chat.id, "user", "older prompt")
        store.add_message(chat.id, "user", "newer prompt")
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        prompt = app.chat_screen.query_one("#prompt")
        prompt.focus()
        await pilot.press("up")
        assert prompt.text == "newer prompt"
        await pilot.press("up")
        assert prompt.text == "older prompt"
        await pilot.press("down")
        assert prompt.text == "newer prompt"
        await pilot.press("down")
        assert prompt.text == ""
        # a newline and Enter in the box: shift+enter / ctrl+j insert, enter sends
        await pilot.press("a", "ctrl+j", "b")
        assert prompt.text == "a\nb"


async def test_search_finds_text_and_opens_the_chat(home, llada_gguf):
    with Store(home / "data" / "chats.db") as store:
        a = store.create_chat("Dragons")
        store.add_message(a.id, "user", "where does the dragon live?")
        store.add_message(a.id, "assistant", "In the mountains north of the village.")
        b = store.create_chat("Bread")
        store.add_message(b.id, "user", "what does the baker sell?")
        target = store.add_message(b.id, "assistant", "The baker sells bread.")
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        screen = app.chat_screen
        await pilot.press("ctrl+f")
        await pilot.pause()
        from dgchat.app.search_modal import SearchModal

        modal = app.screen
        assert isinstance(modal, SearchModal)
        await pilot.press(*"bake")
        await pilot.pause()
        assert {h.chat_id for h in modal.hits} == {b.id}
        assert any("\x02" in h.snippet for h in modal.hits)
        index = [h.message_id for h in modal.hits].index(target.id)
        await pilot.press("down")  # into the results
        results = modal.query_one("#search-results")
        assert app.focused is results
        results.highlighted = index
        await pilot.press("enter")
        await pilot.pause(0.2)
        assert screen.chat.id == b.id
        assert app.focused is screen.view_for(target.id)


async def test_export_writes_markdown_atomically(home, llada_gguf, tmp_path):
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        await type_text(pilot, "export me")
        await pilot.press("enter")
        await wait_idle(pilot)
        await pilot.press("ctrl+s")
        await pilot.pause()
        from textual.widgets import Input

        target = tmp_path / "out" / "chat.md"
        app.screen.query_one(Input).value = str(target)
        await pilot.press("enter")
        await pilot.pause()
        text = target.read_text(encoding="utf-8")
        answer = app.store.messages(app.chat_screen.chat.id)[-1].content.rstrip()
        assert text.startswith("# export me\n")
        assert "## You\n\nexport me\n" in text
        assert answer in text
        assert sorted(p.name for p in target.parent.iterdir()) == ["chat.md"]  # no temp file left


async def test_settings_validation_defaults_and_reset(home, llada_gguf):
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        screen = app.chat_screen
        from textual.widgets import Input, Label

        from dgchat.app.settings_modal import SettingsModal

        await pilot.press("ctrl+o")
        await pilot.pause()
        modal = app.screen
        assert isinstance(modal, SettingsModal)
        # defaults: the config's [sampler] over the model's recommended values
        assert modal.defaults.steps == 8 and modal.defaults.gen_length == 32
        assert modal.query_one("#field-steps", Input).value == "8"
        error = modal.query_one("#settings-error", Label)

        modal.query_one("#field-steps", Input).value = "0"
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert "steps must be a positive integer" in str(error.render())
        assert isinstance(app.screen, SettingsModal)

        modal.query_one("#field-steps", Input).value = "8"
        modal.query_one("#field-gen_length", Input).value = "64"
        modal.query_one("#field-block_length", Input).value = "24"
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert "not divisible by block length 24" in str(error.render())

        modal.query_one("#field-block_length", Input).value = "32"
        modal.query_one("#field-temperature", Input).value = "-1"
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert "temperature must be >= 0" in str(error.render())

        modal.query_one("#field-temperature", Input).value = "0"
        modal.query_one("#field-model", Input).value = str(home / "missing.gguf")
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert "Model:" in str(error.render()) and "not found" in str(error.render())

        modal.query_one("#field-model", Input).value = ""
        modal.query_one("#field-system").load_text("You are a herald.")
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert not isinstance(app.screen, SettingsModal)
        chat = app.store.get_chat(screen.chat.id)
        assert chat.params == {"gen_length": 64, "block_length": 32}
        assert chat.system_prompt == "You are a herald."
        params = screen.effective_params(app.session.engine)
        assert (params.steps, params.gen_length, params.block_length) == (8, 64, 32)

        # the system prompt reaches the model, the settings reach the sampler
        await type_text(pilot, "hi")
        await pilot.press("enter")
        await wait_idle(pilot)
        answer = app.store.messages(screen.chat.id)[-1]
        assert answer.meta["params"]["gen_length"] == 64
        assert screen.answers.history_for_model()[0] == {"role": "system", "content": "You are a herald."}

        # reset puts every sampler field back to the defaults; saving then stores no overrides
        await pilot.press("ctrl+o")
        await pilot.pause()
        modal = app.screen
        assert modal.query_one("#field-gen_length", Input).value == "64"
        await pilot.click("#reset")
        await pilot.pause()
        assert modal.query_one("#field-gen_length", Input).value == "32"
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert app.store.get_chat(screen.chat.id).params == {}


async def test_model_load_failure_shows_a_dialog_and_the_app_keeps_running(home, tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf file at all")
    app = make_app(bad)
    async with app.run_test(size=SIZE) as pilot:
        from dgchat.app.error_modal import ErrorModal

        await wait_for(pilot, lambda: isinstance(app.screen, ErrorModal), what="the error dialog")
        message = str(app.screen.query_one("#error-message").render())
        assert "broken.gguf" in message
        await pilot.press("enter")
        await pilot.pause()
        assert not isinstance(app.screen, ErrorModal)
        assert app.is_running and app.session.engine is None
        # typing still works and is saved; the answer waits for a model
        await type_text(pilot, "are you there?")
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ErrorModal), what="the second load failure")
        screen = app.chat_screen
        assert [m.content for m in app.store.messages(screen.chat.id)] == ["are you there?"]


async def test_no_model_says_how_to_give_one(home, monkeypatch):
    without_bundled_model(monkeypatch)
    app = make_app(None)
    async with app.run_test(size=SIZE) as pilot:
        from dgchat.app.no_model_screen import NoModelScreen

        await pilot.pause()
        assert isinstance(app.screen, NoModelScreen)
        body = str(app.screen.query_one(".dialog--body").render())
        assert "dgchat --model" in body and "~/dgchat-home/config/config.toml" in body and "DGCHAT_MODEL" in body
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen is app.chat_screen
        status = str(app.chat_screen.query_one("#status-text").render())
        assert "No model" in status
        await type_text(pilot, "saved anyway")
        await pilot.press("enter")
        await pilot.pause()
        assert [m.content for m in app.store.messages(app.chat_screen.chat.id)] == ["saved anyway"]


async def test_open_model_from_the_no_model_screen(home, monkeypatch, llada_gguf):
    without_bundled_model(monkeypatch)
    app = make_app(None)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.click("#open")
        await pilot.pause()
        from textual.widgets import Input

        app.screen.query_one(Input).value = str(llada_gguf)
        await pilot.press("enter")
        await wait_model(pilot)
        assert app.session.path == Path(llada_gguf).resolve()


async def test_command_palette_has_namespaced_commands(home, llada_gguf):
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        from dgchat.app.commands import ChatCommands, ModelCommands, OpenChatCommands, ViewCommands

        provider = ViewCommands(app.chat_screen)
        titles = [provider._title(name) for name, _h, _c in provider.commands()]
        assert "view: toggle dark / light" in titles
        for cls in (ChatCommands, ModelCommands, OpenChatCommands):
            assert all(provider_name.startswith(cls.namespace + ": ")
                       for provider_name in (cls(app.chat_screen)._title(n) for n, _h, _c in cls(app.chat_screen).commands()))
        dark = app.current_theme.dark
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"view: toggle dark")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await pilot.pause(0.2)
        assert app.current_theme.dark is not dark
        assert app.store.get_setting("theme") == app.theme


async def test_keymap_from_config_remaps_bindings(tmp_path, monkeypatch, llada_gguf):
    setup_home(tmp_path, monkeypatch, '[sampler]\nsteps = 8\ngen_length = 32\n[keys]\n"chat.search" = "f9"\n')
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        from dgchat.app.search_modal import SearchModal

        await pilot.press("ctrl+f")
        await pilot.pause()
        assert not isinstance(app.screen, SearchModal)
        await pilot.press("f9")
        await pilot.pause()
        assert isinstance(app.screen, SearchModal)
        await pilot.press("escape")
        await pilot.pause()
        rows = dict((i, k) for _g, entries in app.help_rows() for i, k, _d in entries)
        assert rows["chat.search"] == "f9"
        await pilot.press("f1")
        await pilot.pause()
        from dgchat.app.help_modal import HelpModal

        assert isinstance(app.screen, HelpModal)


def test_unknown_binding_id_or_theme_is_a_config_error(tmp_path, monkeypatch):
    setup_home(tmp_path, monkeypatch, '[keys]\n"chat.nonsense" = "f6"\n')
    with pytest.raises(DgchatError, match="unknown binding id 'chat.nonsense'"):
        make_app(None)
    setup_home(tmp_path, monkeypatch, 'theme = "no-such-theme"\n')
    with pytest.raises(DgchatError, match="theme 'no-such-theme' is not a theme"):
        make_app(None)


async def test_copy_falls_back_to_a_file_and_says_so(home, llada_gguf):
    with Store(home / "data" / "chats.db") as store:
        chat = store.create_chat("c")
        store.add_message(chat.id, "user", "q")
        store.add_message(chat.id, "assistant", "the answer")
    app = make_app(llada_gguf, chat=chat.id)
    notices: list[str] = []
    async with app.run_test(size=SIZE) as pilot:
        app.notify = lambda message, **kw: notices.append(str(message))  # type: ignore[method-assign]
        app.chat_screen.notify = app.notify  # type: ignore[method-assign]
        await pilot.press("alt+c")
        await pilot.pause()
    fallback = home / "data" / "clipboard.txt"
    assert fallback.read_text(encoding="utf-8") == "the answer"
    assert any(str(fallback) in n and "OSC 52" in n for n in notices)
    assert app.clipboard == "the answer"


def test_osc52_detection_and_system_tool(monkeypatch):
    from dgchat.app.clipboard import copy_text, terminal_supports_osc52

    assert terminal_supports_osc52({"TERM": "xterm-256color"})
    assert terminal_supports_osc52({"TERM": "screen-256color", "TMUX": "/tmp/t"})
    assert not terminal_supports_osc52({"TERM": "xterm-256color", "TERM_PROGRAM": "Apple_Terminal"})
    assert not terminal_supports_osc52({"TERM": "linux"})

    class FakeApp:
        is_headless = False
        clipboard = ""

        def copy_to_clipboard(self, text):
            self.clipboard = text

    app = FakeApp()
    result = copy_text(app, "hi", "auto", {"TERM": "xterm-256color"})
    assert result.method == "osc52" and app.clipboard == "hi"


async def test_no_color_uses_attributes_not_colours(home, llada_gguf, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        assert app.no_color
        app.session.engine = gated = GatedEngine(app.session.engine, hold_at=2)
        await type_text(pilot, "x")
        await pilot.press("enter")
        await wait_for(pilot, gated.holding.is_set)
        await pilot.pause(0.1)
        canvas = app.chat_screen.query_one("#live-canvas")
        from dgchat.model_backend.canvas import Cell

        assert canvas._styles()[Cell.NEW].reverse
        gated.release.set()
        await wait_idle(pilot)


async def test_theme_choice_is_remembered(home, llada_gguf):
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        assert app.current_theme.dark
        await pilot.press("ctrl+t")
        await pilot.pause()
        assert not app.current_theme.dark
    app2 = make_app(llada_gguf)
    async with app2.run_test(size=SIZE) as pilot:
        assert app2.theme == "textual-light"


async def test_sidebar_rename_delete_and_open(home, llada_gguf):
    with Store(home / "data" / "chats.db") as store:
        a = store.create_chat("Alpha")
        store.add_message(a.id, "user", "a")
        b = store.create_chat("Beta")
        store.add_message(b.id, "user", "b")
    app = make_app(llada_gguf, chat=a.id)
    async with app.run_test(size=SIZE) as pilot:
        screen = app.chat_screen
        assert screen.chat.id == a.id
        chats = screen.query_one("#chat-list")
        chats.focus()
        chats.highlighted = [c.id for c in app.store.list_chats()].index(b.id)
        await pilot.press("enter")
        await pilot.pause()
        assert screen.chat.id == b.id
        await pilot.press("r")
        await pilot.pause()
        from textual.widgets import Input

        app.screen.query_one(Input).value = "Beta renamed"
        await pilot.press("enter")
        await pilot.pause()
        assert app.store.get_chat(b.id).title == "Beta renamed"
        await pilot.press("d")
        await pilot.pause()
        await pilot.press("y")
        await pilot.pause()
        assert app.store.get_chat(b.id) is None
        assert screen.chat is None
        assert [c.id for c in app.store.list_chats()] == [a.id]


async def test_quit_while_generating_saves_the_answer_as_stopped(home, llada_gguf):
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        app.session.engine = gated = GatedEngine(app.session.engine, hold_at=2)
        await type_text(pilot, "quit now")
        await pilot.press("enter")
        await wait_for(pilot, gated.holding.is_set)
        chat_id = app.chat_screen.chat.id
        await pilot.press("ctrl+q")
        await pilot.pause()
    with _db(home) as store:
        messages = store.messages(chat_id)
    assert [(m.role, m.status) for m in messages] == [("user", "done"), ("assistant", "stopped")]


async def test_model_loading_progress_is_shown(home, llada_gguf):
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        from dgchat.app.session import SessionCall

        app.session.loading_path = Path("/models/big.gguf")
        app.post_message(SessionCall(app.session._progress, app.session.loading_path, 0.42))
        await pilot.pause()
        bar = app.chat_screen.query_one("#status")
        assert "Loading big.gguf… 42%" in str(bar.query_one("#status-text").render())
        assert bar.has_class("-loading")
        app.session.loading_path = None
        app.chat_screen.update_status()


def test_open_chat_argument_and_missing_chat(home, llada_gguf):
    with Store(home / "data" / "chats.db") as store:
        chat = store.create_chat("Kept")
    app = make_app(llada_gguf, chat=chat.id)
    assert app.open_chat_id == chat.id
    app.store.close()
    with pytest.raises(DgchatError, match="no saved chat with id 999"):
        make_app(llada_gguf, chat=999)


def test_cli_help_and_version():
    env = dict(os.environ)
    out = subprocess.run([sys.executable, "-m", "dgchat", "--help"], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0
    assert "--model" in out.stdout and "--chat ID" in out.stdout
    out = subprocess.run([sys.executable, "-m", "dgchat", "--version"], capture_output=True, text=True, env=env, timeout=60)
    from dgchat import __version__

    assert out.returncode == 0 and out.stdout.strip() == f"dgchat {__version__}"


def test_bad_config_is_reported_by_the_cli(tmp_path):
    env = dict(os.environ, DGCHAT_HOME=str(tmp_path))
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.toml").write_text("refresh_hz = 0\n")
    out = subprocess.run([sys.executable, "-m", "dgchat"], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 2
    assert "refresh_hz must be an integer from 1 to 120 (got 0)" in out.stderr


def test_partial_text_cuts_at_the_first_undecided_position(llada_gguf):
    from dgchat.app.generation import decided_tokens
    from dgchat.model_backend.canvas import CanvasSnapshot, Cell
    from dgchat.model_backend.loader import load_engine
    from dgchat.model_backend.events import StepEvent, StepTiming

    with load_engine(llada_gguf) as engine:
        tokens = np.array([10, 11, 12, 13], dtype=np.int32)
        state = np.array([Cell.DONE, Cell.NEW, Cell.MASKED, Cell.DONE], dtype=np.int8)
        event = StepEvent(step=1, total_steps=4, canvas_index=1, canvas_step=1,
                          canvas=CanvasSnapshot(tokens, state, np.zeros(4, np.float32)),
                          answer_tokens=np.array([5, 6], np.int32), committed=3, canvas_length=4,
                          timing=StepTiming(0, 0), elapsed_s=1.0)
        assert decided_tokens(engine, event).tolist() == [5, 6, 10, 11]


def test_screen_keys_do_not_collide_with_the_prompt_box():
    """The prompt box has focus most of the time: its own keys (TextArea's) must not shadow ours."""
    from textual.widgets import TextArea

    from dgchat.app.app import DgchatApp
    from dgchat.app.chat_screen import ChatScreen
    from dgchat.app.widgets.prompt_input import PromptInput

    def keys(bindings):
        return {k.strip() for b in bindings for k in b.key.split(",")}

    taken = keys(TextArea.BINDINGS) - keys(PromptInput.BINDINGS)  # what the prompt box keeps for itself
    ours = keys(ChatScreen.BINDINGS) | keys([b for b in DgchatApp.BINDINGS if not b.priority])
    assert not (ours - {"escape"}) & taken
    assert all(b.id for b in ChatScreen.BINDINGS + DgchatApp.BINDINGS + PromptInput.BINDINGS)
