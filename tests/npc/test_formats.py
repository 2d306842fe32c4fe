"""NPC file formats without a model: cards, templates, banned words, lines files, the export schema."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from dgchat.npc.banned import BannedWords
from dgchat.npc.cards import CharacterCard, find_card, load_card_file, load_cards, parse_card, save_card
from dgchat.npc.errors import CardError, ExportError, LinesFileError, MissingVariableError, TemplateError
from dgchat.npc.export import load_schema, schema_path, validate_export
from dgchat.npc.lines_file import load_lines_file
from dgchat.npc.paths import cards_dir
from dgchat.npc.schema_check import schema_errors
from dgchat.npc.templates import DEFAULT_HOLE_LENGTHS, Hole, Slot, parse_template

GUARD = {
    "id": "gate_guard",
    "name": "Captain Brann",
    "role": "the night captain of the city gate",
    "setting": "A walled trading city.",
    "voice": "Gruff, clipped sentences.",
    "examples": ["Move along, traveller.", "Gate's shut till dawn."],
    "banned_words": ["okay", "dude"],
}


def test_card_renders_the_documented_persona() -> None:
    card = parse_card(GUARD)
    assert card.system_prompt() == (
        "You are Captain Brann, the night captain of the city gate.\n"
        "Setting: A walled trading city.\n"
        "Voice: Gruff, clipped sentences.\n"
        "Example lines:\n"
        "- Move along, traveller.\n"
        "- Gate's shut till dawn.\n"
        "Never use these words: okay, dude.\n"
        "Speak only as Captain Brann: reply with the line of dialogue itself, without quotes, stage directions "
        "or narration."
    )
    minimal = parse_card({"name": "Mira the Baker"})
    assert minimal.id == "mira_the_baker"
    assert minimal.system_prompt().startswith("You are Mira the Baker.\nSpeak only as Mira the Baker")


@pytest.mark.parametrize("data, message", [
    ({}, "`name` is required"),
    ({"name": ""}, "`name` is empty"),
    ({"name": "A", "nmae": "typo"}, "unknown key `nmae`"),
    ({"name": 3}, "`name` must be a string"),
    ({"name": "A\nB"}, "`name` must be one line"),
    ({"name": "A", "examples": "one line"}, "`examples` must be a list"),
    ({"name": "A", "examples": ["ok", ""]}, r"`examples\[1\]` is empty"),
    ({"name": "A", "banned_words": ["Dude", "dude"]}, "listed twice"),
    ({"name": "A", "id": "bad id!"}, "may hold only"),
    ({"name": "A", "voice": "x" * 3000}, "the limit is 2000"),
])
def test_card_errors_name_the_problem(data: dict, message: str) -> None:
    with pytest.raises(CardError, match=message):
        parse_card(data, "cards.toml")


def test_card_files_folders_and_lookup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DGCHAT_HOME", str(tmp_path / "home"))
    assert load_cards() == []  # no cards folder yet
    card = parse_card(GUARD)
    path = save_card(card)
    assert path == cards_dir() / "gate_guard.toml" and path.parent == tmp_path / "home" / "data" / "npc" / "cards"
    assert [c.as_dict() for c in load_cards()] == [card.as_dict()]
    assert not list(path.parent.glob(".*tmp"))  # the atomic write left no temp file
    many = tmp_path / "many.toml"
    many.write_text('[[card]]\nname = "Mira the Baker"\n\n[[card]]\nid = "smith"\nname = "Old Tom"\n')
    cards = load_cards([path.parent, many])
    assert [c.id for c in cards] == ["gate_guard", "mira_the_baker", "smith"]
    assert find_card(cards, "smith").name == "Old Tom"
    assert find_card(cards, "old tom").id == "smith"
    with pytest.raises(CardError, match="no character card 'nobody'"):
        find_card(cards, "nobody")
    with pytest.raises(CardError, match="two cards have the id 'gate_guard'"):
        load_cards([path, path])
    broken = tmp_path / "broken.toml"
    broken.write_text("name = \n")
    with pytest.raises(CardError, match="not valid TOML"):
        load_card_file(broken)
    with pytest.raises(CardError, match="no such file"):
        load_card_file(tmp_path / "missing.toml")


def test_card_toml_round_trips_awkward_text(tmp_path: Path) -> None:
    card = CharacterCard(name='Zoë "the Quill"', voice='Says \\o/ and\ttabs\nand "quotes" \x7f', examples=("日本 😀",))
    path = save_card(card, tmp_path / "z.toml")
    assert tomllib.loads(path.read_text())["voice"] == card.voice
    assert load_card_file(path)[0].as_dict() == card.as_dict()


def test_template_syntax() -> None:
    t = parse_template("Halt, {player}! None may pass the {___} after dark.")
    assert t.parts == ("Halt, ", Slot("player"), "! None may pass the ", Hole(0, DEFAULT_HOLE_LENGTHS), " after dark.")
    t = parse_template("{{literal}} {___:4} and {_____:2-4} {name}{___:3-40}")
    holes = t.holes
    assert t.parts[0] == "{literal} "
    assert holes[0].lengths == (4,) and not holes[0].auto
    assert holes[1].lengths == (2, 3, 4) and holes[1].auto and holes[1].default_length == 3
    assert holes[2].lengths[0] == 3 and holes[2].lengths[-1] == 40 and len(holes[2].lengths) == 6
    filled = t.fill({"name": "{___}"})  # variable values are text, never parsed again
    assert filled.display() == "{literal} ___ and ___ {___}___"


@pytest.mark.parametrize("source, message", [
    ("Halt {", "unmatched '{'"),
    ("Halt }", "unmatched '}'"),
    ("a {two words}", "neither a variable"),
    ("a {___:0}", "needs 1 <= length"),
    ("a {___:5-2}", "needs 1 <= length"),
    ("a {___:65}", "needs 1 <= length"),
    ("a {__}", "neither a variable"),
])
def test_template_errors(source: str, message: str) -> None:
    with pytest.raises(TemplateError, match=message):
        parse_template(source)


def test_missing_variable_is_named() -> None:
    with pytest.raises(MissingVariableError, match=r"uses \{player\} but no variable 'player'"):
        parse_template("Halt, {player}!").fill({"other": "x"})


def _byte_tokenizer():
    """A byte-level tokenizer: token b is byte b; 256 and up are control tokens that spell nothing
    (an end token decoded in a hole)."""
    import numpy as np

    from dgchat.npc.templates import Tokenizer

    return Tokenizer(lambda text: np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32),
                     lambda token: b"" if token >= 256 else bytes([token]))


def _read(source: str, holes: list[bytes | None], variables: dict | None = None):
    """The line read back from a canvas whose holes hold `holes` (None: spells nothing)."""
    import numpy as np

    from dgchat.npc.templates import plan_canvas, read_canvas

    tok = _byte_tokenizer()
    filled = parse_template(source).fill(variables or {})
    lengths = [max(1, len(h or b"")) for h in holes]
    plan = plan_canvas(filled, lengths, tok, fill_token=0)
    tokens = plan.tokens.copy()
    for (start, end), hole in zip(plan.spans, holes, strict=True):
        tokens[start:end] = list(hole) if hole else [256] * (end - start)
    text, hole_texts, spans = read_canvas(plan, tokens, tok)
    assert [text[a:b] for a, b in spans] == hole_texts  # the spans point at what each hole says
    return text, hole_texts


@pytest.mark.parametrize("source, holes, line", [
    # the join of fixed text and a hole never doubles a space ("The  spake")
    ("The {___} spake", [None], "The spake"),
    ("The {___} spake", [b"  "], "The spake"),
    ("The {___} spake", [b" king"], "The king spake"),
    ("The {___} spake", [b"king "], "The king spake"),
    ("The {___} spake", [b" old king "], "The old king spake"),
    ("The {___} spake", [b"king"], "The king spake"),  # nothing to normalise
    # a line's start and end take no whitespace from a hole
    ("{___} after dark.", [b" Aye"], "Aye after dark."),
    ("None may pass the {___}", [b" gate \n"], "None may pass the gate"),
    # where the template has no space, a hole's own spacing is kept
    ("x{___}y", [b" - "], "x - y"),
    ("ga{___}te", [b"r"], "garte"),
    ("Halt,{___}!", [b" traveller"], "Halt, traveller!"),
    # the author's fixed text is kept as written, its own double spaces too
    ("Halt,  {___}!", [b" you"], "Halt,  you!"),
    ("{___:1}   {___:1}", [b" a ", b" b "], "a   b"),
    ("line one\n{___} two", [b" word"], "line one\nword two"),
    ("line one {___}\nline two", [None], "line one \nline two"),  # a newline is no double space
    ("{___}{___} end", [b"one ", b" two "], "one two end"),
    ("Halt, {___}{___}", [b"you ", None], "Halt, you"),
    ("Halt, {___}", [None], "Halt,"),
])
def test_the_joins_of_a_template_line_never_double_a_space(source: str, holes: list, line: str) -> None:
    text, _holes = _read(source, holes)
    assert text == line


def test_fixed_text_stays_as_written_away_from_the_joins() -> None:
    source = "Ünïcödé – “quotes”  {___} — ‘single’ …  naïve {player}  東京 😀 "
    text, holes = _read(source, [b" x "], {"player": "Zoë  🗡"})
    assert text == "Ünïcödé – “quotes”  x — ‘single’ …  naïve Zoë  🗡  東京 😀 "
    assert holes == ["x"]


def test_banned_words_match_whole_words_in_generated_spans() -> None:
    banned = BannedWords(["gate", "Magic Sword"])
    assert banned.find("The GATE is shut") == "GATE"
    assert banned.find("the gates are shut") is None  # a longer word is another word
    assert banned.find("a magic sword!") == "magic sword"
    assert banned.find("pass the gate after dark", spans=[(0, 9)]) is None  # only in fixed text
    assert banned.find("pass the gate after dark", spans=[(9, 13)]) == "gate"
    assert banned.find("pass the gate after dark", spans=[(12, 14)]) == "gate"  # overlaps a hole boundary
    assert not BannedWords([]) and BannedWords([]).find("anything") is None
    assert " Gate" in banned.surface_forms() and "GATE" in banned.surface_forms()


def test_lines_file(tmp_path: Path) -> None:
    cards = [parse_card(GUARD), parse_card({"name": "Mira the Baker"})]
    path = tmp_path / "lines.toml"
    path.write_text(
        '[defaults]\ncount = 2\nlength = "bark"\ntemperature = 1\n\n[variables]\nplayer = "Aria"\nlevel = 3\n\n'
        '[[line]]\ncharacter = "gate_guard"\ncontext = "gate_night"\n'
        'template = "Halt, {player}! None may pass the {___} after dark."\n\n'
        '[[line]]\ncharacter = "Mira the Baker"\ncount = 4\nseed = 9\nlength = 30\nvariables = { player = "Bo" }\n'
    )
    lines = load_lines_file(path)
    specs = lines.specs(cards, count=3, variables={"player": "Cy"})
    assert [s.card.id for s in specs] == ["gate_guard", "mira_the_baker"]
    assert specs[0].count == 3 and specs[0].seed == 0 and specs[0].length == "bark"  # command line > [defaults]
    assert specs[0].variables == {"player": "Cy", "level": "3"}
    assert specs[0].params.temperature == 1.0
    assert specs[1].count == 4 and specs[1].seed == 9 and specs[1].length_tokens == 30  # the line's own keys win
    assert specs[1].variables["player"] == "Bo" and specs[1].template is None


@pytest.mark.parametrize("text, message", [
    ('[[line]]\ncontext = "x"\n', "`character` is required"),
    ('[[line]]\ncharacter = "gate_guard"\ncolour = 1\n', "unknown key `colour`"),
    ('[[line]]\ncharacter = "gate_guard"\ncount = "5"\n', "`count` must be an integer"),
    ('[[line]]\ncharacter = "gate_guard"\ntemperature = "hot"\n', "`temperature` has the wrong type"),
    ('title = "x"\n', "unknown top-level key `title`"),
    ('[defaults]\ncount = 1\n', "no \\[\\[line\\]\\] entries"),
])
def test_lines_file_errors(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "lines.toml"
    path.write_text(text)
    with pytest.raises(LinesFileError, match=message):
        load_lines_file(path)


@pytest.mark.parametrize("line, message", [
    ('character = "nobody"', "no character card 'nobody'"),
    ('character = "gate_guard"\ntemplate = "Halt, {player}!"', "no variable 'player'"),
    ('character = "gate_guard"\ntemplate = "Halt {"', "unmatched"),
    ('character = "gate_guard"\nlength = "huge"', "length must be one of"),
    ('character = "gate_guard"\ncount = 0', "count must be"),
    ('character = "gate_guard"\ntop_p = 2.0', "top-p must be in"),
])
def test_lines_file_entry_errors_name_the_entry(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "lines.toml"
    path.write_text(f"[[line]]\n{line}\n")
    with pytest.raises(LinesFileError, match=rf"\[\[line\]\] 1: .*{message}"):
        load_lines_file(path).specs([parse_card(GUARD)])


def _doc() -> dict:
    return {
        "format": "dgchat-npc-lines", "format_version": 1, "generator": "dgchat 0.1.0",
        "model": {"file": "m.gguf", "name": "m", "architecture": "llada", "size_bytes": 10,
                  "fingerprint": "sha256:" + "0" * 64},
        "lines": [{
            "id": "gate_guard.gate_night.0", "character": "gate_guard", "character_name": "Captain Brann",
            "context": "gate_night", "text": "Halt!", "template": None, "variables": {}, "holes": [],
            "seed": 0, "attempt": 0, "sampler_seed": 0, "variant": 0, "model": "m.gguf", "score": None,
            "stop_reason": "eos",
            "settings": {"steps": 8, "temperature": 0.8, "algorithm": "confidence", "top_k": 0, "top_p": 1.0},
        }],
    }


def test_schema_file_ships_and_checks() -> None:
    schema = load_schema()
    assert schema_path().is_file() and schema["$defs"]["line"]["additionalProperties"] is False
    validate_export(_doc())
    for mutate, message in [
        (lambda d: d["lines"][0].pop("seed"), "missing 'seed'"),
        (lambda d: d["lines"][0].update(seed=-1), "less than 0"),
        (lambda d: d["lines"][0].update(seed=True), "expected integer"),
        (lambda d: d["lines"][0].update(extra=1), "unexpected key 'extra'"),
        (lambda d: d["lines"][0].update(id="a b"), "does not match"),
        (lambda d: d.update(format="other"), "must be 'dgchat-npc-lines'"),
        (lambda d: d["model"].update(fingerprint="md5:1"), "does not match"),
        (lambda d: d["lines"].append(dict(d["lines"][0])), "ids are not unique"),
    ]:
        doc = _doc()
        mutate(doc)
        with pytest.raises(ExportError, match=message):
            validate_export(doc)


def test_own_validator_agrees_with_jsonschema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = load_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    good = _doc()
    assert not list(validator.iter_errors(good)) and not schema_errors(good, schema)
    bad = json.loads(json.dumps(good))
    bad["lines"][0]["holes"] = [{"text": "x", "tokens": 0}]
    assert list(validator.iter_errors(bad)) and schema_errors(bad, schema)


def test_logit_bias_parameter() -> None:
    from dgchat.model_backend.errors import InvalidParameterError
    from dgchat.model_backend.masked_diffusion import logit_bias_arrays
    from dgchat.model_backend.params import DiffusionParams

    DiffusionParams(logit_bias=((3, -100.0), (4, 2))).validate()
    with pytest.raises(InvalidParameterError, match="token ids >= 0"):
        DiffusionParams(logit_bias=((-1, 1.0),)).validate()
    with pytest.raises(InvalidParameterError, match=r"in \[-100, 100\]"):
        DiffusionParams(logit_bias=((1, 101.0),)).validate()
    with pytest.raises(InvalidParameterError, match="no logit bias"):
        DiffusionParams(mode="reference", logit_bias=((1, 1.0),)).validate()
    ids, values = logit_bias_arrays(((3, -100.0), (4, 2.0), (4, 1.5), (5, -150.0), (6, -100), (6, 50), (3, 9)))
    assert dict(zip(ids.tolist(), values.tolist(), strict=True)) == {
        3: float("-inf"), 4: 3.5, 5: float("-inf"), 6: float("-inf")}  # a ban wins over any other bias
