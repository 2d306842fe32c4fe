"""The Models screen (F4 / palette) under Pilot: list, pull with pause and resume, verify, use,
remove, import — against the local hub server; the question before any download, keys and buttons
only where they apply, one word per action, and a layout that fits 140x40, 80x24 and 60x20."""

from __future__ import annotations

from pathlib import Path

import pytest
from dgchat.config import load_config
from dgchat.app.models_screen import ModelsScreen
from dgchat.hub import download as dl
from fixtures.app_harness import FAST_SAMPLER, make_app, wait_for, wait_model
from fixtures.hub_fixtures import model_bytes, model_file
from fixtures.wizard_harness import (
    DREAM,
    DREAM_NAME,
    SIZE,
    confirm_download,
    first_run_home,
    panel_text,
    press,
)


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
        # Dream is too slow at the reference speed, so it is not the one recommended (the block-diffusion
        # models of issue 42 may be; the recommendation itself is tested in tests/hub and test_wizard_speed)
        assert rows[DREAM_NAME].status == "available" and not rows[DREAM_NAME].recommended
        assert rows[DREAM_NAME].badge == "too slow here" and sum(r.recommended for r in rows.values()) == 1
        assert rows["dgchat-tiny-plays"].status == "bundled"
        table = screen.query_one("#models-table")
        marks = [str(table.get_row_at(i)[0]) for i in range(len(screen.rows))]
        assert marks[[r.name for r in screen.rows].index("dgchat-tiny-plays")] == "●"  # in use

        await _select(pilot, screen, DREAM_NAME)
        assert "Shell: dgchat models pull dream-v0-instruct-7b-q4_k_m" in str(screen.query_one("#models-detail").render())
        await pilot.press("p")
        await confirm_download(pilot)
        await wait_for(pilot, lambda: screen.hub_task is not None and screen.hub_task.last is not None
                       and screen.hub_task.last.done >= 2_000_000, what="the stall")
        assert screen.query_one("#m-cancel").display
        await pilot.press("c")
        await wait_for(pilot, lambda: screen.hub_task is None, what="the pause")
        await pilot.pause()
        assert "Paused at 1.9 MiB of 4.2 MiB" in panel_text(screen, "status")
        assert "Pull continues from there" in panel_text(screen, "status")
        assert screen.selected.status == "partial" and screen.query_one("#m-pull").label.plain == "Pull"
        assert "Pull continues it from there" in str(screen.query_one("#models-detail").render())
        f.stall_at = None
        hub.release_stall.set()
        await press(pilot, "#m-pull")
        body = await confirm_download(pilot)
        assert "2.3 MiB still to download (a paused download holds 1.9 MiB of 4.2 MiB)" in body
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


def _footer(screen) -> dict[str, str]:
    """The keys the footer shows: key -> description (greyed ones included)."""
    from textual.widgets._footer import FooterKey

    return {k.key: k.description for k in screen.query(FooterKey)}


async def _footer_is(pilot, screen, keys: set[str]) -> None:
    shown = {"escape", "u", "p", "c", "v", "d", "i"}
    await wait_for(pilot, lambda: set(_footer(screen)) & shown == keys, what=f"the footer to show {sorted(keys)}")


def _notices(app) -> list[str]:
    notices: list[str] = []
    app.notify = lambda message, **kw: notices.append(str(message))  # type: ignore[method-assign]
    return notices


async def test_a_download_is_asked_about_first_and_no_downloads_nothing(env, hub):
    """u on a catalog model that is not here, p, and both buttons: each asks, naming the model, its
    size, the free disk and how fast it would answer here; answering no downloads nothing (the hub
    sees no request)."""
    from dgchat.app.confirm_modal import ConfirmModal

    hub.add_file(*DREAM, model_bytes())
    app = make_app(None)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        screen = await _open(pilot)
        await _select(pilot, screen, DREAM_NAME)
        for how in ("u", "p", "#m-use", "#m-pull", "enter"):
            if how.startswith("#"):
                await press(pilot, how)
            else:
                screen.query_one("#models-table").focus()  # enter on the table's row = Use
                await pilot.press(how)
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmModal), what=f"the question after {how}")
            modal = app.screen
            body = str(modal.query_one(".dialog--body").render())
            assert body == ("Dream v0 Instruct 7B, Q4_K_M: ≈4.4 GiB to download from the Hugging Face hub "
                            "(bartowski/Dream-org_Dream-v0-Instruct-7B-GGUF).\n"
                            "Disk: needs 4.4 GiB in ~/dgchat-home/data/models; 200.0 GiB free there.\n"
                            "Answers here: about 2.4 h per answer on this CPU (256 tokens, 0.03 tokens/s); too slow "
                            "here."), body
            title = str(modal.query_one(".dialog--title").render())
            assert title == ("Download this model?" if how in ("p", "#m-pull") else "Download and use this model?")
            if how == "#m-pull":
                await press(pilot, "#no")
            else:
                await pilot.press("escape")
            await wait_for(pilot, lambda: app.screen is screen, what="the answer")
            assert screen.hub_task is None and screen.selected.status == "available"
        assert not (env / "data" / "models" / ".partial").exists()
        assert not (env / "data" / "models" / DREAM[1]).exists()
    assert hub.log == []  # the local hub served nothing


async def test_keys_and_buttons_only_where_they_apply(env, hub):
    """The bundled row has nothing to pull, verify or remove: the footer does not list p/v/d, the
    buttons are not there, and the keys pressed anyway say why. Moving the selection updates both."""
    app = make_app(None)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        screen = await _open(pilot)
        notices = _notices(app)
        await _select(pilot, screen, "dgchat-tiny-plays")
        await _footer_is(pilot, screen, {"escape", "u", "i"})
        shown = [b.id for b in screen.query("#models-buttons Button") if b.display]
        assert shown == ["m-use", "m-import"]
        for key, why in (("p", "dgchat tiny (bundled) ships with dgchat: there is nothing to pull."),
                         ("v", "dgchat tiny (bundled) ships with dgchat: there is no download to verify."),
                         ("d", "dgchat tiny (bundled) ships with dgchat and cannot be removed."),
                         ("c", "Nothing is being downloaded or checked right now.")):
            await pilot.press(key)
            await pilot.pause()
            assert notices[-1] == why
            assert app.screen is screen and screen.hub_task is None
        assert len(notices) == 4

        await _select(pilot, screen, DREAM_NAME)  # not here yet: pull and use, nothing to verify or remove
        await _footer_is(pilot, screen, {"escape", "u", "p", "i"})
        assert [b.id for b in screen.query("#models-buttons Button") if b.display] == ["m-use", "m-pull", "m-import"]
        await pilot.press("v")
        await pilot.pause()
        assert notices[-1] == ("Dream v0 Instruct 7B, Q4_K_M is not on this machine: Pull (p) downloads and "
                               "verifies it.")
    assert hub.log == []


async def test_one_word_per_action_for_a_model_in_the_hf_cache(env, hub, hf_home):
    """A GGUF found in the Hugging Face cache: its button and its key both say Pull (getting it needs
    no download, so no question); once added it is an installed model with Use, Verify and Remove."""
    from dgchat.hub.offline import hub_network
    from fixtures.hub_fixtures import FILE, REPO
    from huggingface_hub import hf_hub_download
    from textual.widgets import Button

    with hub_network():
        hf_hub_download(REPO, FILE, endpoint=hub.endpoint, cache_dir=str(hf_home / "hub"))
    n = len(hub.log)
    app = make_app(None)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        screen = await _open(pilot)
        cached = next(r for r in screen.rows if r.entry is None and r.status == "in HF cache")
        await _select(pilot, screen, cached.name)
        await _footer_is(pilot, screen, {"escape", "u", "p", "i"})
        assert _footer(screen)["p"] == "Pull" and screen.query_one("#m-pull", Button).label.plain == "Pull"
        labels = {str(b.label) for b in screen.query(Button)}
        assert "Add" not in labels and "Resume" not in labels
        await pilot.press("p")
        await wait_for(pilot, lambda: screen.hub_task is None and screen.selected.status == "installed",
                       what="the model added from the cache")
        assert screen.selected.entry is None and "Added as" in panel_text(screen, "result")
        await _footer_is(pilot, screen, {"escape", "u", "v", "d", "i"})
        assert [b.id for b in screen.query("#models-buttons Button") if b.display] == \
            ["m-use", "m-verify", "m-remove", "m-import"]
    assert len(hub.log) == n  # from the cache: nothing downloaded


@pytest.mark.parametrize("size", [(140, 40), (80, 24), (60, 20)])
async def test_the_screen_fits_the_terminal(env, hub, size):
    """No table column runs off the right edge, and every button shows its whole label."""
    from textual.widgets import Button, DataTable

    app = make_app(None)
    async with app.run_test(size=size) as pilot:
        await wait_model(pilot)
        screen = await _open(pilot)
        for name in (DREAM_NAME, "dgchat-tiny-plays"):
            await _select(pilot, screen, name)
            await pilot.pause()
            table = screen.query_one(DataTable)
            assert table.virtual_size.width <= table.scrollable_content_region.width, (size, table.virtual_size)
            for button in screen.query("#models-buttons Button").results(Button):
                if button.display:
                    assert button.content_region.width >= len(button.label.plain), (size, button.label)
                    assert button.region.right <= size[0]
            rendered = [str(table.get_row_at(i)[1]) for i in range(len(screen.rows))]
            assert len(set(rendered)) == len(rendered)  # cut titles still tell the rows apart
        if size[0] < 70:
            assert "Where" not in [str(c.label) for c in table.columns.values()]


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once closed: connections are refused


def _table_lines_up(table) -> None:
    """Every column's header label is whole and starts where its cells start."""
    widths = [c.get_render_width(table) for c in table.columns.values()]
    header = table.render_line(0).text
    x = 0
    for column, width in zip(table.columns.values(), widths):
        label = str(column.label)
        assert header[x + 1:x + 1 + len(label)] == label, (header, label)  # 1: the cell padding
        for y in range(1, table.size.height):  # the rows on screen (the table scrolls past its max-height)
            row = table.scroll_offset.y + y - 1
            if row >= table.row_count:
                break
            cell = str(table.get_row_at(row)[list(table.columns).index(column.key)])
            line = table.render_line(y).text
            assert line[x + 1:x + 1 + len(cell)] == cell, (line, cell)
        x += width


@pytest.mark.parametrize("size", [(140, 40), (80, 24), (60, 20)])
async def test_a_failed_pull_leaves_the_screen_whole_and_its_message_stays_with_its_row(env, monkeypatch, size):
    """After a pull that failed for want of a network, the table is whole and lined up, the buttons
    are on screen (the failure message took their rows at 80x24), and "No network connection" is
    about that model: selecting another one does not show it there, coming back does."""
    from textual.widgets import Button, DataTable, Footer

    from dgchat.app.widgets.transfer_panel import TransferPanel

    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    app = make_app(None)
    async with app.run_test(size=size) as pilot:
        await wait_model(pilot)
        screen = await _open(pilot)
        table = screen.query_one(DataTable)
        _table_lines_up(table)
        await _select(pilot, screen, DREAM_NAME)
        await pilot.press("p")
        await confirm_download(pilot)
        await wait_for(pilot, lambda: screen.hub_task is None and app.screen is screen, 30, "the failed pull")
        await pilot.pause(0.2)
        panel = screen.query_one(TransferPanel)
        assert panel.display and panel.phase_text == "No network connection"
        assert "could not reach the model hub" in panel_text(screen, "error")
        _table_lines_up(table)
        footer_top = screen.query_one(Footer).region.y
        for button in screen.query("#models-buttons Button").results(Button):
            if button.display:
                assert button.region.bottom <= footer_top and button.content_region.height >= 1, (size, button)
        assert screen.query_one("#models-detail-scroll").region.height >= 2

        # another model: the message is not about it
        await _select(pilot, screen, "dgchat-tiny-plays")
        assert not panel.display
        await _select(pilot, screen, "llada-8b-instruct-q4_k_m")
        assert not panel.display
        _table_lines_up(table)
        # back on the model that failed: its message again
        await _select(pilot, screen, DREAM_NAME)
        assert panel.display and panel.phase_text == "No network connection"


async def test_answer_times_and_the_too_slow_badge(env, hub):
    """The Answer column (the predicted time of a 256-token answer on the reference machine
    profile), "too slow here" for a model that fits but answers slower than the limit, "-" where
    nothing is predicted (it does not fit), and the detail's sentence and basis."""
    from textual.widgets import DataTable

    app = make_app(None)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        screen = await _open(pilot)
        table = screen.query_one(DataTable)
        assert [str(c.label) for c in table.columns.values()][-2:] == ["Fit for this machine", "Answer"]
        assert not screen.query_one("#models-speed").display  # the saved profile: nothing to measure

        def cells(name: str) -> list[str]:
            return [str(c) for c in table.get_row_at([r.name for r in screen.rows].index(name))]

        assert cells(DREAM_NAME)[-2:] == ["too slow here", "~2.4 h"]
        assert cells("diffusiongemma-26b-a4b-q8_0")[-2:] == ["will not fit", "-"]
        bundled = next(r for r in screen.rows if r.name == "dgchat-tiny-plays")
        assert cells("dgchat-tiny-plays")[-1] == bundled.speed.short() and not bundled.speed.too_slow
        await _select(pilot, screen, DREAM_NAME)
        detail = str(screen.query_one("#models-detail").render())
        assert detail.startswith("Dream v0 Instruct 7B, Q4_K_M — too slow here\n")
        assert ("Speed: about 2.4 h per answer on this CPU (256 tokens, 0.03 tokens/s)\n"
                "Predicted from this machine's measured speed.\n"
                "Too slow here: over the 90 s a 256-token answer may take (answer_seconds_limit in the config).") \
            in detail
    assert hub.log == []


async def test_the_screen_measures_the_machine_when_no_profile_is_saved(env, monkeypatch):
    """Never measured with this engine build: the rows come at once without answer times, a status
    line shows the measurement's progress (in a worker: the screen stays usable), then the rows
    get their answer times; the profile is saved, and the next opening measures nothing."""
    from textual.widgets import DataTable

    from dgchat.hub import machine_profile
    from fixtures.wizard_harness import FakeMeasure

    fake = FakeMeasure()
    monkeypatch.setattr(machine_profile, "measure", fake)
    machine_profile.profile_path().unlink()
    app = make_app(None)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        screen = await _open(pilot)
        table = screen.query_one(DataTable)
        line = screen.query_one("#models-speed")
        await wait_for(pilot, lambda: "q4_k" in str(line.render()), what="the progress")
        assert str(line.render()) == "Measuring how fast this machine runs models… matrix products, q4_k — 40\u00a0%"
        assert line.display and "Answer" not in [str(c.label) for c in table.columns.values()]
        await _select(pilot, screen, DREAM_NAME)  # usable meanwhile
        assert "Speed: not known yet (measuring this machine, a few seconds)" in \
            str(screen.query_one("#models-detail").render())
        fake.release.set()
        await wait_for(pilot, lambda: "Answer" in [str(c.label) for c in table.columns.values()],
                       what="the answer times")
        assert not line.display and screen.selected.name == DREAM_NAME  # the selection stays
        assert "Speed: about 2.4 h per answer" in str(screen.query_one("#models-detail").render())
        await pilot.press("escape")
        await pilot.pause()
        screen = await _open(pilot)
        assert not screen.query_one("#models-speed").display
    assert fake.calls == 1  # measured once, then reused
