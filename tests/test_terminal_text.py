"""Text from outside at the terminal (issue 31): the one rule (dgchat.terminal_text), the places
outside the app that use it (error lines, `generate`'s output, exports), and the app's output
guard. The app's own views are tested under Pilot and in a pty in tests/app/test_outside_text.py."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest

from dgchat.terminal_text import (
    MESSAGE_LIMIT,
    cli_line,
    for_stream,
    one_line,
    safe_document,
    safe_message,
    terminal_safe,
)

PAYLOAD = "title \x1b]0;pwned\x07 clear \x1b[2J csi \x9b31m bidi \u202egnp.exe mark \u200e."


def _no_raw_controls(text: str) -> bool:
    """No character a terminal acts on: C0 (but newline), DEL, C1, bidi overrides and isolates."""
    return not any(
        (ord(c) < 32 and c != "\n") or 0x7F <= ord(c) < 0xA0 or 0x202A <= ord(c) <= 0x202E or 0x2066 <= ord(c) <= 0x2069
        for c in text
    )


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty


def test_the_rule_shows_controls_as_pictures_and_defuses_bidi():
    shown = terminal_safe(PAYLOAD)
    assert shown == "title ␛]0;pwned␇ clear ␛[2J csi \ufffd31m bidi \ufffdgnp.exe mark ."
    assert _no_raw_controls(shown)
    # the canvas renderers' names for it are the same rule, not a copy
    from dgchat.model_backend import canvas_view

    assert canvas_view.terminal_safe is terminal_safe
    assert canvas_view.VISIBLE_CONTROLS is __import__("dgchat.terminal_text").terminal_text.VISIBLE_CONTROLS


def test_documents_keep_their_tabs_and_crlf_line_ends_but_not_a_lone_cr():
    assert safe_document("a\tb\r\nc\rd\x1b[2J") == "a\tb\nc␍d␛[2J"
    assert terminal_safe("a\tb") == "a b"  # the canvas and one-line places lay no tabs out


def test_one_line_is_one_sanitised_bounded_line():
    body = "upstream said:\r\n" + "\x1b]0;pwned\x07" + "x" * 100_000 + "\nmore\n"
    line = one_line(body)
    assert "\n" not in line and "\r" not in line and _no_raw_controls(line)
    assert line.startswith("upstream said: ␛]0;pwned␇xxx")
    assert len(line) == MESSAGE_LIMIT and line.endswith("...")
    assert one_line("  a\n\n b\t c  ") == "a b c"
    assert one_line("short", 3) == "..."  # never longer than the limit
    assert one_line(ValueError("bad \x1b[31mred")) == "bad ␛[31mred"


def test_safe_message_keeps_lines_and_bounds_the_length():
    text = safe_message("line 1\n\x1b[2Jline 2" + "y" * 10_000, 100)
    assert text.startswith("line 1\n␛[2Jline 2") and len(text) == 100 and text.endswith("...")


def test_a_terminal_gets_the_rule_a_pipe_gets_the_exact_text():
    assert for_stream(PAYLOAD, _Stream(tty=True)) == safe_document(PAYLOAD)
    assert for_stream(PAYLOAD, _Stream(tty=False)) == PAYLOAD


def test_cli_line_writes_one_line_per_message():
    err = io.StringIO()
    cli_line("error", "server answered 500:\n<html>\x1b]0;pwned\x07" + "z" * 50_000, err)
    out = err.getvalue()
    assert out.count("\n") == 1 and out.startswith("dgchat: error: server answered 500: <html>␛]0;pwned␇zz")
    assert _no_raw_controls(out.rstrip("\n")) and len(out) < MESSAGE_LIMIT + 30


def test_every_command_line_error_is_one_sanitised_bounded_line(tmp_path):
    """`dgchat: error:` comes from one printer for every command: an error quoting hostile text
    (here a card path with an escape sequence and a newline, 20 KB long) prints one safe line."""
    card = "/nonexistent/\x1b]0;pwned\x07\nsecond line" + "/k" * 10_000 + ".toml"
    env = {"DGCHAT_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
           "PYTHONPATH": ":".join(p for p in sys.path if p)}
    run = subprocess.run([sys.executable, "-m", "dgchat", "npc", "--cards", card, "--list-cards"], env=env,
                         capture_output=True, timeout=60)
    assert run.returncode == 2
    err = run.stderr.decode()
    assert err.count("\n") == 1, err[:300]
    assert err.startswith("dgchat: error: /nonexistent/␛]0;pwned␇ second line/k/k")
    assert "\x1b" not in err and "\x07" not in err and len(err) < MESSAGE_LIMIT + 30


# -- the app's output guard ---------------------------------------------------------------------------

async def test_the_guard_keeps_control_characters_of_any_widget_off_the_terminal():
    """An Input and a TextArea (which lay their text out themselves, so dgchat cannot give them
    pictures) holding ESC sequences: the terminal output of the screen has none of them, and the
    lines keep their width (the dropped characters are zero cells wide)."""
    from textual.app import App
    from textual.widgets import Input, TextArea

    from dgchat.app import terminal_guard

    class Probe(App):
        def compose(self):
            yield Input("in \x1b]0;pwned\x07 put", id="i")
            yield TextArea("area \x1b[2J \u202eevil\x9b", id="t")

    terminal_guard.install()
    terminal_guard.install()  # idempotent: one wrapper
    app = Probe()
    async with app.run_test(size=(60, 12)) as pilot:
        await pilot.pause()
        out = app.screen._compositor.render_update(full=True).render_segments(app.console)
        assert "\x1b]0;pwned" not in out and "\x1b[2J" not in out
        assert "\u202e" not in out and "\x9b" not in out
        assert "in ]0;pwned put" in out and "area [2J evil" in out


def test_clean_strip_drops_only_the_unsafe_characters():
    from rich.segment import Segment
    from textual.strip import Strip

    from dgchat.app.terminal_guard import clean_strip

    plain = Strip([Segment("plain text")])
    assert clean_strip(plain) is plain
    dirty = Strip([Segment("a\x1b[2Jb\x07"), Segment("\u2066c\u200e")])
    cleaned = clean_strip(dirty)
    assert cleaned.text == "a[2Jbc" and cleaned.cell_length == dirty.cell_length


# -- exports ------------------------------------------------------------------------------------------

def test_the_markdown_export_is_safe_to_cat_to_a_terminal(tmp_path):
    from dgchat.app.export import export_chat
    from dgchat.app.store import Store

    with Store(tmp_path / "chats.db") as store:
        chat = store.create_chat("t")
        store.add_message(chat.id, "user", "q\x1b[2J")
        store.add_message(chat.id, "assistant", "a\x1b]0;pwned\x07\tcode", meta={"model": "m\x1b[31m"})
        store.rename_chat(chat.id, "title \x1b]0;x\x07")
        chat = store.get_chat(chat.id)
        written = export_chat(chat, store.messages(chat.id), tmp_path / "out.md")
        # the database keeps the exact text; the file a person cats gets the rule
        assert store.messages(chat.id)[1].content == "a\x1b]0;pwned\x07\tcode"
    text = written.read_text(encoding="utf-8")
    assert "\x1b" not in text and "\x07" not in text
    assert "a␛]0;pwned␇\tcode" in text and "q␛[2J" in text and "title ␛]0;x␇" in text and "m␛[31m" in text


@pytest.mark.parametrize("tty", [True, False])
def test_generate_prints_the_rule_on_a_terminal_and_exact_text_elsewhere(tty):
    from types import SimpleNamespace

    from dgchat.commands import generate

    final = SimpleNamespace(text="answer \x1b]0;pwned\x07\x1b[2J\n", stop_reason="eos")
    out = _Stream(tty)
    saved = sys.stdout
    sys.stdout = out
    try:
        generate._report(final, SimpleNamespace(json=False), lambda: {})
    finally:
        sys.stdout = saved
    assert out.getvalue() == ("answer ␛]0;pwned␇␛[2J\n" if tty else "answer \x1b]0;pwned\x07\x1b[2J\n")


def test_generate_json_keeps_the_exact_text_on_a_terminal_too():
    import json
    from types import SimpleNamespace

    from dgchat.commands import generate

    final = SimpleNamespace(text="answer \x1b[2J", stop_reason="eos")
    out = _Stream(True)
    saved = sys.stdout
    sys.stdout = out
    try:
        generate._report(final, SimpleNamespace(json=True), lambda: {"text": final.text})
    finally:
        sys.stdout = saved
    assert json.loads(out.getvalue())["text"] == "answer \x1b[2J"
    assert "\x1b" not in out.getvalue()  # JSON's own escape: the terminal sees \u001b


def test_cards_listed_on_a_terminal_follow_the_rule(tmp_path, monkeypatch, capsys):
    card = tmp_path / "guard.toml"
    card.write_text('name = "Brann \\u001b]0;pwned\\u0007"\nrole = "guard"\n', encoding="utf-8")
    from dgchat.cli import main

    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    assert main(["npc", "--cards", str(card), "--list-cards"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "Brann ␛]0;pwned␇" in out



# -- the app's views that build their text from outside text (no app needed) ---------------------------

def test_search_hits_show_the_rule_and_keep_their_highlights():
    from dgchat.app.search_modal import highlighted
    from dgchat.app.store import HIGHLIGHT_END, HIGHLIGHT_START

    text = highlighted(f"a\x1b[2J {HIGHLIGHT_START}hit\x1b]0;x\x07{HIGHLIGHT_END} z")
    assert text.plain == "a␛[2J hit␛]0;x␇ z"
    [span] = text.spans
    assert text.plain[span.start:span.end] == "hit␛]0;x␇" and "reverse" in str(span.style)


def test_an_answers_line_names_a_hostile_model_and_error_on_one_safe_line():
    from dgchat.app.store import Message
    from dgchat.app.widgets.message import meta_line

    message = Message(id=1, chat_id=1, role="assistant", content="x", status="error", created_at=0.0,
                      meta={"model": "m\x1b]0;pwned\x07", "error": "upstream 502:\n<html>\x1b[2J" + "e" * 5000})
    line = meta_line(message)
    assert "\n" not in line and _no_raw_controls(line)
    assert "m␛]0;pwned␇" in line and "upstream 502: <html>␛[2J" in line and len(line) < 800


def test_npc_variants_show_the_models_line_by_the_rule():
    from types import SimpleNamespace

    from dgchat.app.widgets.npc import variant_content

    batch = SimpleNamespace(spec=SimpleNamespace(template=None, variables={}))
    variant = SimpleNamespace(text="Halt!\x1b]0;pwned\x07\u202e", holes=[])
    assert variant_content(batch, variant).plain == "Halt!␛]0;pwned␇\ufffd"


def test_dialogs_quote_outside_text_by_the_rule_and_bounded():
    from dgchat.app.confirm_modal import ConfirmModal
    from dgchat.app.error_modal import MESSAGE_LIMIT as ERROR_LIMIT
    from dgchat.app.error_modal import ErrorModal

    error = ErrorModal("Generation failed", "502\n\x1b]0;pwned\x07" + "x" * 100_000)
    assert error.message.startswith("502\n␛]0;pwned␇x") and len(error.message) == ERROR_LIMIT
    confirm = ConfirmModal("Delete [b]Brann\x1b[2J?", "The card \x1b]0;x\x07 is removed.")
    assert confirm.title_text == "Delete [b]Brann␛[2J?" and confirm.message == "The card ␛]0;x␇ is removed."
