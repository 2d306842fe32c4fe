"""`dgchat npc`: NPC lines for build pipelines, headless (docs/NPC.md)."""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

from dgchat.commands.common import (add_common, add_model_args, add_precise_arg, ctrl_c_cancels, open_local_engine,
                                   placement_choice, precise_choice, resolve_model_path)
from dgchat.model_backend.engine_protocol import LocalEngine
from dgchat.model_backend.errors import GenerationCancelled, InvalidParameterError
from dgchat.npc.cards import load_cards
from dgchat.npc.export import build_export, export_json, write_export
from dgchat.npc.generator import NO_TEMPLATES, NpcGenerator
from dgchat.npc.lines_file import LinesFile, load_lines_file
from dgchat.commands.server_args import add_server_args, server_choice
from dgchat.remote.npc_lines import check_servers, generate_remote
from dgchat.remote.pool import ServerPool
from dgchat.terminal_text import cli_line, for_stream, one_line


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "npc", help="generate NPC lines from character cards and a lines file (no UI)",
        description="Generate NPC lines from character cards and a lines file, and export them as JSON or CSV. "
                    "File formats: docs/NPC.md.",
    )
    add_common(p)
    add_model_args(p)
    p.add_argument("--cards", action="append", metavar="PATH",
                   help="character cards: a TOML file or a folder of them (repeatable; default: the data folder's "
                        "npc/cards)")
    p.add_argument("--template", "--lines", dest="lines", metavar="LINES.toml", help="the lines file: what to generate")
    p.add_argument("--count", type=int, help="variants per line (a line's own `count` wins)")
    p.add_argument("--seed", type=int, help="seed of each line's first variant (a line's own `seed` wins)")
    p.add_argument("--var", action="append", default=[], metavar="NAME=VALUE",
                   help="a game variable for the templates (repeatable; a line's own variables win)")
    p.add_argument("-o", "--out", metavar="FILE",
                   help="export file (.json or .csv); '-' writes JSON to standard output")
    p.add_argument("--format", choices=("json", "csv"), help="export format (default: from the --out extension)")
    p.add_argument("--max-attempts", type=int, default=4, metavar="N",
                   help="tries per variant when a banned word (or an empty line) comes out (default 4)")
    add_precise_arg(p, help="f32 KV cache, no flash attention: a variant's result does not depend on what else is "
                            "in its batch (slower; default: [engine] precise in config.toml, else off)")
    p.add_argument("--list-cards", action="store_true", help="list the character cards found and exit")
    add_server_args(p, many=True)


def _variables(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise InvalidParameterError(f"--var needs NAME=VALUE (got {pair!r})")
        out[name.strip()] = value
    return out


def run(args: argparse.Namespace) -> int:
    cards = load_cards(args.cards)
    if args.list_cards:
        for card in cards:  # card files come from anywhere: on a terminal by the rule, else exact
            print(for_stream(f"{card.id}\t{card.name}\t{card.source}", sys.stdout))
        if not cards:
            sys.stderr.write("dgchat: no character cards found (give --cards PATH)\n")
        return 0
    if not args.lines:
        raise InvalidParameterError("give the lines file: --template LINES.toml")
    if not args.out:
        raise InvalidParameterError("give the export file: --out lines.json (or .csv, or - for standard output)")
    if not cards:
        raise InvalidParameterError("no character cards: pass --cards cards.toml")
    if args.count is not None and args.count < 1:
        raise InvalidParameterError(f"--count must be >= 1 (got {args.count})")
    if args.seed is not None and args.seed < 0:
        raise InvalidParameterError(f"--seed must be >= 0 (got {args.seed})")
    if args.max_attempts < 1:
        raise InvalidParameterError(f"--max-attempts must be >= 1 (got {args.max_attempts})")
    fmt = args.format or ("json" if args.out == "-" else Path(args.out).suffix.lower().lstrip("."))
    if fmt not in ("json", "csv"):
        raise InvalidParameterError(f"--out {args.out}: use a .json or .csv file name, or --format")
    if args.out == "-" and fmt != "json":
        raise InvalidParameterError("standard output takes JSON only")

    lines = load_lines_file(args.lines)
    specs = lines.specs(cards, count=args.count, seed=args.seed, variables=_variables(args.var))

    urls, api_key = server_choice(args)
    if urls:
        if args.precise or args.n_gpu_layers is not None or args.experts_on is not None or args.threads is not None:
            raise InvalidParameterError("--precise, --gpu-layers, --experts-on and --threads set up a local model; "
                                        "each server has its own (dgchat serve --precise ...)")
        try:
            with ctrl_c_cancels() as cancel:
                batches = _generate_remote(urls, api_key, specs, args, cancel, [e.where for e in lines.entries])
        except GenerationCancelled:
            sys.stderr.write("dgchat: stopped (Ctrl-C); nothing was written\n")
            return 130
        return _write(batches, args, fmt)

    # imported when a local model runs, so that `dgchat npc --help` and `--server` runs load no llama.cpp
    from dgchat.model_backend import llamacpp  # heavy: llama.cpp's shared library

    llamacpp.set_verbose(getattr(args, "verbose", False))
    engine = open_local_engine(resolve_model_path(args.model), n_threads=args.threads,
                               precise=precise_choice(args)[0], **placement_choice(args))
    try:
        _check_templates(engine, lines, specs)
        with ctrl_c_cancels() as cancel:
            generator = NpcGenerator(engine, max_attempts=args.max_attempts)
            batches = _generate_all(generator, specs, cancel)
    except GenerationCancelled:
        sys.stderr.write("dgchat: stopped (Ctrl-C); nothing was written\n")
        return 130
    finally:
        engine.close()
    return _write(batches, args, fmt)


def _check_templates(engine: LocalEngine, lines: LinesFile, specs: list) -> None:
    """A block-diffusion model writes free lines only: a template entry is an error before any line
    is generated, naming the entry."""
    if not engine.info.block_diffusion:
        return
    for entry, spec in zip(lines.entries, specs):
        if spec.template is not None:
            raise InvalidParameterError(f"{entry.where}: {Path(engine.path).name} is {engine.label}: {NO_TEMPLATES}")


def _write(batches: list, args: argparse.Namespace, fmt: str) -> int:
    rejected = []
    for batch in batches:
        batch.keep_all()
        rejected += [(batch, v) for v in batch.variants if v.problem is not None]
    document = build_export(batches)
    if args.out == "-":
        sys.stdout.write(export_json(document))
    else:
        write_export(args.out, document, fmt)

    for batch, v in rejected:  # the problem quotes the model's line: one safe line
        cli_line("warning", f"{batch.spec.card.id}/{batch.spec.context or '-'} variant {v.index} "
                            f"(seed {v.seed}) dropped after {v.attempt + 1} tries: {v.problem}")
    where = "standard output" if args.out == "-" else args.out
    sys.stderr.write(f"dgchat: {len(document['lines'])} lines from {len(batches)} entries written to {where}\n")
    return 0


def _generate_all(generator, specs, cancel: threading.Event) -> list:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    batches = []
    if not console.is_terminal:
        # a build log: one line per entry instead of a live bar
        for n, spec in enumerate(specs, 1):
            batches.append(generator.generate(spec, cancel=cancel))
            console.print(f"[{n}/{len(specs)}] {spec.card.id}/{spec.context or '-'}: {spec.count} variants",
                          highlight=False, markup=False)
        return batches
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("[dim]{task.fields[line]}"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        overall = progress.add_task("lines", total=len(specs), line="")
        for spec in specs:
            label = f"{spec.card.id}/{spec.context or '-'}"
            task = progress.add_task(f"  {label}", total=None, line="")

            def report(p, task=task) -> None:
                progress.update(task, completed=p.done, total=p.total, line=p.phase)

            batches.append(generator.generate(spec, progress=report, cancel=cancel))
            progress.remove_task(task)
            progress.advance(overall)
    return batches


def _generate_remote(urls: list[str], api_key: str | None, specs: list, args: argparse.Namespace,
                     cancel: threading.Event, where: list[str] | None = None) -> list:
    """The entries on `dgchat serve` servers (docs/SCALING.md): each entry is one /v1/infill request,
    at most --per-server in flight per server, a failed one retried on another server; the batches
    come back in the lines file's order, so the export is the one a local run writes."""
    import time

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    started = time.perf_counter()
    with ServerPool(urls, api_key=api_key, per_server=args.per_server, timeout=args.timeout,
                    max_failures=args.retries + 1, deadline=args.deadline) as pool:
        # a server that cannot be used is dropped with one line; the run goes on on the others
        check_servers(pool, on_drop=lambda url, why: console.print(
            f"dgchat: {url} dropped ({why}); going on without it", highlight=False, markup=False, soft_wrap=True),
            specs=specs, where=where)
        done = [0]
        if not console.is_terminal:
            def log(event) -> None:  # a build log: one line per entry and per retry
                if event.kind == "done":
                    done[0] += 1
                    spec = specs[event.index]
                    console.print(f"[{done[0]}/{len(specs)}] {spec.card.id}/{spec.context or '-'}: {spec.count} "
                                  f"variants ({event.server})", highlight=False, markup=False)
                else:
                    console.print(f"dgchat: {event.server} failed ({one_line(event.error)}); "
                                  f"{'dropped it, ' if event.kind == 'dropped' else ''}retrying the entry elsewhere",
                                  highlight=False, markup=False, soft_wrap=True)

            batches = generate_remote(pool, specs, max_attempts=args.max_attempts, on_event=log, cancel=cancel)
        else:
            columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                       TextColumn("[dim]{task.fields[note]}"), TimeElapsedColumn())
            with Progress(*columns, console=console, transient=False) as progress:
                overall = progress.add_task("lines", total=len(specs), note="")
                per_server = {url: progress.add_task(f"  {url}", total=None, note="")
                              for url in pool.stats}

                def show(event) -> None:
                    stats = pool.stats[event.server]
                    if event.kind == "done":
                        progress.advance(overall)
                    note = f"{stats.units} lines, {stats.units_per_s:.1f} lines/s"
                    if stats.failures:
                        note += f", {stats.failures} retried elsewhere"
                    if stats.dropped:
                        note += " - dropped"
                    progress.update(per_server[event.server], completed=stats.jobs, note=note)

                batches = generate_remote(pool, specs, max_attempts=args.max_attempts, on_event=show, cancel=cancel)
        elapsed = time.perf_counter() - started
        for stats in pool.stats.values():
            state = f"dropped: {stats.dropped}" if stats.dropped else (
                f"{stats.failures} failed requests retried elsewhere" if stats.failures else "no failures")
            console.print(f"dgchat: {stats.url}: {stats.units} lines in {stats.busy_s:.1f} s "
                          f"({stats.units_per_s:.1f} lines/s); {state}", highlight=False, markup=False, soft_wrap=True)
        total = sum(len(b.variants) for b in batches)
        console.print(f"dgchat: {total} lines from {len(specs)} entries on {len(urls)} server(s) in {elapsed:.1f} s "
                      f"({total / elapsed if elapsed > 0 else 0.0:.1f} lines/s)", highlight=False, markup=False)
    return batches
