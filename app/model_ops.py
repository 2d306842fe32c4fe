"""What the first-run wizard and the Models screen share: the model manager and the machine, one
hub call at a time in a worker thread with progress, the words for progress, fits, answer times and
errors, the question before a download, the token dialog, and saving the default model to the
config file.

This machine's speed (dgchat.hub.machine_profile) is read with the hardware in the detection
worker; when it was never measured for this engine build, `start_profile_task` measures it once in
another worker (a few seconds, then saved), so neither screen waits for it: the list shows answer
times when the profile arrives. The predictions themselves come from the hub (ModelRow.speed).

Hub calls (pull, import, verify, storing a token) block and may take minutes, so they run in a
thread worker. Their progress callback is called in that thread; `HubTask` throttles it to ten
reports a second (plus every phase change) and hands each to the UI thread with
`App.call_from_thread`. The task's cancel event pauses a download (the partial file is kept and the
next pull resumes it); closing the task (the screen goes away) also stops the hand-over, so a
worker never waits on a UI that is shutting down.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dgchat.app.confirm_modal import ConfirmModal
from dgchat.app.paths import atomic_write_text, short_path
from dgchat.app.widgets.steady_cursor import steady_cursors_when_headless
from dgchat.config import ConfigError
from dgchat.hub import (
    DiskFullError,
    DownloadCancelled,
    DownloadError,
    Hardware,
    ModelManager,
    NoNetworkError,
    NotFoundOnHubError,
    Progress,
    TokenRequiredError,
    VerificationError,
    detect_hardware,
    machine_profile,
    store_token,
)
from dgchat.hub.fit import TOO_SLOW, Fit, FitEstimate
from dgchat.hub.machine_profile import MachineProfile
from dgchat.hub.manager import ModelRow, PullResult
from dgchat.hub.util import format_bytes
from dgchat.model_backend.errors import DgchatError
from dgchat.terminal_text import safe_message
from dgchat.toml_files import TomlFileError, parse_toml, read_regular_file
from dgchat.toml_write import toml_string
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widget import Widget
from textual.widgets import Button, DataTable, Input, Label, ProgressBar, Static

PROGRESS_EVERY = 0.1  # seconds between progress hand-overs to the UI (phase changes always go through)

WHERE = {
    "installed": "installed",
    "bundled": "bundled",
    "in HF cache": "HF cache",
    "available": "download",
    "missing": "missing",
}


# -- the model manager and the machine ------------------------------------------------------------


def make_manager() -> ModelManager:
    """The model manager with dgchat's folders and the shipped catalog (the hub from $HF_ENDPOINT)."""
    return ModelManager()


def machine(models_dir: Path) -> Hardware:
    """This machine as the user last described it: detection plus the saved corrections."""
    return detect_hardware(models_dir)


def machine_as_detected(models_dir: Path) -> Hardware:
    return detect_hardware(models_dir, apply_saved=False)


def saved_profile(threads: int | None) -> MachineProfile | None:
    """This machine's speed as measured before (the user cache folder), or None when it never was
    for this engine build and thread count. Reads a file and loads the engine library, so it runs
    in the detection worker, never on the UI thread."""
    try:
        return machine_profile.cached_profile(threads)
    except (DgchatError, OSError):  # no engine: measuring says why, in words
        return None


def machine_and_profile(models_dir: Path, threads: int | None, *,
                        as_detected: bool = False) -> tuple[Hardware, MachineProfile | None]:
    """What the detection worker returns: the machine, and its saved speed profile if any (one
    worker, so a screen lays out its list once, with answer times when they are known)."""
    hw = machine_as_detected(models_dir) if as_detected else machine(models_dir)
    return hw, saved_profile(threads)


MEASURING = "Measuring how fast this machine runs models…"


def measuring_text(fraction: float, what: str) -> str:
    """'Measuring how fast this machine runs models… matrix products, q4_k — 40 %'"""
    return f"{MEASURING} {what} — {round(100 * max(0.0, min(1.0, fraction)))}\u00a0%"  # no break before %


def start_profile_task(node: Widget, threads: int | None, *, progress: Callable[[float, str], None],
                       done: Callable[[MachineProfile], None], failed: Callable[[BaseException], None]) -> HubTask:
    """Measure this machine's speed with the engine (dgchat.hub.machine_profile.ensure_profile: a few
    seconds, saved for every later start) in a thread worker of `node`; `progress(fraction, what)`,
    `done(profile)` and `failed(exc)` run on the UI thread. Closing the task stops the measurement
    (ProfileCancelled; nothing is saved)."""

    def call(on_progress: Callable[[Progress], None], cancel: threading.Event) -> MachineProfile:
        # each part measured is its own "phase", so HubTask's throttle never drops a change of what
        def report(fraction: float, what: str) -> None:
            on_progress(Progress(phase=what, name=what, done=round(1000 * fraction), total=1000))

        return machine_profile.ensure_profile(threads, progress=report, cancel=cancel)

    return start_hub_task(node, "measure-machine", call, progress=lambda p: progress(p.done / 1000, p.phase),
                          done=done, failed=failed)


# -- words -----------------------------------------------------------------------------------------
# Sizes are binary units everywhere (hub.util.format_bytes: KiB, MiB, GiB); fmt_size adds "≈" to an
# approximate one. Nothing on these screens formats a size any other way.


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        m, s = divmod(s, 60)
        return f"{m} min {s:02d} s" if m < 10 else f"{m} min"
    h, rest = divmod(s, 3600)
    return f"{h} h {rest // 60:02d} min"


def fmt_size(size: int, exact: bool = True) -> str:
    return format_bytes(size) if exact else "≈" + format_bytes(size)


def where_text(row: ModelRow) -> str:
    if row.status == "partial" and row.partial is not None:
        frac = row.partial.fraction
        return f"paused {100 * frac:.0f}%" if frac is not None else "paused"
    return WHERE.get(row.status, row.status)


BUNDLED_BADGE = "bundled · no download"
# a badge in three lengths: the full words, for a medium-width table, for a narrow one
BADGES: dict[Fit | str, tuple[str, str, str]] = {
    Fit.VRAM: ("fits in VRAM", "fits in VRAM", "in VRAM"),
    Fit.RAM: ("fits in RAM", "fits in RAM", "in RAM"),
    Fit.NONE: ("will not fit", "will not fit", "too big"),
    Fit.UNKNOWN: ("fit unknown", "fit unknown", "unknown"),
    "bundled": (BUNDLED_BADGE, "no download", "bundled"),
    TOO_SLOW: (TOO_SLOW, TOO_SLOW, "too slow"),
}
NO_DISK = ("; not enough disk", "; no disk", "; no disk")
# "too slow here" in its own colour: not red (it would run), not yellow (it fits, and that is not the point)
FIT_STYLES: dict[Fit | str, str] = {Fit.VRAM: "bold green", Fit.RAM: "yellow", Fit.NONE: "red", Fit.UNKNOWN: "dim",
                                    TOO_SLOW: "medium_purple1"}


def fit_text(fit: FitEstimate | None, *, bundled: bool = False, length: int = 0, too_slow: bool = False) -> str:
    """The fit badge; `length` 0 full words, 1 medium, 2 narrow. The bundled model ships with
    dgchat and is tiny: its badge says that rather than where it would run. A model that fits but
    answers slower than the limit (`too_slow`) is "too slow here" whatever it is."""
    if too_slow and fit is not None:
        return BADGES[TOO_SLOW][length] + (NO_DISK[length] if fit.disk_ok is False else "")
    if bundled and (fit is None or fit.fit is not Fit.NONE):
        return BADGES["bundled"][length]
    if fit is None:
        return BADGES[Fit.UNKNOWN][length]
    return BADGES[fit.fit][length] + (NO_DISK[length] if fit.disk_ok is False else "")


def is_too_slow(row: ModelRow) -> bool:
    """The hub's verdict (ModelRow.badge): it fits, but answers slower than the limit."""
    return row.badge == TOO_SLOW


def row_badge(row: ModelRow, length: int = 0) -> str:
    return fit_text(row.fit, bundled=is_bundled(row), length=length, too_slow=is_too_slow(row))


def row_style(row: ModelRow) -> str:
    if is_too_slow(row):
        return FIT_STYLES[TOO_SLOW]
    if row.fit is None or is_bundled(row):
        return "dim"
    return FIT_STYLES.get(row.fit.fit, "")


def answer_text(row: ModelRow, *, with_gpu: bool = True) -> str:
    """The Answer column: the predicted time of a 256-token answer ("~3 s", "~13 min"), and with
    `with_gpu`, where a GPU is here that this engine build cannot use, the time after rebuilding
    ("~13 min · GPU ~1 s"); "-" where there is no prediction (it does not fit, or no profile)."""
    speed = row.speed
    if speed is None:
        return "-"
    text = speed.short()
    if with_gpu and speed.after_rebuild is not None:
        text += f" · GPU {speed.after_rebuild.per_answer()}"
    return text


def is_bundled(row: ModelRow) -> bool:
    return row.entry is not None and row.entry.bundled


def fit_title(title: str, width: int) -> str:
    """`title` in at most `width` characters; a cut keeps a short tail after the last ", " (the
    quantization: "DiffusionGemma 26B-…, Q4_K_M"), so rows that differ only there stay apart."""
    if len(title) <= width:
        return title
    if width < 2:
        return title[:width]
    _head, sep, tail = title.rpartition(", ")
    if sep and len(tail) + 2 <= width // 2:
        suffix = sep + tail
        return title[:width - len(suffix) - 1].rstrip() + "…" + suffix
    return title[:width - 1].rstrip() + "…"


# -- the table of models (wizard and Models screen) --------------------------------------------

CELL_PADDING = 1  # DataTable's default, on each side of each column


def fill_model_table(table: DataTable, rows: list[ModelRow], marks: list[str], width: int, *,
                     visible_rows: int) -> None:
    """(Re)build `table` for `width` columns of room: the mark, the title, size, where, the fit
    badge and, when this machine's speed is known, the predicted answer time. As room shrinks the
    answer loses its after-a-GPU-rebuild part, the badge words get shorter, then the Where column
    goes (the detail below the table says both), then the titles are cut (keeping the
    quantization). `visible_rows`: the rows the table's height shows (beyond them a 1-column
    scrollbar appears)."""
    sizes = [fmt_size(r.size, r.size_exact) for r in rows]
    wheres = [where_text(r) for r in rows]
    with_answer = any(r.speed is not None for r in rows)
    longest_title = max((len(r.title) for r in rows), default=5)
    scrollbar = 1 if len(rows) > visible_rows else 0
    room = width - scrollbar

    def layout(length: int, with_where: bool, with_gpu: bool) -> tuple[int, str]:
        fit_label = "Fit for this machine" if length == 0 else "Fit"
        badges = [len(row_badge(r, length)) for r in rows]
        cols = [1, max([len("Size"), *map(len, sizes)]), max([len(fit_label), *badges])]
        if with_where:
            cols.append(max([len("Where"), *map(len, wheres)]))
        if with_answer:
            cols.append(max([len("Answer"), *(len(answer_text(r, with_gpu=with_gpu)) for r in rows)]))
        used = sum(c + 2 * CELL_PADDING for c in cols) + 2 * CELL_PADDING
        return room - used, fit_label

    steps = ((0, True, True), (1, True, True), (1, True, False), (1, False, False), (2, False, False))
    chosen = steps[-1]
    for step in steps:
        title_room, _ = layout(*step)
        if title_room >= longest_title:
            chosen = step
            break
    length, with_where, with_gpu = chosen
    title_room, fit_label = layout(*chosen)
    title_width = max(8, min(longest_title, title_room))
    table.clear(columns=True)
    table.add_column(" ", key="mark")
    table.add_column("Model", key="model", width=title_width)
    table.add_column("Size", key="size")
    if with_where:
        table.add_column("Where", key="where")
    table.add_column(fit_label, key="fit")
    if with_answer:
        table.add_column("Answer", key="answer")
    for i, row in enumerate(rows):
        # Text, not str: a DataTable reads a str cell as Rich markup, and titles come from file names
        cells: list[Any] = [Text(marks[i]), Text(fit_title(row.title, title_width)), Text(sizes[i])]
        if with_where:
            cells.append(Text(wheres[i]))
        cells.append(Text(row_badge(row, length), style=row_style(row)))
        if with_answer:
            slow = FIT_STYLES[TOO_SLOW] if is_too_slow(row) else ""
            cells.append(Text(answer_text(row, with_gpu=with_gpu), style=slow))
        table.add_row(*cells, key=str(i))


def estimate_text(fit: FitEstimate) -> str:
    """The stated estimate in one line: what it needs, made of what, compared with what."""
    reason = fit.reason
    said = f"needs {format_bytes(fit.need)}"
    if reason.startswith(said):  # the sum is spelled out here already
        reason = reason[len(said):].lstrip(",; ")
    return (f"needs about {format_bytes(fit.need)} = file {format_bytes(fit.weights)} + KV cache "
            f"{format_bytes(fit.kv_cache)} for {fit.context} tokens + overhead {format_bytes(fit.overhead)}"
            + (f"; {reason}" if reason else ""))


def speed_lines(row: ModelRow, no_speed: str = "") -> list[str]:
    """The prediction in words (dgchat.hub.fit.SpeedVerdict.text), what it is based on, the limit
    when it is too slow, and the command that lets a GPU here run it. Without a prediction for a
    model that fits, `no_speed` says why (not measured yet, the measurement failed)."""
    speed = row.speed
    if speed is None:
        fits = row.fit is not None and row.fit.fit in (Fit.VRAM, Fit.RAM)
        return [f"Speed: {no_speed}"] if fits and no_speed else []
    lines = [f"Speed: {speed.text()}"]
    basis = ("predicted from this machine's measured speed" if speed.prediction.basis == "measured"
             else f"predicted: {speed.prediction.basis}")
    if speed.after_rebuild is not None:
        basis += f"; the GPU time {speed.after_rebuild.basis}"
    lines.append(basis[0].upper() + basis[1:] + ".")
    if speed.too_slow:
        lines.append(f"Too slow here: over the {speed.limit_s:.0f} s a 256-token answer may take "
                     "(answer_seconds_limit in the config).")
    if speed.rebuild is not None:
        lines.append(f"To use your GPU, rebuild the engine (in dgchat's source folder): {speed.rebuild}")
    return lines


def row_details(row: ModelRow, hw: Hardware | None = None, *, resume_word: str = "Pull", no_speed: str = "") -> str:
    """What a person needs to choose this row: what it is, where it comes from, will it fit, how
    fast it answers here. `resume_word`: what the screen calls getting the model (the Models
    screen's Pull); `no_speed`: why there is no answer time (see speed_lines)."""
    lines = [f"{row.title} — {row_badge(row)}" + ("  ★ recommended" if row.recommended else "")]
    if row.description:
        lines.append(row.description)
    if row.fit is not None:
        lines.append("Memory: " + estimate_text(row.fit))
    lines.extend(speed_lines(row, no_speed))
    if row.status in ("installed", "bundled") and row.path is not None:
        lines.append(f"On this machine: {short_path(row.path)}")
    elif row.status == "in HF cache":
        lines.append("Found in your Hugging Face cache: used from there, no download"
                     + (" (converted once)" if row.needs_convert else "") + f"; {resume_word} adds it.")
    elif row.status in ("available", "partial") and row.entry is not None:
        disk = row.fit.disk_need if row.fit is not None else row.size
        free = f" ({format_bytes(hw.disk_free)} free)" if hw is not None and hw.disk_free is not None else ""
        where = short_path(hw.models_dir) if hw is not None else "the models folder"
        entry = row.entry
        if entry.checkpoint:
            lines.append(f"Download: {entry.repo}, a checkpoint of {len(entry.files)} files, "
                         f"{fmt_size(entry.checkpoint_size, False)}; converted and quantized to {entry.quant} here "
                         f"({fmt_size(row.size, row.size_exact)}); needs {format_bytes(disk)} of disk at once (the "
                         f"checkpoint, the unquantized file, the result) in {where}{free}.")
        else:
            lines.append(f"Download: {entry.repo} · {entry.filename}, {fmt_size(row.size, row.size_exact)}"
                         + (", converted once after the download" if row.needs_convert else "")
                         + f"; needs {format_bytes(disk)} of disk in {where}{free}.")
        if row.partial is not None:
            lines.append(f"A paused download holds {format_bytes(row.partial.done)}"
                         + (f" of {format_bytes(row.partial.total)}" if row.partial.total else "")
                         + f"; {resume_word} continues it from there.")
    lines.extend(row.notes)
    return "\n".join(lines)


def downloads(row: ModelRow) -> bool:
    """Whether getting this row goes online (a catalog file that is not on this machine yet)."""
    return row.entry is not None and not row.entry.bundled and row.status in ("available", "partial", "missing")


def download_question(row: ModelRow, hw: Hardware | None, models_dir: Path, *, no_speed: str = "") -> str:
    """The question before a download: the model, how much comes over the network, the disk, and
    how fast it will answer here (`no_speed`: why that is not known)."""
    assert row.entry is not None
    partial = row.partial
    if partial is not None and partial.total and row.entry.checkpoint and partial.done >= partial.total:
        amount = (f"nothing to download: the verified checkpoint ({format_bytes(partial.total)}) is converted and "
                  f"quantized to {row.entry.quant} again")
    elif partial is not None and partial.total:
        left = max(partial.total - partial.done, 0)
        amount = (f"{format_bytes(left)} still to download (a paused download holds "
                  f"{format_bytes(partial.done)} of {format_bytes(partial.total)})")
    elif row.entry.checkpoint:
        amount = (f"{fmt_size(row.entry.checkpoint_size, False)} to download (a checkpoint of "
                  f"{len(row.entry.files)} files, converted and quantized to {row.entry.quant} here: "
                  f"{fmt_size(row.size, row.size_exact)})")
    else:
        amount = f"{fmt_size(row.size, row.size_exact)} to download"
    need = row.fit.disk_need if row.fit is not None else row.size * (2 if row.needs_convert else 1)
    free = (f"{format_bytes(hw.disk_free)} free" if hw is not None and hw.disk_free is not None
            else "free space unknown")
    convert = " (the download and its converted copy)" if row.needs_convert else ""
    if row.entry.checkpoint:
        convert = " at once (the checkpoint, the unquantized file the conversion writes first, the result)"
    speed = row.speed
    if speed is not None:
        answers = f"Answers here: {speed.text()}" + ("; too slow here" if speed.too_slow else "") + "."
    elif row.fit is not None and row.fit.fit is Fit.NONE:
        answers = "Answers here: not predicted, it will not fit in memory."
    else:
        answers = f"Answers here: {no_speed or 'unknown'}."
    return (f"{row.title}: {amount} from the Hugging Face hub ({row.entry.repo}).\n"
            f"Disk: needs {format_bytes(need)}{convert} in {short_path(models_dir)}; {free} there.\n"
            + answers)


def download_confirm(row: ModelRow, hw: Hardware | None, models_dir: Path, *, then_use: bool = False,
                     no_speed: str = "") -> ConfirmModal:
    """The question the wizard and the Models screen ask before anything is downloaded."""
    title = "Download and use this model?" if then_use else "Download this model?"
    # the user has just asked for this download: Enter says yes (Cancel is a Tab or Escape away)
    return ConfirmModal(title, download_question(row, hw, models_dir, no_speed=no_speed),
                        confirm_label="Download", confirm_variant="primary", focus_confirm=True)


PHASES = {
    "resolving": "Asking the hub about the file…",
    "downloading": "Downloading",
    "verifying": "Checking the sha256",
    "converting": "Converting to dgchat's layout",
    "quantizing": "Quantizing",
    "done": "Done",
}


def progress_text(p: Progress) -> str:
    """One line: bytes, speed and time left while downloading; what is being checked or converted."""
    if p.phase == "downloading":
        total = f" of {format_bytes(p.total)}" if p.total else ""
        speed = f" · {format_bytes(p.speed)}/s" if p.speed else ""
        eta = f" · {fmt_duration(p.eta)} left" if p.eta is not None and p.speed else ""
        resumed = f" · resumed at {format_bytes(p.resumed_from)}" if p.resumed_from else ""
        return f"{format_bytes(p.done)}{total}{speed}{eta}{resumed}"
    if p.phase == "verifying":
        return f"sha256 of {p.name}: {format_bytes(p.done)}" + (f" of {format_bytes(p.total)}" if p.total else "")
    if p.phase == "converting":  # the converter reports bytes written
        return f"{format_bytes(p.done)} of {format_bytes(p.total)} written" if p.total else "reading the file…"
    if p.phase == "quantizing":
        return f"tensor {p.done} of {p.total}" if p.total else ""
    if p.phase == "resolving":
        return p.name
    return ""


def pull_summary(result: PullResult) -> str:
    """What happened, and how the file was checked, in a sentence or two."""
    where = short_path(result.path)
    if result.action == "bundled":
        return f"The bundled model: {where}"
    if result.action == "already installed":
        return f"Already installed: {where}"
    model = result.model
    sha = f"sha256 {model.sha256[:16]}…" if model is not None else ""
    if result.action == "from HF cache":
        how = model.verified_by if model is not None else "checked"
        text = f"Taken from your Hugging Face cache without a download; {sha} ({how}). {where}"
    else:
        how = model.verified_by if model is not None and model.verified_by else "checked"
        resumed = ""
        if result.download is not None and result.download.resumed_from:
            resumed = f" Resumed at {format_bytes(result.download.resumed_from)}."
        text = f"Verified: {sha} matches ({how}).{resumed} Saved as {where}"
        ck = result.checkpoint
        if ck is not None:
            resumed = f" Resumed at {format_bytes(ck.resumed_from)}." if ck.resumed_from else ""
            kept = (f"The checkpoint is kept in {short_path(ck.kept)}." if ck.kept is not None
                    else "The checkpoint was deleted after the conversion.")
            text = (f"Converted and quantized to {ck.quantized}: {sha}. The {len(ck.files)} checkpoint files "
                    f"({format_bytes(ck.size)}) matched the hub ({ck.verified_by}).{resumed} {kept} Saved as {where}")
            notes = [n for n in result.notes if n and "kept in" not in n]
            return text + (f"\n{'; '.join(notes)}." if notes else "")
    notes = " ".join(n for n in result.notes if n)
    return text + (f"\n{notes}" if notes else "")


@dataclass(frozen=True)
class Problem:
    title: str
    message: str
    retry: str | None  # label of the button that tries again, or None
    token: bool = False  # a Hugging Face token would help
    offline: bool = False  # the hub could not be reached at all: offer what needs no network


def describe_problem(exc: BaseException) -> Problem:
    """A hub error as the UI shows it: a title, the one-line message, and what can be done."""
    if isinstance(exc, TokenRequiredError):
        return Problem("This model needs a Hugging Face token", str(exc), "Enter a token…", token=True)
    if isinstance(exc, DiskFullError):
        msg = str(exc)
        if exc.resumable and "pull again" not in msg:
            msg += f"; the {format_bytes(exc.bytes_done)} downloaded so far are kept: free some space and retry"
        return Problem("Not enough disk space", msg, "Retry")
    if isinstance(exc, DownloadCancelled):
        return Problem("Paused", str(exc), "Resume")
    if isinstance(exc, NoNetworkError):
        kept = f"; the {format_bytes(exc.bytes_done)} downloaded so far are kept" if exc.resumable else ""
        return Problem("No network connection",
                       f"dgchat could not reach the model hub: {exc.reason}{kept}. Check this machine's network "
                       "connection and retry, or use the bundled model, which needs no download.",
                       "Retry", offline=True)
    if isinstance(exc, VerificationError):
        return Problem("The download did not verify", str(exc), "Download again")
    if isinstance(exc, NotFoundOnHubError):
        return Problem("Not found on the hub", str(exc), "Retry")
    if isinstance(exc, DownloadError):
        return Problem("Download failed", str(exc), "Resume" if exc.resumable else "Retry")
    if isinstance(exc, DgchatError):
        return Problem("That did not work", str(exc), "Retry")
    return Problem("That did not work", f"{type(exc).__name__}: {exc}", "Retry")


# -- one hub call in a worker thread ---------------------------------------------------------------


@dataclass
class HubTask:
    """A running hub call: `stop()` pauses it (cancel event), `close()` also stops UI hand-overs."""

    name: str
    cancel: threading.Event = field(default_factory=threading.Event)
    closing: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    last: Progress | None = None

    @property
    def running(self) -> bool:
        return not self.done.is_set()

    def stop(self) -> None:
        self.cancel.set()

    def close(self) -> None:
        self.closing.set()
        self.cancel.set()


def start_hub_task(
    node: Widget,
    name: str,
    call: Callable[[Callable[[Progress], None], threading.Event], Any],
    *,
    progress: Callable[[Progress], None],
    done: Callable[[Any], None],
    failed: Callable[[BaseException], None],
) -> HubTask:
    """Run `call(on_progress, cancel)` in a thread worker of `node`; its progress, result or error
    reach `progress` / `done` / `failed` on the UI thread."""
    task = HubTask(name)
    app = node.app
    last_sent = [0.0, ""]

    def hand_over(callback: Callable[..., Any], *args: Any) -> None:
        if task.closing.is_set():
            return
        try:
            app.call_from_thread(callback, *args)
        except RuntimeError:  # the app is not running any more
            pass

    def on_progress(p: Progress) -> None:
        task.last = p
        now = time.monotonic()
        if p.phase != last_sent[1] or now - last_sent[0] >= PROGRESS_EVERY or (p.total and p.done >= p.total):
            last_sent[0], last_sent[1] = now, p.phase
            hand_over(progress, p)

    def work() -> None:
        try:
            result = call(on_progress, task.cancel)
        except BaseException as exc:  # noqa: BLE001 - shown to the user, never lost in a thread
            task.done.set()
            hand_over(failed, exc)
        else:
            task.done.set()
            hand_over(done, result)

    node.run_worker(work, thread=True, group="hub", exit_on_error=False, name=name)
    return task


# -- a transfer on screen --------------------------------------------------------------------------


class TransferPanel(Vertical):
    """A pull, import or verification on screen: phase, bar, bytes/speed/time left, the hub's
    messages (retries), then the result or the problem."""

    DEFAULT_CSS = """
    TransferPanel { height: auto; }
    TransferPanel > .tp--phase { text-style: bold; }
    TransferPanel > ProgressBar { margin: 0 0 0 0; }
    TransferPanel > ProgressBar > Bar { width: 1fr; }
    TransferPanel > .tp--message { color: $text-muted; }
    TransferPanel > .tp--result { color: $success; }
    TransferPanel > .tp--error { color: $error; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.active = False

    def compose(self) -> ComposeResult:
        yield Label("", classes="tp--phase", markup=False)
        yield ProgressBar(total=100, show_eta=False)
        yield Static("", classes="tp--status", markup=False)
        yield Static("", classes="tp--message", markup=False)
        yield Static("", classes="tp--result", markup=False)
        yield Static("", classes="tp--error", markup=False)

    def _set(self, cls: str, text: str) -> None:
        widget = self.query_one(f".{cls}")
        # the hub's messages and problems quote what a server said: by the terminal rule
        widget.update(safe_message(text, 4000))  # type: ignore[attr-defined]
        widget.display = bool(text)  # no blank lines between what is said

    def _bar(self, done: int | None, total: int | None) -> None:
        bar = self.query_one(ProgressBar)
        if total:
            bar.update(total=total, progress=min(done or 0, total))
        else:
            bar.update(total=100, progress=0)

    def start(self, phase: str, done: int = 0, total: int | None = None) -> None:
        self.active = True
        self._set("tp--phase", phase)
        self._bar(done, total)
        for cls in ("tp--status", "tp--message", "tp--result", "tp--error"):
            self._set(cls, "")

    def show(self, p: Progress) -> None:
        if not self.active:
            return
        self._set("tp--phase", PHASES.get(p.phase, p.phase))
        if p.total:
            self._bar(p.done, p.total)
        self._set("tp--status", progress_text(p))
        if p.message:
            self._set("tp--message", p.message)

    def stopping(self) -> None:
        self._set("tp--phase", "Stopping…")

    def paused(self, exc: DownloadCancelled, resume_word: str = "Resume") -> None:
        """`resume_word`: the button that continues it on this screen."""
        self.active = False
        self._set("tp--phase", "Paused")
        self._set("tp--message", "")
        if exc.bytes_total:
            self._bar(exc.bytes_done, exc.bytes_total)
            self._set("tp--status", f"Paused at {format_bytes(exc.bytes_done)} of {format_bytes(exc.bytes_total)}. "
                                    f"The partial file is kept: {resume_word} continues from there, also after "
                                    "quitting dgchat.")
        else:
            self._set("tp--status", str(exc))

    def finished(self, text: str) -> None:
        self.active = False
        self._set("tp--phase", "Done")
        self._bar(1, 1)
        self._set("tp--status", "")
        self._set("tp--message", "")
        self._set("tp--result", "✓ " + text)

    def failed(self, problem: Problem) -> None:
        self.active = False
        self._set("tp--phase", problem.title)
        self._set("tp--status", "")
        self._set("tp--error", problem.message)

    @property
    def phase_text(self) -> str:
        return str(self.query_one(".tp--phase", Label).render())

    def text(self, cls: str) -> str:
        return str(self.query_one(f".tp--{cls}", Static).render())


# -- the token dialog ------------------------------------------------------------------------------


class TokenModal(ModalScreen[bool]):
    """Ask for a Hugging Face access token for a gated repo, check it with the hub and store it in
    the hub's own token storage (dgchat.hub.store_token). Dismisses with True once stored."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="dialog.cancel")]

    def __init__(self, repo: str, message: str, had_token: bool) -> None:
        super().__init__(classes="dialog-screen")
        self.repo = repo
        self.message = message
        self.had_token = had_token
        self._store_task: HubTask | None = None

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog -wide", id="token-dialog"):
            yield Label("Hugging Face token", classes="dialog--title")
            yield Static(self.message, markup=False, classes="dialog--body", id="token-why")
            yield Static(
                f"1. Open https://huggingface.co/{self.repo} and accept the licence (once).\n"
                "2. Create a read token at https://huggingface.co/settings/tokens and paste it below.\n"
                "It is checked with the hub and kept in the hub's own token file (~/.cache/huggingface), "
                "where every Hugging Face tool finds it.",
                markup=False, classes="dialog--help",
            )
            yield Input(placeholder="hf_…", password=True, id="token-value")
            yield Label("", id="token-error", classes="dialog--error", markup=False)
            with Horizontal(classes="dialog--buttons"):
                yield Button("Save token and retry", variant="primary", id="ok")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        steady_cursors_when_headless(self)
        self.query_one(Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._submit()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "ok":
            self._submit()
        else:
            self.action_cancel()

    def _submit(self) -> None:
        if self._store_task is not None and self._store_task.running:
            return
        token = self.query_one(Input).value.strip()
        error = self.query_one("#token-error", Label)
        if not token:
            error.update("paste a token first")
            return
        error.update("Checking the token with the hub…")
        self.query_one("#ok", Button).disabled = True

        def call(_progress: Callable[[Progress], None], _cancel: threading.Event) -> Any:
            return store_token(token)

        self._store_task = start_hub_task(self, "store-token", call, progress=lambda p: None,
                                    done=self._stored, failed=self._rejected)

    def _stored(self, _info: Any) -> None:
        self.dismiss(True)

    def _rejected(self, exc: BaseException) -> None:
        self.query_one("#token-error", Label).update(str(exc) if isinstance(exc, DgchatError) else
                                                     f"{type(exc).__name__}: {exc}")
        self.query_one("#ok", Button).disabled = False
        self.query_one(Input).focus()

    def action_cancel(self) -> None:
        if self._store_task is not None:
            self._store_task.close()
        self.dismiss(False)


# -- the config file -------------------------------------------------------------------------------

_TABLE_RE = re.compile(r"^\s*\[")
_DEFAULT_RE = re.compile(r"^\s*default_model\s*=")
CONFIG_HEADER = (
    "# dgchat settings; every key is optional (docs/APP.md lists them all).\n"
    "# Written by the first-run setup; edit freely.\n"
)


def _config_lines(config_path: Path) -> list[str]:
    """The config file's lines, each ending in a newline (a new file's header when there is none),
    for the edits below that keep comments and everything they do not touch."""
    try:  # a regular file of bounded size (a FIFO would block the app)
        old = read_regular_file(config_path).decode("utf-8")
    except TomlFileError as exc:
        if exc.kind != "missing":
            raise ConfigError(f"{config_path}: {exc}") from None
        old = CONFIG_HEADER
    except UnicodeDecodeError:
        raise ConfigError(f"{config_path}: not UTF-8 text") from None
    lines = old.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    return lines


def save_default_model(config_path: Path, model_path: Path | str | None) -> None:
    """Set (or with None remove) `default_model` in the config file, keeping everything else as it
    is (comments, other keys, tables); creates the file if there is none. Atomic."""
    config_path = Path(config_path)
    lines = _config_lines(config_path)
    first_table = next((i for i, line in enumerate(lines) if _TABLE_RE.match(line)), len(lines))
    kept = [line for i, line in enumerate(lines) if i >= first_table or not _DEFAULT_RE.match(line)]
    first_table -= len(lines) - len(kept)
    if model_path is not None:
        # after the leading comments and keys, before the first [table] (keys there would belong to it)
        kept.insert(first_table, f"default_model = {toml_string(str(model_path))}\n")
    text = "".join(kept)
    try:
        parsed = parse_toml(text)
    except TomlFileError as exc:
        raise ConfigError(f"{config_path}: {exc}, so default_model was not written") from None
    if parsed.get("default_model") != (str(model_path) if model_path is not None else None):
        raise ConfigError(f"{config_path}: default_model could not be set (a multi-line value?); edit it by hand")
    atomic_write_text(config_path, text)


_SERVER_TABLE_RE = re.compile(r"^\s*\[\s*server\s*\]\s*(#.*)?$")
_SERVER_KEY_RE = re.compile(r"^\s*(url|api_key|\"url\"|\"api_key\")\s*=")
_KEY_LINE_RE = re.compile(r"^\s*[A-Za-z0-9_\"'-]+\s*=")


def save_server(config_path: Path, url: str | None, api_key: str | None = None) -> None:
    """Set the `[server]` table's url (and api_key when given; an api_key already there is removed
    otherwise, so a key meant for another server is never sent to this one), or with url None
    remove both. Everything else in the file stays as it is (comments, other keys and tables);
    creates the file if there is none. Atomic."""
    config_path = Path(config_path)
    lines = _config_lines(config_path)
    header = next((i for i, line in enumerate(lines) if _SERVER_TABLE_RE.match(line)), None)
    if header is not None:
        end = next((i for i in range(header + 1, len(lines)) if _TABLE_RE.match(lines[i])), len(lines))
        body = [line for line in lines[header + 1:end] if not _SERVER_KEY_RE.match(line)]
        new_keys = []
        if url is not None:
            new_keys.append(f"url = {toml_string(url)}\n")
            if api_key:
                new_keys.append(f"api_key = {toml_string(api_key)}\n")
        if new_keys or any(_KEY_LINE_RE.match(line) for line in body):
            lines[header:end] = [lines[header], *new_keys, *body]
        else:  # nothing left in the table: the header goes too (its comments stay)
            lines[header:end] = body
    elif url is not None:
        if lines and lines[-1].strip():
            lines.append("\n")
        lines.append("[server]\n")
        lines.append(f"url = {toml_string(url)}\n")
        if api_key:
            lines.append(f"api_key = {toml_string(api_key)}\n")
    wanted_key = api_key if url is not None and api_key else None
    _write_config(config_path, "".join(lines), "server", "url", "[server]",
                  lambda table: table.get("url") == url and table.get("api_key") == wanted_key)


_ENGINE_TABLE_RE = re.compile(r"^\s*\[\s*engine\s*\]\s*(#.*)?$")
_PRECISE_KEY_RE = re.compile(r"^\s*(precise|\"precise\")\s*=")


def save_precise(config_path: Path, precise: bool) -> None:
    """Set `[engine] precise` (exact mode: f32 KV cache, no flash attention), keeping everything
    else as it is; creates the table, or the file, if there is none. Atomic."""
    config_path = Path(config_path)
    lines = _config_lines(config_path)
    line = f"precise = {'true' if precise else 'false'}\n"
    header = next((i for i, text in enumerate(lines) if _ENGINE_TABLE_RE.match(text)), None)
    if header is not None:
        end = next((i for i in range(header + 1, len(lines)) if _TABLE_RE.match(lines[i])), len(lines))
        body = [text for text in lines[header + 1:end] if not _PRECISE_KEY_RE.match(text)]
        lines[header:end] = [lines[header], line, *body]
    else:
        if lines and lines[-1].strip():
            lines.append("\n")
        lines += ["[engine]\n", line]
    _write_config(config_path, "".join(lines), "engine", "precise", "[engine] precise",
                  lambda table: table.get("precise") is precise)


def _write_config(config_path: Path, text: str, table_name: str, key: str, what: str,
                  took: Callable[[dict], bool]) -> None:
    """Write the edited config.toml once it parses and `took` finds the edit in it, atomically and
    0600 as every settings file (it may hold a key); else a ConfigError and the file unchanged."""
    try:
        parsed = parse_toml(text)
    except TomlFileError as exc:
        raise ConfigError(f"{config_path}: {exc}, so {what} was not written") from None
    table = parsed.get(table_name) if isinstance(parsed.get(table_name), dict) else {}
    if not took(table):
        raise ConfigError(f"{config_path}: {what} could not be set (is it written another way, such as "
                          f"{table_name}.{key} = …?); edit it by hand")
    atomic_write_text(config_path, text)
