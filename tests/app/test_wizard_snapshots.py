"""Snapshots (pytest-textual-snapshot) of each first-run wizard step and of the Models screen.

Deterministic: fixed terminal size, fixed hardware (tests/fixtures/wizard_harness.py), the reference
machine profile (answer times), HOME and
DGCHAT_HOME under tmp_path (paths print as ~/…), the fixture model as the bundled one, downloads
held at a fixed byte offset by the local hub (stall) with the on-screen progress set to fixed
numbers, and the test generation held at a fixed step with fixed elapsed times (no clocks).
Update with `pytest tests/app/test_wizard_snapshots.py --snapshot-update` and review the SVGs.
"""

from __future__ import annotations

import pytest

from fixtures.app_harness import FAST_SAMPLER, GatedEngine, make_app, wait_for
from fixtures.hub_fixtures import model_bytes
from fixtures.wizard_harness import (
    DREAM,
    DREAM_NAME,
    SIZE,
    download,
    first_run_home,
    press,
    to_model_step,
    wizard,
)

from dgchat.app import session as app_session
from dgchat.hub import download as dl
from dgchat.hub.download import Progress

STALL = 1_500_000


@pytest.fixture
def env(tmp_path, monkeypatch, hub, hf_home):
    monkeypatch.setattr(dl, "PROGRESS_INTERVAL", 0.0)
    return first_run_home(tmp_path, monkeypatch, hub=hub)


def _steps(*steps):
    async def run_before(pilot):
        await pilot.pause()
        for step in steps:
            await step(pilot)
        await pilot.pause(0.1)
    return run_before


async def _to_hardware(pilot):
    wiz = wizard(pilot.app)
    await press(pilot, "#wiz-next")
    await wait_for(pilot, lambda: wiz.hw is not None and not wiz.detecting)
    await pilot.pause()


async def _to_models(pilot):
    await to_model_step(pilot)


async def _to_dream(pilot):
    """The model step with Dream selected (the bundled model is the one recommended)."""
    await to_model_step(pilot, select=DREAM_NAME)


async def _start_download(pilot):
    wiz = wizard(pilot.app)
    await download(pilot)
    await wait_for(pilot, lambda: wiz.pull_task is not None and wiz.pull_task.last is not None
                   and wiz.pull_task.last.done >= STALL, what="the stall")
    await pilot.pause(0.2)


async def _fixed_progress(pilot):
    wiz = wizard(pilot.app)
    total = len(model_bytes())
    wiz.show_progress(Progress(phase="downloading", name=DREAM[1], done=STALL, total=total, speed=2.5 * 2**20,
                               eta=(total - STALL) / (2.5 * 2**20), resumed_from=0,
                               message="the connection was reset; retrying in 2 s (attempt 2 of 5)"))
    await pilot.pause()


async def _pause_download(pilot):
    wiz = wizard(pilot.app)
    await press(pilot, "#wiz-cancel")
    await wait_for(pilot, lambda: wiz.download_state == "paused")


def test_welcome(snap_compare, env):
    assert snap_compare(make_app(None), terminal_size=SIZE, run_before=_steps())


def test_hardware(snap_compare, env):
    assert snap_compare(make_app(None), terminal_size=SIZE, run_before=_steps(_to_hardware))


def test_model_choice(snap_compare, env):
    assert snap_compare(make_app(None), terminal_size=SIZE, run_before=_steps(_to_models))


def test_downloading(snap_compare, env, hub):
    hub.add_file(*DREAM, model_bytes()).stall_at = STALL
    assert snap_compare(make_app(None), terminal_size=SIZE,
                        run_before=_steps(_to_dream, _start_download, _fixed_progress))


def test_download_paused(snap_compare, env, hub):
    hub.add_file(*DREAM, model_bytes()).stall_at = STALL
    assert snap_compare(make_app(None), terminal_size=SIZE,
                        run_before=_steps(_to_dream, _start_download, _pause_download))


def test_download_failed(snap_compare, env, hub):
    hub.add_file(DREAM[0], "another-file.gguf", b"x" * 100)

    async def failed(pilot):
        wiz = wizard(pilot.app)
        await download(pilot)
        await wait_for(pilot, lambda: wiz.download_state == "failed")

    assert snap_compare(make_app(None), terminal_size=SIZE, run_before=_steps(_to_dream, failed))


def test_no_network_connection(snap_compare, env, monkeypatch):
    """The hub refuses the connection: "No network connection", and the bundled model is offered."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{sock.getsockname()[1]}")

    async def failed(pilot):
        wiz = wizard(pilot.app)
        await download(pilot)
        await wait_for(pilot, lambda: wiz.download_state == "failed")

    assert snap_compare(make_app(None), terminal_size=SIZE, run_before=_steps(_to_dream, failed))


def test_token_prompt(snap_compare, env, hub):
    hub.add_file(*DREAM, model_bytes())
    hub.gate(DREAM[0], "hf_right_token")

    async def asked(pilot):
        from dgchat.app.token_modal import TokenModal

        await download(pilot)
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, TokenModal))

    assert snap_compare(make_app(None), terminal_size=SIZE, run_before=_steps(_to_dream, asked))


def _bundled_test_held_at_step_3(monkeypatch):
    """The ready step's test answer on the bundled model, held at its third denoising step (every
    model load is wrapped in a GatedEngine): a run_before step after the model step."""
    held: list[GatedEngine] = []

    def load(path, **kwargs):
        from dgchat.model_backend.loader import load_engine

        held.append(GatedEngine(load_engine(path, **kwargs), hold_at=3))
        return held[-1]

    monkeypatch.setattr(app_session, "load_engine", load)

    async def bundled_and_hold(pilot):
        wiz = wizard(pilot.app)
        await press(pilot, "#wiz-bundled")
        await wait_for(pilot, lambda: held and held[0].holding.is_set(), what="the held step")
        await wait_for(pilot, lambda: wiz.canvas is not None and wiz.canvas.event is not None
                       and wiz.canvas.event.step == 3, what="the canvas at step 3")
        wiz.canvas.replan()
        await pilot.pause()

    return bundled_and_hold


def test_ready_live_test_generation(snap_compare, env, monkeypatch):
    assert snap_compare(make_app(None), terminal_size=SIZE,
                        run_before=_steps(_to_models, _bundled_test_held_at_step_3(monkeypatch)))


def test_models_screen(snap_compare, env):
    (env / "config" / "config.toml").write_text(FAST_SAMPLER, encoding="utf-8")

    async def open_models(pilot):
        from dgchat.app.models_screen import ModelsScreen

        app = pilot.app
        await wait_for(pilot, lambda: app.session.engine is not None and app.session.loading_path is None)
        await pilot.press("f4")
        await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen) and bool(app.screen.rows))
        await pilot.pause()

    assert snap_compare(make_app(None), terminal_size=SIZE, run_before=_steps(open_models))


# -- the speed of this machine, and small terminals (issue 29) -----------------------------------

SMALL = [(80, 24), (60, 20)]
SMALL_IDS = ["80x24", "60x20"]


@pytest.mark.parametrize("size", SMALL, ids=SMALL_IDS)
def test_hardware_small(snap_compare, env, size):
    """The machine page at 80x24 and 60x20: the GPU-offload note whole, the buttons on screen."""
    assert snap_compare(make_app(None), terminal_size=size, run_before=_steps(_to_hardware))


@pytest.mark.parametrize("size", SMALL, ids=SMALL_IDS)
def test_model_choice_small(snap_compare, env, size):
    """The model step at 80x24 and 60x20, Dream selected: too slow here, its answer time, Download."""
    assert snap_compare(make_app(None), terminal_size=size, run_before=_steps(_to_dream))


def test_the_question_before_a_download(snap_compare, env):
    """Download asks first: size, disk, free disk, answer time (the Models screen's question)."""
    async def ask(pilot):
        from dgchat.app.confirm_modal import ConfirmModal

        await press(pilot, "#wiz-next")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, ConfirmModal))

    assert snap_compare(make_app(None), terminal_size=(60, 20), run_before=_steps(_to_dream, ask))


def test_hardware_with_a_gpu_this_build_cannot_use(snap_compare, env, monkeypatch):
    """A GPU is present, this engine build is CPU-only: the note and the exact rebuild command, at 80x24."""
    from dataclasses import replace

    from dgchat.app import model_ops
    from dgchat.hub.hardware import GpuInfo
    from fixtures.wizard_harness import GIB, fixed_hardware

    def with_gpu(models_dir=None, **kwargs):
        gpu = GpuInfo(name="NVIDIA GeForce RTX 4090", vram_total=24 * GIB, vram_free=23 * GIB, kind="nvidia")
        return replace(fixed_hardware(models_dir, **kwargs), gpus=(gpu,), vram_total=24 * GIB, vram_free=23 * GIB)

    monkeypatch.setattr(model_ops, "detect_hardware", with_gpu)
    assert snap_compare(make_app(None), terminal_size=(80, 24), run_before=_steps(_to_hardware))


# -- issue 43: every step readable at 60x20 (and 80x24) ---------------------------------------------


def test_model_choice_run_again_60x20(snap_compare, env):
    """Run again (Close joins the buttons), the bundled model selected: the bar read `Bundled mod`;
    the buttons take shorter words where the short labels do not fit."""
    async def run_again_bundled(pilot):
        wiz = wizard(pilot.app)
        wiz.rerun = True  # as after "setup: run again"
        await to_model_step(pilot, select="dgchat-tiny-plays")

    assert snap_compare(make_app(None), terminal_size=(60, 20), run_before=_steps(run_again_bundled))


def test_no_network_connection_60x20(snap_compare, env, monkeypatch):
    """The failed download at 60x20: the heading says it was not downloaded (it said "Downloading …"),
    the repository and the models folder break after a '/', the three buttons whole."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{sock.getsockname()[1]}")

    async def failed(pilot):
        wiz = wizard(pilot.app)
        await download(pilot)
        await wait_for(pilot, lambda: wiz.download_state == "failed")

    assert snap_compare(make_app(None), terminal_size=(60, 20), run_before=_steps(_to_dream, failed))


@pytest.mark.parametrize("size", SMALL, ids=SMALL_IDS)
def test_ready_small(snap_compare, env, monkeypatch, size):
    """The ready step at 80x24 and 60x20 with the bundled model (the download step marked skipped,
    not done), the test held at step 3: the question whole, the path broken after a '/'."""
    assert snap_compare(make_app(None), terminal_size=size,
                        run_before=_steps(_to_models, _bundled_test_held_at_step_3(monkeypatch)))
