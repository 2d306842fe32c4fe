"""One message of the conversation: a user prompt (plain text) or a final answer (Markdown).

A turn with several versions (regenerated answers, edited prompts) shows "‹ 2/3 ›" in the header;
[ / ] (or Left / Right) on the focused message flip between them (the chat screen does the flip).
`p` on an answer replays its denoising in place of its text (app/widgets/replay.py) and `x` exports
that as an asciicast; the chat screen loads the recording.
"""

from __future__ import annotations

from typing import Any

from dgchat.app.store import Message
from dgchat.app.widgets.replay import ReplayView
from dgchat.recording.history import DenoisingHistory
from dgchat.terminal_text import one_line, safe_document
from markdown_it import MarkdownIt
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message as TextualMessage
from textual.widgets import Label, Markdown, Static

STATUS_LABEL = {"stopped": "stopped", "error": "failed", "generating": "interrupted"}

# An answer's tok/s divides its tokens by the time spent denoising whole canvases: for an answer
# that used a small part of its canvas (a 3-token reply on a 256-position canvas) that reads as a
# slow model when the model was fast. The rate is shown only for answers of at least
# MIN_RATE_TOKENS tokens that filled at least MIN_RATE_FILL of the canvas positions decided;
# otherwise the line says what was computed and how long it took: "3 tokens (canvas 256) · … · 1.3 s".
MIN_RATE_TOKENS = 16
MIN_RATE_FILL = 0.5


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _number(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def speed_parts(stats: dict[str, Any], canvas_length: int, *, blocks: bool = False) -> tuple[str, str]:
    """(what the tokens were decided on, how fast): ("", "51.2 tok/s") for an answer that filled
    its canvas, ("canvas 256", "1.3 s") for a short one (see MIN_RATE_TOKENS); `blocks`: the
    canvases were the blocks of a block-diffusion answer ("2 blocks of 4")."""
    tokens = _count(stats.get("tokens"))
    rate = _number(stats.get("tokens_per_s"))
    elapsed = _number(stats.get("elapsed_s"))
    canvases = _count(stats.get("canvases"))
    positions = canvases * canvas_length
    filled = tokens >= MIN_RATE_FILL * positions if positions else True
    if rate > 0 and tokens >= MIN_RATE_TOKENS and filled:
        return "", f"{rate:.1f} tok/s"
    canvas = ""
    if positions and blocks:
        canvas = f"{canvases} block{'s' if canvases != 1 else ''} of {canvas_length}"
    elif positions:
        canvas = f"canvas {canvas_length}" if canvases == 1 else f"{canvases} canvases of {canvas_length}"
    return canvas, (f"{elapsed:.1f} s" if elapsed > 0 else "")


def meta_line(message: Message) -> str:
    """'128 tokens · 64 steps · 51.2 tok/s · model' for a finished answer; a short answer says what
    it was decided on and how long that took instead of a rate: '3 tokens (canvas 256) · 8 steps ·
    1.3 s · model' (see speed_parts). A block-diffusion answer counts its blocks: '512 tokens ·
    128 blocks · 436 steps · 255.1 tok/s · model'."""
    meta = message.meta
    parts: list[str] = []
    stats = meta.get("stats") or {}
    if isinstance(stats, dict) and stats:
        params = meta.get("params") if isinstance(meta.get("params"), dict) else {}
        blocks = _count(meta.get("block_size")) > 0
        canvas, speed = speed_parts(stats, _count(params.get("gen_length")), blocks=blocks)
        parts.append(f"{_count(stats.get('tokens'))} tokens" + (f" ({canvas})" if canvas else ""))
        if blocks and not canvas:
            n = _count(stats.get("canvases"))
            parts.append(f"{n} block{'s' if n != 1 else ''}")
        parts.append(f"{_count(stats.get('steps'))} steps")
        if speed:
            parts.append(speed)
    seed = meta.get("seed")
    if isinstance(seed, int) and not isinstance(seed, bool):
        parts.append(f"seed {seed}")  # with the stored params, this version can be had again
    reason = meta.get("stop_reason")
    if reason == "max_tokens" and message.status == "done":
        parts.append("hit max tokens")
    # a server's model name and error text are outside text: one line, terminal-safe, bounded
    if meta.get("model"):
        parts.append(one_line(meta["model"], 200))
    if meta.get("error"):
        parts.append(one_line(meta["error"], 500))
    return " · ".join(parts)


class MessageView(Vertical, can_focus=True):
    """Focus a message (Tab / click) to copy it, edit a prompt, or regenerate the last answer."""

    BINDINGS = [
        Binding("c", "copy", "Copy", id="message.copy"),
        Binding("e", "edit", "Edit & re-run", id="message.edit"),
        Binding("r", "regenerate", "Regenerate", id="message.regenerate"),
        Binding("left_square_bracket,left", "older_version", "Older version", id="message.older_version"),
        Binding("right_square_bracket,right", "newer_version", "Newer version", id="message.newer_version"),
        Binding("p", "replay", "Replay", id="message.replay"),
        Binding("x", "export_recording", "Export .cast", show=False, id="message.export_recording"),
    ]

    class Action(TextualMessage):
        def __init__(self, view: MessageView, action: str) -> None:
            super().__init__()
            self.view = view
            self.action = action

    def __init__(self, message: Message, **kwargs: Any) -> None:
        classes = f"message -{message.role} -{message.status}"
        super().__init__(classes=classes, **kwargs)
        self.message = message

    def compose(self) -> ComposeResult:
        m = self.message
        who = "You" if m.role == "user" else "Assistant"
        status = STATUS_LABEL.get(m.status)
        header = who + (f" · {status}" if status else "") + version_marker(m)
        yield Label(header, classes="message--header")
        # what the database keeps is exact; what reaches the terminal follows dgchat.terminal_text's
        # rule: an answer's ESC]0;...BEL or ESC[2J (any server or model can send one, and a stored
        # chat replays it on every open) shows as ␛]0;...␇, never drives the terminal
        if m.role == "user":
            yield Static(safe_document(m.content), markup=False, classes="message--body")
        elif m.content.strip():
            yield Markdown(safe_document(m.content), classes="message--body", parser_factory=markdown_parser)
        else:
            empty = "(stopped before any text was decided)" if m.status != "done" else "(empty answer)"
            yield Static(empty, markup=False, classes="message--body -empty")
        if m.role == "assistant":
            line = meta_line(m)
            if line:
                yield Label(line, markup=False, classes="message--meta")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "edit":
            return self.message.role == "user"
        if action == "regenerate":
            # only the conversation's last answer can be regenerated: no key offered where it is refused
            return self.message.role == "assistant" and self._ends_conversation()
        if action in ("replay", "export_recording"):
            return self.message.role == "assistant"
        if action == "older_version":
            return self.message.versions > 1 and (self.message.version > 1 or None)
        if action == "newer_version":
            return self.message.versions > 1 and (self.message.version < self.message.versions or None)
        return True

    def _ends_conversation(self) -> bool:
        parent = self.parent
        if parent is None:
            return False
        views = [child for child in parent.children if isinstance(child, MessageView)]
        return bool(views) and views[-1] is self

    def action_copy(self) -> None:
        self.post_message(self.Action(self, "copy"))

    def action_edit(self) -> None:
        self.post_message(self.Action(self, "edit"))

    def action_regenerate(self) -> None:
        self.post_message(self.Action(self, "regenerate"))

    def action_replay(self) -> None:
        self.post_message(self.Action(self, "replay"))

    def action_export_recording(self) -> None:
        self.post_message(self.Action(self, "export_recording"))

    @property
    def replay(self) -> ReplayView | None:
        found = self.query(ReplayView)
        return found.first() if found else None

    async def start_replay(self, history: DenoisingHistory) -> ReplayView:
        """Show the answer's denoising in place of its text (until the replay is closed)."""
        old = self.replay
        if old is not None:
            await old.remove()
        for body in self.query(".message--body"):
            body.display = False
        view = ReplayView(history, classes="message--replay")
        await self.mount(view, after=self.query_one(".message--header"))
        view.focus()
        return view

    async def on_replay_view_closed(self, message: ReplayView.Closed) -> None:
        message.stop()
        await message.view.remove()
        for body in self.query(".message--body"):
            body.display = True
        self.focus()

    def action_older_version(self) -> None:
        self.post_message(self.Action(self, "older_version"))

    def action_newer_version(self) -> None:
        self.post_message(self.Action(self, "newer_version"))


def markdown_parser() -> MarkdownIt:
    """Markdown without raw HTML: a model's `<b>` or `<unused12>` is text to show, not markup to
    drop (Textual renders no HTML, so an answer made of such tokens showed as nothing)."""
    return MarkdownIt("gfm-like", options_update={"html": False})


def version_marker(message: Message) -> str:
    """'  ‹ 2/3 ›' on a turn with several versions, '' otherwise."""
    if message.versions <= 1:
        return ""
    return f"  ‹ {message.version}/{message.versions} ›"
