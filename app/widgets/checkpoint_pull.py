"""A checkpoint install on screen (the wizard's download step, the Models screen): two bars.

A catalog entry that names a Hugging Face checkpoint (dgchat.hub.checkpoint) is downloaded, then
converted and quantized here. `PullPanel` is the screens' TransferPanel with a second section for
that: the first bar follows the download (the whole checkpoint's bytes, the file being fetched, each
file's hash check), the second the conversion (bytes of the unquantized GGUF written, then llama.cpp
quantizing tensor by tensor, then the result's hash). For any other pull the second section stays
hidden and the panel is the TransferPanel it always was.

A failure or a pause in either phase is one line under the bars, and says what is kept: the
partial download (Resume continues it) or the verified download (Resume converts it again, no
download). `KeepCheckpointConfirm` is the question before such a download, with a tick box to keep
the checkpoint after converting it.
"""

from __future__ import annotations

from typing import Any

from pathlib import Path

from dgchat.app import model_ops
from dgchat.app.confirm_modal import ConfirmModal
from dgchat.app.model_ops import PHASES, Problem, progress_text
from dgchat.app.widgets.tick_box import TickBox
from dgchat.app.widgets.transfer_panel import TransferPanel
from dgchat.hub import DownloadCancelled, Hardware, Progress
from dgchat.hub.catalog import CatalogEntry
from dgchat.hub.manager import ModelRow
from dgchat.hub.util import format_bytes
from dgchat.terminal_text import safe_message
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Checkbox, Label, ProgressBar, Static

CONVERT_PHASES = ("converting", "quantizing")


def conversion_label(entry: CatalogEntry | None) -> str | None:
    """The second bar's title for a checkpoint entry ("Convert and quantize to Q4_K_M"), else None."""
    if entry is None or not entry.checkpoint:
        return None
    return f"Convert and quantize to {entry.quant}"


class PullPanel(TransferPanel):
    """TransferPanel plus the conversion's bar (shown for a checkpoint entry: `stages(label)`)."""

    DEFAULT_CSS = """
    PullPanel > .cp--convert { height: auto; margin-top: 1; }
    PullPanel > .cp--convert > .cp--phase { text-style: bold; }
    PullPanel > .cp--convert.-waiting > .cp--phase { text-style: none; color: $text-muted; }
    PullPanel > .cp--convert > ProgressBar > Bar { width: 1fr; }
    PullPanel > .cp--convert > .cp--status { color: $text-muted; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.convert_label: str | None = None
        self.converting = False  # the download is done and verified; the second phase runs

    def compose(self) -> ComposeResult:
        # TransferPanel's parts, with the conversion's section before the result and the problem
        yield Label("", classes="tp--phase", markup=False)
        yield ProgressBar(total=100, show_eta=False, classes="cp--download-bar")
        yield Static("", classes="tp--status", markup=False)
        yield Static("", classes="tp--message", markup=False)
        with Vertical(classes="cp--convert -waiting"):
            yield Label("", classes="cp--phase", markup=False)
            yield ProgressBar(total=100, show_eta=False, classes="cp--convert-bar")
            yield Static("", classes="cp--status", markup=False)
        yield Static("", classes="tp--result", markup=False)
        yield Static("", classes="tp--error", markup=False)

    def on_mount(self) -> None:
        self.query_one(".cp--convert").display = False

    # -- what the screens call ----------------------------------------------------------------------

    def stages(self, convert_label: str | None) -> None:
        """Before `start`: a checkpoint's conversion gets the second bar (None: a plain pull)."""
        self.convert_label = convert_label
        self.converting = False
        section = self.query_one(".cp--convert")
        section.display = convert_label is not None
        section.add_class("-waiting")
        self._cv("cp--phase", f"2 · {convert_label} (after the download)" if convert_label else "")
        self._cv("cp--status", "")
        self._cv_bar(0, None)

    def start(self, phase: str, done: int = 0, total: int | None = None) -> None:
        super().start(phase, done, total)
        if self.convert_label is not None:
            self.converting = False
            self.query_one(".cp--convert").add_class("-waiting")
            self._cv("cp--phase", f"2 · {self.convert_label} (after the download)")
            self._cv("cp--status", "")
            self._cv_bar(0, None)

    def show(self, p: Progress) -> None:
        if self.convert_label is None:
            super().show(p)
            return
        if not self.active:
            return
        if p.phase in CONVERT_PHASES or (self.converting and p.phase in ("verifying", "done")):
            self._show_conversion(p)
            return
        super().show(p)
        self._set("tp--phase", "1 · " + PHASES.get(p.phase, p.phase) + (" the checkpoint" if p.phase in (
            "downloading",) else ""))
        if p.phase == "resolving" and p.total:
            self._set("tp--status", f"asking the hub about file {min(p.done + 1, p.total)} of {p.total}: {p.name}")
        elif p.phase == "downloading":
            self._set("tp--status", f"{progress_text(p)} · {p.name}")
        elif p.phase == "verifying":
            self._set("tp--status", f"checking {p.name}: {format_bytes(p.done)}"
                                    + (f" of {format_bytes(p.total)}" if p.total else ""))

    def _show_conversion(self, p: Progress) -> None:
        if not self.converting:
            self.converting = True
            self._set("tp--phase", "1 · Downloaded and verified")
            self._set("tp--message", "")
            bar = self.query_one(".cp--download-bar", ProgressBar)
            bar.update(total=bar.total or 1, progress=bar.total or 1)
            self.query_one(".cp--convert").remove_class("-waiting")
        label = self.convert_label or ""
        if p.phase == "converting":
            self._cv("cp--phase", f"2 · {label}: writing the GGUF")
            self._cv("cp--status", f"{format_bytes(p.done)} of {format_bytes(p.total)} written" if p.total
                     else "reading the checkpoint…")
        elif p.phase == "quantizing":
            self._cv("cp--phase", f"2 · {label}: quantizing")
            self._cv("cp--status", f"tensor {p.done} of {p.total} (llama.cpp's quantizer; it cannot be paused, "
                                   "Cancel takes effect when it ends)")
        elif p.phase == "verifying":
            self._cv("cp--phase", f"2 · {label}: checking the result")
            self._cv("cp--status", f"sha256: {format_bytes(p.done)}" + (f" of {format_bytes(p.total)}" if p.total
                                                                         else ""))
        if p.total:
            self._cv_bar(p.done, p.total)

    def paused(self, exc: DownloadCancelled, resume_word: str = "Resume") -> None:
        if self.convert_label is not None and self.converting:
            self.active = False
            self._cv("cp--phase", f"2 · {self.convert_label}: paused")
            self._cv("cp--status", f"The verified download is kept: {resume_word} converts it again, without "
                                   "downloading, also after quitting dgchat.")
            return
        super().paused(exc, resume_word)

    def finished(self, text: str) -> None:
        if self.convert_label is not None:
            self.converting = True
            self.query_one(".cp--convert").remove_class("-waiting")
            self._cv("cp--phase", f"2 · {self.convert_label}: done")
            self._cv("cp--status", "")
            self._cv_bar(1, 1)
        super().finished(text)
        if self.convert_label is not None:
            self._set("tp--phase", "1 · Downloaded and verified")

    def failed(self, problem: Problem) -> None:
        if self.convert_label is not None and self.converting:
            # the download is done: the problem belongs to the second phase, under its bar
            self.active = False
            self._cv("cp--phase", f"2 · {self.convert_label}: {problem.title.lower()}")
            self._cv("cp--status", "")
            self._set("tp--error", problem.message)
            return
        super().failed(problem)

    # -- the second section ---------------------------------------------------------------------

    def _cv(self, cls: str, text: str) -> None:
        widget = self.query_one(f".cp--convert > .{cls}")
        widget.update(safe_message(text, 4000))  # type: ignore[attr-defined]

    def _cv_bar(self, done: int, total: int | None) -> None:
        bar = self.query_one(".cp--convert-bar", ProgressBar)
        bar.update(total=total or 100, progress=min(done, total) if total else 0)

    def conversion_text(self, part: str = "phase") -> str:
        """The second section's title ("phase") or status line ("status"), for tests and screens."""
        return str(self.query_one(f".cp--convert > .cp--{part}").render())

    def bars(self) -> tuple[float, float]:
        """(download, conversion) progress as fractions, for tests."""
        out = []
        for cls in ("cp--download-bar", "cp--convert-bar"):
            bar = self.query_one(f".{cls}", ProgressBar)
            out.append((bar.progress / bar.total) if bar.total else 0.0)
        return out[0], out[1]


class KeepCheckpointConfirm(ConfirmModal):
    """The download question for a checkpoint entry, with a tick box: keep the checkpoint after
    converting it (`keep` once answered; default off, the checkpoint is deleted)."""

    def __init__(self, title: str, message: str, keep_size: int) -> None:
        super().__init__(title, message, confirm_label="Download", confirm_variant="primary", focus_confirm=True)
        self.keep = False
        self.keep_size = keep_size

    def on_mount(self) -> None:
        dialog = self.query_one(".dialog")
        box = TickBox(f"Keep the checkpoint after converting it ({format_bytes(self.keep_size)} more on disk)",
                       id="keep-checkpoint", value=False, compact=True)
        dialog.mount(box, before=dialog.query_one(".dialog--buttons"))
        super().on_mount()

    def on_checkbox_changed(self, event: Checkbox.Changed) -> None:
        event.stop()
        self.keep = event.value


def download_confirm(row: ModelRow, hw: Hardware | None, models_dir: Path, *, then_use: bool = False,
                     no_speed: str = "") -> ConfirmModal:
    """model_ops.download_confirm, with the keep-the-checkpoint tick box for a checkpoint entry (its
    answer: the modal's `keep`, read by the screen when the question is answered)."""
    if row.entry is None or not row.entry.checkpoint:
        return model_ops.download_confirm(row, hw, models_dir, then_use=then_use, no_speed=no_speed)
    title = "Download and use this model?" if then_use else "Download this model?"
    return KeepCheckpointConfirm(title, model_ops.download_question(row, hw, models_dir, no_speed=no_speed),
                                 row.entry.checkpoint_size)


def keep_answer(modal: ConfirmModal) -> bool:
    """Whether the user ticked "keep the checkpoint" in the question (False for any other question)."""
    return bool(getattr(modal, "keep", False))
