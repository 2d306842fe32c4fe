"""The line under the prompt: which model, how it runs, loading progress."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Label, ProgressBar


class StatusBar(Horizontal):
    DEFAULT_CSS = """
    StatusBar { height: 1; }
    StatusBar > #status-text { width: 1fr; }
    StatusBar > ProgressBar { width: 30; display: none; }
    StatusBar.-loading > ProgressBar { display: block; }
    """

    def compose(self) -> ComposeResult:
        yield Label("", id="status-text", markup=False)
        yield ProgressBar(total=100, show_eta=False, id="load-progress")

    def set_text(self, text: str) -> None:
        self.query_one("#status-text", Label).update(text)

    def set_loading(self, fraction: float | None) -> None:
        bar = self.query_one(ProgressBar)
        if fraction is None:
            self.remove_class("-loading")
            return
        self.add_class("-loading")
        bar.update(progress=round(100 * max(0.0, min(1.0, fraction))))
