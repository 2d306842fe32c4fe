"""PathText (app/widgets/path_text.py): a path longer than its line breaks after a '/', not inside
a name; everything else wraps as Textual wraps it."""

from __future__ import annotations

from dgchat.app.widgets.path_text import PathText, line_spans
from textual.content import Content


def _lines(text: str, width: int) -> list[str]:
    return [text[a:b] for a, b in line_spans(text, width)]


def test_a_path_longer_than_a_line_breaks_after_a_slash() -> None:
    assert _lines("in ~/.local/share/dgchat/models", 20) == ["in ~/.local/share/", "dgchat/models"]
    repo = "from huggingface.co/mradermacher/LLaDA-MoE-7B-A1B-Instruct-GGUF · x.gguf\ninto ~/models"
    assert _lines(repo, 54) == ["from huggingface.co/mradermacher/", "LLaDA-MoE-7B-A1B-Instruct-GGUF · x.gguf",
                                "into ~/models"]


def test_words_that_fit_wrap_as_before() -> None:
    assert _lines("a path ~/x/y fits whole on the next line", 12) == ["a path ~/x/y", "fits whole", "on the next",
                                                                        "line"]
    assert _lines("needs 7.4 GiB in ~/.local/share/dgchat/models; free", 40) == [
        "needs 7.4 GiB in", "~/.local/share/dgchat/models; free"]
    assert _lines("a\n\nb", 10) == ["a", "", "b"]
    assert _lines("", 10) == [""]


def test_a_part_longer_than_a_line_is_folded_at_the_edge() -> None:
    assert _lines("~/averyveryverylongname/x", 10) == ["~/", "averyveryv", "erylongnam", "e/x"]


def test_styles_are_kept() -> None:
    text = PathText(Content.from_markup("[b]bold[/b] ~/x/y/zzz"))
    assert text.at(6).plain == "bold\n~/x/y/\nzzz" and str(text) == "bold ~/x/y/zzz"
    assert [(s.start, s.end) for s in text.at(6).spans] == [(0, 4)]
