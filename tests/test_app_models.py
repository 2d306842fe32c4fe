"""The Models screen (F4 / palette) under Pilot: list, pull with pause and resume, verify, use,
remove, import — against the local hub server."""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures.app_harness import FAST_SAMPLER, make_app, wait_for, wait_model
from fixtures.hub_fixtures import hf_home, hub, model_bytes, model_file  # noqa: F401
from fixtures.wizard_harness import DREAM, DREAM_NAME, SIZE, first_run_home, panel_text, press

from dgchat.app.config import load_config
from dgchat.app.models_screen import ModelsScreen
from dgchat.hub import download as dl


@pytest.fixture
def env(tmp_path, monkeypatch, hub, hf_home):
    """A set-up app: a config (no wizard), the fixture model as the bundled default."""
    monkeypatch.setattr(dl, "PROGRESS_INTERVAL", 0.0)
    home = first_run_home(tmp_path, monkeypatch, hub=hub)
    (home / "config" / "config.toml").write_text(FAST_SAMPLER, encoding="utf-8")
    return home


def _screen(app) -> ModelsScreen:
    screen = app.screen
    assert isinstance(screen, ModelsScreen), screen
    return screen


async def _open(pilot) -> ModelsScreen:
    await pilot.press("f4")
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, ModelsScreen) and bool(pilot.app.screen.rows),
                   what="the Models screen")
    await pilot.pause()
    return pilot.app.screen


async def _select(pilot, screen: ModelsScreen, name: str) -> None:
    index = next(i for i, r in enumerate(screen.rows) if r.name == name)
    screen.query_one("#models-table").move_cursor(row=index)
    await pilot.pause()
    assert screen.selected.name == name


async def test_pull_pause_resume_verify_use_and_remove(env, hub):
    f = hub.add_file(*DREAM, model_bytes())
    f.stall_at = 2_000_000
    app = make_app(None)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        bundled = app.session.path
        screen = await _open(pilot)
        assert "8 CPU cores · 16.0 GiB RAM · 200.0 GiB free in ~/dgchat-home/data/models" in \
            str(screen.query_one("#models-hw").render())
        rows = {r.name: r for r in screen.rows}
        assert rows[DREAM_NAME].status == "available" and rows[DREAM_NAME].recommended
        assert rows["dgchat-tiny-plays"].status == "bundled"
        table = screen.query_one("#models-table")
        marks = [str(table.get_row_at(i)[0]) for i in range(len(screen.rows))]
        assert marks[[r.name for r in screen.rows].index("dgchat-tiny-plays")] == "●"  # in use

        await _select(pilot, screen, DREAM_NAME)
        assert "Shell: dgchat models pull dream-v0-instruct-7b-q4_k_m" in str(screen.query_one("#models-detail").render())
        await pilot.press("p")
        await wait_for(pilot, lambda: screen.hub_task is not None and screen.hub_task.last is not None
                       and screen.hub_task.last.done >= 2_000_000, what="the stall")
        assert screen.query_one("#m-cancel").display
        await pilot.press("c")
        await wait_for(pilot, lambda: screen.hub_task is None, what="the pause")
        await pilot.pause()
        assert "Paused at 1.9 MiB of 4.2 MiB" in panel_text(screen, "status")
        assert screen.selected.status == "partial" and screen.query_one("#m-pull").label.plain == "Resume"
        f.stall_at = None
        hub.release_stall.set()
        await press(pilot, "#m-pull")
        await wait_for(pilot, lambda: screen.hub_task is None and screen.selected.status == "installed",
                       what="the resumed download")
        assert "Resumed at 1.9 MiB" in panel_text(screen, "result")
        assert hub.cdn_gets()[-1].range == "bytes=2000000-"

        await pilot.press("v")
        await wait_for(pilot, lambda: "matches the file as installed" in panel_text(screen, "result"),
                       what="verification")

        path = env / "data" / "models" / DREAM[1]
        await pilot.press("u")
        await wait_for(pilot, lambda: app.screen is app.chat_screen, what="the chat")
        await wait_model(pilot)
        assert app.session.path == path and app.session.default_path == path
        assert load_config().default_model == str(path)
        assert load_config().sampler == {"steps": 8, "gen_length": 32}  # the rest of the config is kept

        # the model in use cannot be removed; another one can
        screen = await _open(pilot)
        await _select(pilot, screen, DREAM_NAME)
        await pilot.press("d")
        await pilot.pause()
        assert "is the model in use" in panel_text(screen, "error") and path.exists()
        await _select(pilot, screen, "dgchat-tiny-plays")
        await press(pilot, "#m-use")
        await wait_for(pilot, lambda: app.screen is app.chat_screen)
        await wait_model(pilot)
        assert app.session.path == bundled
        screen = await _open(pilot)
        await _select(pilot, screen, DREAM_NAME)
        await pilot.press("d")
        await wait_for(pilot, lambda: app.screen.__class__.__name__ == "ConfirmModal")
        await press(pilot, "#yes")
        await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen) and screen.selected.status == "available")
        assert not path.exists() and f"deleted ~/dgchat-home/data/models/{DREAM[1]}" in panel_text(screen, "result")
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen is app.chat_screen


async def test_import_from_disk_and_the_palette_command(env, hub, tmp_path):
    mine = tmp_path / "My Model.gguf"
    mine.write_bytes(model_file().read_bytes())
    app = make_app(None)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"manage models")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen) and bool(app.screen.rows))
        screen = app.screen
        await pilot.press("i")
        await pilot.pause()
        from textual.widgets import Input

        prompt = app.screen
        prompt.query_one(Input).value = str(tmp_path / "missing.gguf")
        await pilot.press("enter")
        await pilot.pause()
        assert "model file not found" in str(prompt.query_one("#prompt-error").render())
        prompt.query_one(Input).value = str(mine)
        await pilot.press("enter")
        await wait_for(pilot, lambda: screen.hub_task is None and any(r.name == "my-model" for r in screen.rows),
                       what="the import")
        assert screen.selected.name == "my-model" and screen.selected.status == "installed"
        assert "Added as 'my-model'" in panel_text(screen, "result")
        await pilot.press("d")
        await wait_for(pilot, lambda: app.screen.__class__.__name__ == "ConfirmModal")
        assert "The file stays where it is" in str(app.screen.query_one(".dialog--body").render())
        await press(pilot, "#yes")
        await wait_for(pilot, lambda: all(r.name != "my-model" for r in screen.rows))
        assert mine.exists()  # an imported original is never deleted
    assert hub.log == []  # nothing here went online
    assert Path(mine).read_bytes() == model_file().read_bytes()
