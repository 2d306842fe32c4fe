"""Small terminals: the chat, the NPC workshop, the Models screen and Settings at 140x40, 80x24 and
60x20 (snapshots), and Pilot checks that do not depend on pixels: the NPC form's controls lie on
screen at 80x24 and 60x20, the chat's sidebar hides on a narrow terminal and comes back on a wide
one unless the user chose otherwise with Ctrl+B, and the footer keeps the essential keys visible.

Deterministic like tests/app/test_snapshots.py: HOME and DGCHAT_HOME under tmp_path, fixed hardware
(tests/fixtures/wizard_harness.py), the fixture model as the bundled one, stored messages with fixed
statistics. Update the baselines with
`pytest tests/app/test_layout_snapshots.py --snapshot-update` and review the SVGs.
"""

from __future__ import annotations

import pytest
from dgchat.app.store import Store
from fixtures.app_harness import FAST_SAMPLER, make_app, wait_for, wait_model
from fixtures.wizard_harness import first_run_home

SIZES = [(140, 40), (80, 24), (60, 20)]
SIZE_IDS = [f"{w}x{h}" for w, h in SIZES]
GUARD = '''id = "gate_guard"
name = "Captain Brann"
role = "the night captain of the city gate"
voice = "Gruff, clipped sentences."
examples = ["Move along, traveller."]
'''
# the controls of the NPC line form, all of which must be on screen and usable
NPC_FORM = ("#npc-context", "#npc-situation", "#npc-template", "#npc-length", "#npc-count", "#npc-seed",
            "#npc-temperature", "#npc-generate")


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A set-up home (config written: no wizard), fixed hardware, the fixture model as the bundled
    one (the default model), two chats and one character card."""
    home = first_run_home(tmp_path, monkeypatch)
    (home / "config" / "config.toml").write_text(FAST_SAMPLER, encoding="utf-8")
    cards = home / "data" / "npc" / "cards"
    cards.mkdir(parents=True, exist_ok=True)
    (cards / "guard.toml").write_text(GUARD, encoding="utf-8")
    return home


def _conversation(home) -> int:
    with Store(home / "data" / "chats.db") as store:
        other = store.create_chat("Market day")
        store.add_message(other.id, "user", "What does the baker sell?")
        chat = store.create_chat()
        store.add_message(chat.id, "user", "Why is the gate shut after dark?")
        answer = store.begin_answer(chat.id, {"model": "dgchat-tiny-plays.gguf"})
        store.finish_answer(answer.id, "The gate stays **closed** after dark: the king sleeps and the guards "
                            "are weary.", "done",
                            {"stop_reason": "eos", "stats": {"tokens": 21, "steps": 8, "tokens_per_s": 52.3}})
        return chat.id


def _ready(extra=None):
    async def run_before(pilot):
        await wait_model(pilot)
        if extra is not None:
            await extra(pilot)
        await pilot.pause(0.1)
    return run_before


async def _open_npc(pilot):
    from dgchat.app.npc_screen import NpcScreen

    await pilot.press("f3")
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, NpcScreen), what="the workshop")
    await pilot.pause()
    return pilot.app.screen


async def _open_models(pilot):
    from dgchat.app.models_screen import ModelsScreen

    await pilot.press("f4")
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, ModelsScreen) and bool(pilot.app.screen.rows),
                   what="the Models screen")
    await pilot.pause()


async def _open_settings(pilot):
    from dgchat.app.settings_modal import SettingsModal

    await pilot.press("ctrl+o")
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, SettingsModal), what="the settings")
    await pilot.pause()


# -- snapshots: 4 screens x 3 sizes --------------------------------------------------------------

@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
def test_chat(snap_compare, home, size):
    chat_id = _conversation(home)
    assert snap_compare(make_app(None, chat=chat_id), terminal_size=size, run_before=_ready())


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
def test_npc_workshop(snap_compare, home, size):
    assert snap_compare(make_app(None), terminal_size=size, run_before=_ready(_open_npc))


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
def test_models_screen(snap_compare, home, size):
    assert snap_compare(make_app(None), terminal_size=size, run_before=_ready(_open_models))


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
def test_settings(snap_compare, home, size):
    chat_id = _conversation(home)
    assert snap_compare(make_app(None, chat=chat_id), terminal_size=size, run_before=_ready(_open_settings))


# -- the same screens, checked without pixels ----------------------------------------------------

def _on_screen(app, widget) -> bool:
    region = widget.region
    return region.width > 0 and region.height > 0 and app.screen.region.contains_region(region)


def _visible_footer_keys(screen) -> set[str]:
    """The keys whose footer entry is fully shown (on screen, left of the docked Ctrl+P entry)."""
    from textual.widgets._footer import FooterKey

    keys = list(screen.query(FooterKey))
    palette = [k for k in keys if k.has_class("-command-palette")]
    limit = palette[0].region.x if palette else screen.region.right
    return {k.key for k in keys if _on_screen(screen.app, k) and k.region.right <= limit}


@pytest.mark.parametrize("size", [(80, 24), (60, 20)], ids=["80x24", "60x20"])
async def test_npc_form_controls_are_on_screen(home, size):
    app = make_app(None)
    async with app.run_test(size=size) as pilot:
        await wait_model(pilot)
        screen = await _open_npc(pilot)
        await pilot.pause(0.1)
        for selector in NPC_FORM:
            widget = screen.query_one(selector)
            assert _on_screen(app, widget), f"{selector} at {size}: {widget.region} not in {app.screen.region}"
        # the controls of a row do not overlap (a squeezed row would stack them on one cell)
        regions = [screen.query_one(s).region for s in NPC_FORM]
        for i, a in enumerate(regions):
            for b in regions[i + 1:]:
                assert not a.overlaps(b), (a, b)
        assert {"ctrl+g", "ctrl+s", "f1"} <= _visible_footer_keys(screen)
        side = screen.query_one("#npc-side")
        if size[0] >= 80:
            assert side.display and _on_screen(app, screen.query_one("#npc-cards"))
        else:
            # the character list gives way to the form; keys go to the form, Ctrl+B brings the list back
            assert not side.display
            assert screen.focused is not None and side not in screen.focused.ancestors
            await pilot.press("ctrl+b")
            await pilot.pause()
            assert side.display and _on_screen(app, screen.query_one("#npc-cards"))
            assert screen.focused is screen.query_one("#npc-cards")


async def test_npc_generate_button_works_at_60x20(home):
    app = make_app(None)
    async with app.run_test(size=(60, 20)) as pilot:
        await wait_model(pilot)
        screen = await _open_npc(pilot)
        screen.query_one("#npc-count").value = "2"
        await pilot.click("#npc-generate")
        await wait_for(pilot, lambda: screen.job is None and len(screen.batches) == 1, 30, "the variants")
        assert len(screen.batches[0].variants) == 2


async def test_card_editor_buttons_are_on_screen_at_80x24_and_60x20(home):
    from dgchat.app.npc_card_modal import CardModal

    app = make_app(None)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_model(pilot)
        await _open_npc(pilot)
        await pilot.press("ctrl+o")
        await wait_for(pilot, lambda: isinstance(app.screen, CardModal))
        for size in [(80, 24), (60, 20)]:
            await pilot.resize_terminal(*size)
            await pilot.pause(0.1)
            modal = app.screen
            for selector in ("#card-name", "#save", "#cancel", ".card--hint"):
                widget = modal.query_one(selector)
                assert _on_screen(app, widget), f"{selector} at {size}: {widget.region}"
            # the last field scrolls into view when it gets the focus
            modal.query_one("#card-banned").focus()
            await pilot.pause(0.1)
            assert _on_screen(app, modal.query_one("#card-banned"))


async def test_chat_sidebar_hides_when_narrow_and_returns_when_wide(home):
    chat_id = _conversation(home)
    app = make_app(None, chat=chat_id)
    async with app.run_test(size=(60, 20)) as pilot:
        await wait_model(pilot)
        chat = app.chat_screen
        sidebar = chat.query_one("#sidebar")
        prompt = chat.query_one("#prompt")
        assert not sidebar.display and sidebar.region.width == 0
        assert prompt.region.width >= 50 and _on_screen(app, prompt)
        # the footer drops New chat and Search (F1 and the palette keep them) so that these fit
        assert {"enter", "ctrl+r", "ctrl+o", "f1"} <= _visible_footer_keys(chat)
        await pilot.press("ctrl+f")  # dropped from the footer, still bound
        await pilot.pause()
        from dgchat.app.search_modal import SearchModal

        assert isinstance(app.screen, SearchModal)
        await pilot.press("escape")
        await pilot.pause()

        await pilot.resize_terminal(140, 40)
        await pilot.pause(0.1)
        assert sidebar.display and _on_screen(app, sidebar)

        # hidden while it has the keys: they go to the prompt, not to a list nobody sees
        chat.query_one("#chat-list").focus()
        await pilot.pause()
        await pilot.resize_terminal(60, 20)
        await pilot.pause(0.1)
        assert not sidebar.display and chat.focused is prompt

        await pilot.resize_terminal(80, 24)
        await pilot.pause(0.1)
        assert sidebar.display and _on_screen(app, sidebar)
        # the classic terminal keeps the sidebar and a conversation wide enough to read
        assert prompt.region.width >= 55
        assert {"enter", "ctrl+o", "f1"} <= _visible_footer_keys(chat)


async def test_ctrl_b_is_an_explicit_choice_that_holds_at_any_width(home):
    chat_id = _conversation(home)
    app = make_app(None, chat=chat_id)
    async with app.run_test(size=(60, 20)) as pilot:
        await wait_model(pilot)
        chat = app.chat_screen
        sidebar = chat.query_one("#sidebar")
        assert not sidebar.display
        await pilot.press("ctrl+b")  # shown on a narrow terminal because the user asked
        await pilot.pause()
        assert sidebar.display and _on_screen(app, sidebar)
        await pilot.resize_terminal(140, 40)
        await pilot.pause(0.1)
        await pilot.resize_terminal(60, 20)
        await pilot.pause(0.1)
        assert sidebar.display

        await pilot.resize_terminal(140, 40)
        await pilot.pause(0.1)
        await pilot.press("ctrl+b")  # hidden on a wide terminal: it stays hidden
        await pilot.pause()
        assert not sidebar.display
        await pilot.resize_terminal(60, 20)
        await pilot.pause(0.1)
        await pilot.resize_terminal(140, 40)
        await pilot.pause(0.1)
        assert not sidebar.display
        assert chat.query_one("#prompt").region.width >= 130


async def test_a_sidebar_shown_on_a_narrow_terminal_lies_over_the_chat(home):
    """Ctrl+B's sidebar at 60 columns took 28 of them from the conversation (a 32-column chat); below
    NARROW_BELOW it lies over the chat instead, narrower, with the keys, and the chat keeps its width
    underneath. Opening a chat from it puts it away again."""
    chat_id = _conversation(home)
    app = make_app(None, chat=chat_id)
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_model(pilot)
        chat = app.chat_screen
        sidebar, prompt = chat.query_one("#sidebar"), chat.query_one("#prompt")
        conversation = chat.query_one("#conversation")
        await pilot.press("ctrl+b", "ctrl+b")  # hidden, then shown again: the user's choice
        await pilot.pause()
        await pilot.resize_terminal(60, 20)
        await pilot.pause(0.1)
        assert sidebar.display and _on_screen(app, sidebar)  # the choice holds ...
        assert sidebar.region.width <= 24
        assert prompt.region.width >= 55 and conversation.region.width >= 58  # ... and the chat keeps its width
        assert prompt.region.x == 0

        # shown at that width: over the chat, with the keys; opening a chat puts it away
        await pilot.press("ctrl+b")
        await pilot.pause()
        assert not sidebar.display
        await pilot.press("ctrl+b")
        await pilot.pause()
        assert sidebar.display and chat.focused is chat.query_one("#chat-list")
        assert prompt.region.width >= 55
        await pilot.press("down", "enter")  # the other chat
        await pilot.pause(0.1)
        assert chat.chat is not None and chat.chat.title == "Market day"
        assert not sidebar.display and chat.focused is prompt

        # on a wide terminal the sidebar is beside the chat, as before
        await pilot.resize_terminal(140, 40)
        await pilot.pause(0.1)
        assert sidebar.display and prompt.region.x >= sidebar.region.right


async def test_screens_below_catch_up_with_a_resize(home):
    """A resize while a modal or a tool screen is on top reaches the chat when it comes back."""
    from dgchat.app.npc_screen import NpcScreen
    from dgchat.app.settings_modal import SettingsModal

    chat_id = _conversation(home)
    app = make_app(None, chat=chat_id)
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_model(pilot)
        chat = app.chat_screen
        sidebar = chat.query_one("#sidebar")
        await _open_settings(pilot)
        await pilot.resize_terminal(60, 20)
        await pilot.pause(0.1)
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, SettingsModal))
        await pilot.pause(0.1)
        assert not sidebar.display and chat.query_one("#prompt").region.width >= 50

        npc = await _open_npc(pilot)
        assert not npc.query_one("#npc-side").display
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.screen is chat)
        await pilot.resize_terminal(140, 40)
        await pilot.pause(0.1)
        await pilot.press("f3")
        await wait_for(pilot, lambda: isinstance(app.screen, NpcScreen))
        await pilot.pause(0.1)
        assert npc.query_one("#npc-side").display and _on_screen(app, npc.query_one("#npc-cards"))
        for selector in NPC_FORM:
            assert _on_screen(app, npc.query_one(selector)), selector


async def test_drafting_keys_and_status_fit_60x20(home):
    from dgchat.app.drafting_screen import DraftingScreen

    app = make_app(None)
    async with app.run_test(size=(60, 20)) as pilot:
        await wait_model(pilot)
        await pilot.press("f5")
        await wait_for(pilot, lambda: isinstance(app.screen, DraftingScreen))
        screen = app.screen
        await pilot.pause(0.1)
        assert {"ctrl+r", "ctrl+g", "escape", "f1"} <= _visible_footer_keys(screen)
        editor = screen.editor
        assert _on_screen(app, editor) and editor.region.width == 60
        editor.insert("The guard closed the gate after dark.")
        await pilot.press("ctrl+g")
        await wait_for(pilot, lambda: screen.proposal is not None and screen.proposal.text is not None
                       and not screen.engine_busy, 30, "the proposal")
        await pilot.pause(0.1)
        assert {"enter", "escape", "r"} <= _visible_footer_keys(screen)
        # the status line names the keys to decide within the width that is shown
        status = str(screen.query_one("#draft-status #status-text").render())
        shown = status[: screen.query_one("#draft-status #status-text").region.width]
        assert "Enter accept" in shown and "Esc reject" in shown
