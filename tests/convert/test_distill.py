"""Recipe v6's teacher (convert/default_model/distill.py): its draws, its answers against the engine's own `--ar`
decoding of the same context, the answers file, and the canvases the trainer builds from it."""

from __future__ import annotations

import numpy as np
import pytest

from dgchat.convert.default_model import default_model_config as dmc
from dgchat.convert.default_model import default_tokenizer as dtok
from dgchat.convert.default_model import distill
from dgchat.convert.default_model import plays_data
from dgchat.convert.default_model import train_default as td
from dgchat.model_backend.errors import DgchatError
from fixtures.recipe_samples import tiny_recipe_data, tiny_text_arch


def test_draw_rows_greedy_top_p_and_inverse_cdf():
    logits = np.log(np.array([[0.1, 0.6, 0.3], [0.5, 0.25, 0.25]], np.float32))
    u = np.array([0.0, 0.99])
    assert distill.draw_rows(logits, 0.0, 0.9, u).tolist() == [1, 0]
    # T 1, no top-p: the inverse CDF over candidates sorted by probability (0.6, 0.3, 0.1)
    for uu, want in ((0.0, 1), (0.59, 1), (0.61, 2), (0.89, 2), (0.91, 0)):
        assert distill.draw_rows(logits[:1], 1.0, 1.0, np.array([uu]))[0] == want, uu
    # top-p 0.5: only the first candidate (0.6 >= 0.5) stays, whatever the uniform
    assert {int(distill.draw_rows(logits[:1], 1.0, 0.5, np.array([x]))[0]) for x in (0.0, 0.5, 0.99)} == {1}
    # top-p 0.8: the first two (0.6 + 0.3), renormalised: 0.6/0.9 of the uniforms give token 1
    got = [int(distill.draw_rows(logits[:1], 1.0, 0.8, np.array([x]))[0]) for x in np.linspace(0, 0.999, 1000)]
    assert abs(got.count(1) / 1000 - 0.6 / 0.9) < 0.01 and 0 not in got
    # a temperature below 1 sharpens: at T 0.25 token 1 takes (6^4)/(6^4 + 3^4 + 1) of the mass
    got = [int(distill.draw_rows(logits[:1], 0.25, 1.0, np.array([x]))[0]) for x in np.linspace(0, 0.999, 1000)]
    assert abs(got.count(1) / 1000 - 6**4 / (6**4 + 3**4 + 1)) < 0.01
    # only the top TEACHER_TOP_K candidates are ever drawn
    wide = np.zeros((1, 1000), np.float32)
    wide[0, :distill.TEACHER_TOP_K] = 0.001  # the top-k, a hair above the rest
    drawn = {int(distill.draw_rows(wide, 1.0, 1.0, np.array([x]))[0]) for x in np.linspace(0, 0.999, 500)}
    assert drawn <= set(range(distill.TEACHER_TOP_K)) and len(drawn) > distill.TEACHER_TOP_K // 2


@pytest.fixture(scope="module")
def tiny_teacher(tmp_path_factory):
    """A tiny trained default model as a GGUF, and its data."""
    from dgchat.convert.api import convert

    tmp = tmp_path_factory.mktemp("teacher")
    data = tiny_recipe_data(tmp / "data")
    run = tmp / "run"
    td.train(data, run, threads=None, arch=tiny_text_arch(), precision="fp32", recipe="v1",
             overrides={"steps": 2, "batch_size": 2, "warmup_steps": 1, "eval_every": 100, "ckpt_every": 100,
                        "sample_every": 100, "eval_batches": 1})
    hf = td.export_hf(run, data, tmp / "hf")
    return data, convert(hf, tmp / "tiny.gguf", outtype="f32").output


@pytest.mark.slow
def test_teacher_answers_are_the_engines_left_to_right_answers(tiny_teacher):
    """Greedy, each answer equals `--ar` decoding of the window's text up to that turn through the
    public engine, whichever sequences shared its batches; an answer that does not end is None."""
    from dgchat.model_backend.loader import load_engine
    from dgchat.model_backend.events import FinalEvent
    from dgchat.model_backend.params import DiffusionParams

    data, gguf = tiny_teacher
    windows = td.Windows(data / "train.npz")
    settings = distill.TeacherSettings(temperature=0.0, first_temperature=0.0, max_new=6)
    got = {(w, t): a for w, t, a in distill.teacher_answers(gguf, windows, settings, n_parallel=3, threads=1,
                                                            batch_tokens=40)}
    assert set(got) == {(w, t) for w in range(len(windows)) for t in range(len(windows.spans(w)))}
    alone = {(w, t): a for w, t, a in distill.teacher_answers(gguf, windows, settings, n_parallel=1, threads=1)}
    engine = load_engine(gguf, n_threads=1)
    checked = ended = 0
    for (w, t), answer in sorted(got.items()):
        start = int(windows.spans(w)[t][0])
        params = DiffusionParams(autoregressive=True, temperature=0.0, max_tokens=settings.max_new + 1, seed=0)
        final = [e for e in engine.generate(windows.ids(w)[:start].astype(np.int32), params)
                 if isinstance(e, FinalEvent)][0]
        want = final.tokens if final.stop_reason == "eos" and final.tokens.size <= settings.max_new else None
        for a in (answer, alone[(w, t)]):
            assert (a is None) == (want is None), (w, t)
            if want is not None:
                assert a.tolist() == want.tolist(), (w, t)
        checked += 1
        ended += want is not None
    assert checked == len(got) >= 4 and 0 < ended < checked  # both kinds of answer were compared


@pytest.mark.slow
def test_teacher_draws_depend_on_the_seed_not_on_the_batch(tiny_teacher):
    data, gguf = tiny_teacher
    windows = td.Windows(data / "train.npz")
    settings = distill.TeacherSettings(temperature=1.0, first_temperature=1.0, max_new=5, top_p=1.0, seed=3)

    def run(parallel: int, seed: int = 3):
        s = distill.TeacherSettings(**{**settings.__dict__, "seed": seed})
        return {(w, t): None if a is None else a.tolist()
                for w, t, a in distill.teacher_answers(gguf, windows, s, n_parallel=parallel, threads=1)}

    a, b = run(1), run(4)
    assert a == b
    assert run(4, seed=4) != a


def test_answers_file_and_teacher_canvases(tmp_path):
    answers = {(0, 0): np.array([10, 11, 12], np.int32), (0, 1): None, (1, 0): np.arange(20, 20 + 31, dtype=np.int32),
               (1, 1): np.array([], np.int32)}
    path = tmp_path / "teacher.npz"
    distill.save_answers(path, answers, distill.TeacherSettings(), "abc", n_windows=2, data_meta_sha256="d")
    loaded = distill.TeacherAnswers(path)
    assert len(loaded) == 4 and loaded.meta["model_sha256"] == "abc" and loaded.meta["n_windows"] == 2
    assert loaded.get(0, 1) is None and loaded.get(5, 0) is None
    assert loaded.get(0, 0).tolist() == [10, 11, 12] and loaded.get(1, 1).tolist() == []
    with np.load(path, allow_pickle=False) as z:  # no pickled objects in the file
        assert {"window", "turn", "length", "tokens", "meta"} <= set(z.files)

    L = dmc.CANVAS_LENGTH
    spans = np.array([[5, 9], [12, 20]])
    cv = td.teacher_canvases(0, spans, loaded, L)
    assert [start for start, _ in cv] == [5]  # turn 1 has no answer
    assert cv[0][1][:4].tolist() == [10, 11, 12, dtok.END_OF_TURN] and set(cv[0][1][4:].tolist()) == {dtok.PAD}
    cv = td.teacher_canvases(1, spans, loaded, L)
    assert [start for start, _ in cv] == [5, 12]  # 31 tokens and the end fill one canvas exactly
    assert cv[0][1][-1] == dtok.END_OF_TURN and cv[0][1][:31].tolist() == list(range(20, 51))
    assert cv[1][1][0] == dtok.END_OF_TURN


@pytest.mark.slow
def test_distilled_recipe_trains_on_teacher_canvases_and_pins_the_teacher(tiny_teacher, tmp_path):
    import json

    data, gguf = tiny_teacher
    windows = td.Windows(data / "train.npz")
    settings = distill.TeacherSettings(temperature=0.0, first_temperature=1.0, max_new=8)
    answers = {(w, t): a for w, t, a in distill.teacher_answers(gguf, windows, settings, n_parallel=2, threads=1)}
    teacher = tmp_path / "teacher.npz"
    data_sha = plays_data.sha256_of(data / "meta.json")
    distill.save_answers(teacher, answers, settings, "sha", n_windows=len(windows), data_meta_sha256=data_sha)
    val = td.Windows(data / "val.npz")
    val_answers = {(w, t): a for w, t, a in distill.teacher_answers(gguf, val, settings, threads=1)}
    val_teacher = tmp_path / "val-teacher.npz"
    distill.save_answers(val_teacher, val_answers, settings, "sha", n_windows=len(val), data_meta_sha256=data_sha)

    # the batch's canvases are the teacher's answers, at the turns' starts
    loaded = distill.TeacherAnswers(teacher)
    batch = td.make_batch(windows, [0], dmc.CANVAS_LENGTH, 8, np.random.default_rng(0), teacher=loaded)
    want = td.teacher_canvases(0, windows.spans(0), loaded, dmc.CANVAS_LENGTH)
    assert batch["valid"][0].sum() == len(want)
    for c, (start, canvas) in enumerate(want):
        assert batch["starts"][0, c] == start and batch["targets"][0, c].tolist() == canvas.tolist()

    run = tmp_path / "v6"
    state = td.train(data, run, threads=None, arch=tiny_text_arch(), precision="fp32", recipe="v6", init_from=gguf,
                     teacher=teacher, val_teacher=val_teacher,
                     overrides={"steps": 2, "batch_size": 2, "warmup_steps": 1, "eval_every": 2, "ckpt_every": 2,
                                "sample_every": 100, "eval_batches": 1, "log_every": 1})
    assert state["step"] == 2
    pinned = json.loads((run / "settings.json").read_text())
    assert pinned["teacher"]["file"] == "teacher.npz" and pinned["teacher"]["first_temperature"] == 1.0
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    val_recs = [r for r in log if r["kind"] == "val"]
    assert {"kd_diff", "kd_t1", "diff_t1"} <= set(val_recs[-1]) and np.isfinite(val_recs[-1]["kd_t1"])
    assert all(np.isfinite(r["diff"]) for r in log if r["kind"] == "train")

    # answers made from another data folder are refused, as is a file that is not one
    other = tmp_path / "other.npz"
    distill.save_answers(other, answers, settings, "sha", n_windows=len(windows), data_meta_sha256="elsewhere")
    with pytest.raises(DgchatError, match="another data folder"):
        td.train(data, tmp_path / "v6b", threads=None, arch=tiny_text_arch(), precision="fp32", recipe="v6",
                 init_from=gguf, teacher=other, overrides={"steps": 1})
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not an npz")
    with pytest.raises(DgchatError, match="not a teacher answers file"):
        distill.TeacherAnswers(junk)


def test_teacher_goes_with_the_distilled_recipe_only(tmp_path, capsys):
    base = ["train", "--data-dir", str(tmp_path / "data"), "--run-dir", str(tmp_path / "run"),
            "--init-from", str(tmp_path / "v4.gguf")]
    for extra in (["--recipe", "v6"], ["--recipe", "v4", "--teacher", str(tmp_path / "t.npz")]):
        with pytest.raises(SystemExit):
            td.main(base + extra)
        assert "--teacher goes with --recipe v6" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
