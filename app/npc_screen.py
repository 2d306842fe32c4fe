"""The NPC workshop: character cards, a line to write (free, or a template with holes), N variants
generated at once and drawn live as they denoise, keep / reject, export of the kept lines.

Everything about lines is dgchat.npc's (docs/NPC.md): the screen builds a LineSpec from the form,
runs `NpcGenerator(engine).generate(spec, progress=…, cancel=…)` on a worker thread (one batched
decode per step for all variants), and hands the kept variants to build_export / write_export.

Seeds: with the Seed field empty each batch draws its own first seed (param_resolution.draw_seed), so
Ctrl+G again gives other lines; the batch's title and each variant name the seeds used, and the
export records them. A typed seed is the person's choice and is kept: the same card, line, seed,
count and model give the same lines here as with `dgchat npc`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dgchat.app.breakpoints import WIDTH_BREAKPOINTS
from dgchat.app.error_modal import ErrorModal
from dgchat.app.npc_cards import CardShelf
from dgchat.app.npc_workshop.cards import NpcCards
from dgchat.app.npc_workshop.line_form import NpcLineForm
from dgchat.app.paths import short_path
from dgchat.app.prompt_modal import PromptModal
from dgchat.app.session import EngineJob
from dgchat.app.tool_screen import ToolScreen, open_tool
from dgchat.app.widgets.fitting_footer import FittingFooter
from dgchat.app.widgets.npc import BatchView, CardList, VariantView
from dgchat.app.widgets.status_bar import StatusBar
from dgchat.app.widgets.steady_cursor import steady_cursors_when_headless
from dgchat.model_backend.errors import DgchatError
from dgchat.npc.errors import NpcError
from dgchat.npc.export import build_export, write_export
from dgchat.npc.generator import (
    LENGTH_PRESETS,
    LineBatch,
    LineSpec,
    NpcGenerator,
    NpcProgress,
)
from dgchat.npc.paths import data_dir
from dgchat.remote.npc_lines import lines_on_server
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import (
    Grid,
    Horizontal,
    HorizontalGroup,
    Vertical,
    VerticalScroll,
)
from textual.widgets import Button, Header, Input, Label, Select, Static

PHASES = {"length": "trying hole lengths", "score": "scoring lengths", "generate": "denoising",
          "retry": "regenerating (banned word or empty line)"}


def open_workshop(app: Any) -> None:
    open_tool(app, NpcScreen.TOOL_NAME, NpcScreen)


def default_export_path() -> Path:
    return data_dir() / "npc" / "exports" / "lines.json"


class NpcScreen(NpcCards, NpcLineForm, ToolScreen):
    TOOL_NAME = "npc-workshop"
    OWNER = "the NPC workshop"
    TITLE = "NPC workshop"
    BINDINGS = [
        Binding("escape", "stop", "Stop", id="npc.stop"),
        Binding("escape", "back", "Back", id="npc.back"),
        Binding("ctrl+g", "generate", "Generate", id="npc.generate"),
        # not in the footer (the character list's hint and its own n / e keys say it; F1 lists them): the
        # footer of a narrow terminal keeps room for Generate, Keep / Reject, Export and F1
        Binding("ctrl+n", "new_card", "New card", show=False, id="npc.new_card"),
        Binding("ctrl+o", "edit_card", "Edit card", show=False, id="npc.edit_card"),
        Binding("ctrl+s", "export", "Export", id="npc.export"),
        Binding("ctrl+b", "toggle_cards", "Character list", show=False, id="npc.toggle_cards"),
    ]
    # -narrow / -medium / -wide by terminal width (app/breakpoints.py): the character list hides on
    # narrow terminals, the form's paired rows stack below WIDE_FROM columns
    HORIZONTAL_BREAKPOINTS = WIDTH_BREAKPOINTS
    # CSS, not DEFAULT_CSS: it must win over the app stylesheet (e.g. its LiveCanvas rule); Screen CSS is
    # app-wide, hence every rule names the screen
    CSS = """
    NpcScreen #npc-main { height: 1fr; }
    NpcScreen #npc-side { width: 30; border-right: solid $panel; background: $surface; }
    NpcScreen.-medium #npc-side { width: 24; }
    NpcScreen.-narrow #npc-side { display: none; }
    NpcScreen .npc--title { padding: 0 1; text-style: bold; color: $text-muted; }
    NpcScreen #npc-cards { height: 1fr; border: none; background: $surface; }
    NpcScreen #npc-cards:focus { background-tint: $foreground 4%; }
    NpcScreen #npc-card-errors { height: auto; max-height: 8; padding: 0 1; color: $error; }
    NpcScreen .npc--hint { padding: 0 1; color: $text-muted; }
    NpcScreen #npc-pane { width: 1fr; }
    NpcScreen #npc-spec { height: auto; padding: 1 1 0 1; border-bottom: solid $panel; }
    NpcScreen .npc--row { height: auto; }
    NpcScreen .npc--label { width: 10; color: $text-muted; }
    NpcScreen .npc--label-inline { width: auto; color: $text-muted; margin: 0 1; }
    NpcScreen .npc--pair { height: auto; }
    NpcScreen .npc--group { width: auto; }
    NpcScreen .npc--group.-grow { width: 1fr; }
    NpcScreen.-medium .npc--pair, NpcScreen.-narrow .npc--pair { layout: vertical; }
    NpcScreen.-medium .npc--group, NpcScreen.-narrow .npc--group { width: 1fr; }
    NpcScreen.-medium .npc--label-inline.-second, NpcScreen.-narrow .npc--label-inline.-second {
        width: 10; margin: 0; }
    NpcScreen #npc-context { width: 20; }
    NpcScreen.-medium #npc-context, NpcScreen.-narrow #npc-context { width: 1fr; }
    NpcScreen #npc-situation { width: 1fr; }
    NpcScreen #npc-template { width: 1fr; }
    NpcScreen #npc-vars-grid { grid-size: 6; grid-columns: auto 1fr auto 1fr auto 1fr; grid-rows: 1;
                               grid-gutter: 0 1; height: auto; width: 1fr; }
    NpcScreen.-medium #npc-vars-grid, NpcScreen.-narrow #npc-vars-grid { grid-size: 4;
                                                                         grid-columns: auto 1fr auto 1fr; }
    NpcScreen .npc--var-label { width: auto; color: $secondary; }
    NpcScreen #npc-vars-none { width: 1fr; color: $text-muted; }
    NpcScreen #npc-length { width: 16; }
    NpcScreen #npc-count, NpcScreen #npc-temperature { width: 5; }
    /* "random" and the cursor; a drawn seed typed back in has up to six digits. The button's margin is
       one cell, so that the row still fits beside the character list at WIDE_FROM columns */
    NpcScreen #npc-seed { width: 7; }
    NpcScreen #npc-generate { margin-left: 1; }
    NpcScreen #npc-spec-error { color: $error; height: auto; }
    NpcScreen #npc-spec-error.-empty { display: none; }
    NpcScreen #npc-results { height: 1fr; padding: 0 1; }
    NpcScreen .npc--empty { color: $text-muted; padding: 1 1; }
    NpcScreen BatchView { height: auto; margin-top: 1; }
    NpcScreen .batch--title { text-style: bold; color: $text-muted; }
    NpcScreen .batch--note { color: $warning; }
    NpcScreen VariantView { height: auto; padding: 0 1; border-left: outer $panel; }
    NpcScreen VariantView:focus { border-left: outer $accent; background: $boost; }
    NpcScreen VariantView.-kept { border-left: outer $success; }
    NpcScreen VariantView.-kept:focus { border-left: outer $accent; }
    NpcScreen VariantView.-rejected .variant--text { color: $text-disabled; text-style: strike; }
    NpcScreen .variant--head { color: $text-muted; }
    NpcScreen VariantView.-kept .variant--head { color: $success; }
    NpcScreen VariantView.-problem .variant--head { color: $warning; }
    NpcScreen VariantCanvas { margin: 0; padding: 0; border: none; }
    NpcScreen VariantCanvas > .canvas--progress { color: $text-muted; }
    NpcScreen VariantCanvas > .canvas--masked { color: $text-disabled; }
    NpcScreen VariantCanvas > .canvas--draft { color: $text-disabled; text-style: italic; }
    NpcScreen VariantCanvas > .canvas--new { color: $text; background: $accent 35%; text-style: bold; }
    NpcScreen VariantCanvas > .canvas--done { color: $text; }
    NpcScreen VariantCanvas > .canvas--fixed { color: $secondary; }
    NpcScreen #npc-status { height: 1; padding: 0 1; color: $text-muted; background: $surface; }
    """

    def __init__(self) -> None:
        super().__init__(id="npc-screen")
        self.shelf = CardShelf()
        self.batches: list[LineBatch] = []
        self.var_values: dict[str, str] = {}
        self._slots: tuple[str, ...] = ()
        self._batch_view: BatchView | None = None
        self._generator: tuple[Any, NpcGenerator] | None = None  # (engine, its generator)
        self._export_path: Path | None = None
        self._current_card: str | None = None
        # the problem under the form came from checking the form at Ctrl+G (build_spec): it is checked
        # again whenever the form or the characters change, so it never outlives its cause
        self._form_problem = False

    # -- layout ---------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header(icon="≡")
        with Horizontal(id="npc-main"):
            with Vertical(id="npc-side"):
                yield Label("Characters", classes="npc--title")
                yield CardList(id="npc-cards")
                yield Static("", id="npc-card-errors", markup=False)
                yield Static("", classes="npc--hint", id="npc-cards-hint", markup=False)
            with Vertical(id="npc-pane"):
                with Vertical(id="npc-spec"):
                    # a "pair" is one row on a wide screen and two stacked rows below WIDE_FROM columns
                    with Horizontal(classes="npc--row npc--pair"):
                        with HorizontalGroup(classes="npc--group"):
                            yield Label("Context", classes="npc--label")
                            yield Input(placeholder="gate_night", id="npc-context", compact=True)
                        with HorizontalGroup(classes="npc--group -grow"):
                            yield Label("Situation", classes="npc--label-inline -second")
                            yield Input(placeholder="The player walks up to the closed gate after dark.",
                                        id="npc-situation", compact=True)
                    with Horizontal(classes="npc--row"):
                        yield Label("Template", classes="npc--label")
                        yield Input(placeholder="empty: a free line · Halt, {player}! None may pass the {___} after dark.",
                                    id="npc-template", compact=True)
                    with Horizontal(classes="npc--row"):
                        yield Label("Variables", classes="npc--label")
                        yield Static("none — {name} in the template adds one", id="npc-vars-none", markup=False)
                        yield Grid(id="npc-vars-grid")
                    with Horizontal(classes="npc--row npc--pair", id="npc-run-row"):
                        with HorizontalGroup(classes="npc--group"):
                            yield Label("Length", classes="npc--label")
                            yield Select([(f"{name} ≤{n}", name) for name, n in LENGTH_PRESETS.items()],
                                         value="short", allow_blank=False, id="npc-length", compact=True)
                            yield Label("Variants", classes="npc--label-inline")
                            yield Input("4", type="integer", id="npc-count", compact=True)
                        with HorizontalGroup(classes="npc--group"):
                            yield Label("Seed", classes="npc--label-inline -second")
                            # empty: new seeds for every batch; a typed seed repeats its lines
                            yield Input("", placeholder="random", type="integer", id="npc-seed", compact=True)
                            yield Label("Temp", classes="npc--label-inline")
                            yield Input("", placeholder="0.8", type="number", id="npc-temperature", compact=True)
                            yield Button("Generate", id="npc-generate", compact=True, variant="primary")
                    yield Label("", id="npc-spec-error", markup=False, classes="-empty")
                with VerticalScroll(id="npc-results"):
                    yield Static("Pick a character (Ctrl+B shows or hides the list), write a line (or leave the "
                                 "template empty for a free line) and press Ctrl+G. Each variant denoises live; "
                                 "k keeps it, x rejects it; Ctrl+S exports the kept lines as JSON or CSV.",
                                 classes="npc--empty", id="npc-empty", markup=False)
                yield StatusBar(id="npc-status")
        yield FittingFooter()

    def on_mount(self) -> None:
        steady_cursors_when_headless(self)
        # ToolScreen.on_mount runs too: Textual calls each class's handler along the MRO
        self.query_one("#npc-vars-grid").display = False
        self.reload_cards()
        self.update_status()
        self.query_one(CardList).focus()

    # -- generating -----------------------------------------------------------------------------
    def action_generate(self) -> None:
        if self.engine_busy:
            return
        try:
            spec = self.build_spec()
        except DgchatError as exc:
            self.spec_error(str(exc), from_form=True)
            return
        self.spec_error("")
        engine = self.engine_for_job()
        if engine is None:
            return
        if engine.text_only:
            self.spec_error(f"NPC lines are not available on {self.session.loaded_url()}: they need a "
                            "dgchat serve server (its /v1/infill); vLLM and other servers answer the chat only")
            return
        results = self.query_one("#npc-results", VerticalScroll)
        for hint in self.query("#npc-empty"):
            hint.remove()
        view = BatchView(self._batch_title(spec, drawn=not self.seed_typed), spec.count, spec.seed, engine,
                         classes="batch")
        self._batch_view = view
        results.mount(view)
        results.scroll_end(animate=False)

        def run(job: EngineJob) -> LineBatch:
            # a server runs the same generator on the spec (remote/npc_lines.py); no canvases cross
            # the wire for lines, so the batch shows when the server's answer is complete
            on_server = lines_on_server(engine, spec, max_attempts=4, started=lambda: job.record(
                -1, None, phase="on the server", progress=(0, spec.count)))
            if on_server is not None:
                return on_server
            cached = self._generator
            if cached is None or cached[0] is not engine:
                cached = self._generator = (engine, NpcGenerator(engine))

            def progress(p: NpcProgress) -> None:
                job.record(p.variant if p.variant is not None else -1, p.event, phase=p.phase,
                           progress=(p.done, p.total))

            return cached[1].generate(spec, progress=progress, cancel=job.cancel)

        self.start_job(EngineJob("npc", run))
        self.update_status()

    @staticmethod
    def _batch_title(spec: LineSpec, *, drawn: bool = False) -> str:
        """The batch's heading: who, which line, and the seeds used (`drawn`: random ones, which typed
        into Seed give these lines again)."""
        line = f"“{spec.template}”" if spec.template is not None else f"free line, {spec.length}"
        seeds = f"seed {spec.seed}" if spec.count == 1 else f"seeds {spec.seed}–{spec.seed + spec.count - 1}"
        if drawn:
            seeds = f"random {seeds}"
        context = f" · {spec.context}" if spec.context else ""
        return f"{spec.card.name}{context} · {line} · {seeds}"

    def show_progress(self, job: EngineJob) -> None:
        view = self._batch_view
        if view is not None:
            for variant in view.variant_views:
                event = job.latest.get(variant.index)
                if event is not None and variant.canvas is not None and variant.canvas.event is not event:
                    variant.canvas.show(event)
        self.update_status()

    def job_finished(self, job: EngineJob) -> None:
        view, self._batch_view = self._batch_view, None
        if job.error is None and job.result is not None:
            batch: LineBatch = job.result
            self.batches.append(batch)
            if view is not None:
                view.finish(batch)
                views = view.variant_views
                if views:
                    views[0].focus()
                    self.query_one("#npc-results", VerticalScroll).scroll_end(animate=False)
        else:
            if view is not None:
                view.remove()
            if job.cancelled:
                self.notify("Stopped; nothing was kept from that line.")
            elif isinstance(job.error, NpcError):
                self.spec_error(job.error_text())
            else:
                self.app.push_screen(ErrorModal("Cannot generate the line", job.error_text()))
        self.update_status()

    def on_variant_view_mark(self, event: VariantView.Mark) -> None:
        event.stop()
        view = event.view
        batch = view.batch
        if batch is None:
            return
        try:
            if event.status == "kept":
                batch.keep(view.index)
            else:
                batch.reject(view.index)
        except NpcError as exc:
            self.notify(str(exc), severity="warning")
        view.refresh_state()
        self.update_status()

    def action_keep_all(self) -> None:
        """Keep every variant of the last line that was not rejected."""
        if not self.batches:
            return
        self.batches[-1].keep_all()
        for view in self.query(VariantView):
            view.refresh_state()
        self.update_status()

    def action_clear(self) -> None:
        if self.engine_busy:
            return
        self.batches.clear()
        results = self.query_one("#npc-results", VerticalScroll)
        results.remove_children()
        self.update_status()

    # -- export ---------------------------------------------------------------------------------
    @property
    def kept_count(self) -> int:
        return sum(len(b.kept) for b in self.batches)

    def action_export(self) -> None:
        kept = self.kept_count
        if not kept:
            self.notify("Nothing kept yet: press k on a variant to keep it.", severity="warning")
            return
        path = self._export_path or default_export_path()

        def check(text: str) -> str | None:
            if not text:
                return "enter a file name"
            if Path(text).suffix.lower() not in (".json", ".csv"):
                return "the file name must end in .json or .csv"
            return None

        def done(value: str | None) -> None:
            if value:
                self.export_to(Path(value).expanduser())

        self.app.push_screen(PromptModal(
            "Export kept lines", self._short(path), ok_label="Export", check=check,
            help_text=f"{kept} kept line{'s' if kept != 1 else ''}: JSON or CSV by the file's extension "
                      "(the format of docs/NPC.md, no timestamps).",
        ), done)

    def export_to(self, path: Path) -> Path | None:
        batches = [b for b in self.batches if b.kept]
        try:
            document = build_export(batches)
            written = write_export(path, document)
        except DgchatError as exc:
            self.app.push_screen(ErrorModal("Cannot export", str(exc)))
            return None
        self._export_path = written
        n = len(document["lines"])
        self.notify(f"Exported {n} line{'s' if n != 1 else ''} to {self._short(written)}")
        return written

    # -- the rest -------------------------------------------------------------------------------
    @staticmethod
    def _short(path: Path | None) -> str:
        return short_path(path) if path is not None else ""

    def update_status(self) -> None:
        try:
            bar = self.query_one("#npc-status", StatusBar)
        except Exception:  # noqa: BLE001 - not composed yet
            return
        job = self.job
        if job is not None and job.running:
            done, total = job.progress
            phase = PHASES.get(job.phase, "starting")
            state = " · stopping…" if job.cancel.is_set() else ""
            bar.set_text(f"Generating · {phase} · {done}/{total}{state} · Esc stops")
            bar.set_loading(done / total if total else 0.0)
            return
        bar.set_loading(None)
        kept = self.kept_count
        bar.set_parts([*self.model_status_parts(), *([(f"{kept} kept · Ctrl+S exports", 1)] if kept else [])])

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "stop":
            return self.engine_busy
        if action == "back":
            return not self.engine_busy
        if action in ("generate", "clear"):
            return not self.engine_busy
        return True

    def action_stop(self) -> None:
        self.stop_job()
        view = self._batch_view
        if view is not None:
            for variant in view.variant_views:
                if variant.canvas is not None:
                    variant.canvas.mark_stopping()
        self.update_status()

    def action_back(self) -> None:
        if len(self.app.screen_stack) > 1:
            self.app.pop_screen()
