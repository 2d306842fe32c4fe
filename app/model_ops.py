"""What the first-run wizard and the Models screen share: the model manager and the machine, and
the words for progress, fits, answer times and errors, the table of models, the question before a
download. Around it, each in its own module: the hub call in a worker thread (app/hub_task.py), the
transfer on screen (app/widgets/transfer_panel.py), the token dialog (app/token_modal.py), and the
config file's edits (dgchat.config: save_default_model, save_server, save_precise).

This machine's speed (dgchat.hub.machine_profile) is read with the hardware in the detection
worker; when it was never measured for this engine build, `start_profile_task` measures it once in
another worker (a few seconds, then saved), so neither screen waits for it: the list shows answer
times when the profile arrives. The predictions themselves come from the hub (ModelRow.speed).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dgchat.app.confirm_modal import ConfirmModal
from dgchat.app.hub_task import HubTask, start_hub_task
from dgchat.app.paths import short_path
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
)
from dgchat.hub.fit import TOO_SLOW, Fit, FitEstimate
from dgchat.hub.machine_profile import MachineProfile
from dgchat.hub.manager import ModelRow, PullResult
from dgchat.hub.split_speed import split_words
from dgchat.hub.util import format_bytes
from dgchat.model_backend.errors import DgchatError
from rich.text import Text
from textual.widget import Widget
from textual.widgets import DataTable

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
    Fit.EXPERTS_RAM: ("fits with experts in RAM", "experts in RAM", "VRAM+RAM"),
    Fit.RAM: ("fits in RAM", "fits in RAM", "in RAM"),
    Fit.NONE: ("will not fit", "will not fit", "too big"),
    Fit.UNKNOWN: ("fit unknown", "fit unknown", "unknown"),
    "bundled": (BUNDLED_BADGE, "no download", "bundled"),
    TOO_SLOW: (TOO_SLOW, TOO_SLOW, "too slow"),
}
NO_DISK = ("; not enough disk", "; no disk", "; no disk")
# "too slow here" in its own colour: not red (it would run), not yellow (it fits, and that is not the point)
FIT_STYLES: dict[Fit | str, str] = {Fit.VRAM: "bold green", Fit.EXPERTS_RAM: "green", Fit.RAM: "yellow",
                                    Fit.NONE: "red", Fit.UNKNOWN: "dim", TOO_SLOW: "medium_purple1"}


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
        fits = row.fit is not None and row.fit.fits
        return [f"Speed: {no_speed}"] if fits and no_speed else []
    lines = [f"Speed: {speed.text()}"]
    if (split := split_words(speed.prediction)) is not None:  # where a step's time goes, on both routes
        lines.append(split)
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
