"""Snapshot tests (pytest-textual-snapshot): one per screen, deterministic.

Fixed terminal size, fixed model (the tiny llada fixture, seed 0, temperature 0), HOME and
DGCHAT_HOME under tmp_path (paths print as ~/…), messages with fixed statistics, and the
mid-generation view held at a fixed step with fixed elapsed times (no clocks). Update with
`pytest tests/app/test_snapshots.py --snapshot-update` and review the SVGs under __snapshots__.
"""

from __future__ import annotations

from fixtures.app_harness import GatedEngine, make_app, setup_home, wait_for, wait_model, without_bundled_model

from dgchat.app.store import Store

SIZE = (110, 32)

ANSWER = """The gate stays **closed** after dark:

1. the king sleeps,
2. the guards are weary.

```python
print("halt, traveller")
```"""


def _conversation(home) -> int:
    with Store(home / "data" / "chats.db") as store:
        other = store.create_chat("Market day")
        store.add_message(other.id, "user", "What does the baker sell?")
        chat = store.create_chat()
        store.add_message(chat.id, "user", "Why is the gate shut?")
        answer = store.begin_answer(chat.id, {"model": "tiny-llada.gguf"})
        store.finish_answer(answer.id, ANSWER, "done", {
            "stop_reason": "eos", "stats": {"tokens": 41, "steps": 8, "tokens_per_s": 52.3}})
        store.add_message(chat.id, "user", "And tomorrow?")
        stopped = store.begin_answer(chat.id, {"model": "tiny-llada.gguf"})
        store.finish_answer(stopped.id, "Tomorrow the", "stopped", {
            "stop_reason": "cancelled", "stats": {"tokens": 3, "steps": 2, "tokens_per_s": 40.0}})
        return chat.id


def _ready(extra=None):
    async def run_before(pilot):
        await wait_model(pilot)
        if extra is not None:
            await extra(pilot)
        await pilot.pause(0.1)
    return run_before


def test_new_chat(snap_compare, home, llada_gguf):
    assert snap_compare(make_app(llada_gguf), terminal_size=SIZE, run_before=_ready())


def test_conversation_with_markdown_answer(snap_compare, home, llada_gguf):
    chat_id = _conversation(home)
    assert snap_compare(make_app(llada_gguf, chat=chat_id), terminal_size=SIZE, run_before=_ready())


def test_conversation_light_theme(snap_compare, tmp_path, monkeypatch, llada_gguf):
    home = setup_home(tmp_path, monkeypatch, 'theme = "light"\n[sampler]\nsteps = 8\ngen_length = 32\n')
    chat_id = _conversation(home)
    assert snap_compare(make_app(llada_gguf, chat=chat_id), terminal_size=SIZE, run_before=_ready())


async def _generate_and_hold(pilot):
    app = pilot.app
    app.session.engine = gated = GatedEngine(app.session.engine, hold_at=3)
    prompt = app.chat_screen.query_one("#prompt")
    prompt.insert("Who guards the gate?")
    await pilot.press("enter")
    await wait_for(pilot, gated.holding.is_set)
    canvas = app.chat_screen.query_one("#live-canvas")
    await wait_for(pilot, lambda: canvas.event is not None and canvas.event.step == 3)
    canvas.replan()  # the reserved height otherwise depends on which earlier steps were painted
    await pilot.pause()


def test_live_canvas_mid_generation(snap_compare, home, llada_gguf):
    assert snap_compare(make_app(llada_gguf), terminal_size=SIZE, run_before=_ready(_generate_and_hold))


def test_live_canvas_no_color(snap_compare, home, llada_gguf, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    assert snap_compare(make_app(llada_gguf), terminal_size=SIZE, run_before=_ready(_generate_and_hold))


def test_settings_modal(snap_compare, home, llada_gguf):
    async def open_settings(pilot):
        await pilot.press("ctrl+o")
        await pilot.pause()

    assert snap_compare(make_app(llada_gguf), terminal_size=(110, 44), run_before=_ready(open_settings))


def test_search_modal(snap_compare, home, llada_gguf):
    _conversation(home)

    async def search(pilot):
        await pilot.press("ctrl+f")
        await pilot.pause()
        await pilot.press(*"gate")
        await pilot.pause()

    assert snap_compare(make_app(llada_gguf), terminal_size=SIZE, run_before=_ready(search))


def test_key_help(snap_compare, home, llada_gguf):
    async def help_(pilot):
        await pilot.press("f1")
        await pilot.pause()

    assert snap_compare(make_app(llada_gguf), terminal_size=(110, 40), run_before=_ready(help_))


def test_edit_prompt_modal(snap_compare, home, llada_gguf):
    chat_id = _conversation(home)

    async def edit(pilot):
        await pilot.press("ctrl+g")
        await pilot.pause()

    assert snap_compare(make_app(llada_gguf, chat=chat_id), terminal_size=SIZE, run_before=_ready(edit))


def test_model_load_error_dialog(snap_compare, home, tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF but not really")

    async def failed(pilot):
        from dgchat.app.error_modal import ErrorModal

        await wait_for(pilot, lambda: isinstance(pilot.app.screen, ErrorModal))
        await pilot.pause()

    assert snap_compare(make_app(bad), terminal_size=SIZE, run_before=failed)


def test_no_model_screen(snap_compare, home, monkeypatch):
    without_bundled_model(monkeypatch)
    async def shown(pilot):
        await pilot.pause()

    assert snap_compare(make_app(None), terminal_size=SIZE, run_before=shown)
