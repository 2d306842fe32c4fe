"""The wizard's machine step: cores, RAM, free disk, GPU offload and VRAM (dgchat.hub.detect_hardware),
and this machine's speed (dgchat.hub.machine_profile).

Every value can be corrected and the correction is kept (hardware.toml); Enter in a field goes on
(the screen turns it into Next). "Detect again" forgets the corrections. A GPU this engine build
cannot use is named, with the command that rebuilds the engine for it.

The saved speed profile comes with the hardware (one detection worker). Without one, it is measured
as soon as this step has the hardware, in its own worker, with its progress shown: the wizard stays
usable, the model step lists models by memory until the profile arrives (each change reaches it as
messages.SpeedChanged), and closing the wizard stops the measurement (nothing half-measured is saved).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from dgchat.app import model_ops
from dgchat.app.hub_task import HubTask, start_hub_task
from dgchat.app.model_ops import describe_problem
from dgchat.app.paths import short_path
from dgchat.app.widgets.path_text import PathText
from dgchat.app.widgets.tick_box import TickBox
from dgchat.app.wizard.messages import GoToStep, NavChanged, SpeedChanged
from dgchat.app.wizard.speed import SpeedReport
from dgchat.app.wizard.step import NavPlan
from dgchat.hub import (
    Hardware,
    HubError,
    clear_hardware_overrides,
    load_hardware_overrides,
    save_hardware_overrides,
)
from dgchat.hub.hardware import rebuild_command
from dgchat.hub.machine_profile import MachineProfile, ProfileCancelled
from dgchat.hub.util import format_bytes
from textual.app import ComposeResult
from textual.containers import Grid, VerticalScroll
from textual.widget import Widget
from textual.widgets import Checkbox, Input, Label, Static

# hardware field -> (label, input id)
HW_FIELDS = (
    ("cpu_cores", "CPU cores", "hw-cores"),
    ("ram_total", "RAM", "hw-ram"),
    ("disk_free", "Free disk", "hw-disk"),
    ("vram_total", "GPU memory", "hw-vram"),
)
HW_LABEL_WIDTH = (14, 12)  # #hw-grid's first column (below NARROW columns): the speed rows line up with it


def _size_text(value: int | None) -> str:
    return format_bytes(value) if value is not None else ""


class HardwareStep(VerticalScroll):
    """Step 2: the detected machine, correctable, and its measured speed."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(id="step-hardware", classes="wiz-step", **kwargs)
        self.hw: Hardware | None = None
        self.detecting = False
        self.speed = SpeedReport()
        self.profile_task: HubTask | None = None
        self._shown: dict[str, str] = {}  # the text each field was filled with (a change is a correction)
        self._models_dir: Path | None = None  # where models go (the catalog's): its disk is the one measured
        self._catalog_error = ""

    def compose(self) -> ComposeResult:
        yield Label("This machine", classes="wiz--h1")
        yield Static("Detected automatically. If something is wrong, correct it here: the model "
                     "suggestions are based on these numbers, and your corrections are kept.",
                     markup=False, classes="wiz--text")
        with Grid(id="hw-grid"):
            for key, label, wid in HW_FIELDS:
                yield Label(label, classes="hw--label")
                yield Input("", id=wid, compact=True, placeholder="unknown, e.g. 8G"
                            if key != "cpu_cores" else "unknown")
                yield Label("", id=f"{wid}-note", classes="hw--note", markup=False)
            yield Label("GPU offload", classes="hw--label")
            yield TickBox("offloads", id="hw-offload", compact=True)
            yield Label("", id="hw-offload-note", classes="hw--note", markup=False)
        # a GPU this engine build cannot use: what to run (the whole width: it is long)
        yield Static("", id="hw-offload-help", markup=False)
        yield Static("", id="hw-speed", markup=False)
        yield Static("", id="hw-notes", classes="wiz--muted", markup=False)
        yield Static("", id="hw-error", classes="wiz--error", markup=False)

    # -- the screen's hooks ---------------------------------------------------------------------
    def enter(self, models_dir: Path | None, catalog_error: str) -> None:
        """The step shows: the machine is detected the first time. `models_dir`: None when the
        catalog could not be read (`catalog_error` says why)."""
        self._models_dir, self._catalog_error = models_dir, catalog_error
        if self.hw is None and not self.detecting:
            self._detect()

    def nav_plan(self) -> NavPlan:
        return NavPlan(shown=frozenset({"wiz-back", "wiz-redetect"}),
                       next_enabled=self.hw is not None and not self.detecting)

    def focus_target(self) -> Widget | None:
        return self.query_one("#hw-cores", Input)

    def next(self) -> None:
        if self.apply():
            self.post_message(GoToStep("model"))

    # -- detection ------------------------------------------------------------------------------
    def _detect(self, *, as_detected: bool = False) -> None:
        if self._models_dir is None:  # opened at this step with a catalog that could not be read
            self.query_one("#hw-error", Static).update(self._catalog_error or "The model catalog could not be read.")
            return
        self.detecting = True
        self.query_one("#hw-notes", Static).update("Looking at this machine…")
        models_dir = self._models_dir
        threads = self.app.config.n_threads

        def call(_progress: Any, _cancel: threading.Event) -> tuple[Hardware, MachineProfile | None]:
            return model_ops.machine_and_profile(models_dir, threads, as_detected=as_detected)

        start_hub_task(self, "detect-hardware", call, progress=lambda p: None, done=self._detected,
                       failed=self._detect_failed)
        self.post_message(NavChanged())

    def redetect(self) -> None:
        """Forget the saved corrections and look at the machine again."""
        try:
            clear_hardware_overrides()
        except OSError as exc:
            self.query_one("#hw-error", Static).update(f"could not remove the saved corrections: {exc}")
        self._detect(as_detected=True)

    def _detected(self, result: tuple[Hardware, MachineProfile | None]) -> None:
        hw, profile = result
        self.detecting = False
        self.hw = hw
        if profile is not None and self.speed.profile is None:
            self._set_speed(SpeedReport(profile, "ready"))
        self._fill(hw)
        self.ensure_profile()
        self.post_message(NavChanged())
        if self.display:  # the current step (the ContentSwitcher shows only that one)
            self.query_one("#hw-cores", Input).focus()

    def _detect_failed(self, exc: BaseException) -> None:
        self.detecting = False
        self.query_one("#hw-error", Static).update(describe_problem(exc).message)
        self.post_message(NavChanged())

    def _fill(self, hw: Hardware) -> None:
        values = {
            "cpu_cores": str(hw.cpu_cores) if hw.cpu_cores is not None else "",
            "ram_total": _size_text(hw.ram_total),
            "disk_free": _size_text(hw.disk_free),
            "vram_total": _size_text(hw.vram_total),
        }
        for key, _label, wid in HW_FIELDS:
            self.query_one(f"#{wid}", Input).value = values[key]
        self._shown = values
        self.query_one("#hw-cores-note", Label).update("CPUs dgchat may use")
        self.query_one("#hw-ram-note", Label).update(
            f"{format_bytes(hw.ram_available)} free now" if hw.ram_available is not None else "")
        self.query_one("#hw-disk-note", Label).update(PathText(f"in {short_path(hw.models_dir)}"))
        if hw.gpus:
            names = ", ".join(g.name for g in hw.gpus)
            free = f", {format_bytes(hw.vram_free)} free" if hw.vram_free is not None else ""
            vram_note = f"{names}{free}" + (" (unified memory)" if hw.unified_memory else "")
        else:
            vram_note = "no GPU found" if hw.vram_total is None else ""
        self.query_one("#hw-vram-note", Label).update(vram_note)
        box = self.query_one("#hw-offload", Checkbox)
        box.value = hw.gpu_offload
        unused_gpu = hw.gpus[0] if hw.gpus and not hw.gpu_offload else None
        if hw.gpu_offload:
            offload = "this engine build offloads layers to the GPU"
        elif unused_gpu is not None:
            offload = "CPU only: this engine build cannot use the GPU"
        else:
            offload = "CPU only: this engine build does not offload to a GPU"
        self.query_one("#hw-offload-note", Label).update(offload)
        help_ = self.query_one("#hw-offload-help", Static)
        help_.display = unused_gpu is not None
        notes = list(hw.notes)
        if unused_gpu is not None:
            help_.update(f"{unused_gpu.name} is here, but this engine build runs models on the CPU only. To let "
                         f"dgchat use the GPU, rebuild the engine in dgchat's source folder:\n"
                         f"{rebuild_command(unused_gpu.kind)}")
            notes = [n for n in notes if not n.startswith("gpu_offload:")]  # the same, said above
        self.query_one("#hw-notes", Static).update("\n".join(notes))
        self.query_one("#hw-error", Static).update("")
        self.show_speed()

    def apply(self) -> bool:
        """Take the user's corrections (saved for next time); False with a message on a bad value."""
        assert self.hw is not None
        error = self.query_one("#hw-error", Static)
        changes: dict[str, Any] = {}
        for key, label, wid in HW_FIELDS:
            text = self.query_one(f"#{wid}", Input).value.strip()
            if text == self._shown.get(key, ""):
                continue
            if not text:
                error.update(f"{label}: enter a value (e.g. 16G), or press Detect again")
                self.query_one(f"#{wid}", Input).focus()
                return False
            changes[key] = text
        offload = self.query_one("#hw-offload", Checkbox).value
        if offload != self.hw.gpu_offload:
            changes["gpu_offload"] = offload
        if not changes:
            error.update("")
            return True
        try:
            hw = self.hw.with_overrides(**changes)
            saved = load_hardware_overrides()
        except HubError as exc:
            error.update(str(exc).replace("hardware override: ", ""))
            return False
        saved.update({k: getattr(hw, k) for k in changes})
        try:
            save_hardware_overrides(saved)
        except (HubError, OSError) as exc:
            error.update(f"the correction is used now but could not be saved: {exc}")
        self.hw = hw
        self._fill(hw)
        return True

    # -- this machine's speed -------------------------------------------------------------------
    def ensure_profile(self) -> SpeedReport:
        """Start measuring unless there is a profile, no hardware yet, a failed measurement or one
        running; returns the report as it is now (the model step lists models by it)."""
        if self.speed.profile is not None or self.hw is None or self.speed.state == "failed":
            return self.speed
        if self.profile_task is not None and self.profile_task.running:
            return self.speed
        self.profile_task = model_ops.start_profile_task(
            self, self.app.config.n_threads, progress=self._measuring, done=self._measured,
            failed=self._measure_failed)
        self._set_speed(SpeedReport(None, "measuring", self.speed.error, (0.0, "starting")))
        return self.speed

    def stop_measuring(self) -> None:
        """Measuring beside the model test would skew both: stopped (nothing saved; measured next time)."""
        if self.profile_task is not None and self.profile_task.running:
            self.profile_task.close()
            self.profile_task = None
            self._set_speed(SpeedReport(self.speed.profile, "stopped", self.speed.error, self.speed.progress))

    def _measuring(self, fraction: float, what: str) -> None:
        self._set_speed(SpeedReport(self.speed.profile, self.speed.state, self.speed.error, (fraction, what)))

    def _measured(self, profile: MachineProfile) -> None:
        self.profile_task = None
        self._set_speed(SpeedReport(profile, "ready", self.speed.error, self.speed.progress), settled=True)

    def _measure_failed(self, exc: BaseException) -> None:
        self.profile_task = None
        if isinstance(exc, ProfileCancelled):
            report = SpeedReport(self.speed.profile, "stopped", self.speed.error, self.speed.progress)
        else:
            report = SpeedReport(self.speed.profile, "failed", describe_problem(exc).message, self.speed.progress)
        self._set_speed(report, settled=True)

    def _set_speed(self, report: SpeedReport, *, settled: bool = False) -> None:
        self.speed = report
        self.show_speed()
        self.post_message(SpeedChanged(report, settled=settled))

    def show_speed(self) -> None:
        """The speed rows (dgchat.hub.machine_profile.summary) or the measurement's progress; the
        labels' width follows the grid's first column, narrower on a narrow terminal."""
        narrow = self.screen.has_class("-narrow")
        self.query_one("#hw-speed", Static).update(self.speed.rows(HW_LABEL_WIDTH[narrow]))

    def on_unmount(self) -> None:
        if self.profile_task is not None:  # stops the measurement; nothing half-measured is saved
            self.profile_task.close()
