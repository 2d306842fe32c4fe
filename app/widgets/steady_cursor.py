"""Headless runs (tests, snapshots) keep text cursors steady: a blinking cursor made a screenshot
depend on when it was taken."""

from __future__ import annotations

from textual.widget import Widget
from textual.widgets import Input, TextArea


def steady_cursors_when_headless(root: Widget) -> None:
    """Turn off cursor blinking for every Input and TextArea under `root` when the app is headless."""
    if not root.app.is_headless:
        return
    for field in root.query(Input):
        field.cursor_blink = False
    for area in root.query(TextArea):
        area.cursor_blink = False
