"""The model picker: choose a chat's model from what is on this machine, or browse for a file.

The list comes from the model manager (dgchat.hub.ModelManager.listing, the same as the Models
screen and `dgchat models`): the model in use, the installed ones and the bundled one, then the
catalog models that are not downloaded yet. Choosing one of those downloads nothing: the picker
says how to get it (Models, F4, or `dgchat models pull NAME`) and can open the Models screen.

Typing filters the list. Typing a path (~/…, /…, ./…) — or choosing "Browse…" — lists that
folder's sub-folders and .gguf files instead; → completes the name, Enter opens a folder or
chooses a file. Every file is checked from its header (the caller's `check`) before the picker
closes with its path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dgchat import assets
from dgchat.app import model_ops
from dgchat.app.paths import short_path
from dgchat.app.widgets.path_suggester import (
    PathSuggester,
    folder_entries,
    looks_like_path,
    split_typed_path,
)
from dgchat.app.widgets.steady_cursor import steady_cursors_when_headless
from dgchat.hub.manager import ModelRow
from dgchat.hub.util import format_bytes
from dgchat.model_backend.errors import DgchatError
from dgchat.terminal_text import safe_message
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, OptionList, Static
from textual.widgets.option_list import Option

RUNNABLE = ("installed", "bundled", "in HF cache")
BROWSE_ID = "browse"


@dataclass(frozen=True)
class PickerEntry:
    """One choosable line. kind: "model" (a file that runs now), "catalog" (not here yet),
    "browse", "folder" or "file" (while browsing)."""

    kind: str
    title: str
    status: str = ""
    path: Path | None = None
    row: ModelRow | None = None
    in_use: bool = False

    def haystack(self) -> str:
        name = self.row.name if self.row is not None else ""
        return f"{self.title} {name} {self.status} {self.path.name if self.path else ''}".lower()


def _resolved(path: Path | None) -> Path | None:
    if path is None:
        return None
    try:
        return Path(path).expanduser().resolve()
    except OSError:
        return Path(path).expanduser().absolute()


def entries_from_rows(rows: list[ModelRow], current: Path | None) -> tuple[list[PickerEntry], list[PickerEntry]]:
    """(models that run now, catalog models to get first); the model in use is marked, and listed
    first when the manager does not know it (a file given with --model)."""
    here: list[PickerEntry] = []
    later: list[PickerEntry] = []
    in_use = _resolved(current)
    for row in rows:
        size = model_ops.fmt_size(row.size, row.size_exact)
        if row.path is not None and row.status in RUNNABLE:
            using = in_use is not None and _resolved(row.path) == in_use
            here.append(PickerEntry("model", row.title, f"{model_ops.where_text(row)} · {size}", row.path, row,
                                    using))
        elif row.entry is not None or row.status == "in HF cache":
            status = {"available": "not downloaded", "partial": model_ops.where_text(row),
                      "missing": "file missing", "in HF cache": "in HF cache, converted once"}.get(row.status,
                                                                                              row.status)
            later.append(PickerEntry("catalog", row.title, f"{status} · {size}", None, row))
    if current is not None and not any(e.in_use for e in here):
        here.insert(0, PickerEntry("model", current.name, "in use", current, None, True))
    here.sort(key=lambda e: not e.in_use)  # the model in use first, then the manager's order
    return here, later


def how_to_get(row: ModelRow) -> str:
    """What to do to run a catalog model that is not on this machine; nothing is downloaded here."""
    if row.status == "partial":
        return (f"{row.title}: {model_ops.where_text(row)}. Resume the download in Models (F4 → Pull), "
                f"or in a shell: dgchat models pull {row.name}")
    if row.status == "missing":
        notes = "; ".join(row.notes) or "its file is gone"
        return f"{row.title}: {notes}. Models (F4) can download or import it again."
    if row.status == "in HF cache" and row.entry is None:
        return f"{row.title}: {row.description}."
    if row.status == "in HF cache":
        return (f"{row.title} is in your Hugging Face cache but must be converted once: Models (F4 → Use), "
                f"or in a shell: dgchat models pull {row.name}")
    size = model_ops.fmt_size(row.size, row.size_exact)
    return (f"{row.title} is not downloaded ({size}). Download it in Models (F4 → Pull), "
            f"or in a shell: dgchat models pull {row.name}")


class ModelPicker(ModalScreen[Path | None]):
    """Dismisses with the chosen model file (checked), or None."""

    DEFAULT_CSS = """
    ModelPicker { align: center middle; }
    ModelPicker #picker {
        width: 90;
        max-width: 100%;
        height: 32;
        max-height: 90%;
        padding: 1 2;
        border: thick $primary 70%;
        background: $surface;
    }
    ModelPicker.-narrow #picker { width: 100%; padding: 0 1; }
    ModelPicker.-short #picker { height: 100%; max-height: 100%; padding: 0 1; }
    ModelPicker .picker--title { text-style: bold; width: 100%; }
    ModelPicker #picker-query { margin-top: 1; }
    ModelPicker.-short #picker-query { margin-top: 0; }
    ModelPicker #picker-query:focus { border: tall $accent; }
    ModelPicker #picker-list { height: 1fr; min-height: 3; text-wrap: nowrap; text-overflow: ellipsis; }
    ModelPicker #picker-list:focus { border: tall $accent; }
    ModelPicker #picker-detail { color: $text-muted; height: auto; max-height: 4; }
    ModelPicker.-short #picker-detail { max-height: 2; }
    ModelPicker #picker-message { height: auto; max-height: 4; }
    ModelPicker #picker-message.-error { color: $error; }
    ModelPicker #picker-message.-info { color: $warning; }
    ModelPicker #picker-buttons { height: auto; align-horizontal: right; }
    ModelPicker #picker-buttons Button { min-width: 8; margin-left: 1; }
    ModelPicker Button:focus { text-style: bold reverse; }
    """

    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (70, "-roomy")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (30, "-high")]

    BINDINGS = [
        Binding("escape", "cancel", "Cancel", id="dialog.cancel"),
        Binding("down", "move(1)", "Next", show=False, id="picker.next"),
        Binding("up", "move(-1)", "Previous", show=False, id="picker.previous"),
        Binding("pagedown", "move(8)", "Page down", show=False, id="picker.page_down"),
        Binding("pageup", "move(-8)", "Page up", show=False, id="picker.page_up"),
    ]

    def __init__(
        self,
        *,
        current: Path | None,
        check: Callable[[str], str | None],
        open_models: Callable[[], None] | None = None,
        title: str = "Choose a model",
    ) -> None:
        super().__init__(classes="dialog-screen")
        self.current = Path(current).expanduser() if current is not None else None
        self.check = check
        self.open_models = open_models
        self.title_text = title
        self.models: list[PickerEntry] = []
        self.catalog: list[PickerEntry] = []
        self.loaded = False
        self.shown: list[PickerEntry] = []

    def compose(self) -> ComposeResult:
        with Vertical(id="picker"):
            yield Label(self.title_text, classes="picker--title", markup=False)
            yield Input(placeholder="Type to filter, or a path: ~/models/… (→ completes)", id="picker-query",
                        suggester=PathSuggester((".gguf",)))
            yield OptionList(id="picker-list")
            yield Static("", id="picker-detail", markup=False)
            yield Static("", id="picker-message", markup=False)
            with Horizontal(id="picker-buttons"):
                yield Button("Use", variant="primary", id="picker-use")
                yield Button("Browse…", id="picker-browse")
                if self.open_models is not None:
                    yield Button("Models…", id="picker-models")
                yield Button("Cancel", id="picker-cancel")

    def on_mount(self) -> None:
        steady_cursors_when_headless(self)
        if self.current is not None:
            self.models = [PickerEntry("model", self.current.name, "in use", self.current, None, True)]
        self._say("")
        self._refresh_list()
        self.query_one("#picker-query", Input).focus()
        self._load_listing()

    @work(thread=True, exclusive=True, group="picker-listing", exit_on_error=False)
    def _load_listing(self) -> None:
        # the listing reads the registry and scans the Hugging Face cache: not on the UI thread
        try:
            rows = model_ops.make_manager().listing(None)
        except DgchatError as exc:
            self.app.call_from_thread(self._listing_failed, str(exc))
            return
        self.app.call_from_thread(self._listing_done, rows)

    def _listing_done(self, rows: list[ModelRow]) -> None:
        if self not in self.app.screen_stack:  # closed while the list was being read
            return
        self.models, self.catalog = entries_from_rows(rows, self.current)
        self.loaded = True
        self._refresh_list()

    def _listing_failed(self, message: str) -> None:
        if self not in self.app.screen_stack:
            return
        self.loaded = True
        self._say(f"The list of installed models could not be read: {message}", error=True)
        self._refresh_list()

    # -- the list -------------------------------------------------------------------------------
    @property
    def query_text(self) -> str:
        return self.query_one("#picker-query", Input).value

    def _refresh_list(self) -> None:
        text = self.query_text.strip()
        if looks_like_path(text):
            self._show_folder(text)
        else:
            self._show_models(text)

    def _fill(self, groups: list[tuple[str | None, list[PickerEntry]]], highlight: int | None) -> None:
        option_list = self.query_one("#picker-list", OptionList)
        option_list.clear_options()
        self.shown = []
        options: list[Option] = []
        for heading, entries in groups:
            if not entries:
                continue
            if heading is not None:
                options.append(Option(Text(heading, style="bold"), disabled=True))
                self.shown.append(PickerEntry("heading", heading))
            for entry in entries:
                options.append(Option(self._prompt(entry), id=str(len(self.shown))))
                self.shown.append(entry)
        option_list.add_options(options)
        choosable = [i for i, e in enumerate(self.shown) if e.kind != "heading"]
        if choosable:
            option_list.highlighted = highlight if highlight in choosable else choosable[0]
        self._show_detail()

    @staticmethod
    def _prompt(entry: PickerEntry) -> Text:
        mark = "● " if entry.in_use else "  "
        text = Text(mark + entry.title, style="bold" if entry.in_use else "")
        if entry.kind == "catalog":
            text.stylize("dim")
        if entry.status:
            text.append("  " + entry.status, style="dim italic")
        return text

    def _show_models(self, text: str) -> None:
        words = text.lower().split()

        def keep(entry: PickerEntry) -> bool:
            return all(w in entry.haystack() for w in words)

        here = [e for e in self.models if keep(e)]
        later = [e for e in self.catalog if keep(e)]
        browse = PickerEntry("browse", "Browse for a .gguf file…", "type a path, → completes")
        groups: list[tuple[str | None, list[PickerEntry]]] = [
            ("On this machine" + ("" if self.loaded else " (looking…)"), here),
            (None, [browse] if not words or keep(browse) else []),
            ("Not downloaded yet (Models, F4)", later),
        ]
        highlight = 1 if here else None  # the first model (after its heading): the one in use
        self._fill(groups, highlight)
        if words and not here and not later:
            self._say(f"No model matches “{text}”. Type a path (~/…) to browse for a file.")

    def _show_folder(self, text: str) -> None:
        folder, prefix = split_typed_path(text)
        try:
            entries = folder_entries(folder, prefix, (".gguf",))
        except FileNotFoundError:
            self._fill([], None)
            self._say(f"No such folder: {short_path(folder)}", error=True)
            return
        except OSError as exc:
            self._fill([], None)
            self._say(f"Cannot read {short_path(folder)}: {exc.strerror or exc}", error=True)
            return
        listed: list[PickerEntry] = []
        if not prefix and folder.parent != folder:
            listed.append(PickerEntry("folder", "..", "parent folder", folder.parent))
        for name, is_dir in entries:
            path = folder / name
            if is_dir:
                listed.append(PickerEntry("folder", name + "/", "folder", path))
            else:
                try:
                    size = format_bytes(path.stat().st_size)
                except OSError:
                    size = ""
                listed.append(PickerEntry("file", name, size, path))
        heading = f"In {short_path(folder)}: folders and .gguf files"
        # Enter should take a model when there is one here, else go into the first folder
        kinds = [e.kind for e in listed]
        first = kinds.index("file") if "file" in kinds else next(
            (i for i, e in enumerate(listed) if e.title != ".."), 0)
        self._fill([(heading, listed)], 1 + first if listed else None)
        if not entries:
            self._say("No folders or .gguf files here" + (f" starting with “{prefix}”." if prefix else "."))

    @property
    def highlighted(self) -> PickerEntry | None:
        index = self.query_one("#picker-list", OptionList).highlighted
        if index is None or not 0 <= index < len(self.shown):
            return None
        entry = self.shown[index]
        return None if entry.kind == "heading" else entry

    def _show_detail(self) -> None:
        entry = self.highlighted
        detail = ""
        if entry is not None:
            if entry.kind == "model" and entry.row is not None and entry.row.status == "bundled":
                detail = entry.row.description  # its path is inside dgchat's package: not worth a line
            elif entry.kind == "model" and entry.path is not None:
                description = entry.row.description if entry.row is not None else ""
                detail = "\n".join(x for x in (description, short_path(entry.path)) if x)
            elif entry.kind == "catalog" and entry.row is not None:
                detail = entry.row.description
            elif entry.kind == "browse":
                detail = "A GGUF text-diffusion model (LLaDA, Dream, RND1, DiffusionGemma) anywhere on disk."
        self.query_one("#picker-detail", Static).update(detail)
        catalog = entry is not None and entry.kind == "catalog"
        for button in self.query("#picker-models"):
            button.display = catalog
        self.query_one("#picker-use", Button).label = "Open" if entry is not None and entry.kind == "folder" else "Use"

    def _say(self, text: str, *, error: bool = False, info: bool = False) -> None:
        message = self.query_one("#picker-message", Static)
        message.update(safe_message(text, 4000))  # may quote a file's or a server's problem
        message.display = bool(text)
        message.set_class(error, "-error")
        message.set_class(info, "-info")

    # -- events ---------------------------------------------------------------------------------
    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self._say("")
        self._refresh_list()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        text = event.value.strip()
        if looks_like_path(text):
            self._submit_path(text)
        else:
            self._act(self.highlighted)

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        event.stop()
        self._show_detail()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self._act(self.highlighted)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        button = event.button.id
        if button == "picker-use":
            self._act(self.highlighted)
        elif button == "picker-browse":
            self._browse()
        elif button == "picker-models":
            self._to_models()
        else:
            self.action_cancel()

    # -- actions --------------------------------------------------------------------------------
    def action_move(self, by: int) -> None:
        """↑/↓ move through the list while typing in the query (a focused list handles them itself)."""
        option_list = self.query_one("#picker-list", OptionList)
        choosable = [i for i, e in enumerate(self.shown) if e.kind != "heading"]
        if not choosable:
            return
        current = option_list.highlighted
        if current not in choosable:
            option_list.highlighted = choosable[0]
            return
        position = max(0, min(len(choosable) - 1, choosable.index(current) + by))
        option_list.highlighted = choosable[position]

    def action_cancel(self) -> None:
        self.dismiss(None)

    def _act(self, entry: PickerEntry | None) -> None:
        if entry is None:
            if not self.shown:
                self._say("Nothing to choose here.", error=True)
            return
        if entry.kind in ("model", "file") and entry.path is not None:
            self._choose(entry.path)
        elif entry.kind == "folder" and entry.path is not None:
            self._set_query(_typed(entry.path, folder=True))
        elif entry.kind == "browse":
            self._browse()
        elif entry.kind == "catalog" and entry.row is not None:
            more = "\nModels… opens the Models screen." if self.open_models is not None else ""
            self._say(how_to_get(entry.row) + more, info=True)

    def _choose(self, path: Path) -> None:
        problem = self.check(str(path))
        if problem:
            self._say(problem, error=True)
            return
        self.dismiss(path)

    def _submit_path(self, text: str) -> None:
        path = Path(text).expanduser()
        if path.is_file():
            self._choose(path)
        elif path.is_dir():
            if not text.endswith("/"):
                self._set_query(text + "/")
            else:
                self._act(self.highlighted)
        elif self.highlighted is not None:
            self._act(self.highlighted)  # a started name: the first folder or file it matches
        else:
            self._say(f"No such file or folder: {text}", error=True)

    def _browse(self) -> None:
        # from the model in use's folder; the bundled model's folder is inside dgchat's package
        start = self.current.parent if self.current is not None and self.current != assets.bundled_model_path() \
            else Path.home()
        if not start.is_dir():
            start = Path.home()
        self._set_query(_typed(start, folder=True))

    def _set_query(self, text: str) -> None:
        query = self.query_one("#picker-query", Input)
        query.value = text
        query.cursor_position = len(text)
        query.focus()

    def _to_models(self) -> None:
        open_models = self.open_models
        self.dismiss(None)
        if open_models is not None:
            self.app.call_later(open_models)


def _typed(path: Path, *, folder: bool) -> str:
    """A path as a person would type it (~/… under the home folder), folders with a trailing /."""
    text = "~" if path == Path.home() else short_path(path)
    if folder and not text.endswith("/"):
        text += "/"
    return text
