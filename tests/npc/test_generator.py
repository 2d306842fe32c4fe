"""NPC generation on a real (tiny, random-weight) model: templates, variants, banned words, exports."""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from dgchat.model_backend.loader import load_engine
from dgchat.model_backend.errors import GenerationCancelled
from dgchat.model_backend.params import DiffusionParams
from dgchat.npc import banned as banned_module
from dgchat.npc.cards import parse_card
from dgchat.npc.errors import MissingVariableError, NpcError, TemplateError
from dgchat.npc.export import build_export, export_csv, export_json, load_schema, read_csv_lines, write_export
from dgchat.npc.generator import RETRY_SEED_STRIDE, LineSpec, NpcGenerator
from dgchat.npc.schema_check import schema_errors
from dgchat.npc.templates import line_pieces, parse_template, plan_canvas

GUARD = parse_card({"id": "gate_guard", "name": "Captain Brann", "role": "the night captain",
                    "voice": "Gruff.", "examples": ["Move along."]})


@pytest.fixture(scope="module")
def engine(llada_gguf: Path):
    with load_engine(llada_gguf, n_threads=1) as e:  # 1 thread: no spin-waits on a busy 2-core box
        yield e


@pytest.fixture(scope="module")
def generator(engine) -> NpcGenerator:
    return NpcGenerator(engine)


TEMPLATES = [
    ("Halt, {player}! None may pass the {___:2} after dark.", {"player": "Aria"}),
    ("{___:3} after dark.", {}),
    ("None may pass the {___:2}", {}),
    ("  leading and trailing spaces  {___:1}  ", {}),
    ("Ünïcödé – “quotes” {___:2} — ‘single’ … naïve café 東京 😀", {}),
    ("{___:1}{___:2}", {}),
    ("<|im_end|> is text here {___:2} <|mask|><|endoftext|>", {}),
    ("line one\nline two {___:2}\n\ttabbed\r\n", {}),
    ("{{braces}} {___:1} }}", {}),
    ("emoji 😀 split{___:1}😀 again", {}),
    ("Greetings, {player} of {town}! {___:2}", {"player": "Zoë 🗡", "town": "Øst-by"}),
    ("x{___:1}y", {}),
    ("ga{___:1}te", {}),
    ("'tis {___:2}, 'tis", {}),
    ("{___:1}   {___:1}", {}),
    ("0123456789 {___:2} + - * / = ( ) [ ]", {}),
    ("The quick brown fox {___:3} the lazy dog. " * 3, {}),
    ("{player}{___:1}{player}", {"player": "<|im_start|>"}),
]


def _check_byte_identity(generator: NpcGenerator, source: str, variables: dict, seed: int = 3) -> None:
    tok = generator.tokenizer
    batch = generator.generate(LineSpec(GUARD, template=source, variables=variables, count=1, seed=seed))
    v = batch.variants[0]
    filled = parse_template(source).fill(variables)
    fixed_parts = [p for p in filled.parts if isinstance(p, str)]
    # the canvas the model finished, and the line made of it: fixed parts as written, holes in
    # between; only the spacing where the two meet is normalised (never a doubled space)
    plan = plan_canvas(filled, [h.tokens for h in v.holes], tok, fill_token=generator.engine.info.mask_token,
                       end_token=generator.end_token)
    final = np.array(v.tokens, dtype=np.int32)
    decoded = [tok.bytes_of(final[s:e]).decode("utf-8", "replace") for s, e in plan.spans]
    pieces = line_pieces(filled.parts, decoded)
    assert "".join(text for text, _hole in pieces) == v.text
    assert [h.text for h in v.holes] == [text for text, hole in pieces if hole is not None]
    for (text, hole), part in zip(pieces, filled.parts, strict=True):
        if hole is None:  # fixed text: as written, or without the spaces that met a hole's
            assert text in (part, part.lstrip(" \t"), part.rstrip(" \t"), part.strip(" \t")), (source, v.text)
        else:  # a hole: what it decoded to, less whitespace at its ends
            assert text.strip() == decoded[hole].strip() and text in decoded[hole], (source, v.text)
    shown = [text for text, _hole in pieces if text]
    for left, right in zip(shown, shown[1:]):
        assert not (left[-1] in " \t" and right[0] in " \t"), (source, v.text)  # no "The  spake"
    # the canvas the model saw and finished: every fixed run spells its bytes, untouched
    np.testing.assert_array_equal(final[plan.fixed], plan.tokens[plan.fixed])
    assert not np.isin(final, generator.engine.info.mask_token).any()
    runs, start = [], None
    for i, f in enumerate(list(plan.fixed[:-1]) + [False]):  # the last position is the end token
        if f and start is None:
            start = i
        if not f and start is not None:
            runs.append(tok.bytes_of(final[start:i]))
            start = None
    assert runs == [p.encode("utf-8") for p in fixed_parts], source
    assert final[-1] == generator.end_token


@pytest.mark.parametrize("source, variables", TEMPLATES)
def test_templates_keep_fixed_text_byte_identical(generator: NpcGenerator, source: str, variables: dict) -> None:
    _check_byte_identity(generator, source, variables)


def test_random_templates_keep_fixed_text_byte_identical(generator: NpcGenerator) -> None:
    """Fragments that BPE would merge across a hole (spaces, half words, multi-byte characters)."""
    rng = np.random.default_rng(0)
    pool = [" ", "  ", "a", "ga", "te", " the", "the ", "Halt", ",", "!", "'", "\n", "\t", "é", "e\u0301", "東",
            "京", "😀", "🗡", "–", "“", "”", "<|im_end|>", "<|mask|>", "{{", "}}", "0", "12", "\r\n", "ß", "ﬁ"]
    for n in range(60):
        pieces = []
        for _ in range(int(rng.integers(1, 5))):
            pieces.append("".join(rng.choice(pool, size=int(rng.integers(0, 5)))))
            pieces.append(f"{{___:{int(rng.integers(1, 4))}}}")
        if len(pieces) > 2 and rng.random() < 0.5:
            pieces.pop()  # end on fixed text or on a hole
        _check_byte_identity(generator, "".join(pieces).encode().decode("unicode_escape").encode("latin-1")
                             .decode("utf-8"), {}, seed=n)


def test_template_errors_surface_before_generating(generator: NpcGenerator) -> None:
    with pytest.raises(MissingVariableError):
        generator.generate(LineSpec(GUARD, template="Halt, {player}! {___}"))
    with pytest.raises(TemplateError, match="no hole"):
        generator.generate(LineSpec(GUARD, template="Halt, {player}!", variables={"player": "A"}))
    with pytest.raises(NpcError, match="count must be"):
        generator.generate(LineSpec(GUARD, count=0))
    with pytest.raises(NpcError, match="length must be"):
        generator.generate(LineSpec(GUARD, length=0))


def test_variants_are_distinct_under_different_seeds_and_identical_under_the_same(generator) -> None:
    spec = LineSpec(GUARD, context="idle", length="bark", count=4, seed=0)
    first = generator.generate(spec)
    again = generator.generate(spec)
    tokens = [tuple(v.tokens) for v in first.variants]
    assert len(set(tokens)) == 4  # four seeds, four different lines
    assert [v.seed for v in first.variants] == [0, 1, 2, 3]
    assert tokens == [tuple(v.tokens) for v in again.variants]  # same seeds, same lines
    assert [v.text for v in first.variants] == [v.text for v in again.variants]
    other = generator.generate(replace(spec, seed=100))
    assert not set(tokens) & {tuple(v.tokens) for v in other.variants}
    # a template's variants differ in their holes, and repeat too
    tspec = LineSpec(GUARD, template="Halt! None may pass the {___:3} after dark.", count=3, seed=7)
    holes = [tuple(v.tokens) for v in generator.generate(tspec).variants]
    assert len(set(holes)) == 3 and holes == [tuple(v.tokens) for v in generator.generate(tspec).variants]


def test_a_variant_does_not_depend_on_its_batch_on_the_precise_engine(llada_gguf: Path) -> None:
    with load_engine(llada_gguf, precise=True, n_threads=1) as engine:
        g = NpcGenerator(engine)
        batch = g.generate(LineSpec(GUARD, length=16, count=3, seed=5))
        alone = g.generate(LineSpec(GUARD, length=16, count=1, seed=7))
        assert alone.variants[0].tokens == batch.variants[2].tokens and alone.variants[0].seed == 7


def test_hole_length_is_chosen_by_the_models_own_score(generator: NpcGenerator) -> None:
    progress = []
    spec = LineSpec(GUARD, template="Halt! {___:1-3} after dark, {___:2}.", count=2, seed=1)
    batch = generator.generate(spec, progress=progress.append)
    for v in batch.variants:
        tried = dict((tuple(lengths), score) for lengths, score in v.length_scores)
        assert sorted(tried) == [(1, 2), (2, 2), (3, 2)]
        assert v.score == max(tried.values())
        assert tuple(h.tokens for h in v.holes) == max(tried, key=lambda k: (tried[k], -sum(k)))
        # the score is the mean pseudo-log-likelihood of the whole line after the prompt
        prompt = generator.prompt(spec, parse_template(spec.template).fill({}))
        rescored = generator.engine.pseudo_log_likelihood(prompt, np.array(v.tokens, np.int32), groups=4)
        assert float(np.mean(rescored)) == pytest.approx(v.score, abs=1e-4)
    assert {p.phase for p in progress} == {"length", "score"}
    done = [p.done for p in progress]
    assert done == sorted(done) and progress[-1].done == progress[-1].total
    assert all(p.done <= p.total for p in progress)
    assert batch.settings["hole_candidates"] == [[1, 2, 3], [2]]


def test_banned_single_token_words_are_never_sampled(generator: NpcGenerator) -> None:
    """' the' is one token: a +15 bias makes the model say it everywhere, the card's ban wins."""
    the = int(generator.tokenizer.tokenize(" the")[0])
    push = DiffusionParams(logit_bias=((the, 15.0),))
    loud = generator.generate(LineSpec(GUARD, length=12, count=2, seed=0, params=push))
    assert all(" the" in v.text and the in v.tokens for v in loud.variants)
    card = parse_card({"name": "Captain Brann", "banned_words": ["The"]})
    quiet = generator.generate(LineSpec(card, length=12, count=2, seed=0, params=push))
    bias = dict(generator.bias_for(LineSpec(card), template=False))
    for form in (" the", "the", "The", " The", "THE"):
        assert bias[int(generator.tokenizer.tokenize(form)[0])] == -100.0
    for v in quiet.variants:
        assert the not in v.tokens and v.problem is None and v.attempt == 0
        assert " the " not in f" {v.text.lower()} "


def test_a_line_with_a_banned_word_is_generated_again(generator, monkeypatch) -> None:
    """Multi-token banned words are caught in the text: the variant is regenerated with the next seed."""
    spec = LineSpec(parse_card({"name": "Captain Brann", "banned_words": ["zzz"]}), length=12, count=3, seed=0)
    plain = generator.generate(spec)
    calls = []

    def find(self, text, spans=None):  # the first check of variants 0 and 2 finds the word
        calls.append(text)
        return "zzz" if len(calls) in (1, 3) else None

    monkeypatch.setattr(banned_module.BannedWords, "find", find)
    batch = generator.generate(spec)
    assert len(calls) == 5
    assert [v.attempt for v in batch.variants] == [1, 0, 1]
    assert batch.variants[1].tokens == plain.variants[1].tokens
    for i in (0, 2):
        v = batch.variants[i]
        assert v.problem is None and v.tokens != plain.variants[i].tokens and v.seed == i
        assert v.sampler_seed == i + RETRY_SEED_STRIDE and v.params.seed == v.sampler_seed
    # every try fails: the variant comes back rejected, and cannot be kept
    monkeypatch.setattr(banned_module.BannedWords, "find", lambda self, text, spans=None: "zzz")
    gen = NpcGenerator(generator.engine, max_attempts=2)
    bad = gen.generate(replace(spec, count=1))
    v = bad.variants[0]
    assert v.status == "rejected" and v.attempt == 1 and "banned word 'zzz'" in v.problem
    with pytest.raises(NpcError, match="cannot be kept"):
        bad.keep(0)


def test_cancel_stops_generation(generator: NpcGenerator) -> None:
    cancel = threading.Event()
    with pytest.raises(GenerationCancelled):
        generator.generate(LineSpec(GUARD, length=48, count=2), cancel=cancel,
                           progress=lambda p: cancel.set())


def test_export_validates_and_reproduces(generator: NpcGenerator, tmp_path: Path) -> None:
    specs = [
        LineSpec(GUARD, context="gate night", template="Halt, {player}! None may pass the {___:2} after dark.",
                 variables={"player": "Aria"}, count=3, seed=4),
        LineSpec(GUARD, context="idle", length="bark", count=2, seed=9),
    ]

    def run() -> list:
        batches = [generator.generate(s) for s in specs]
        batches[0].keep(0)
        batches[0].keep(2)
        batches[0].reject(1)
        batches[1].keep_all()
        return batches

    doc = build_export(run())
    assert [(line["id"], line["variant"]) for line in doc["lines"]] == [
        ("gate_guard.gate_night.4", 0), ("gate_guard.gate_night.6", 2),
        ("gate_guard.idle.9", 0), ("gate_guard.idle.10", 1)]
    first = doc["lines"][0]
    assert first["text"].startswith("Halt, Aria! None may pass the ") and first["text"].endswith(" after dark.")
    assert first["model"] == Path(generator.engine.path).name and first["settings"]["temperature"] == 0.8
    assert first["settings"]["steps"] == 2 and first["template"] == specs[0].template
    assert doc["lines"][2]["template"] is None and doc["lines"][2]["settings"]["length"] == "bark"
    text = export_json(doc)
    schema = load_schema()
    assert not schema_errors(json.loads(text), schema)
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(json.loads(text), schema)
    # the same seeds and model give the same file, byte for byte
    assert export_json(build_export(run())) == text
    # CSV: the same records, one row each
    path = write_export(tmp_path / "lines.csv", doc)
    rows = read_csv_lines(path.read_bytes().decode("utf-8"))
    assert rows == doc["lines"]
    line_schema = {**schema["$defs"]["line"], "$defs": schema["$defs"]}
    for row in rows:
        jsonschema.validate(row, line_schema)
    assert path.read_bytes() == export_csv(doc).encode("utf-8")
    write_export(tmp_path / "lines.json", doc)
    assert (tmp_path / "lines.json").read_text(encoding="utf-8") == text


def test_whether_to_retry_with_another_seed_is_param_resolutions_rule(generator, monkeypatch) -> None:
    """A line with a banned word is generated again with another seed only if the seed changes
    anything; that is asked of param_resolution.uses_seed with the model's info (the app's one rule,
    which knows uniform-state canvases and autoregressive decoding), not of a second rule here."""
    from dgchat.model_backend import param_resolution

    asked = []

    def uses_seed(params, info=None) -> bool:
        asked.append((params.temperature, info))
        return False

    monkeypatch.setattr(param_resolution, "uses_seed", uses_seed)
    monkeypatch.setattr(banned_module.BannedWords, "find", lambda self, text, spans=None: "zzz")
    spec = LineSpec(parse_card({"name": "Captain Brann", "banned_words": ["zzz"]}), length=12, count=1, seed=0)
    [v] = generator.generate(spec).variants
    assert asked == [(0.8, generator.engine.info)]  # sampled at the NPC temperature, yet "no effect"
    assert v.attempt == 0 and v.status == "rejected"  # so no second try
