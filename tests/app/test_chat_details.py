"""The chat screen's smaller behaviours (issue 16): the second copy key, the remapping example,
model info and the status line without float noise, the speed line of short answers, reopening the
last chat, and the conversation's token count (Pilot on the fixture models, real SQLite)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures.app_harness import SIZE, make_app, type_text, wait_for, wait_idle, wait_model

from dgchat.app.store import Message, Store


def _status(screen) -> str:
    return str(screen.query_one("#status-text").render())


def _tokens_label(screen):
    return screen.query_one("#status-tokens")


# -- copying ----------------------------------------------------------------------------------------

async def test_f8_and_alt_c_as_tmux_sends_it_copy_the_last_answer(home, llada_gguf):
    from textual import events
    from textual._xterm_parser import XTermParser

    with Store(home / "data" / "chats.db") as store:
        chat = store.create_chat("c")
        store.add_message(chat.id, "user", "q")
        store.add_message(chat.id, "assistant", "the answer")
    fallback = home / "data" / "clipboard.txt"
    app = make_app(llada_gguf, chat=chat.id)
    async with app.run_test(size=SIZE) as pilot:
        prompt = app.chat_screen.query_one("#prompt")
        assert app.focused is prompt
        await pilot.press("f8")
        await pilot.pause()
        assert fallback.read_text(encoding="utf-8") == "the answer"
        assert prompt.text == ""

        # tmux sends Alt+C as ESC c, which Textual reads as "alt+c" *with* the character "c": the
        # prompt box used to type that "c"
        parser = XTermParser()
        [key] = [e for e in [*parser.feed("\x1bc"), *parser.feed("")] if isinstance(e, events.Key)]
        assert (key.key, key.character) == ("alt+c", "c")
        fallback.unlink()
        app.post_message(events.Key("alt+c", "c"))
        await pilot.pause(0.1)
        assert prompt.text == ""
        assert fallback.read_text(encoding="utf-8") == "the answer"
        # plain letters and the prompt box's own Alt keys still work
        await pilot.press("a", "b")
        assert prompt.text == "ab"
        await pilot.press("alt+backspace")
        assert prompt.text == ""


def test_the_remapping_example_uses_a_free_key():
    from textual.app import App
    from textual.screen import Screen
    from textual.widgets import TextArea

    from dgchat.app.app import _bindings, all_binding_ids, binding_sources
    from dgchat.app.help_modal import REMAP_EXAMPLE, remap_hint

    binding_id, key = REMAP_EXAMPLE
    assert binding_id in all_binding_ids()
    taken = {k.strip() for _g, classes in binding_sources() for b in _bindings(classes) for k in b.key.split(",")}
    taken |= {k.strip() for cls in (App, Screen, TextArea) for b in cls.BINDINGS for k in b.key.split(",")}
    assert key not in taken
    line = f'"{binding_id}" = "{key}"'
    assert line in remap_hint("~/config.toml")
    docs = (Path(__file__).parents[2] / "docs" / "APP.md").read_text(encoding="utf-8")
    assert line in docs.split("\n[keys]", 1)[1].split("```", 1)[0]  # the config example


@pytest.mark.parametrize("size", [(140, 40), (80, 24)])
async def test_key_help_lines_up_its_columns_and_says_how_to_focus_a_message(home, llada_gguf, size):
    """F1's groups were separate tables sized by their own rows: the action and id columns moved
    from group to group. And the message keys (c, e, r, [ ]) act on a focused message, which F1
    never said how to reach."""
    from dgchat.app.help_modal import HelpModal

    app = make_app(llada_gguf)
    async with app.run_test(size=size) as pilot:
        await pilot.press("f1")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpModal), what="the key help")
        modal = app.screen
        await pilot.pause()
        starts: dict[str, set[int]] = {"action": set(), "id": set()}
        tables = list(modal.query(".help--table"))
        assert len(tables) == len(modal.rows) > 5
        for table, (_group, rows) in zip(tables, modal.rows, strict=True):
            binding_id, _key, description = rows[0]
            first = table.render_line(0).text
            starts["action"].add(first.index(description))
            starts["id"].add(first.rindex(binding_id))
        assert len(starts["action"]) == 1 and len(starts["id"]) == 1, starts
        groups = [str(label.render()) for label in modal.query(".help--group")]
        focused = next(g for g in groups if g.startswith("Focused message"))
        assert "Shift+Tab" in focused and "click" in focused


# -- model info and the status line ----------------------------------------------------------------

def test_values_without_float_noise():
    import numpy as np

    from dgchat.app.sampler_text import defaults_text, temperature_text, value_text
    from dgchat.model_backend.params import DiffusionParams

    assert value_text(float(np.float32(0.005))) == "0.005" and value_text(0.001) == "0.001"
    assert value_text(24) == "24" and value_text(True) == "true" and value_text("entropy") == "entropy"
    annealing = DiffusionParams(temperature=0.0, t_min=float(np.float32(0.4)), t_max=float(np.float32(0.8)))
    assert temperature_text(annealing, uniform_state=True) == "0.8 → 0.4"
    assert temperature_text(annealing, uniform_state=False) == "0"  # a masked model uses `temperature`
    assert temperature_text(DiffusionParams(temperature=0.7, t_min=0.4, t_max=0.8, autoregressive=True), True) == "0.7"
    temperature, rest = defaults_text({"steps": 48, "temperature": 0.0, "top_p": 0.949999988079071}, False)
    assert (temperature, rest) == ("0", "steps=48, top_p=0.95")


async def test_model_info_and_status_show_the_annealed_temperature(home):
    """The bundled model is a DiffusionGemma with float32 defaults (0.005 is stored as
    0.004999999888241291, read back as written) that anneals its temperature 0.8 → 0.4."""
    from dgchat.app.error_modal import ErrorModal
    from dgchat.assets import bundled_model_path

    bundled = bundled_model_path()
    assert bundled is not None
    app = make_app(bundled)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        screen = app.chat_screen
        assert app.session.engine.info.defaults["confidence_threshold"] == 0.005  # not float32's 0.0049999998
        status = _status(screen)
        assert "T 0.8 → 0.4" in status and "T 0 " not in status and not status.endswith("T 0")
        screen.action_model_info()
        await pilot.pause()
        assert isinstance(app.screen, ErrorModal)
        text = str(app.screen.query_one("#error-message").render())
        assert "temperature: 0.8 → 0.4" in text
        assert "confidence_threshold=0.005" in text and "0.0049999" not in text and "0.400000" not in text
        assert "t_min" not in text and "temperature=0" not in text
        assert "context: 4,096 tokens" in text


async def test_a_masked_model_shows_its_fixed_temperature(home, llada_gguf):
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        assert _status(app.chat_screen).endswith(" · T 0")


# -- the speed line of a finished answer ------------------------------------------------------------

def _answer(stats: dict, gen_length: int | None = 256) -> Message:
    meta = {"stats": stats, "model": "m.gguf"}
    if gen_length is not None:
        meta["params"] = {"gen_length": gen_length}
    return Message(1, 1, "assistant", "x", meta=meta)


def test_a_short_answer_shows_its_canvas_not_a_misleading_rate():
    from dgchat.app.widgets.message import meta_line

    tiny = {"tokens": 3, "steps": 48, "canvases": 1, "elapsed_s": 1.3, "tokens_per_s": 2.3}
    assert meta_line(_answer(tiny)) == "3 tokens (canvas 256) · 48 steps · 1.3 s · m.gguf"
    # long enough but most of the canvas unused: still the same honest line
    sparse = {"tokens": 40, "steps": 48, "canvases": 1, "elapsed_s": 1.0, "tokens_per_s": 40.0}
    assert "tok/s" not in meta_line(_answer(sparse)) and "(canvas 256)" in meta_line(_answer(sparse))
    full = {"tokens": 200, "steps": 48, "canvases": 1, "elapsed_s": 2.0, "tokens_per_s": 100.0}
    assert meta_line(_answer(full)) == "200 tokens · 48 steps · 100.0 tok/s · m.gguf"
    several = {"tokens": 10, "steps": 96, "canvases": 2, "elapsed_s": 2.5, "tokens_per_s": 4.0}
    assert meta_line(_answer(several)).startswith("10 tokens (2 canvases of 256) · 96 steps · 2.5 s")
    # older rows without canvas statistics: no rate for a short answer, and nothing invented
    assert meta_line(_answer({"tokens": 3, "steps": 2, "tokens_per_s": 40.0}, None)) == "3 tokens · 2 steps · m.gguf"
    assert meta_line(_answer({"tokens": 41, "steps": 8, "tokens_per_s": 52.3}, None)) == \
        "41 tokens · 8 steps · 52.3 tok/s · m.gguf"


async def test_a_real_answer_speed_line_follows_the_rule(home, llada_gguf):
    from dgchat.app.widgets.message import MIN_RATE_FILL, MIN_RATE_TOKENS

    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        screen = app.chat_screen
        await type_text(pilot, "hi")
        await pilot.press("enter")
        await wait_idle(pilot)
        answer = app.store.messages(screen.chat.id)[-1]
        stats = answer.meta["stats"]
        line = str(screen.view_for(answer.id).query_one(".message--meta").render())
        positions = stats["canvases"] * 32
        if stats["tokens"] >= MIN_RATE_TOKENS and stats["tokens"] >= MIN_RATE_FILL * positions:
            assert f"{stats['tokens_per_s']:.1f} tok/s" in line
        else:
            assert "tok/s" not in line
            assert line.startswith(f"{stats['tokens']} tokens (canvas 32) · 8 steps · {stats['elapsed_s']:.1f} s")


# -- reopening the last chat ------------------------------------------------------------------------

async def test_relaunch_opens_the_last_chat_unless_told_otherwise(home, llada_gguf):
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        await type_text(pilot, "remember me")
        await pilot.press("enter")
        await wait_idle(pilot)
        chat_id = app.chat_screen.chat.id
        count = str(_tokens_label(app.chat_screen).render())
    with Store(home / "data" / "chats.db") as store:
        other = store.create_chat("Other")
        store.add_message(other.id, "user", "elsewhere")

    again = make_app(llada_gguf)
    async with again.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        screen = again.chat_screen
        assert screen.chat is not None and screen.chat.id == chat_id
        assert [v.message.content for v in screen.query(".message")][0] == "remember me"
        assert again.focused is screen.query_one("#prompt")
        await wait_for(pilot, lambda: str(_tokens_label(screen).render()) == count, what="the same count")

    chosen = make_app(llada_gguf, chat=other.id)  # --chat wins
    async with chosen.run_test(size=SIZE) as pilot:
        assert chosen.chat_screen.chat.id == other.id

    # the last chat is now `other` (opening one makes it the last); once deleted, a new chat opens
    with Store(home / "data" / "chats.db") as store:
        assert store.get_setting("last_chat") == other.id
        store.delete_chat(other.id)
    fresh = make_app(llada_gguf)
    async with fresh.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert fresh.chat_screen.chat is None
        assert fresh.chat_screen.query(".conversation--hint")


# -- the view stays at the latest message ----------------------------------------------------------

def _long_chat(home: Path) -> int:
    """A saved chat taller than the terminal, as the app leaves it: answers with their statistics
    line, in Markdown (both laid out after the views are mounted)."""
    meta = {"model": "tiny-llada.gguf", "stop_reason": "max_tokens", "params": {"gen_length": 32},
            "stats": {"tokens": 256, "steps": 24, "canvases": 8, "elapsed_s": 0.8, "tokens_per_s": 315.7}}
    with Store(home / "data" / "chats.db") as store:
        chat = store.create_chat("long")
        for i in range(5):
            store.add_message(chat.id, "user", f"Question {i}: what news of the king?")
            answer = store.begin_answer(chat.id, {"model": "tiny-llada.gguf"})
            store.finish_answer(answer.id, "Ay, come,,,,", "done", meta)
        store.set_setting("last_chat", chat.id)
    return chat.id


def _at_end(conversation) -> bool:
    return conversation.max_scroll_y > 0 and conversation.scroll_y >= conversation.max_scroll_y


async def _settle(pilot) -> None:
    for _ in range(5):  # Markdown lays out over a few refreshes
        await pilot.pause(0.05)


async def test_a_reopened_chat_and_a_resize_keep_the_latest_message_in_view(home, llada_gguf):
    chat_id = _long_chat(home)
    app = make_app(llada_gguf)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.chat_screen
        assert screen.chat is not None and screen.chat.id == chat_id
        conversation = screen.query_one("#conversation")
        await _settle(pilot)
        assert _at_end(conversation), (conversation.scroll_y, conversation.max_scroll_y)
        last = list(screen.query(".message"))[-1]
        assert conversation.region.y <= last.region.y and last.region.bottom <= conversation.region.bottom
        for size in ((140, 40), (60, 20), (80, 24)):
            await pilot.resize_terminal(*size)
            await _settle(pilot)
            assert _at_end(conversation), (size, conversation.scroll_y, conversation.max_scroll_y)
        # scrolled up by the user: a resize leaves the view where the user put it
        conversation.scroll_home(animate=False)
        await _settle(pilot)
        await pilot.resize_terminal(100, 30)
        await _settle(pilot)
        assert conversation.scroll_y < conversation.max_scroll_y / 2
        # back at the end (the user scrolled down to it): it follows again
        conversation.scroll_end(animate=False)
        await _settle(pilot)
        await pilot.resize_terminal(70, 22)
        await _settle(pilot)
        assert _at_end(conversation)

        # another chat opened from the sidebar shows its end too
        other = app.store.create_chat("other")
        for i in range(5):
            app.store.add_message(other.id, "user", f"more {i}")
            answer = app.store.begin_answer(other.id, {"model": "tiny-llada.gguf"})
            app.store.finish_answer(answer.id, "\n\n".join(f"Paragraph {j} of answer {i}." for j in range(3)), "done",
                                    {"model": "tiny-llada.gguf"})
        screen.open_chat(other.id)
        await _settle(pilot)
        assert _at_end(conversation)


# -- the conversation's token count -----------------------------------------------------------------

async def test_token_count_follows_answers_versions_and_the_model(home, llada_gguf, small_ctx_gguf):
    from dgchat.app.settings_modal import ChatSettings

    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        screen = app.chat_screen
        label = _tokens_label(screen)
        assert not label.has_class("-shown")  # a new chat has no conversation yet
        context = app.session.engine.n_ctx_max

        def expected_after_answer() -> int:
            stats = app.store.messages(screen.chat.id)[-1].meta["stats"]
            return stats["prompt_tokens"] + stats["tokens"]

        await type_text(pilot, "count me")
        await pilot.press("enter")
        await wait_idle(pilot)
        first = expected_after_answer()
        assert first > 0
        assert str(label.render()) == f"{first:,} / {context:,} tokens"
        assert label.has_class("-shown") and not label.has_class("-near") and not label.has_class("-full")

        await type_text(pilot, "and more words to count, please")
        await pilot.press("enter")
        await wait_idle(pilot)
        second = expected_after_answer()
        assert second > first
        assert str(label.render()) == f"{second:,} / {context:,} tokens"

        # a prompt edited back to an earlier point: counted again, for that shorter conversation
        last_prompt = app.store.messages(screen.chat.id)[-2]
        app.store.add_message(screen.chat.id, "user", "short", version_of=last_prompt.id)
        screen.transcript.render()
        screen.recount()
        engine = app.session.engine
        shorter = int(engine.chat_prompt(screen.answers.history_for_model()).size)
        await wait_for(pilot, lambda: str(label.render()) == f"{shorter:,} / {context:,} tokens", what="the recount")

        # another model: its tokenizer and context; 64 tokens cannot take the next 32-token canvas
        screen.apply_settings(ChatSettings(str(small_ctx_gguf), "", {}), quiet=True)
        await wait_for(pilot, lambda: app.session.path == Path(small_ctx_gguf) and app.session.loading_path is None,
                       what="the small model")
        await wait_for(pilot, lambda: str(label.render()).endswith("/ 64 tokens"), what="the count for the new model")
        small = app.session.engine
        counted = int(small.chat_prompt(screen.answers.history_for_model()).size)
        assert str(label.render()) == f"{counted:,} / 64 tokens"
        assert label.has_class("-full") and not label.has_class("-near")


def test_context_levels():
    from dgchat.app.widgets.status_bar import context_level, context_text

    assert context_text(1234, 4096) == "1,234 / 4,096 tokens"
    assert context_level(1000, 256, 4096) == "ok"
    assert context_level(3100, 256, 4096) == "near"  # 3,356 of 4,096 is over 80%
    assert context_level(3900, 256, 4096) == "full"  # the next canvas does not fit
    assert context_level(10, 10, 0) == "ok"


async def test_a_prompt_sent_while_the_count_runs_is_answered_after_it(home, llada_gguf):
    """The count borrows the engine for milliseconds; a prompt sent meanwhile waits for it quietly
    (no "busy" notice) and is answered as soon as the count is done."""
    import threading

    with Store(home / "data" / "chats.db") as store:
        chat = store.create_chat("Counted")
        store.add_message(chat.id, "user", "an old question")
        store.add_message(chat.id, "assistant", "an old answer")  # no count of its own: counted by a job
    app = make_app(llada_gguf, chat=chat.id)
    notices: list[str] = []
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        screen = app.chat_screen
        label = _tokens_label(screen)
        await wait_for(pilot, lambda: label.has_class("-shown"), what="the first count")
        assert screen.status_line.count_job is None and not app.session.busy
        screen.notify = lambda message, **kw: notices.append(str(message))  # type: ignore[method-assign]

        class SlowCount:
            """The real engine; its next chat_prompt (the count's) waits until released."""

            def __init__(self, engine):
                self._engine = engine
                self.counting = threading.Event()
                self.release = threading.Event()
                self.gated = True

            def __getattr__(self, name):
                return getattr(self._engine, name)

            def chat_prompt(self, messages, **kwargs):
                if self.gated:
                    self.gated = False
                    self.counting.set()
                    self.release.wait(15)
                return self._engine.chat_prompt(messages, **kwargs)

        app.session.engine = slow = SlowCount(app.session.engine)
        screen.recount(fresh=True)
        await wait_for(pilot, slow.counting.is_set, what="the count to start")
        await type_text(pilot, "a new question")
        await pilot.press("enter")
        await pilot.pause(0.2)
        assert screen.answers.pending and screen.generation is None and not notices
        slow.release.set()
        await wait_for(pilot, lambda: screen.generation is not None or len(app.store.messages(chat.id)) == 4,
                       what="the answer to start")
        await wait_idle(pilot)
        conversation = app.store.messages(chat.id)
        assert [m.role for m in conversation] == ["user", "assistant", "user", "assistant"]
        assert conversation[-1].status == "done" and not notices
        stats = conversation[-1].meta["stats"]
        assert str(label.render()).startswith(f"{stats['prompt_tokens'] + stats['tokens']:,} / ")
