"""`TransferPanel`: a pull, import or verification on screen (the wizard's download step, the Models
screen): phase, bar, bytes/speed/time left, the hub's messages (retries), then the result or the
problem, in the words of dgchat.app.model_ops."""

from __future__ import annotations

from typing import Any

from dgchat.app.model_ops import PHASES, Problem, progress_text
from dgchat.hub import DownloadCancelled, Progress
from dgchat.hub.util import format_bytes
from dgchat.terminal_text import safe_message
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Label, ProgressBar, Static


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
