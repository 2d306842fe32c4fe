"""A checkpoint entry in the first-run wizard and the Models screen under Pilot: a tiny real checkpoint
on the local stand-in hub is downloaded, converted and quantized (the real converter and llama.cpp's
quantizer) with a bar for each phase, then loaded, tested and used in the chat; a failure in either
phase is one line and loses nothing (the download is kept, Retry converts without downloading)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from dgchat.app import model_ops
from dgchat.app.models_screen import ModelsScreen
from dgchat.app.widgets.checkpoint_pull import KeepCheckpointConfirm, PullPanel
from dgchat.config import load_config
from dgchat.convert.errors import ConvertError
from dgchat.hub import checkpoint as hub_checkpoint
from dgchat.hub import download as dl
from dgchat.hub.catalog import load_catalog
from dgchat.hub.manager import ModelManager
from dgchat.model_backend.gguf_file import read_gguf_header
from fixtures import checkpoint_hub as ck
from fixtures.app_harness import FAST_SAMPLER, make_app, type_text, wait_for, wait_idle, wait_model
from fixtures.wizard_harness import SIZE, first_run_home, panel_text, press, to_model_step

pytest.importorskip("tokenizers")

GGUF = "tiny-llada-checkpoint-Q4_K_M.gguf"


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hub, hf_home, base: Path) -> Path:
    """A first-run home whose catalog has the checkpoint entry, served by the local hub."""
    monkeypatch.setattr(dl, "PROGRESS_INTERVAL", 0.0)
    home = first_run_home(tmp_path, monkeypatch, hub=hub)
    ck.host(hub, base)
    catalog = ck.write_catalog(tmp_path / "catalog.toml", base)
    monkeypatch.setattr(model_ops, "make_manager", lambda: ModelManager(catalog=load_catalog(catalog)))
    return home


class Gate:
    """Holds the conversion after its first tensor (in the worker thread) until released, so a test
    sees the second bar mid-way; `fail_once` makes the first conversion fail instead."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, fail_once: bool = False) -> None:
        self.reached = threading.Event()
        self.release = threading.Event()
        self.calls = 0
        real = hub_checkpoint.convert

        def gated(source, out, *args, progress=None, **kwargs):
            self.calls += 1
            if fail_once and self.calls == 1:
                raise ConvertError(f"{source.name}: the converter stopped (a fault of this test)")

            def on_write(done, total, tensor):
                if not self.reached.is_set():
                    time.sleep(0.15)  # past the UI's 0.1 s throttle: this report reaches the screen
                progress(done, total, tensor)
                if not self.reached.is_set():
                    self.reached.set()
                    self.release.wait(30)

            return real(source, out, *args, progress=on_write, **kwargs)

        monkeypatch.setattr(hub_checkpoint, "convert", gated)


async def test_wizard_downloads_converts_and_quantizes_with_two_bars(env: Path, hub, base: Path, monkeypatch):
    shard = ck.weight_names(base)[1]
    hub.files[(ck.REPO, shard)].stall_at = 1_000_000
    gate = Gate(monkeypatch)
    app = make_app(None)
    async with app.run_test(size=SIZE) as pilot:
        wiz = await to_model_step(pilot, select=ck.NAME)
        detail = str(wiz.query_one("#model-detail").render())
        assert f"Download: {ck.REPO}, a checkpoint of 6 files" in detail
        assert "converted and quantized to Q4_K_M here" in detail and "needs" in detail
        assert wiz.query_one("#wiz-next").label.plain == "Download"
        await press(pilot, "#wiz-next")
        await wait_for(pilot, lambda: isinstance(app.screen, KeepCheckpointConfirm), what="the question")
        body = str(app.screen.query_one(".dialog--body").render())
        assert "to download (a checkpoint of 6 files, converted and quantized to Q4_K_M here" in body
        assert "at once (the checkpoint, the unquantized file the conversion writes first, the result)" in body
        assert "Keep the checkpoint after converting it" in str(app.screen.query_one("#keep-checkpoint").label)
        await press(pilot, "#yes")  # not kept: the default

        panel = wiz.query_one("#dl-panel", PullPanel)
        # phase 1: the download's bar moves, the conversion's waits
        await wait_for(pilot, lambda: hub.stalled.is_set() and panel.bars()[0] > 0.3, what="the download bar")
        await pilot.pause()
        assert panel.phase_text == "1 · Downloading the checkpoint"
        assert shard in panel_text(wiz, "status") and " of 6.0 MiB" in panel_text(wiz, "status")
        assert panel.bars()[1] == 0
        assert panel.conversion_text() == "2 · Convert and quantize to Q4_K_M (after the download)"
        assert wiz.query_one("#wiz-cancel").display
        hub.files[(ck.REPO, shard)].stall_at = None
        hub.release_stall.set()
        # phase 2: the download is done and verified, the conversion's bar moves
        await wait_for(pilot, lambda: gate.reached.is_set() and panel.bars()[1] > 0, what="the conversion bar")
        await pilot.pause()
        assert panel.bars()[0] == 1.0 and 0 < panel.bars()[1] < 1
        assert panel.phase_text == "1 · Downloaded and verified"
        assert panel.conversion_text() == "2 · Convert and quantize to Q4_K_M: writing the GGUF"
        assert " written" in panel.conversion_text("status")
        gate.release.set()
        await wait_for(pilot, lambda: wiz.download_state == "done", timeout=60, what="the conversion")
        await pilot.pause()
        assert panel.bars() == (1.0, 1.0)
        assert panel.conversion_text() == "2 · Convert and quantize to Q4_K_M: done"
        result = panel_text(wiz, "result")
        assert "Converted and quantized to Q4_K_M: sha256 " in result
        assert "The 7 checkpoint files (6.0 MiB) matched the hub" in result and "The checkpoint was deleted after the conversion." in result
        path = env / "data" / "models" / GGUF
        assert wiz.pull_result.path == path and read_gguf_header(path).get("general.file_type") == 15
        assert not (env / "data" / "models" / ".partial" / f"{ck.NAME}.checkpoint").exists()

        await press(pilot, "#wiz-next")
        assert wiz.step == "ready"
        await wait_for(pilot, lambda: wiz.load_state == "loaded", what="the converted model to load")
        await wait_for(pilot, lambda: wiz.generation is None and bool(wiz.query("#ready-text")), timeout=30,
                       what="the test answer")
        await press(pilot, "#wiz-next")  # Start chatting
        await wait_for(pilot, lambda: app.screen is app.chat_screen, what="the chat")
        assert app.session.path == path and load_config().default_model == str(path)
        await type_text(pilot, "hello")
        await pilot.press("enter")
        await wait_idle(pilot)
        messages = app.store.messages(app.chat_screen.chat.id)
        assert [m.role for m in messages] == ["user", "assistant"] and messages[1].status == "done"


async def test_wizard_failures_in_either_phase_lose_nothing(env: Path, hub, base: Path, monkeypatch):
    shard = ck.weight_names(base)[-1]  # fetched last: every other file is verified when it is refused
    hub.files[(ck.REPO, shard)].corrupt_at = 1234
    Gate(monkeypatch, fail_once=True).release.set()
    app = make_app(None)
    async with app.run_test(size=SIZE) as pilot:
        wiz = await to_model_step(pilot, select=ck.NAME)
        await press(pilot, "#wiz-next")
        await wait_for(pilot, lambda: isinstance(app.screen, KeepCheckpointConfirm), what="the question")
        await press(pilot, "#yes")
        panel = wiz.query_one("#dl-panel", PullPanel)
        # a corrupt file: refused and deleted, the other files kept; Download again fetches only it
        await wait_for(pilot, lambda: wiz.download_state == "failed", timeout=30, what="the refused file")
        await pilot.pause()
        assert panel.phase_text == "The download did not verify"
        error = panel_text(wiz, "error")
        assert error.startswith(f"{ck.REPO}: {shard} is corrupt") and "\n" not in error
        assert wiz.query_one("#wiz-retry").label.plain == "Download again"
        hub.files[(ck.REPO, shard)].corrupt_at = None
        before = {n: f.gets for (repo, n), f in hub.files.items() if repo == ck.REPO}
        await press(pilot, "#wiz-retry")
        # the conversion fails (once): one line under the second bar, the verified download kept
        await wait_for(pilot, lambda: wiz.download_state == "failed", timeout=60, what="the failed conversion")
        await pilot.pause()
        assert {n for (repo, n), f in hub.files.items() if repo == ck.REPO and f.gets > before[n]} == {shard}
        assert panel.bars()[0] == 1.0 and panel.phase_text == "1 · Downloaded and verified"
        assert panel.conversion_text() == "2 · Convert and quantize to Q4_K_M: that did not work"
        error = panel_text(wiz, "error")
        assert "the converter stopped" in error and "the verified download (6.0 MiB) is kept" in error
        assert "\n" not in error and wiz.query_one("#wiz-retry").label.plain == "Retry"
        n = len(hub.log)
        await press(pilot, "#wiz-retry")
        await wait_for(pilot, lambda: wiz.download_state == "done", timeout=60, what="the conversion")
        assert len(hub.log) == n  # converted from the kept download: no request
        assert "Converted and quantized to Q4_K_M" in panel_text(wiz, "result")


async def test_models_screen_pulls_a_checkpoint_and_keeps_it(env: Path, hub, monkeypatch):
    (env / "config" / "config.toml").write_text(FAST_SAMPLER, encoding="utf-8")
    app = make_app(None)
    async with app.run_test(size=SIZE) as pilot:
        await wait_model(pilot)
        await pilot.press("f4")
        await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen) and bool(app.screen.rows),
                       what="the Models screen")
        screen = app.screen
        index = next(i for i, r in enumerate(screen.rows) if r.name == ck.NAME)
        screen.query_one("#models-table").move_cursor(row=index)
        await pilot.pause()
        await pilot.press("p")
        await wait_for(pilot, lambda: isinstance(app.screen, KeepCheckpointConfirm), what="the question")
        await pilot.click("#keep-checkpoint")
        await pilot.pause()
        assert app.screen.keep
        await press(pilot, "#yes")
        panel = screen.query_one(PullPanel)
        await wait_for(pilot, lambda: screen.hub_task is None and screen.selected.status == "installed",
                       timeout=60, what="the install")
        await pilot.pause()
        assert panel.bars() == (1.0, 1.0) and panel.conversion_text() == "2 · Convert and quantize to Q4_K_M: done"
        kept = env / "data" / "models" / "checkpoints" / "tiny-llada-checkpoint"
        assert "The checkpoint is kept in ~/dgchat-home/data/models/checkpoints/tiny-llada-checkpoint." \
            in panel_text(screen, "result")
        assert (kept / "config.json").exists()
        path = env / "data" / "models" / GGUF
        await pilot.press("u")
        await wait_for(pilot, lambda: app.screen is app.chat_screen, what="the chat")
        await wait_model(pilot)
        assert app.session.path == path
