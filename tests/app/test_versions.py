"""Answer versions in the chat app (Pilot, the tiny llada fixture, real SQLite): regenerating keeps
the earlier answers, [ / ] flip between them, and the version shown is what the model reads next."""

from __future__ import annotations

from fixtures.app_harness import SIZE, GatedEngine, make_app, type_text, wait_for, wait_idle, wait_model

from dgchat.app.export import chat_markdown


def _header(view) -> str:
    return str(view.query_one(".message--header").render())


async def test_regenerate_twice_keeps_three_versions_and_the_shown_one_counts(home, llada_gguf):
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        screen = app.chat_screen
        store = app.store
        await type_text(pilot, "tell me")
        await pilot.press("enter")
        await wait_idle(pilot)
        first_answer = store.messages(screen.chat.id)[-1]
        for count in (2, 3):
            await pilot.press("ctrl+r")
            await wait_for(pilot, lambda n=count: len(store.versions(first_answer.id)) == n, what=f"version {count}")
            await wait_idle(pilot)
        chat_id = screen.chat.id
        prompt, answer = store.messages(chat_id)
        versions = store.versions(answer.id)
        assert len(versions) == 3 and answer.id == versions[-1].id and (answer.version, answer.versions) == (3, 3)
        assert all(v.status == "done" and v.parent_id == prompt.id for v in versions)
        # one view per turn, the newest version shown
        assert [v.message.id for v in screen.query(".message")] == [prompt.id, answer.id]
        assert "‹ 3/3 ›" in _header(screen.view_for(answer.id))

        # temperature 0 gives the same text three times: label the versions to tell them apart
        for number, version in enumerate(versions, 1):
            store.update_message(version.id, f"answer number {number}")

        screen.view_for(answer.id).focus()
        expected = [(1, "left_square_bracket"), (0, "left"), (0, "left_square_bracket"), (1, "right_square_bracket"),
                    (2, "right"), (2, "right"), (1, "left")]
        for index, key in expected:
            await pilot.press(key)
            await pilot.pause()
            shown = store.messages(chat_id)[-1]
            assert shown.id == versions[index].id, key
            view = screen.view_for(shown.id)
            assert view is not None and app.focused is view
            assert view.message.content == f"answer number {index + 1}"
            assert f"‹ {index + 1}/3 ›" in _header(view)
            assert [v.message.id for v in screen.query(".message")] == [prompt.id, shown.id]
        await pilot.press("left")
        await pilot.pause()
        assert store.messages(chat_id)[-1].id == versions[0].id

        # the next prompt continues the version shown: the model reads it, the prompt follows it
        app.session.engine = gated = GatedEngine(app.session.engine, hold_at=1)
        await type_text(pilot, "and then?")
        await pilot.press("enter")
        await wait_for(pilot, gated.holding.is_set, what="the next answer")
        assert screen.generation.messages == [
            {"role": "user", "content": "tell me"},
            {"role": "assistant", "content": "answer number 1"},
            {"role": "user", "content": "and then?"},
        ]
        gated.release.set()
        await wait_idle(pilot)
        conversation = store.messages(chat_id)
        assert [m.id for m in conversation[:2]] == [prompt.id, versions[0].id]
        assert conversation[2].parent_id == versions[0].id and conversation[3].role == "assistant"
        # export writes the conversation shown
        text = chat_markdown(store.get_chat(chat_id), conversation)
        assert "answer number 1" in text and "answer number 2" not in text and "answer number 3" not in text
        assert "## Assistant (version 1 of 3)" in text

        # flipping the answer of the first turn back to version 3: its branch has no follow-up
        screen.view_for(versions[0].id).focus()
        await pilot.press("right", "right")
        await pilot.pause()
        assert [m.id for m in store.messages(chat_id)] == [prompt.id, versions[2].id]
        assert [v.message.id for v in screen.query(".message")] == [prompt.id, versions[2].id]
        # and back: the follow-up of version 1 is still there
        await pilot.press("left", "left")
        await pilot.pause()
        assert [m.id for m in store.messages(chat_id)] == [m.id for m in conversation]
        assert len(screen.query(".message")) == 4


async def test_a_regenerate_that_keeps_nothing_shows_the_earlier_answer_again(home, llada_gguf):
    """An answer that fails before deciding any text is not kept: the earlier version is shown."""
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        screen = app.chat_screen
        await type_text(pilot, "hello")
        await pilot.press("enter")
        await wait_idle(pilot)
        first = app.store.messages(screen.chat.id)[-1]

        class Failing:
            def __init__(self, engine):
                self._engine = engine

            def __getattr__(self, name):
                return getattr(self._engine, name)

            def generate(self, *args, **kwargs):
                raise RuntimeError("the model fell over")

        app.session.engine = Failing(app.session.engine)
        await pilot.press("ctrl+r")
        await wait_idle(pilot)
        from dgchat.app.error_modal import ErrorModal

        assert isinstance(app.screen, ErrorModal)
        await pilot.press("escape")
        await pilot.pause()
        conversation = app.store.messages(screen.chat.id)
        assert conversation[-1].id == first.id and (conversation[-1].version, conversation[-1].versions) == (1, 1)
        assert [v.message.id for v in screen.query(".message")] == [m.id for m in conversation]


async def test_search_hit_in_an_older_version_opens_that_version(home, llada_gguf):
    from dgchat.app.store import Store

    with Store(home / "data" / "chats.db") as store:
        chat = store.create_chat("Gate")
        store.add_message(chat.id, "user", "why is the gate shut?")
        old = store.add_message(chat.id, "assistant", "Because of the dragons.")
        new = store.begin_answer(chat.id, version_of=old.id)
        store.finish_answer(new.id, "Because the king sleeps.", "done")
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        screen = app.chat_screen
        await pilot.press("ctrl+f")
        await pilot.pause()
        modal = app.screen
        await pilot.press(*"dragons")
        await pilot.pause()
        assert [h.message_id for h in modal.hits] == [old.id]
        await pilot.press("down", "enter")
        await pilot.pause(0.2)
        assert screen.chat.id == chat.id
        assert app.store.messages(chat.id)[-1].id == old.id
        view = screen.view_for(old.id)
        assert app.focused is view and "‹ 1/2 ›" in _header(view)


async def test_the_edit_dialog_names_the_keys_that_flip_back(home, llada_gguf):
    """The help line's `[` and `]` are text, not Rich markup (which swallowed them: "Re-running
    keeps the earlier version:  on the prompt flip back")."""
    from dgchat.app.edit_modal import EditModal

    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        await type_text(pilot, "tell me")
        await pilot.press("enter")
        await wait_idle(pilot)
        await pilot.press("ctrl+g")
        await wait_for(pilot, lambda: isinstance(app.screen, EditModal), what="the edit dialog")
        help_text = str(app.screen.query_one(".dialog--help").render())
        assert help_text == "Re-running keeps the earlier version: [ and ] on the prompt flip back."
