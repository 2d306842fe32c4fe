"""The messages a wizard step posts to the wizard screen (they bubble up from the step): the steps
never call one another, and the screen decides what a step's outcome means for the others."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dgchat.app.model_source import ServerSource
from dgchat.app.wizard.speed import SpeedReport
from dgchat.hub.manager import ModelRow
from textual.message import Message


@dataclass(frozen=True)
class ServerChoice:
    """The server the form checked, and what the ready step says and saves of it."""

    source: ServerSource
    model: str  # what it serves (the model the session will use), as shown
    is_dgchat: bool
    typed_key: str | None  # the key typed in the form (saved only if `save_key`)
    save_key: bool  # "save the key in the config file" was ticked


class GoToStep(Message):
    """Show this step (one of step.STEPS, or "server")."""

    def __init__(self, step: str) -> None:
        super().__init__()
        self.step = step


class NavChanged(Message):
    """What the step offers in the button bar changed. `focus`: after the next refresh, "step" puts
    the focus where the step wants it (as when it shows), a button id on that button."""

    def __init__(self, focus: str = "") -> None:
        super().__init__()
        self.focus = focus


class NextRequested(Message):
    """Do what the main button does, if it can be pressed (a model table row was chosen)."""


class UseModel(Message):
    """A model on this machine was chosen (installed, bundled): test it."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path


class GetModel(Message):
    """A model to download (or to import from the Hugging Face cache) first."""

    def __init__(self, row: ModelRow, *, keep_checkpoint: bool = False) -> None:
        super().__init__()
        self.row = row
        self.keep_checkpoint = keep_checkpoint


class Downloaded(Message):
    """The download (or import) ended with the model file at `path`."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path


class UseServer(Message):
    """The server form's server was chosen: test it."""

    def __init__(self, choice: ServerChoice) -> None:
        super().__init__()
        self.choice = choice


class SpeedChanged(Message):
    """This machine's speed: measuring began, progressed or ended (`settled`: a profile came, or
    the measurement failed or stopped, so the model list may change)."""

    def __init__(self, report: SpeedReport, *, settled: bool = False) -> None:
        super().__init__()
        self.report = report
        self.settled = settled


class Finished(Message):
    """The choice is saved in the config and the model is loaded: the wizard closes into the chat."""
