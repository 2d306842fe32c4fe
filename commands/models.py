"""`dgchat models`: list, pull, rm, import and verify models (plus login and hardware).

Everything here is a thin layer over dgchat.hub (docs/MODELS.md); only `pull` and `login` use the
network, and only when asked.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from dgchat.commands.common import add_common, ctrl_c_cancels
from dgchat.config import load_config
from dgchat.hub import paths
from dgchat.hub.errors import DownloadCancelled, VerificationError
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
    g.add_argument("--vram", metavar="SIZE", help="assume this much free GPU memory, e.g. 8G")
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
        changes["ram_total"] = parse_size(args.ram)
    if getattr(args, "vram", None):
        changes["vram_total"] = parse_size(args.vram)
        changes["vram_free"] = changes["vram_total"]
        changes["gpu_offload"] = changes["vram_total"] > 0
    if getattr(args, "no_gpu", False):
        changes["gpu_offload"] = False
    return hw.with_overrides(**changes) if changes else hw


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
    from rich.markup import escape
    from rich.table import Table

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
    console = Console(highlight=False, soft_wrap=False)
    for label, value in hw.summary():
        console.print(f"[bold]{label + ':':<12}[/] {escape(value)}", overflow="ignore", crop=False)
    for note in hw.notes:
        console.print(f"[dim]note: {escape(note)}[/]", overflow="ignore", crop=False)
    header = ("", "NAME", "SIZE", "DOWNLOAD", "DISK", "STATUS", "FIT", "ANSWER", "NEEDS")
    lines = []
    for r in rows:
        size = format_bytes(r.size) if r.size_exact else f"~{format_bytes(r.size)}"
        download, disk = _download_and_disk(r)
        status = r.status
        if r.partial is not None:
            status = f"partial {100 * r.partial.done / r.partial.total:.0f}%" if r.partial.total else "partial"
        answer = r.speed.short() if r.speed else "-"
        if r.speed is not None and r.speed.after_rebuild is not None:
            answer += f" (GPU {r.speed.after_rebuild.per_answer()})"
        lines.append(("*" if r.recommended else "", r.name, size, download, disk, status, r.badge or "-", answer,
                      format_bytes(r.fit.need) if r.fit else "-"))
    fit_col = header.index("FIT")
    if console.is_terminal:
        table = Table(box=None, pad_edge=False, show_edge=False)
        for col in header:
            table.add_column(col, no_wrap=True)
        for line in lines:
            style = {"fits in VRAM": "green", "fits in RAM": "yellow", "too slow here": "magenta",
                     "will not fit": "red"}.get(line[fit_col])
            table.add_row(*map(escape, line[:fit_col]),
                          f"[{style}]{line[fit_col]}[/]" if style else escape(line[fit_col]),
                          *map(escape, line[fit_col + 1:]))
        console.print(table)
    else:  # a pipe or a file: plain columns, never truncated
        widths = [max(len(str(x)) for x in col) for col in zip(header, *lines)]
        for line in (header, *lines):
            print("  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip())
    print("SIZE: the model file; DOWNLOAD: what comes over the network (a checkpoint for the models converted "
          "here); DISK: what the download needs on disk at its peak")
    if profile is not None:
        print(f"ANSWER: the predicted time of a 256-token answer here ({summary(profile)[0][1]})")
        estimated = {r.speed.prediction.basis for r in rows if r.speed and r.speed.prediction.basis != "measured"}
        estimated |= {r.speed.after_rebuild.basis for r in rows if r.speed and r.speed.after_rebuild}
        if estimated:
            print(f"        GPU times are {sorted(estimated)[0]}: this engine build has measured no GPU")
    else:
        print("ANSWER: not predicted, this machine's speed is not measured (`dgchat models hardware --measure`)")
    if rec_row is not None and rec is not None:
        here = rec_row.status in ("installed", "bundled")
        console.print(f"* recommended for this machine: [bold]{escape(rec_row.name)}[/]"
                      + (" (installed)" if here else f"  (`dgchat models pull {escape(rec_row.name)}`)"),
                      overflow="ignore", crop=False)
        console.print(f"  why: {escape(rec.reason)}", soft_wrap=True)
    return 0


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
