"""The first-run wizard end to end under Pilot, against the local hub server (tests/fixtures/hub_server.py)
serving the fixture model under the catalog's real repo and file names."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from textual.widgets import Input

from fixtures.app_harness import GatedEngine, make_app, sync_wait, type_text, wait_for, wait_idle, wait_model
from fixtures.hub_fixtures import model_bytes
from fixtures.wizard_harness import (
    DREAM,
    DREAM_NAME,
    GIB,
    SIZE,
    download,
    first_run_home,
    panel_text,
    press,
    select_row,
    to_model_step,
    wizard,
)

from dgchat.app import session as app_session
from dgchat.config import load_config
from dgchat.app.token_modal import TokenModal
from dgchat.app.wizard.screen import WizardScreen
from dgchat.hub import download as dl
from dgchat.hub.hardware import load_hardware_overrides
from dgchat.hub.manager import ModelManager


@pytest.fixture
def env(tmp_path, monkeypatch, hub, hf_home):
    monkeypatch.setattr(dl, "PROGRESS_INTERVAL", 0.0)  # every chunk reported: the pause point is exact
    return first_run_home(tmp_path, monkeypatch, hub=hub)


def _models_dir(home: Path) -> Path:
    return home / "data" / "models"


def _heading(wiz) -> str:
    return str(wiz.query_one("#dl-title").render())


def _steps_line(wiz) -> str:
    return str(wiz.query_one("#wiz-steps").render())


async def _ready_and_tested(pilot, wiz) -> None:
    await wait_for(pilot, lambda: wiz.load_state == "loaded", what="the model to load")
    await wait_for(pilot, lambda: wiz.generation is None and bool(wiz.query("#ready-text")), timeout=30,
                   what="the test answer")
    await pilot.pause()


async def test_download_pause_resume_test_and_chat(env, hub, hf_home):
    f = hub.add_file(*DREAM, model_bytes())
    stall = 1_500_000
    f.stall_at = stall
    app = make_app(None)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        wiz = wizard(app)
        assert app.session.engine is None and app.session.loading_path is None  # nothing loads behind the wizard
        assert "nothing leaves this machine" in str(wiz.query_one("#wiz-promise").render())
        await press(pilot, "#wiz-next")
        await wait_for(pilot, lambda: wiz.hw is not None, what="hardware")
        await pilot.pause()
        assert wiz.query_one("#hw-cores", Input).value == "8"
        assert wiz.query_one("#hw-ram", Input).value == "16.0 GiB"
        assert wiz.query_one("#hw-disk", Input).value == "200.0 GiB"
        assert wiz.query_one("#hw-vram", Input).value == ""
        # detection was wrong: the user corrects the RAM, and the correction is kept
        wiz.query_one("#hw-ram", Input).value = "12G"
        await press(pilot, "#wiz-next")
        await wait_for(pilot, lambda: wiz.step == "model" and wiz.choice is not None)
        assert load_hardware_overrides() == {"ram_total": 12 * GIB}
        assert wiz.hw.ram_total == 12 * GIB
        # the recommendation is preselected (which model it is: tests/hub/test_fit.py, test_wizard_speed.py)
        assert wiz.choice.recommended and [r.name for r in wiz.rows if r.recommended] == [wiz.choice.name]
        # Dream, chosen anyway, with its stated estimate and its predicted answer time
        await select_row(pilot, wiz, DREAM_NAME)
        detail = str(wiz.query_one("#model-detail").render())
        assert "needs about" in detail and "KV cache" in detail and "10.2 GiB of RAM usable" in detail
        assert "Speed: about 2.4 h per answer on this CPU (256 tokens, 0.03 tokens/s)" in detail
        assert wiz.query_one("#wiz-next").label.plain == "Download"

        question = await download(pilot)  # asked first, like the Models screen's Pull
        assert "Answers here: about 2.4 h per answer on this CPU" in question
        assert wiz.step == "download"
        await wait_for(pilot, lambda: wiz.pull_task.last is not None and wiz.pull_task.last.done >= stall,
                       what="the stall")
        assert _heading(wiz) == "Downloading Dream v0 Instruct 7B, Q4_K_M"
        await press(pilot, "#wiz-cancel")
        await wait_for(pilot, lambda: wiz.download_state == "paused", what="the pause")
        await pilot.pause()
        assert _heading(wiz) == "Paused: Dream v0 Instruct 7B, Q4_K_M"
        status = panel_text(wiz, "status")
        assert "Paused at 1.4 MiB of 4.2 MiB" in status and "Resume continues" in status
        assert wiz.query_one("#wiz-retry").label.plain == "Resume"
        mgr = ModelManager()
        assert next(r for r in mgr.listing(wiz.hw) if r.name == DREAM_NAME).status == "partial"

        f.stall_at = None
        hub.release_stall.set()
        await press(pilot, "#wiz-retry")
        await wait_for(pilot, lambda: wiz.download_state == "done", what="the resumed download")
        await pilot.pause()
        result = wiz.pull_result
        assert result.download.resumed_from == stall
        assert hub.cdn_gets()[-1].range == f"bytes={stall}-"
        path = _models_dir(env) / DREAM[1]
        assert result.path == path and path.read_bytes() == model_bytes()
        text = panel_text(wiz, "result")
        assert "Verified: sha256" in text and "hub LFS etag" in text and "Resumed at 1.4 MiB" in text
        assert _heading(wiz) == "Downloaded: Dream v0 Instruct 7B, Q4_K_M"

        await press(pilot, "#wiz-next")
        assert wiz.step == "ready"
        assert "✓ Download  ›  5 Ready" in _steps_line(wiz)  # this model came through the download step
        await _ready_and_tested(pilot, wiz)
        assert "tokens/s" in str(wiz.query_one("#ready-stats").render())
        await press(pilot, "#wiz-next")  # Start chatting
        await wait_for(pilot, lambda: app.screen is app.chat_screen, what="the chat")
        assert app.session.engine is not None and app.session.path == path and app.session.default_path == path
        assert load_config().default_model == str(path)
        from huggingface_hub import constants

        assert constants.HF_HUB_OFFLINE  # the pull lifted offline mode for itself only
        await type_text(pilot, "hello")
        await pilot.press("enter")
        await wait_idle(pilot)
        messages = app.store.messages(app.chat_screen.chat.id)
        assert [m.role for m in messages] == ["user", "assistant"] and messages[1].status == "done"

    # the next start: no wizard, the chosen model from the config, no network
    n = len(hub.log)
    app = make_app(None)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        assert app.screen is app.chat_screen and app.session.path == path
    assert len(hub.log) == n


async def test_gated_repo_asks_for_a_token_and_retries(env, hub, hf_home):
    hub.add_file(*DREAM, model_bytes())
    hub.gate(DREAM[0], "hf_right_token")
    app = make_app(None)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        wiz = await to_model_step(pilot, select=DREAM_NAME)
        await download(pilot)
        await wait_for(pilot, lambda: isinstance(app.screen, TokenModal), what="the token dialog")
        await pilot.pause()
        assert wiz.download_state == "failed" and "is gated" in panel_text(wiz, "error")
        modal = app.screen
        modal.query_one(Input).value = "hf_wrong"
        await press(pilot, "#ok")
        await wait_for(pilot, lambda: "rejected" in str(modal.query_one("#token-error").render()),
                       what="the rejection")
        assert isinstance(app.screen, TokenModal)
        modal.query_one(Input).value = "hf_right_token"
        await pilot.press("enter")
        await wait_for(pilot, lambda: wiz.download_state == "done", what="the download after the token")
        assert (hf_home / "token").read_text().strip() == "hf_right_token"  # the hub's own token storage
        heads = hub.requests("HEAD", f"/{DREAM[0]}/resolve/")
        assert heads[-1].authorization == "Bearer hf_right_token" and heads[-1].status == 302
        assert all(g.authorization is None for g in hub.cdn_gets())  # the token never goes to the CDN
        assert (_models_dir(env) / DREAM[1]).read_bytes() == model_bytes()


async def test_the_bundled_model_needs_no_network(env, hub):
    app = make_app(None)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        wiz = wizard(app)
        await press(pilot, "#wiz-next")
        await wait_for(pilot, lambda: wiz.hw is not None)
        wiz.query_one("#hw-ram", Input).value = "lots"
        await press(pilot, "#wiz-next")
        await pilot.pause()
        assert wiz.step == "hardware" and "not a size: 'lots'" in str(wiz.query_one("#hw-error").render())
        wiz.query_one("#hw-ram", Input).value = "16.0 GiB"
        await press(pilot, "#wiz-next")
        await wait_for(pilot, lambda: wiz.step == "model")
        assert load_hardware_overrides() == {}  # nothing corrected, nothing saved
        await press(pilot, "#wiz-bundled")
        assert wiz.step == "ready"
        await _ready_and_tested(pilot, wiz)
        await press(pilot, "#wiz-next")
        await wait_for(pilot, lambda: app.screen is app.chat_screen)
        bundled = env.parent / "bundled" / "dgchat-tiny-plays.gguf"
        assert app.session.path == bundled and load_config().default_model == str(bundled)
    assert hub.log == []


@pytest.mark.parametrize("fault", ["404", "corrupt", "disk full"])
async def test_failures_are_shown_clearly(env, hub, fault, monkeypatch):
    if fault == "404":
        hub.add_file(DREAM[0], "another-file.gguf", b"x" * 100)
        title, words = "Not found on the hub", f"no file '{DREAM[1]}'"
    elif fault == "corrupt":
        hub.add_file(*DREAM, model_bytes()).corrupt_at = 123_456
        title, words = "The download did not verify", "deleted"
    else:
        hub.add_file(*DREAM, model_bytes())
        usage = shutil.disk_usage(env)
        monkeypatch.setattr(shutil, "disk_usage", lambda _p: usage._replace(free=1_000_000))
        title, words = "Not enough disk space", "976.6 KiB free in"
    app = make_app(None)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        wiz = await to_model_step(pilot, select=DREAM_NAME)
        await download(pilot)
        await wait_for(pilot, lambda: wiz.download_state == "failed", what="the failure")
        await pilot.pause()
        assert wiz.panel.phase_text == title
        assert words in panel_text(wiz, "error")
        retry = wiz.query_one("#wiz-retry")
        assert retry.display and not wiz.query_one("#wiz-next").display
        await press(pilot, "#wiz-back")
        await wait_for(pilot, lambda: wiz.step == "model")
        row = next(r for r in wiz.rows if r.name == DREAM_NAME)
        assert row.status == "available" and row.installed is None  # no half model listed
        assert not (_models_dir(env) / DREAM[1]).exists()


async def test_a_model_in_the_hf_cache_is_used_without_a_download(env, hub, hf_home, monkeypatch):
    from huggingface_hub import hf_hub_download

    from dgchat.hub.offline import hub_network

    hub.add_file(*DREAM, model_bytes())
    with hub_network():
        cached = Path(hf_hub_download(DREAM[0], DREAM[1], endpoint=hub.endpoint, cache_dir=str(hf_home / "hub")))
    n = len(hub.log)
    engines: list[GatedEngine] = []

    def held_engine(path, **kwargs):
        from dgchat.model_backend.loader import load_engine

        engines.append(GatedEngine(load_engine(path, **kwargs), hold_at=2))
        return engines[-1]

    monkeypatch.setattr(app_session, "load_engine", held_engine)
    app = make_app(None)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        wiz = await to_model_step(pilot, select=DREAM_NAME)
        assert wiz.choice.status == "in HF cache"
        assert "Found in your Hugging Face cache" in str(wiz.query_one("#model-detail").render())
        assert wiz.query_one("#wiz-next").label.plain == "Use it (no download)"
        await press(pilot, "#wiz-next")  # nothing to download: no question
        await wait_for(pilot, lambda: wiz.download_state == "done")
        assert "without a download" in panel_text(wiz, "result")
        assert wiz.model_path == cached
        await press(pilot, "#wiz-next")
        await wait_for(pilot, lambda: engines and engines[0].holding.is_set(), what="the test to run")
        assert wiz.generation is not None and wiz.generation.running
        # quitting while the test runs: the answer stops, the engine is closed, nothing hangs
    sync_wait(lambda: engines[0].model._ptr is None, timeout=10)
    assert len(hub.log) == n
    assert not load_config().exists  # the wizard was not finished: it comes back next time


async def test_skip_setup_writes_the_config_and_uses_the_bundled_model(env):
    app = make_app(None)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await press(pilot, "#wiz-skip")
        await wait_model(pilot)
        assert app.screen is app.chat_screen
        assert app.session.path == env.parent / "bundled" / "dgchat-tiny-plays.gguf"
    config = load_config()
    assert config.exists and config.default_model is None
    app = make_app(None)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert not isinstance(app.screen, WizardScreen)


async def test_no_wizard_when_a_model_is_given(tmp_path, monkeypatch, llada_gguf):
    first_run_home(tmp_path, monkeypatch, bundled=False)
    app = make_app(llada_gguf)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        assert app.screen is app.chat_screen


def test_save_default_model_keeps_the_rest_of_the_config(tmp_path):
    from dgchat.config import save_default_model

    path = tmp_path / "config.toml"
    save_default_model(path, tmp_path / "a model.gguf")
    assert load_config(path).default_model == str(tmp_path / "a model.gguf")
    path.write_text('# mine\ntheme = "light"\ndefault_model = "/old.gguf"\n\n[sampler]\nsteps = 8\n')
    save_default_model(path, Path('/new "quoted".gguf'))
    text = path.read_text()
    assert text.startswith("# mine\ntheme = \"light\"\n") and text.count("default_model") == 1
    config = load_config(path)
    assert config.default_model == '/new "quoted".gguf' and config.theme == "textual-light"
    assert config.sampler == {"steps": 8}
    save_default_model(path, None)
    assert "default_model" not in path.read_text() and load_config(path).sampler == {"steps": 8}


DG_Q4 = "diffusiongemma-26b-a4b-q4_k_m"


def _closed_endpoint() -> str:
    """A local address nothing listens on: a connection to it is refused."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def _step_text(wiz) -> str:
    """Everything the model step shows in words: the why line, the table and the detail."""
    table = wiz.query_one("#wiz-models")
    cells = [" | ".join(str(c) for c in table.get_row_at(i)) for i in range(table.row_count)]
    return "\n".join([str(wiz.query_one("#model-why").render()), *cells, str(wiz.query_one("#model-detail").render())])


async def test_the_recommendation_is_the_strongest_model_that_fits(env, hub, monkeypatch):
    """23.5 GiB of RAM, CPU only (the case of issue 16), and this machine's speed cannot be measured
    (no saved profile, the engine fails): the wizard still works, by memory alone. DiffusionGemma
    26B Q4_K_M needs 18.4 of the 20.0 GiB usable, so it fits and, being the strongest that fits,
    is the one starred; the wording says what "fits" means, and that speed is unknown. Sizes are in
    binary units only."""
    import re

    from dgchat.hub import machine_profile, save_hardware_overrides
    from dgchat.model_backend.errors import DgchatError

    def broken(*_a, **_k):
        raise DgchatError("the engine could not start")

    machine_profile.profile_path().unlink()
    monkeypatch.setattr(machine_profile, "ensure_profile", broken)
    save_hardware_overrides({"ram_total": int(23.5 * GIB)})
    app = make_app(None)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        wiz = await to_model_step(pilot)
        await wait_for(pilot, lambda: wiz.profile_state == "failed", what="the failed measurement")
        await pilot.pause()
        assert "This machine's speed could not be measured (the engine could not start)" in \
            str(wiz.query_one("#model-speed").render())
        assert wiz.hw.ram_total == int(23.5 * GIB)  # the saved correction is what the wizard uses
        assert wiz.choice.name == DG_Q4 and wiz.choice.recommended
        assert [r.name for r in wiz.rows if r.recommended] == [DG_Q4]
        # the reason in a clause above the table (#model-speed says the list goes by memory alone), what
        # "fits" means first in the starred row's details
        assert str(wiz.query_one("#model-why").render()) == (
            "★ DiffusionGemma 26B-A4B it, Q4_K_M is recommended: the strongest model that fits in RAM.")
        assert str(wiz.query_one("#model-detail").render()).startswith(
            "DiffusionGemma 26B-A4B it, Q4_K_M — fits in RAM  ★ recommended\n"
            "It needs 18.4 GiB of the 20.0 GiB usable: 85% of the RAM, the rest stays free for the system.\n")
        assert "Answer" not in [str(c.label) for c in wiz.query_one("#wiz-models").columns.values()]
        assert "Speed: unknown (this machine's speed could not be measured)" in \
            str(wiz.query_one("#model-detail").render())
        text = _step_text(wiz)
        assert "≈15.7 GiB" in text and "≈4.4 GiB" in text
        assert not re.search(r"\d\s*(GB|MB|KB)\b", text), text  # one unit: GiB/MiB, never GB
        for name in ("dream-v0-instruct-7b-q4_k_m", "dgchat-tiny-plays"):
            wiz.query_one("#wiz-models").move_cursor(row=[r.name for r in wiz.rows].index(name))
            await pilot.pause()
            assert not re.search(r"\d\s*(GB|MB|KB)\b", _step_text(wiz))
        # the bundled model's badge says what it is, not where a 4 MiB model would run
        bundled = wiz.rows.index(next(r for r in wiz.rows if r.name == "dgchat-tiny-plays"))
        assert str(wiz.query_one("#wiz-models").get_row_at(bundled)[-1]) == "bundled · no download"
        assert str(wiz.query_one("#model-detail").render()).startswith("dgchat tiny (bundled) — bundled · no download")
    assert hub.log == []


@pytest.mark.parametrize("where", ["refused", "unresolvable"])
async def test_no_network_offers_the_bundled_model(env, monkeypatch, where):
    """The hub cannot be reached: the page says "No network connection" (not an errno), offers the
    bundled model beside Retry and Choose another, leaves no lock in models/.partial, and the bundled
    model finishes the setup."""
    monkeypatch.setenv("HF_ENDPOINT", _closed_endpoint() if where == "refused" else "http://dgchat-no-such-hub.invalid")
    app = make_app(None)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        wiz = await to_model_step(pilot, select=DREAM_NAME)
        await download(pilot)
        await wait_for(pilot, lambda: wiz.download_state == "failed", what="the failure")
        await pilot.pause()
        assert wiz.panel.phase_text == "No network connection"
        error = panel_text(wiz, "error")
        reason = ("127.0.0.1 refused the connection" if where == "refused"
                  else "dgchat-no-such-hub.invalid could not be looked up (no answer from DNS)")
        assert error == (f"dgchat could not reach the model hub: {reason}. Check this machine's network connection "
                         "and retry, or use the bundled model, which needs no download.")
        assert "Errno" not in error
        shown = {str(b.label) for b in wiz.query("#wiz-nav Button") if b.display}
        assert shown == {"Choose another model", "Use the bundled model", "Retry"}
        partial = _models_dir(env) / ".partial"
        assert not partial.exists() or list(partial.iterdir()) == []  # no .lock left behind
        await press(pilot, "#wiz-bundled")
        assert wiz.step == "ready"
        await _ready_and_tested(pilot, wiz)
        await press(pilot, "#wiz-next")  # Start chatting
        await wait_for(pilot, lambda: app.screen is app.chat_screen, what="the chat")
        bundled = env.parent / "bundled" / "dgchat-tiny-plays.gguf"
        assert app.session.path == bundled and load_config().default_model == str(bundled)


async def test_after_a_failed_download_the_heading_and_the_steps_say_what_happened(env, monkeypatch):
    """Issue 43: the download page's heading kept "Downloading Dream …" over "No network
    connection"; after "Use the bundled model" the steps line said "✓ Download" for a step that was
    skipped. Now the heading says the model was not downloaded, and the steps line marks the
    download as skipped."""
    monkeypatch.setenv("HF_ENDPOINT", _closed_endpoint())
    app = make_app(None)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        wiz = await to_model_step(pilot, select=DREAM_NAME)
        await download(pilot)
        await wait_for(pilot, lambda: wiz.download_state == "failed", what="the failure")
        await pilot.pause()
        assert wiz.panel.phase_text == "No network connection"
        assert _heading(wiz) == "Not downloaded: Dream v0 Instruct 7B, Q4_K_M"
        await press(pilot, "#wiz-bundled")
        assert wiz.step == "ready"
        steps = _steps_line(wiz)
        assert steps == "✓ Welcome  ›  ✓ This machine  ›  ✓ Model  ›  – Download skipped  ›  5 Ready", \
            steps
        await _ready_and_tested(pilot, wiz)
    # at 60 columns the steps line names only the current step: the skipped one is "– 4", not "✓ 4"
    app = make_app(None)
    async with app.run_test(size=(60, 20)) as pilot:
        await pilot.pause()
        wiz = await to_model_step(pilot)
        await press(pilot, "#wiz-bundled")
        assert wiz.step == "ready" and _steps_line(wiz) == "✓ 1 › ✓ 2 › ✓ 3 › – 4 › 5 Ready"
        await _ready_and_tested(pilot, wiz)


async def test_enter_in_the_download_question_downloads(env, hub):
    """Issue 43: the question before a download had the focus on Cancel, so the first Enter closed
    it and nothing happened. The user has just asked for the download: Download has the focus."""
    from dgchat.app.confirm_modal import ConfirmModal

    hub.add_file(*DREAM, model_bytes())
    app = make_app(None)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        wiz = await to_model_step(pilot, select=DREAM_NAME)
        await press(pilot, "#wiz-next")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmModal), what="the download question")
        await pilot.pause()
        assert app.focused is app.screen.query_one("#yes") and str(app.focused.label) == "Download"
        await pilot.press("enter")
        await wait_for(pilot, lambda: wiz.download_state == "done", what="the download")
        assert (_models_dir(env) / DREAM[1]).read_bytes() == model_bytes()


async def test_setup_runs_again_from_the_palette(env, hub):
    """After setup: "setup: correct the hardware values" opens the wizard at the machine step, where
    a correction is saved in hardware.toml; Close leaves without touching the default model.
    "setup: run again" opens it at the start, with Close instead of Skip setup."""
    from dgchat.app.commands import SetupCommands

    (env / "config" / "config.toml").write_text("[sampler]\nsteps = 8\ngen_length = 32\n", encoding="utf-8")
    app = make_app(None)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        titles = [SetupCommands(app.chat_screen)._title(n) for n, _h, _c in SetupCommands(app.chat_screen).commands()]
        assert titles == ["setup: run again", "setup: correct the hardware values"]
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"setup: correct the hardware")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, WizardScreen), what="the wizard")
        wiz = app.screen
        assert wiz.rerun and wiz.step == "hardware"
        await wait_for(pilot, lambda: wiz.hw is not None and not wiz.detecting, what="hardware detection")
        await pilot.pause()
        wiz.query_one("#hw-ram", Input).value = "24G"
        await press(pilot, "#wiz-next")
        await wait_for(pilot, lambda: wiz.step == "model", what="the model step")
        assert load_hardware_overrides() == {"ram_total": 24 * GIB}
        assert wiz.query_one("#wiz-close").display
        await press(pilot, "#wiz-close")
        await wait_for(pilot, lambda: app.screen is app.chat_screen, what="the chat")
        assert load_config().default_model is None  # nothing else changed

        app.action_setup()
        await wait_for(pilot, lambda: isinstance(app.screen, WizardScreen), what="the wizard again")
        wiz = app.screen
        await pilot.pause()
        assert wiz.step == "welcome" and wiz.query_one("#wiz-close").display
        assert not wiz.query_one("#wiz-skip").display  # Skip setup would rewrite the config
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.screen is app.chat_screen, what="the chat after Escape")
    assert hub.log == []
