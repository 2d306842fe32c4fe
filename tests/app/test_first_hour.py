"""What a person meets in the first hour with the chat (issue 43), Pilot on the bundled model and the
tiny fixtures, real SQLite; one pty run of the real app for text sent in one burst.

Regenerate gives another answer (a seed drawn per answer unless one was chosen, stored and shown on
the answer, and enough to get the same text again); nothing on the chat screen is cut mid-word (the
footer's keys, the answer's line, the status line, the F1 list, the model info dialog's button);
focus stays on a regenerated answer and `r` is offered only where it works; search names the
versions it found; flipping versions never shows an empty conversation; the export dialog and its
toast name whole paths.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from fixtures.app_harness import SIZE, make_app, type_text, wait_for, wait_idle, wait_model
from fixtures.app_pty import Terminal, app_env, wait_until
from textual.geometry import Region
from textual.widgets import Input, OptionList
from textual.widgets._footer import FooterKey

from dgchat import assets
from dgchat.app.error_modal import ErrorModal
from dgchat.app.help_modal import HelpModal
from dgchat.app.search_modal import SearchModal
from dgchat.app.store import Store
from dgchat.app.widgets.fitting_footer import FittingFooter
from dgchat.app.widgets.message import MessageView
from dgchat.model_backend.events import FinalEvent
from dgchat.model_backend.params import DiffusionParams

QUESTION = "What says Falstaff?"


def _bundled() -> Path:
    path = assets.bundled_model_path()
    assert path is not None
    return path


def _screen_lines(app) -> list[str]:
    strips = app.screen._compositor.render_strips()
    return [strip.text for strip in strips]


def _region_text(app, region: Region) -> str:
    lines = _screen_lines(app)
    return "\n".join(lines[y][region.x:region.right] for y in range(region.y, region.bottom))


def _params_of(meta: dict) -> DiffusionParams:
    values = {k: tuple(tuple(x) if isinstance(x, list) else x for x in v) if isinstance(v, list) else v
              for k, v in meta["params"].items()}
    return DiffusionParams(**values)


async def _ask(pilot, text: str = QUESTION) -> None:
    await type_text(pilot, text)
    await pilot.press("enter")
    await wait_idle(pilot)


# -- 1: regenerate ---------------------------------------------------------------------------------

async def test_regenerating_three_times_gives_three_answers_each_with_its_seed(home):
    app = make_app(_bundled())
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        screen, store = app.chat_screen, app.store
        await _ask(pilot)
        first = store.messages(screen.chat.id)[-1]
        for count in (2, 3, 4):
            await pilot.press("ctrl+r")
            await wait_for(pilot, lambda n=count: len(store.versions(first.id)) == n, what=f"version {count}")
            await wait_idle(pilot)
        versions = store.versions(first.id)
        texts = [v.content for v in versions]
        seeds = [v.meta["seed"] for v in versions]
        assert len(set(texts)) == 4, texts  # today's code: four times the same answer (seed 0)
        assert len(set(seeds)) == 4 and all(v.meta["params"]["seed"] == v.meta["seed"] for v in versions)
        shown = screen.view_for(versions[-1].id)
        assert f"seed {seeds[-1]}" in str(shown.query_one(".message--meta").render())

        # the stored seed and settings give the same text again
        engine = app.session.engine
        prompt = engine.chat_prompt([{"role": "user", "content": QUESTION}])
        for version in versions:
            final = [e for e in engine.generate(prompt, _params_of(version.meta)) if isinstance(e, FinalEvent)][-1]
            assert final.text == version.content


async def test_a_seed_the_chat_chose_is_kept(home):
    with Store(home / "data" / "chats.db") as store:
        chat = store.create_chat("fixed", params={"seed": 7})
    app = make_app(_bundled(), chat=chat.id)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        await _ask(pilot)
        first = app.store.messages(chat.id)[-1]
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: len(app.store.versions(first.id)) == 2, what="version 2")
        await wait_idle(pilot)
        a, b = app.store.versions(first.id)
        assert a.meta["seed"] == b.meta["seed"] == 7 and a.content == b.content


async def test_regenerating_a_greedy_answer_says_it_will_repeat(home, llada_gguf):
    app = make_app(llada_gguf)  # temperature 0, confidence order: the seed changes nothing
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        await _ask(pilot, "tell me")
        answer = app.store.messages(app.chat_screen.chat.id)[-1]
        assert "seed" not in answer.meta  # not shown where it does not matter
        await pilot.press("ctrl+r")
        await wait_idle(pilot)
        assert any("temperature 0" in n.message for n in app._notifications)


# -- 7: focus after regenerate, `r` only where it works ---------------------------------------------

async def test_r_on_the_answer_keeps_the_focus_on_its_new_version(home):
    app = make_app(_bundled())
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        screen = app.chat_screen
        await _ask(pilot)
        answer = app.store.messages(screen.chat.id)[-1]
        screen.view_for(answer.id).focus()
        await pilot.pause()
        await pilot.press("r")
        await wait_for(pilot, lambda: len(app.store.versions(answer.id)) == 2, what="version 2")
        await wait_idle(pilot)
        await pilot.pause(0.1)
        newest = app.store.messages(screen.chat.id)[-1]
        assert newest.id != answer.id and app.focused is screen.view_for(newest.id)

        # a second turn: the first answer is no longer the last, and its `r` is not offered
        await _ask(pilot, "And then?")
        screen.view_for(newest.id).focus()
        await pilot.pause()
        active = screen.active_bindings
        assert "r" not in active or active["r"].binding.action != "regenerate", active.get("r")
        last = app.store.messages(screen.chat.id)[-1]
        screen.view_for(last.id).focus()
        await pilot.pause()
        assert screen.active_bindings["r"].binding.action == "regenerate"


# -- 3, 4: the footer, the answer's line and the status line are never cut mid-word ----------------

def _footer_keys_whole(app) -> list[str]:
    """The footer's shown keys, each checked to be drawn whole before the command-palette key."""
    footer = app.screen.query_one(FittingFooter)
    palette = [k for k in footer.query(FooterKey) if k.has_class("-command-palette")][0]
    line = _screen_lines(app)[footer.region.y]
    shown = []
    for key in footer.query(FooterKey):
        if key is palette or not key.display:
            continue
        assert key.region.right <= palette.region.x, (key.description, line)
        text = str(key.render()).strip()
        assert text in line, (text, line)
        shown.append(key.description)
    assert "Commands" in line and line.rstrip().endswith("Commands")
    return shown


@pytest.mark.parametrize("size", [(140, 40), (80, 24), (60, 20)])
async def test_the_footer_shows_whole_keys_while_generating_and_in_a_replay(home, size):
    from fixtures.app_harness import GatedEngine

    app = make_app(_bundled())
    async with app.run_test(size=size) as pilot:
        await wait_model(pilot)
        screen = app.chat_screen
        await _ask(pilot)
        assert "Keys" in _footer_keys_whole(app)
        app.session.engine = gated = GatedEngine(app.session.engine, hold_at=2)
        await pilot.press("ctrl+r")
        await wait_for(pilot, gated.holding.is_set, what="the answer to be generating")
        await pilot.pause(0.2)
        shown = _footer_keys_whole(app)
        assert "Keys" in shown and "Stop" in shown
        gated.release.set()
        await wait_idle(pilot)
        answer = app.store.messages(screen.chat.id)[-1]
        screen.view_for(answer.id).focus()
        await pilot.press("p")
        await pilot.pause(0.3)
        shown = _footer_keys_whole(app)
        assert "Close replay" in shown and "Keys" in shown


@pytest.mark.parametrize("size", [(80, 24), (60, 20)])
async def test_the_answers_line_wraps_instead_of_losing_the_model_name(home, size):
    app = make_app(_bundled())
    async with app.run_test(size=size) as pilot:
        await wait_model(pilot)
        await _ask(pilot)
        answer = app.store.messages(app.chat_screen.chat.id)[-1]
        line = app.chat_screen.view_for(answer.id).query_one(".message--meta")
        line.scroll_visible(animate=False)
        await pilot.pause()
        shown = " ".join(_region_text(app, line.region).split())
        assert "dgchat-tiny-plays" in shown and f"seed {answer.meta['seed']}" in shown, shown


async def test_the_status_line_keeps_the_temperature_when_the_count_appears(home):
    app = make_app(_bundled())
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_model(pilot)
        await _ask(pilot)
        await wait_for(pilot, lambda: "tokens" in str(app.chat_screen.query_one("#status-tokens").render()),
                       what="the token count")
        await pilot.pause(0.1)
        bar = app.chat_screen.query_one("#status")
        text = _region_text(app, bar.region)
        assert "T 0.8 → 0.4" in text and "…" not in text, text


# -- 2, 5: dialogs at the sizes where they were cut ----------------------------------------------

@pytest.mark.parametrize("size", [(140, 40), (60, 20)])
async def test_model_info_keeps_its_button_on_screen(home, llada_gguf, size):
    app = make_app(llada_gguf)
    async with app.run_test(size=size) as pilot:
        await wait_model(pilot)
        app.chat_screen.action_model_info()
        await wait_for(pilot, lambda: isinstance(app.screen, ErrorModal), what="the dialog")
        await pilot.pause(0.2)
        dialog = app.screen.query_one(".dialog")
        button = app.screen.query_one("#ok")
        assert dialog.region.contains_region(button.region), (dialog.region, button.region)
        assert "OK" in _region_text(app, button.region)
        await pilot.press("enter")
        await pilot.pause()
        assert not isinstance(app.screen, ErrorModal)


async def test_f1_on_a_small_terminal_shows_whole_descriptions(home, llada_gguf):
    app = make_app(llada_gguf)
    async with app.run_test(size=(60, 20)) as pilot:
        await wait_model(pilot)
        await pilot.press("f1")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpModal), what="F1")
        await pilot.pause(0.1)
        text = "\n".join(_screen_lines(app))
        assert "Quit" in text and "Commands" in text and "app.quit" not in text and "…" not in text, text


# -- 8: search names versions ---------------------------------------------------------------------

async def test_search_folds_versions_with_the_same_words_and_numbers_them(home, llada_gguf):
    with Store(home / "data" / "chats.db") as store:
        chat = store.create_chat("versions")
        store.add_message(chat.id, "user", "who?")
        first = store.add_message(chat.id, "assistant", "Sir John, said the host")
        for text in ("Sir John, said the host", "Sir John runs", "nobody here"):
            store.add_message(chat.id, "assistant", text, version_of=first.id)
        hits = store.search("Sir John")
    assert sorted((h.matched_versions, h.versions) for h in hits) == [((1, 2), 4), ((3,), 4)]
    assert sorted(h.versions_text() for h in hits) == ["version 3/4", "versions 1, 2 of 4"]
    app = make_app(llada_gguf, chat=chat.id)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        await pilot.press("ctrl+f")
        await wait_for(pilot, lambda: isinstance(app.screen, SearchModal), what="the search")
        app.screen.query_one(Input).value = "Sir John"
        await pilot.pause(0.2)
        results = app.screen.query_one(OptionList)
        rows = [str(results.get_option_at_index(i).prompt) for i in range(results.option_count)]
        assert len(rows) == 2 and any("versions 1, 2 of 4" in r for r in rows) and any("version 3/4" in r for r in rows)
        assert "2 matches" in str(app.screen.query_one("#search-count").render())


# -- 9: flipping versions never shows an empty answer -----------------------------------------------

@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")
def test_flipping_versions_never_draws_an_empty_conversation(tmp_path: Path) -> None:
    """The real app in a pty: `[` and `]` on an answer, every frame drawn read back. Removing the old
    version before the new one's Markdown was laid out drew frames with neither (8 in 4 flips)."""
    home = tmp_path / "home"
    (home / "config").mkdir(parents=True)
    (home / "config" / "config.toml").write_text("[sampler]\nsteps = 8\n")
    with Store(home / "data" / "chats.db") as store:
        chat = store.create_chat("flip")
        store.add_message(chat.id, "user", "q")
        first = store.add_message(chat.id, "assistant", " ".join(f"alpha{i}" for i in range(60)))
        store.add_message(chat.id, "assistant", " ".join(f"bravo{i}" for i in range(60)), version_of=first.id)
    term = Terminal([sys.executable, "-m", "dgchat", "--model", str(_bundled()), "--chat", str(chat.id)],
                    app_env(home, tmp_path), 100, 30)
    blank = 0
    try:
        wait_until(lambda: "bravo1" in term.text(), 60, "the chat")
        time.sleep(0.5)
        term.keys("\x1b[Z")  # Shift+Tab: from the prompt box to the answer
        time.sleep(0.5)
        for key, word in (("[", "alpha1"), ("]", "bravo1"), ("[", "alpha1"), ("]", "bravo1")):
            start = term.now()
            term.keys(key)
            wait_until(lambda w=word: w in term.text(), 10, f"the version with {word}")
            time.sleep(0.5)
            blank += sum(1 for t, text in term.frames() if t >= start and "alpha1" not in text and "bravo1" not in text)
        term.keys("\x11")
    finally:
        code = term.close()
    assert code == 0
    assert blank == 0


# -- 13: export names whole paths ------------------------------------------------------------------

async def test_the_recording_export_names_the_whole_path(home):
    from dgchat.app.prompt_modal import PromptModal

    app = make_app(_bundled())
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_model(pilot)
        screen = app.chat_screen
        await _ask(pilot)
        answer = app.store.messages(screen.chat.id)[-1]
        screen.view_for(answer.id).focus()
        await pilot.press("x")
        await wait_for(pilot, lambda: isinstance(app.screen, PromptModal), what="the export dialog")
        dialog = app.screen
        box = dialog.query_one("#prompt-value")
        assert box.value == f"dgchat-{screen.chat.id}-answer-{answer.id}.cast"
        assert box.value in _region_text(app, box.region)
        await pilot.press("enter")
        await wait_for(pilot, lambda: not isinstance(app.screen, PromptModal), what="the export")
        written = [n.message for n in app._notifications if "exported" in n.message][-1]
        path = next(p for p in (home / "data").rglob("*.cast"))
        assert f"asciinema play {path}" in written


# -- 18: text and Enter in one write ---------------------------------------------------------------

@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")
def test_a_prompt_sent_in_one_burst_is_sent(tmp_path: Path) -> None:
    """A paste without bracketed paste (or tmux's send-keys) writes the text and Enter at once: the
    app ran Enter (a priority key) before the letters queued for the prompt box were typed, so
    the box was empty when read, or half full."""
    home = tmp_path / "home"
    (home / "config").mkdir(parents=True)
    (home / "config" / "config.toml").write_text("[sampler]\nsteps = 8\n")
    term = Terminal([sys.executable, "-m", "dgchat", "--model", str(_bundled())], app_env(home, tmp_path), 100, 30)
    db = home / "data" / "chats.db"
    prompts = [f"Good morrow number {i}, what news" for i in range(6)]
    try:
        wait_until(lambda: "dgchat-tiny-plays" in term.text(), 60, "the model to load")
        time.sleep(0.5)
        for i, prompt in enumerate(prompts):
            term.keys(prompt + "\r")
            try:
                wait_until(lambda n=i + 1: _answers(db) >= n, 30, f"the answer to prompt {i}")
            except AssertionError:
                print(term.text())
                raise
        time.sleep(0.3)
        term.keys("\x11")
    finally:
        code = term.close()
    assert code == 0
    import sqlite3

    with sqlite3.connect(db) as conn:
        sent = [row[0] for row in conn.execute("SELECT content FROM messages WHERE role = 'user' ORDER BY id")]
    assert sent == prompts


def _answers(db: Path) -> int:
    import sqlite3

    if not db.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
            return conn.execute("SELECT COUNT(*) FROM messages WHERE role = 'assistant' "
                                "AND status != 'generating'").fetchone()[0]
    except sqlite3.Error:
        return 0


async def test_a_seed_of_0_in_the_config_is_a_choice_too(tmp_path, monkeypatch):
    from fixtures.app_harness import FAST_SAMPLER, setup_home

    setup_home(tmp_path, monkeypatch, FAST_SAMPLER + "seed = 0\n")
    app = make_app(_bundled())
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        await _ask(pilot)
        first = app.store.messages(app.chat_screen.chat.id)[-1]
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: len(app.store.versions(first.id)) == 2, what="version 2")
        await wait_idle(pilot)
        a, b = app.store.versions(first.id)
        assert a.meta["seed"] == b.meta["seed"] == 0 and a.content == b.content


def test_fit_parts_leaves_out_whole_parts_by_rank():
    from dgchat.app.widgets.status_bar import fit_parts

    parts = [("model.gguf", 0), ("DiffusionGemma, patched engine", 4), ("steps 24", 2), ("canvas 32", 2),
             ("entropy", 3), ("T 0.8 → 0.4", 1)]
    assert fit_parts(parts, 200) == "model.gguf · DiffusionGemma, patched engine · steps 24 · canvas 32 · entropy · T 0.8 → 0.4"
    assert fit_parts(parts, 60) == "model.gguf · steps 24 · canvas 32 · entropy · T 0.8 → 0.4"
    assert fit_parts(parts, 40) == "model.gguf · steps 24 · T 0.8 → 0.4"
    assert fit_parts(parts, 10) == "model.gguf"  # rank 0 stays (the label cuts it if it must)
    assert fit_parts(parts, 0) == fit_parts(parts, 200)  # not laid out yet: everything


# -- 14: a checkbox that is off does not show a mark ----------------------------------------------

async def test_an_unticked_box_shows_no_mark():
    from textual.app import App

    from dgchat.app.widgets.tick_box import TickBox

    class Boxes(App):
        def compose(self):
            yield TickBox("offloads", id="off", compact=True)
            yield TickBox("offloads", value=True, id="on", compact=True)

    app = Boxes()
    async with app.run_test(size=(30, 4)) as pilot:
        off, on = app.query_one("#off"), app.query_one("#on")
        assert str(off.render()).startswith("▐ ▌") and str(on.render()).startswith("▐✓▌")
        off.value = True
        await pilot.pause()
        assert str(off.render()).startswith("▐✓▌")
