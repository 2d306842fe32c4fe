"""`dgchat models`: list, pull, rm, import and verify models (plus login and hardware).

Everything here is a thin layer over dgchat.hub (docs/MODELS.md); only `pull` and `login` use the
network, and only when asked.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
from dataclasses import dataclass
from typing import Any

from dgchat.commands.common import add_common, ctrl_c_cancels
from dgchat.config import load_config
from dgchat.hub import paths
from dgchat.hub.errors import DownloadCancelled, HubError, VerificationError
from dgchat.hub.hardware import (
    clear_hardware_overrides,
    detect_hardware,
    load_hardware_overrides,
    save_hardware_overrides,
)
from dgchat.hub.machine_profile import cached_profile, ensure_profile, summary
from dgchat.hub.manager import ModelManager
from dgchat.hub.tokens import store_token
from dgchat.hub.util import format_bytes, parse_size
from dgchat.model_backend.errors import DgchatError
from dgchat.terminal_text import cli_line


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "models", help="list, download, import, verify and remove models",
        description="Manage models: the catalog (assets/catalog.toml), installed models, and GGUFs already in the "
        "Hugging Face cache. Only `pull` and `login` use the network.",
    )
    add_common(p)
    msub = p.add_subparsers(dest="models_command", metavar="ACTION", parser_class=type(p))
    msub.required = True

    ls = msub.add_parser("list", help="catalog + installed + Hugging Face cache, with fit badges")
    ls.add_argument("--json", action="store_true", help="one JSON object: hardware, models, recommendation")
    ls.add_argument("--no-hf-cache", action="store_true", help="do not look into the Hugging Face cache")
    ls.add_argument("--wide", action="store_true",
                    help="every column (DOWNLOAD, DISK, NEEDS too) however wide the terminal; by default the "
                         "table fits the terminal's width")
    ls.add_argument("--no-measure", action="store_true",
                    help="when this machine's speed was never measured, list without speeds instead of measuring "
                    "(a few seconds, once)")
    _add_hw_flags(ls)

    pull = msub.add_parser("pull", help="download (and convert) a catalog model; resumes a stopped download")
    pull.add_argument("name", help="catalog name (see `dgchat models list`)")
    pull.add_argument("--keep-checkpoint", action="store_true",
                      help="a checkpoint entry: keep the downloaded checkpoint (in <models>/checkpoints/) after "
                      "converting it; default: delete it once the conversion is verified")
    pull.add_argument("--token", help="Hugging Face token for this pull (default: HF_TOKEN or the stored login)")
    pull.add_argument("--no-hf-cache", action="store_true", help="download even if the Hugging Face cache has it")
    pull.add_argument("--retries", type=int, default=5, metavar="N", help="reconnects without progress (default 5)")

    rm = msub.add_parser("rm", help="remove an installed model (deletes only files dgchat downloaded or converted)")
    rm.add_argument("name")
    rm.add_argument("--keep-file", action="store_true", help="forget the model but leave its file")

    imp = msub.add_parser("import", help="register a local GGUF (validated; the file stays where it is)")
    imp.add_argument("path")
    imp.add_argument("--name", help="name to register it under (default: from the file name)")
    imp.add_argument("--convert", action="store_true",
                     help="upstream diffusion-gemma layout: write a converted copy into the models folder")

    ver = msub.add_parser("verify", help="re-hash installed models against the sha256 recorded at install")
    ver.add_argument("names", nargs="*", metavar="NAME", help="default: every installed model")

    login = msub.add_parser("login", help="store a Hugging Face token (for gated repos) in the hub's token storage")
    login.add_argument("--token", help="the token (default: read from standard input, or prompted)")
    login.add_argument("--no-validate", action="store_true", help="store it without asking the hub who it belongs to")

    hw = msub.add_parser("hardware", help="show the detected hardware; correct values the detection got wrong")
    hw.add_argument("--ram", metavar="SIZE", help="total RAM, e.g. 32G")
    hw.add_argument("--vram", metavar="SIZE", help="GPU memory, e.g. 24G (0 for none)")
    hw.add_argument("--cores", type=int, metavar="N", help="CPU cores")
    hw.add_argument("--gpu-offload", choices=("yes", "no"), help="whether llama.cpp offloads to the GPU")
    hw.add_argument("--reset", action="store_true", help="forget every correction")
    hw.add_argument("--measure", action="store_true",
                    help="measure this machine's speed with the engine again (a few seconds; kept for next time)")
    hw.add_argument("--json", action="store_true")


def _add_hw_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("hardware for the fit badges (this run only; `dgchat models hardware` saves them)")
    g.add_argument("--ram", metavar="SIZE", help="assume this much RAM, e.g. 16G")
    g.add_argument("--vram", metavar="SIZE", help="assume a GPU with this much free memory, e.g. 12G, 12GiB or "
                   "8000M (0: none); its speed is estimated as a typical GPU's")
    g.add_argument("--no-gpu", action="store_true", help="assume no GPU offload")


def run(args: argparse.Namespace) -> int:
    handler = {
        "list": _list, "pull": _pull, "rm": _rm, "import": _import, "verify": _verify, "login": _login,
        "hardware": _hardware,
    }[args.models_command]
    return handler(args)


# -- list ---------------------------------------------------------------------------------------------


def _hardware_for(args: argparse.Namespace, models_dir) -> Any:
    hw = detect_hardware(models_dir)
    changes: dict[str, Any] = {}
    if getattr(args, "ram", None):
        changes["ram_total"] = _size_option("--ram", args.ram)
    if getattr(args, "vram", None):
        changes["vram_total"] = _size_option("--vram", args.vram)
        changes["vram_free"] = changes["vram_total"]
        changes["gpu_offload"] = changes["vram_total"] > 0
    if getattr(args, "no_gpu", False):
        changes["gpu_offload"] = False
    return hw.with_overrides(**changes) if changes else hw


def _size_option(flag: str, text: str) -> int:
    """A size option's bytes; a bad one is an error that names the option (exit code 2)."""
    try:
        return parse_size(text)
    except HubError as exc:
        raise HubError(f"{flag}: {exc}") from None


def _config():
    return load_config()


def _profile(*, measure: bool, remeasure: bool = False, threads: int | None = None):
    """The machine profile: the saved one, else (with `measure`) a new measurement, said on stderr."""
    if not remeasure:
        cached = cached_profile(threads)
        if cached is not None or not measure:
            return cached
    sys.stderr.write("measuring this machine's speed with the engine (a few seconds, kept for next time) ...\n")
    with ctrl_c_cancels() as cancel:
        return ensure_profile(threads, remeasure=remeasure, cancel=cancel)


def _list(args: argparse.Namespace) -> int:
    from rich.console import Console

    mgr = ModelManager()
    hw = _hardware_for(args, mgr.models_dir)
    config = _config()
    profile = _profile(measure=not args.no_measure, threads=config.n_threads)
    rows = mgr.listing(hw, include_hf_cache=not args.no_hf_cache, profile=profile,
                       limit_s=config.answer_seconds_limit)
    rec_row = next((r for r in rows if r.recommended), None)
    rec = mgr.recommend(hw, profile=profile, limit_s=config.answer_seconds_limit) if rec_row else None
    if args.json:
        print(json.dumps({"hardware": hw.as_dict(), "recommended": rec_row.name if rec_row else None,
                          "recommendation_reason": rec.reason if rec else None,
                          "answer_seconds_limit": config.answer_seconds_limit,
                          "profile": profile.as_dict() if profile else None,
                          "models": [r.as_dict() for r in rows]},
                         ensure_ascii=False, indent=2))
        return 0
    # the width of the terminal, or of COLUMNS; 80 (a terminal's default) for a pipe without it
    console = Console(highlight=False, soft_wrap=False)
    width = console.width
    for label, value in hw.summary():
        _print_wrapped(console, value, lead=f"{label + ':':<12} ", lead_style="bold")
    for note in hw.notes:
        _print_wrapped(console, note, lead="note: ", style="dim")
    layout = choose_layout(rows, width, wide=args.wide)
    _print_table(console, rows, layout)
    if layout.columns == ALL_COLUMNS:
        _print_wrapped(console, "the model file; DOWNLOAD: what comes over the network (a checkpoint for the "
                       "models converted here); DISK: what the download needs on disk at its peak", lead="SIZE: ")
    else:
        _print_wrapped(console, "the model file. More columns (download, disk, memory): `--wide`", lead="SIZE: ")
    if profile is not None:
        _print_wrapped(console, f"the predicted time of a 256-token answer here ({summary(profile)[0][1]})",
                       lead="ANSWER: ")
        estimated = {r.speed.prediction.basis for r in rows if r.speed and r.speed.prediction.basis != "measured"}
        if layout.gpu_times:
            estimated |= {r.speed.after_rebuild.basis for r in rows if r.speed and r.speed.after_rebuild}
        elif any(r.speed is not None and r.speed.after_rebuild is not None for r in rows):
            _print_wrapped(console, "with this machine's GPU, after rebuilding the engine for it: `--wide`",
                           lead="        ")
        if estimated:
            _print_wrapped(console, f"GPU times are {sorted(estimated)[0]}: this engine build has measured no GPU",
                           lead="        ")
    if any(r.fit is not None and r.fit.placement is not None and r.fit.placement.mode == "experts-in-ram"
           for r in rows):
        _print_wrapped(console, "experts in RAM: every layer on the GPU, the routed experts of some layers in RAM, "
                       "copied to the GPU for each canvas step (`--json`: placement, and the step's parts)",
                       lead="FIT: ")
    else:
        _print_wrapped(console, "not predicted, this machine's speed is not measured (`dgchat models hardware "
                       "--measure`)", lead="ANSWER: ")
    if rec_row is not None and rec is not None:
        lead = "* recommended for this machine: "
        pull = "(installed)" if rec_row.status in ("installed", "bundled") else f"(`dgchat models pull {rec_row.name}`)"
        if len(lead) + len(rec_row.name) + 2 + len(pull) <= width:
            _print_wrapped(console, f"{rec_row.name}  {pull}", lead=lead, text_style=("bold", len(rec_row.name)))
        else:  # the command on a line of its own, whole, so that it can be copied
            _print_wrapped(console, rec_row.name, lead=lead, text_style=("bold", len(rec_row.name)))
            _print_wrapped(console, f"`dgchat models pull {rec_row.name}`", lead="  get it with ")
        _print_wrapped(console, rec.reason, lead="  why: ")
    return 0


# The columns of `models list`. An 80-column terminal (the default) gets NARROW_COLUMNS: what the
# model is, whether it is here, whether it runs here and how long an answer takes (the reason the
# table exists); --wide, or a terminal with room for all of them, adds the rest.
ALL_COLUMNS = ("", "NAME", "SIZE", "DOWNLOAD", "DISK", "STATUS", "FIT", "ANSWER", "NEEDS")
NARROW_COLUMNS = ("", "NAME", "SIZE", "STATUS", "FIT", "ANSWER")
COLUMN_GAP = 2  # spaces between two columns
MIN_NAME_WIDTH = 12  # a name folded narrower than this is harder to read than a line the terminal wraps
# the fit badges in fewer letters (under the FIT header, "in RAM" says what "fits in RAM" does)
SHORT_BADGES = {"fits in VRAM": "in VRAM", "fits with experts in RAM": "experts in RAM", "fits in RAM": "in RAM",
                "too slow here": "too slow", "will not fit": "too big"}
BADGE_STYLES = {"fits in VRAM": "green", "fits with experts in RAM": "green", "fits in RAM": "yellow",
                "too slow here": "magenta", "will not fit": "red"}


@dataclass(frozen=True)
class ListLayout:
    """Which columns `models list` shows, with which words."""

    columns: tuple[str, ...]
    short_badges: bool  # "in RAM" for "fits in RAM"
    gpu_times: bool  # the answer time after a GPU rebuild next to this build's: "~6 min (GPU ~4 s)"


def list_cells(row: Any, layout: ListLayout) -> dict[str, str]:
    """One row of the table, column name -> cell text (row: a hub.manager.ModelRow)."""
    size = format_bytes(row.size) if row.size_exact else f"~{format_bytes(row.size)}"
    download, disk = _download_and_disk(row)
    status = row.status
    if row.partial is not None:
        status = f"partial {100 * row.partial.done / row.partial.total:.0f}%" if row.partial.total else "partial"
    answer = row.speed.short() if row.speed else "-"
    if layout.gpu_times and row.speed is not None and row.speed.after_rebuild is not None:
        answer += f" (GPU {row.speed.after_rebuild.per_answer()})"
    badge = row.badge or "-"
    cells = {"": "*" if row.recommended else "", "NAME": row.name, "SIZE": size, "DOWNLOAD": download,
             "DISK": disk, "STATUS": status, "FIT": SHORT_BADGES.get(badge, badge) if layout.short_badges else badge,
             "ANSWER": answer, "NEEDS": format_bytes(row.fit.need) if row.fit else "-"}
    return {col: cells[col] for col in layout.columns}


def table_width(rows: list[Any], layout: ListLayout) -> int:
    """The columns `layout` needs for `rows`, headers included, nothing cut."""
    lines = [list_cells(r, layout) for r in rows]
    widths = [max([len(col), *(len(cells[col]) for cells in lines)]) for col in layout.columns]
    return sum(widths) + COLUMN_GAP * (len(widths) - 1)


def choose_layout(rows: list[Any], width: int, *, wide: bool = False) -> ListLayout:
    """The fullest layout that fits `width` columns: every column, then the narrow set, with shorter
    badge words, then without the after-a-GPU-rebuild times (the narrowest; past it the terminal
    table folds long names). `wide`: every column, whatever the width."""
    candidates = [ListLayout(ALL_COLUMNS, False, True), ListLayout(NARROW_COLUMNS, False, True),
                  ListLayout(NARROW_COLUMNS, True, True), ListLayout(NARROW_COLUMNS, True, False)]
    if wide:
        return candidates[0]
    return next((c for c in candidates if table_width(rows, c) <= width), candidates[-1])


def _print_table(console: Any, rows: list[Any], layout: ListLayout) -> None:
    """The table in plain columns. To a pipe or a file nothing is cut; on a terminal narrower than
    the table only the names give way, folded onto more lines (not below MIN_NAME_WIDTH): the other
    columns are short and stay whole, the answer time above all."""
    from rich.text import Text

    lines = [list_cells(r, layout) for r in rows]
    widths = {col: max([len(col), *(len(cells[col]) for cells in lines)]) for col in layout.columns}
    if console.is_terminal:
        room = console.width - (table_width(rows, layout) - widths["NAME"])
        if room >= MIN_NAME_WIDTH:  # else the lines are too long anyway (--wide): names stay whole
            widths["NAME"] = min(widths["NAME"], room)
    gap = " " * COLUMN_GAP

    def show(cells: dict[str, str], style: dict[str, str]) -> None:
        name = cells["NAME"]
        parts = [name[i:i + widths["NAME"]] for i in range(0, len(name), widths["NAME"])] or [""]
        for i, part in enumerate(parts):
            line = Text()
            for n, col in enumerate(layout.columns):
                cell = part if col == "NAME" else (cells[col] if i == 0 else "")
                line.append(gap if n else "")
                line.append(cell.ljust(widths[col]), style=style.get(col, ""))
            line.rstrip()
            if console.is_terminal:
                console.print(line, overflow="ignore", crop=False, soft_wrap=True)
            else:
                print(line.plain)

    show({col: col for col in layout.columns}, {col: "bold" for col in layout.columns})
    for row, cells in zip(rows, lines):
        show(cells, {"FIT": BADGE_STYLES.get(row.badge or "", "")})


_NUMBER_AND_UNIT = re.compile(r"(\d) (?=(?:s|min|h|days?|[KMGT]i?B|tokens?(?:/s)?|threads?)\b)")


def _print_wrapped(console: Any, text: str, *, lead: str = "", lead_style: str = "", style: str = "",
                   text_style: tuple[str, int] | None = None) -> None:
    """`lead` + `text`, word-wrapped to the console's width with the lines after the first under the
    text (a path too long for a line is broken). `text_style`: (style, length) of the text's start."""
    from rich.text import Text

    width = max(console.width, len(lead) + 20)
    # a number stays with its unit ("~6 min", "3.3 tokens/s"): a no-break space while wrapping
    glued = _NUMBER_AND_UNIT.sub(lambda m: m.group(1) + "\u00a0", text)
    lines = textwrap.wrap(glued, width, initial_indent=lead, subsequent_indent=" " * len(lead),
                          break_on_hyphens=False) or [lead.rstrip()]
    for i, line in enumerate(line.replace("\u00a0", " ") for line in lines):
        shown = Text(line, style=style)
        if i == 0:
            if lead_style:
                shown.stylize(lead_style, 0, len(lead))
            if text_style is not None:
                shown.stylize(text_style[0], len(lead), len(lead) + text_style[1])
        console.print(shown, overflow="ignore", crop=False, soft_wrap=True)


def _download_and_disk(r: Any) -> tuple[str, str]:
    """The DOWNLOAD and DISK columns: bytes over the network (a checkpoint's, a GGUF's) and disk at
    the peak (checkpoint + unquantized intermediate + result); "-" for a model already here."""
    entry = r.entry
    if entry is None or entry.bundled or r.status in ("installed", "bundled", "in HF cache"):
        return "-", "-"
    exact = r.size_exact if not entry.checkpoint else False
    download = format_bytes(entry.download_size if entry.checkpoint else r.size)
    disk = format_bytes(r.fit.disk_need) if r.fit is not None else "-"
    return (download if exact else f"~{download}"), (f"~{disk}" if disk != "-" and not exact else disk)


# -- pull ---------------------------------------------------------------------------------------------


class _ProgressView:
    """Progress reports -> a rich bar on a terminal, plain lines otherwise."""

    LABELS = {"resolving": "resolving", "downloading": "downloading", "verifying": "verifying sha256",
              "converting": "converting", "quantizing": "quantizing", "done": "done"}

    def __init__(self) -> None:
        from rich.console import Console

        self.console = Console(stderr=True, highlight=False)
        self.live = self.console.is_terminal
        self.bar = None
        self.task = None
        self.tasks: dict[tuple[str, bool], Any] = {}
        self.converted = False  # the conversion has started: a "verifying" now is the result's hash
        self.phase = None
        self.last_message = ""

    def __enter__(self) -> _ProgressView:
        if self.live:
            from rich.progress import BarColumn, Progress, TextColumn

            self.bar = Progress(TextColumn("{task.description:<18}"), BarColumn(), TextColumn("{task.fields[info]}"),
                                console=self.console, transient=False)
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

    def __call__(self, p) -> None:  # p: dgchat.hub.download.Progress
        if p.phase in ("quantizing", "resolving") and p.total:  # tensors, files: counts, not bytes
            info = f"{p.done} / {p.total}" + (f"  {p.name}" if p.phase == "resolving" and p.name else "")
        else:
            info = format_bytes(p.done) + (f" / {format_bytes(p.total)}" if p.total else "")
        if p.phase == "downloading":
            if p.speed:
                info += f"  {format_bytes(p.speed)}/s"
            if p.eta is not None:
                m, s = divmod(int(p.eta), 60)
                h, m = divmod(m, 60)
                info += f"  ETA {h}:{m:02d}:{s:02d}" if h else f"  ETA {m}:{s:02d}"
            if p.resumed_from:
                info += f"  (resumed at {format_bytes(p.resumed_from)})"
        label = self.LABELS.get(p.phase, p.phase)
        if p.phase in ("converting", "quantizing"):
            self.converted = True
        if self.bar is not None:
            # a checkpoint alternates "downloading" and "verifying" file by file: one bar per phase (and
            # per side of the conversion), not one per file; "downloading" is the whole checkpoint's
            # bytes and must not be shown finished between two files
            if p.phase != self.phase and self.task is not None and self.phase != "downloading":
                # a finished phase shows as finished (its last report may have been throttled away)
                task = next(t for t in self.bar.tasks if t.id == self.task)
                counted = self.phase in ("quantizing", "resolving")  # tensors, files
                done = ("ok" if not task.total else f"{int(task.total)} / {int(task.total)}" if counted
                        else format_bytes(task.total))
                self.bar.update(self.task, total=task.total or 1, completed=task.total or 1, info=done)
            if p.phase == "done":
                self.task = None
            elif p.phase != self.phase:
                key = (p.phase, self.converted)
                self.task = self.tasks.get(key)
                if self.task is None:
                    self.task = self.tasks[key] = self.bar.add_task(label, total=p.total or None, info=info)
            if self.task is not None:
                self.bar.update(self.task, completed=p.done, total=p.total or None, info=info)
            if p.message and p.message != self.last_message:
                self.bar.console.print(f"[yellow]{p.message}[/]")
        else:
            if p.phase != self.phase and p.phase != "done":
                self.console.print(f"{label}: {p.name}" + (f" ({info})" if p.phase == "downloading" else ""))
            if p.message and p.message != self.last_message:
                self.console.print(p.message)
        self.phase = p.phase
        self.last_message = p.message or self.last_message


def _with_cancel(fn: Any) -> Any:
    """Run fn(cancel) with Ctrl-C setting `cancel` (a second Ctrl-C interrupts at once)."""
    with ctrl_c_cancels() as cancel:
        return fn(cancel)


def _pull(args: argparse.Namespace) -> int:
    mgr = ModelManager()
    try:
        with _ProgressView() as view:
            res = _with_cancel(lambda cancel: mgr.pull(args.name, token=args.token, progress=view, cancel=cancel,
                                                       use_hf_cache=not args.no_hf_cache, retries=args.retries,
                                                       keep_checkpoint=args.keep_checkpoint))
    except DownloadCancelled as exc:
        sys.stderr.write(f"dgchat: {exc}\n")
        return 130
    for note in res.notes:
        print(f"note: {note}")
    if res.action == "bundled":
        print(f"{args.name} ships with dgchat: {res.path}")
    elif res.action == "already installed":
        print(f"{res.model.name} is already installed: {res.path}")
    else:
        m = res.model
        how = f", checked by {m.verified_by}" if m.verified_by else ""
        print(f"installed {m.name} ({res.action}): {res.path} ({format_bytes(m.size)}, sha256 {m.sha256[:16]}...{how})")
        ck = res.checkpoint
        if ck is not None:
            print(f"checkpoint: {len(ck.files)} files, {format_bytes(ck.size)}"
                  + (f", commit {ck.commit[:12]}" if ck.commit else "")
                  + (f"; kept in {ck.kept}" if ck.kept else "; deleted after the conversion (--keep-checkpoint keeps it)"))
    return 0


# -- rm / import / verify -------------------------------------------------------------------------------


def _rm(args: argparse.Namespace) -> int:
    res = ModelManager().remove(args.name, delete_files=not args.keep_file)
    for path in res.deleted:
        print(f"deleted {path}")
    for path in res.kept:
        print(f"kept {path} (not a file dgchat downloaded)" if not args.keep_file else f"kept {path}")
    if res.partial_removed:
        print(f"removed the partial download of {res.name}")
    print(f"removed {res.name}")
    return 0


def _import(args: argparse.Namespace) -> int:
    with _ProgressView() as view:
        model = _with_cancel(lambda cancel: ModelManager().import_model(
            args.path, name=args.name, convert=args.convert, progress=view, cancel=cancel))
    print(f"imported {model.name}: {model.path} ({model.architecture}, {format_bytes(model.size)}, "
          f"sha256 {model.sha256[:16]}...)")
    return 0


def _verify(args: argparse.Namespace) -> int:
    mgr = ModelManager()
    names = args.names or [m.name for m in mgr.installed()]
    if not names:
        print("no installed models to verify")
        return 0
    bad = 0
    for name in names:
        try:
            with _ProgressView() as view:
                res = _with_cancel(lambda cancel, n=name: mgr.verify(n, progress=view, cancel=cancel))
        except (VerificationError, DgchatError) as exc:
            if len(names) == 1:
                raise
            bad += 1
            cli_line("error", exc)
            continue
        print(f"ok {res.name}: {res.path} (sha256 {res.sha256[:16]}...)")
    if bad:
        sys.stderr.write(f"dgchat: error: {bad} of {len(names)} models failed verification\n")
        return 2
    return 0


# -- login / hardware -----------------------------------------------------------------------------------


def _login(args: argparse.Namespace) -> int:
    token = args.token
    if token is None:
        if sys.stdin is not None and not sys.stdin.isatty():
            token = sys.stdin.readline()
        else:
            import getpass

            token = getpass.getpass("Hugging Face token (input hidden): ")
    info = store_token(token, validate=not args.no_validate)
    who = f" for {info.user}" if info.user else ""
    print(f"token stored{who} as {info.token_name!r} in the Hugging Face token storage")
    return 0


def _hardware(args: argparse.Namespace) -> int:
    if args.reset:
        clear_hardware_overrides()
    changes: dict[str, Any] = {}
    if args.ram:
        changes["ram_total"] = parse_size(args.ram)
    if args.vram:
        changes["vram_total"] = parse_size(args.vram)
    if args.cores is not None:
        changes["cpu_cores"] = args.cores
    if args.gpu_offload:
        changes["gpu_offload"] = args.gpu_offload == "yes"
    if changes:
        saved = load_hardware_overrides()
        saved.update(changes)
        save_hardware_overrides(saved)
    hw = detect_hardware(paths.models_dir())
    threads = _config().n_threads
    profile = _profile(measure=args.measure, remeasure=args.measure, threads=threads)
    if args.json:
        print(json.dumps({**hw.as_dict(), "profile": profile.as_dict() if profile else None}, indent=2))
        return 0
    for label, value in hw.summary():
        print(f"{label + ':':<13} {value}")
    for label, value in summary(profile):
        print(f"{label + ':':<13} {value}")
    for note in hw.notes:
        print(f"note: {note}")
    return 0
