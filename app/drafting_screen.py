"""Drafting: a document the model helps write.

The document is a TextArea saved to <data>/drafts/draft.txt (atomically, a second after the last
change, and when leaving the screen or quitting) and restored when the screen opens again.

Ctrl+R rewrites the selected span in context (the text before *and* after it; with nothing
selected it fills in at the cursor), Ctrl+G continues from the cursor. The proposal denoises in
place: while it runs and until it is decided, the editor is replaced by a preview of the same lines
with the canvas at the span. Enter / y accepts it (one edit: Ctrl+Z undoes it), Esc / n rejects it
(the document is untouched), r asks again with the next seed, + / - asks for a longer or shorter
span; Esc while it runs stops it. The model math is drafting_plan's and the engine's.

Seeds: the first proposal's is the config's [sampler] seed when it sets one (the person's choice:
the same document then gets the same proposals), else a newly drawn one, so that opening Drafting
again (a new run of the app) does not repeat the last session's proposals; each later proposal
takes the next seed. The status line names the proposal's seed.

A model that writes left to right (block diffusion: SDAR, BD3LM) cannot see the text after a span:
its rewrite is written after the text before the selection, as long as the selection, and a line
over the status says so while the proposal is shown ("SDAR writes left to right: this rewrite
continues from the text before the selection and does not see the text after it"); its
continuation runs over several blocks (drafting_plan).

On a server (`dgchat --server URL`) the same keys work: against dgchat serve the canvas streams from
the server (a rewrite is a completion with the text after as its suffix); a server without infill
(vLLM, ...) can continue from the cursor, and a rewrite there says why it cannot be done.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dgchat.app import paths
from dgchat.app.breakpoints import WIDTH_BREAKPOINTS
from dgchat.app.drafting_plan import (
    DraftPlan,
    DraftRequest,
    left_to_right_note,
    no_infill_message,
    plan,
    proposal_text,
    writes_left_to_right,
)
from dgchat.model_backend import param_resolution
from dgchat.model_backend.engine_protocol import Engine
from dgchat.app.error_modal import ErrorModal
from dgchat.app.paths import short_path
from dgchat.app.session import EngineJob
from dgchat.app.tool_screen import ToolScreen, open_tool
from dgchat.app.widgets.draft_preview import DraftPreview
from dgchat.app.widgets.fitting_footer import FittingFooter
from dgchat.app.widgets.status_bar import StatusBar
from dgchat.app.widgets.steady_cursor import steady_cursors_when_headless
from dgchat.model_backend.events import FinalEvent, StepEvent
from dgchat.recording.blocks import decided_count
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.geometry import Offset
from textual.timer import Timer
from textual.widgets import Header, Label, TextArea
from textual.widgets.text_area import Selection

AUTOSAVE_DELAY = 1.0  # seconds after the last change


def open_drafting(app: Any) -> None:
    open_tool(app, DraftingScreen.TOOL_NAME, DraftingScreen)


def draft_path() -> Path:
    return paths.data_dir() / "drafts" / "draft.txt"


@dataclass
class Proposal:
    request: DraftRequest
    start: tuple[int, int]  # the span in the document (TextArea locations)
    end: tuple[int, int]
    plan: DraftPlan | None = None
    text: str | None = None  # set when the proposal is finished
    engine: Engine | None = None


class DraftingScreen(ToolScreen):
    TOOL_NAME = "drafting"
    OWNER = "the drafting screen"
    TITLE = "Drafting"
    BINDINGS = [
        Binding("ctrl+r", "rewrite", "Rewrite / fill", id="draft.rewrite"),
        Binding("ctrl+g", "continue", "Continue", id="draft.continue"),
        Binding("enter,y", "accept", "Accept", id="draft.accept"),
        Binding("escape,n", "reject", "Reject", id="draft.reject"),
        Binding("r", "retry", "Another", id="draft.retry"),
        Binding("plus,equals_sign", "resize(1)", "Longer", id="draft.longer"),
        Binding("minus", "resize(-1)", "Shorter", id="draft.shorter"),
        Binding("escape", "stop", "Stop", id="draft.stop"),
        Binding("escape", "back", "Back", id="draft.back"),
        Binding("ctrl+s", "save", "Save", show=False, id="draft.save"),
    ]
    # -narrow / -medium / -wide by terminal width (app/breakpoints.py): below 110 columns the footer is
    # compact (dgchat.tcss)
    HORIZONTAL_BREAKPOINTS = WIDTH_BREAKPOINTS
    # CSS, not DEFAULT_CSS: it must win over the app stylesheet (e.g. its LiveCanvas rule); Screen CSS is
    # app-wide, hence every rule names the screen
    CSS = """
    DraftingScreen #draft-editor { height: 1fr; border: none; padding: 0 1; }
    DraftingScreen #draft-preview-scroll { height: 1fr; padding: 0 1; display: none; }
    DraftingScreen.-proposing #draft-editor { display: none; }
    DraftingScreen.-proposing #draft-preview-scroll { display: block; }
    DraftingScreen #draft-status { height: 1; padding: 0 1; color: $text-muted; background: $surface; }
    DraftingScreen #draft-note { width: 100%; height: auto; padding: 0 1; color: $warning; background: $surface;
                                 display: none; }
    DraftingScreen.-proposing.-noted #draft-note { display: block; }
    """

    def __init__(self, path: Path | None = None) -> None:
        super().__init__(id="drafting-screen")
        self.path = path or draft_path()
        self.proposal: Proposal | None = None
        self._saved_text = ""
        self._save_timer: Timer | None = None
        self._save_error: str | None = None
        self._seed = 0
        self._note = ""
        # (the document before, after) the last accepted proposal: the status line says which of
        # the two the document holds (Ctrl+Z / Ctrl+Y move between them), or nothing once edited
        self._accepted: tuple[str, str] | None = None

    def compose(self) -> ComposeResult:
        yield Header(icon="≡")
        yield TextArea("", id="draft-editor", soft_wrap=True, tab_behavior="focus",
                       placeholder="Write here. Select text and press Ctrl+R to have it rewritten in context, "
                                   "or Ctrl+G to continue from the cursor.")
        with VerticalScroll(id="draft-preview-scroll", can_focus=True):
            yield DraftPreview(id="draft-preview")
        # what the proposal could not take into account (a left-to-right model: the text after it)
        yield Label("", id="draft-note", markup=False)
        yield StatusBar(id="draft-status")
        yield FittingFooter()

    @property
    def editor(self) -> TextArea:
        return self.query_one("#draft-editor", TextArea)

    @property
    def preview(self) -> DraftPreview:
        return self.query_one("#draft-preview", DraftPreview)

    def on_mount(self) -> None:
        # ToolScreen.on_mount runs too: Textual calls each class's handler along the MRO
        # the config's own [sampler] table, not sampler_params(): DiffusionParams' seed defaults to 0, so
        # there it never reads as unset. Drawn through the module: tests replace draw_seed.
        seed = self.app.config.sampler.get("seed")
        self._seed = int(seed) if seed is not None else param_resolution.draw_seed()
        editor = self.editor
        steady_cursors_when_headless(self)
        self._load()
        editor.focus()
        self.update_status()

    # -- the file -------------------------------------------------------------------------------
    def _load(self) -> None:
        editor = self.editor
        try:
            with self.path.open(encoding="utf-8", newline="") as handle:  # line ends kept as they are
                text = handle.read()
        except FileNotFoundError:
            text = ""
        except (OSError, UnicodeDecodeError) as exc:
            # never overwrite a file we could not read: keep it aside and start afresh
            aside = self.path.with_name(self.path.name + ".unreadable")
            try:
                self.path.replace(aside)
                where = f"it was moved to {aside.name}"
            except OSError:
                where = "it is left as it was"
                self.path = self.path.with_name("draft-new.txt")
            self.app.push_screen(ErrorModal("Cannot read the draft", f"{self.path}: {exc}\n\n{where}."))
            text = ""
        editor.load_text(text)
        self._saved_text = text
        end = editor.document.end
        editor.move_cursor(end)

    def on_text_area_changed(self, event: TextArea.Changed) -> None:
        if event.text_area.id != "draft-editor":
            return
        if self._save_timer is not None:
            self._save_timer.stop()
        if event.text_area.text != self._saved_text:
            self._save_timer = self.set_timer(AUTOSAVE_DELAY, self.save_now)
        self.update_status()

    def save_now(self) -> bool:
        """Write the document if it changed; False when writing failed (the status line says why)."""
        if self._save_timer is not None:
            self._save_timer.stop()
            self._save_timer = None
        text = self.editor.text
        if text == self._saved_text:
            return True
        try:
            paths.atomic_write_text(self.path, text)
        except OSError as exc:
            self._save_error = f"not saved: {exc.strerror or exc}"
            self.update_status()
            return False
        self._saved_text = text
        self._save_error = None
        self.update_status()
        return True

    def action_save(self) -> None:
        if self.save_now():
            self.notify(f"Saved {self._short_path()}")

    def on_screen_suspend(self) -> None:
        self.save_now()

    def before_exit(self) -> None:
        self.save_now()

    def on_unmount(self) -> None:
        # ToolScreen.on_unmount (stops a running job) is called by Textual as well
        try:
            self.save_now()
        except Exception:  # noqa: BLE001 - the widgets may be gone already
            pass

    # -- asking the model -----------------------------------------------------------------------
    def action_rewrite(self) -> None:
        self._ask("rewrite")

    def action_continue(self) -> None:
        self._ask("continue")

    def _ask(self, kind: str) -> None:
        if self.engine_busy or self.proposal is not None:
            return
        editor = self.editor
        start, end = sorted((editor.selection.start, editor.selection.end))
        if kind == "continue":
            start = end = editor.selection.end  # from the cursor; a selection is kept
        before = editor.get_text_range((0, 0), start)
        after = editor.get_text_range(end, editor.document.end)
        selected = editor.get_text_range(start, end)
        request = DraftRequest(kind, before, selected, after, seed=self._seed)
        self._note = ""
        self._accepted = None
        self._seed += 1
        self._start(Proposal(request, start, end))

    def _start(self, proposal: Proposal) -> None:
        engine = self.engine_for_job()
        if engine is None:
            return
        if proposal.request.kind == "rewrite" and engine.text_only:
            # said before anything is sent: the server has no way to fill a span between two texts
            self.notify(no_infill_message(self.session.loaded_url()), severity="warning", timeout=8)
            return
        editor = self.editor
        proposal.engine = engine
        self.proposal = proposal
        # the preview starts at the document line at the top of the editor: the span stays put
        top_row = editor.wrapped_document.offset_to_location(Offset(0, int(editor.scroll_offset.y)))[0]
        top = (min(top_row, proposal.start[0]), 0)
        shown_before = editor.get_text_range(top, proposal.start)
        editor.read_only = True
        note = left_to_right_note(engine, proposal.request.kind, proposal.request.selected)
        self.query_one("#draft-note", Label).update(note)
        self.set_class(bool(note), "-noted")
        self.add_class("-proposing")
        self.preview.start(engine, shown_before, proposal.request.after, proposal.request.kind,
                           proposal.request.length or 0, left_to_right=writes_left_to_right(engine))
        self.query_one("#draft-preview-scroll").focus()
        base = dict(self.app.config.sampler)  # the [sampler] table as written
        request = proposal.request

        def run(job: EngineJob) -> tuple[DraftPlan, FinalEvent | None]:
            draft = plan(engine, request, base)
            proposal.plan = draft  # the UI reads the span length while the job runs
            final = None
            for event in engine.generate(draft.prompt, draft.params, cancel=job.cancel, template=draft.template):
                if isinstance(event, StepEvent):
                    # block after block: how much of the whole proposal is decided, not one block's steps
                    done = (min(decided_count(event), draft.span), draft.span) if draft.left_to_right else \
                        (event.canvas_step, event.total_steps)
                    job.record(0, event, progress=done)
                else:
                    final = event
            return draft, final

        self.start_job(EngineJob("draft", run))
        self.update_status()

    def show_progress(self, job: EngineJob) -> None:
        proposal = self.proposal
        event = job.latest.get(0)
        if proposal is not None and proposal.plan is not None and event is not None:
            self.preview.show(event, proposal.plan.span)
        self.update_status()

    def job_finished(self, job: EngineJob) -> None:
        proposal = self.proposal
        if proposal is None:
            return
        result = job.result
        final = result[1] if result is not None else None
        if job.error is not None or final is None or final.stop_reason == "cancelled":
            self._close_preview()
            if job.cancelled or (final is not None and final.stop_reason == "cancelled"):
                self.notify("Stopped; the document is unchanged.")
            else:
                self.app.push_screen(ErrorModal("Cannot write the proposal", job.error_text()))
            return
        proposal.plan = result[0]
        proposal.text = proposal_text(proposal.engine, proposal.plan, final)
        self.preview.finish(proposal.text)
        self.update_status()

    def action_accept(self) -> None:
        proposal = self.proposal
        if proposal is None or proposal.text is None:
            return
        editor = self.editor
        self._close_preview()
        before = editor.text
        # one undoable edit: a checkpoint on each side keeps typing before or after it separate
        editor.history.checkpoint()
        result = editor.replace(proposal.text, proposal.start, proposal.end, maintain_selection_offset=False)
        editor.history.checkpoint()
        editor.selection = Selection(proposal.start, result.end_location)
        self._note = ""
        self._accepted = (before, editor.text)
        self.update_status()

    def action_reject(self) -> None:
        if self.proposal is None or self.engine_busy:
            return
        self._close_preview()
        self._note = "rejected"
        self._accepted = None
        self.update_status()

    def action_retry(self) -> None:
        proposal = self.proposal
        if proposal is None or proposal.text is None or self.engine_busy:
            return
        request = replace(proposal.request, seed=self._seed, length=proposal.plan.span if proposal.plan else None)
        self._seed += 1
        self._close_preview()
        self._start(Proposal(request, proposal.start, proposal.end))

    def action_resize(self, direction: int) -> None:
        proposal = self.proposal
        if proposal is None or proposal.text is None or proposal.plan is None or self.engine_busy:
            return
        span = proposal.plan.span
        span = span + max(1, span // 2) if direction > 0 else max(1, span - max(1, span // 3))
        request = replace(proposal.request, seed=self._seed, length=span)
        self._seed += 1
        self._close_preview()
        self._start(Proposal(request, proposal.start, proposal.end))

    def _close_preview(self) -> None:
        self.proposal = None
        editor = self.editor
        editor.read_only = False
        self.remove_class("-proposing")
        editor.focus()
        self.refresh_bindings()

    def action_stop(self) -> None:
        self.stop_job()
        self.update_status()

    def action_back(self) -> None:
        self.save_now()
        if len(self.app.screen_stack) > 1:
            self.app.pop_screen()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        busy = self.engine_busy
        open_ = self.proposal is not None
        if action == "stop":
            return busy
        if action in ("accept", "retry", "resize"):
            return open_ and not busy and self.proposal.text is not None  # type: ignore[union-attr]
        if action == "reject":
            return open_ and not busy
        if action in ("rewrite", "continue", "back"):
            return not open_ and not busy
        return True

    # -- status ---------------------------------------------------------------------------------
    def _short_path(self) -> str:
        return short_path(self.path)

    def update_status(self) -> None:
        try:
            bar = self.query_one("#draft-status", StatusBar)
            editor = self.editor
        except Exception:  # noqa: BLE001 - not composed yet
            return
        proposal = self.proposal
        job = self.job
        if proposal is not None:
            request = proposal.request
            # a rewrite with nothing selected fills in at the cursor: say so, it is not a rewrite
            fill = request.kind == "rewrite" and not request.selected
            what = "Filling in at the cursor" if fill else "Rewriting" if request.kind == "rewrite" else "Continuing"
            size = f" · {proposal.plan.span} tokens" if proposal.plan is not None else ""
            if job is not None and job.running:
                done, total = job.progress
                state = " · stopping…" if job.cancel.is_set() else " · Esc stops"
                if proposal.plan is not None and proposal.plan.on_server and not total:  # nothing back yet
                    bar.set_text(f"{what}{size} · seed {request.seed} · waiting for the server…{state}")
                    bar.set_loading(0.0)
                    return
                if proposal.plan is not None and proposal.plan.left_to_right:
                    bar.set_text(f"{what}{size} · seed {request.seed} · {done}/{total} decided{state}")
                else:
                    bar.set_text(f"{what}{size} · seed {request.seed} · step {done}/{total}{state}")
                bar.set_loading(done / total if total else 0.0)
                return
            bar.set_loading(None)
            if proposal.text is not None:
                # short enough for 80 columns (y and n work too; F1 lists them)
                bar.set_text(f"{'Fill-in' if fill else 'Proposal'}{size} · seed {request.seed} · Enter accept · "
                             "Esc reject · r another · +/- size")
                return
        bar.set_loading(None)
        text = editor.text
        words = len(text.split())
        if self._save_error:
            saved = self._save_error
        else:
            saved = "saved" if text == self._saved_text else "editing…"
        note = self._note or ""
        if self._accepted is not None:
            before, after = self._accepted
            if text == after:
                note = "accepted · Ctrl+Z undoes it"
            elif text == before:
                note = "undone · Ctrl+Y redoes it"
            else:
                note = ""  # edited since: the note would be about another document
        # a narrow line leaves out the engine's label first, then the file's path, then the model
        model = [(part, rank + 2) for part, rank in self.model_status_parts()]
        bar.set_parts([(saved, 0), (f"{words} words", 1), *([(note, 1)] if note else []), *model,
                       (self._short_path(), 3)])

    def _idle_status(self) -> None:
        if not self.engine_busy and self.proposal is None:
            self.update_status()

