"""Teacher answers for the distilled recipe (issue 13, recipe v6): the model's own encoder, read as the
causal LM it is (`--ar`), answers every turn of the training windows, and the decoder is then trained
to write those answers instead of the plays' own lines.

Why. A parallel decoder predicts each canvas position from its marginal given the context; where the
target text given its context is broad (any of a thousand lines fits a scene), every position is
uncertain and the entropy-bound sampler must decide them about one at a time: measured on the shipped
v4 weights, a content canvas accepts ~1.3 positions a step and runs to its 24-step limit. Training on
a teacher's answers instead of the data is sequence-level knowledge distillation (Kim and Rush 2016),
the standard way non-autoregressive translation models (Gu et al. 2018, Mask-Predict) reach few-step
decoding: the teacher's answers are far less varied than the data, so the student's marginals sharpen
and whole runs of positions can be accepted in one step. The teacher is this model's own left-to-right
decoder (grammatical where the diffusion answers are not: model card), sampled at a low temperature
so that some variety survives.

    python -m dgchat.convert.default_model.distill --model assets/dgchat-tiny-plays.gguf --data-dir DATA \\
        --out DATA/teacher.npz --temperature 0 --first-temperature 1

Each answer is drawn with its own generator seeded by (seed, window, turn), so the draws do not
depend on the batching (the logits may, in their last bits: llama.cpp's matrix products are tiled
by batch shape). Answers that have not ended after `max_new` tokens are
kept as None: the recipe trains one-canvas answers only (a 32-token canvas holds 31 tokens and the
end of turn), since a second canvas would be conditioned on the plays' text of the first.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dgchat.convert.default_model import default_tokenizer as dtok
from dgchat.convert.default_model.default_model_config import CANVAS_LENGTH
from dgchat.convert.default_model.plays_data import sha256_of
from dgchat.convert.default_model.token_windows import Windows
from dgchat.model_backend import llamacpp
from dgchat.model_backend.loader import load_model
from dgchat.model_backend.errors import DgchatError

MAX_NEW = CANVAS_LENGTH - 1  # the answer and its <end_of_turn> fill one canvas
TEACHER_TOP_K = 64  # candidates per draw before top-p (the teacher's tail is never worth sampling)


@dataclass(frozen=True)
class TeacherSettings:
    """The teacher's sampler. The first token of an answer may be drawn hotter than the rest: the
    answer's variety then sits in its first word, which the student's sampler decides (and
    accepts) first, and the rest follows from it nearly deterministically."""

    temperature: float = 0.0
    top_p: float = 0.9
    max_new: int = MAX_NEW
    seed: int = 0
    first_temperature: float = 1.0


def draw_rows(logits: np.ndarray, temperature: float, top_p: float, uniforms: np.ndarray) -> np.ndarray:
    """One token per row of logits: greedy at temperature 0, else a draw from softmax(logits / T)
    restricted to the top-k candidates and then to the smallest set holding `top_p` of their mass
    (the usual top-k, top-p, temperature order), by inverse CDF with the given uniforms."""
    if temperature <= 0:
        return np.argmax(logits, axis=1)
    k = min(TEACHER_TOP_K, logits.shape[1])
    cand = np.argpartition(-logits, k - 1, axis=1)[:, :k]
    x = np.take_along_axis(logits, cand, axis=1).astype(np.float64) / temperature
    order = np.argsort(-x, axis=1, kind="stable")
    cand = np.take_along_axis(cand, order, axis=1)
    x = np.take_along_axis(x, order, axis=1)
    p = np.exp(x - x[:, :1])
    p /= p.sum(axis=1, keepdims=True)
    cum = np.cumsum(p, axis=1)
    keep = (cum - p) < top_p  # the first candidate always stays
    p = np.where(keep, p, 0.0)
    cum = np.cumsum(p, axis=1)
    target = uniforms[:, None] * cum[:, -1:]
    idx = np.minimum((cum <= target).sum(axis=1), k - 1)
    return cand[np.arange(cand.shape[0]), idx]


@dataclass
class _Job:
    """One window: its turns are answered in order, the cache holding the window's own text up to
    the turn being answered (each answer's tokens are removed before the next turn's text is fed)."""

    window: int
    ids: np.ndarray
    starts: list[int]
    seed: int
    turn: int = 0
    fed: int = 0  # window tokens in the cache
    out: list[int] | None = None  # the answer so far, None while the context is still being fed
    rng: np.random.Generator | None = None

    @property
    def target(self) -> int:
        return self.starts[self.turn]


def teacher_answers(model_path: Path, windows, settings: TeacherSettings, *, indices=None, n_parallel: int = 64,
                    threads: int | None = None, batch_tokens: int = 512,
                    progress=None) -> Iterator[tuple[int, int, np.ndarray | None]]:
    """(window, turn, answer tokens without the end token, or None if it did not end) for every turn
    of the given windows (default: all), by batched left-to-right decoding with llama.cpp."""
    model = load_model(model_path, n_threads=threads)
    try:
        yield from _answer_all(model, windows, settings, indices, n_parallel, threads, batch_tokens, progress)
    finally:
        model.close()


def _answer_all(model: llamacpp.LlamaModel, windows, settings, indices, n_parallel, threads, batch_tokens, progress):
    eog = np.zeros(model.n_vocab, bool)
    eog[[dtok.END_OF_TURN, dtok.EOS]] = True
    per_seq = int(np.diff(windows.seq_offsets).max()) + settings.max_new + 8  # the longest window and an answer
    ctx = llamacpp.LlamaContext(model, n_ctx=n_parallel * per_seq, max_tokens=batch_tokens,
                                n_seq_max=n_parallel, n_threads=threads, per_seq_ctx=per_seq)
    pending = (_Job(int(w), windows.ids(int(w)).astype(np.int32), [int(a) for a, _ in windows.spans(int(w))],
                    settings.seed) for w in (range(len(windows)) if indices is None else indices))
    slots: list[_Job | None] = [None] * n_parallel
    done = 0
    t0 = time.perf_counter()
    try:
        while True:
            for seq in range(n_parallel):
                while slots[seq] is None or not slots[seq].starts:
                    slots[seq] = next(pending, None)
                    ctx.seq_rm(seq, 0)
                    if slots[seq] is None:
                        break
            active = [(seq, job) for seq, job in enumerate(slots) if job is not None]
            if not active:
                break
            toks, pos, seqs, outs, owners = [], [], [], [], []
            room = batch_tokens
            for seq, job in active:  # answers being written first: one token each
                if job.out:
                    toks.append(job.out[-1])
                    pos.append(job.target + len(job.out) - 1)
                    seqs.append(seq)
                    outs.append(len(toks) - 1)
                    owners.append(seq)
                    room -= 1
            for seq, job in active:  # then the windows' text, as far as the batch has room
                if job.out is None and room > 0:
                    n = min(room, job.target - job.fed)
                    toks.extend(job.ids[job.fed:job.fed + n].tolist())
                    pos.extend(range(job.fed, job.fed + n))
                    seqs.extend([seq] * n)
                    job.fed += n
                    room -= n
                    if job.fed == job.target:
                        outs.append(len(toks) - 1)
                        owners.append(seq)
            logits = ctx.decode_tokens(np.array(toks, np.int32), np.array(pos, np.int32),
                                       seq_ids=np.array(seqs, np.int32), outputs=np.array(outs, np.int64))
            if not owners:
                continue
            for seq in owners:
                job = slots[seq]
                if job.out is None:
                    job.out = []
                    job.rng = np.random.default_rng([job.seed, job.window, job.turn])
            uniforms = np.array([slots[seq].rng.random() for seq in owners])
            first = np.array([not slots[seq].out for seq in owners])
            logits = np.asarray(logits)
            drawn = np.empty(len(owners), np.int64)
            for rows, temp in ((first, settings.first_temperature), (~first, settings.temperature)):
                if rows.any():
                    drawn[rows] = draw_rows(logits[rows], temp, settings.top_p, uniforms[rows])
            for seq, tok in zip(owners, drawn.tolist()):
                job = slots[seq]
                if eog[tok]:
                    yield job.window, job.turn, np.array(job.out, np.int32)
                elif len(job.out) >= settings.max_new:
                    yield job.window, job.turn, None
                else:
                    job.out.append(int(tok))
                    continue
                ctx.seq_rm(seq, job.target)  # drop the answer: the next turn reads the window's text
                job.out = None
                job.turn += 1
                done += 1
                if job.turn == len(job.starts):
                    slots[seq] = None
                if progress is not None and done % 2000 == 0:
                    progress(done, time.perf_counter() - t0)
    finally:
        ctx.close()


def save_answers(path: Path, answers: dict[tuple[int, int], np.ndarray | None], settings: TeacherSettings,
                 model_sha256: str, n_windows: int, data_meta_sha256: str) -> None:
    """An npz (no pickle): per (window, turn) in order, the answer's tokens or length -1, and what made
    them (the teacher's settings and file, the data folder's meta.json, the windows answered)."""
    keys = sorted(answers)
    lengths = np.array([-1 if answers[k] is None else answers[k].size for k in keys], np.int32)
    tokens = np.concatenate([answers[k] for k in keys if answers[k] is not None] or [np.empty(0, np.int32)])
    meta = dict(settings.__dict__, model_sha256=model_sha256, n_windows=n_windows, data_meta_sha256=data_meta_sha256)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, window=np.array([k[0] for k in keys], np.int32), turn=np.array([k[1] for k in keys], np.int32),
             length=lengths, tokens=tokens.astype(np.int32), meta=np.array(json.dumps(meta, sort_keys=True)))
    os.replace(tmp, path)


class TeacherAnswers:
    """The teacher's answers of a windows file, by (window, turn). With `data_dir`, the file must
    have been made from that data folder (its meta.json), or DgchatError says so."""

    def __init__(self, path: Path, data_dir: Path | None = None) -> None:
        try:
            with np.load(path, allow_pickle=False) as z:
                window, turn, length, tokens = z["window"], z["turn"], z["length"], z["tokens"]
                self.meta = json.loads(str(z["meta"]))
        except (OSError, KeyError, ValueError) as exc:
            raise DgchatError(f"{path}: not a teacher answers file ({exc})") from None
        if data_dir is not None and self.meta.get("data_meta_sha256") != sha256_of(Path(data_dir) / "meta.json"):
            raise DgchatError(f"{path} answers the windows of another data folder than {data_dir} "
                              "(its meta.json differs): make it again with python -m dgchat.convert.default_model.distill")
        offsets = np.concatenate([[0], np.cumsum(np.maximum(length, 0))])
        self._by_key: dict[tuple[int, int], np.ndarray | None] = {}
        for k in range(window.size):
            self._by_key[(int(window[k]), int(turn[k]))] = (
                None if length[k] < 0 else tokens[offsets[k]:offsets[k + 1]].astype(np.int64))

    def get(self, window: int, turn: int) -> np.ndarray | None:
        return self._by_key.get((window, turn))

    def __len__(self) -> int:
        return len(self._by_key)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dgchat.convert.default_model.distill", description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, required=True, help="the teacher GGUF (its --ar decoder)")
    ap.add_argument("--data-dir", type=Path, required=True)
    ap.add_argument("--split", choices=["train", "val"], default="train")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--temperature", type=float, default=TeacherSettings.temperature)
    ap.add_argument("--first-temperature", type=float, default=TeacherSettings.first_temperature,
                    help="the temperature of each answer's first token")
    ap.add_argument("--top-p", type=float, default=TeacherSettings.top_p)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--limit", type=int, help="only the first N windows")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--parallel", type=int, default=64, help="sequences decoded together")
    args = ap.parse_args(argv)
    windows = Windows(args.data_dir / f"{args.split}.npz")
    n = len(windows) if args.limit is None else min(args.limit, len(windows))
    settings = TeacherSettings(args.temperature, args.top_p, MAX_NEW, args.seed, args.first_temperature)
    t0 = time.perf_counter()
    answers: dict[tuple[int, int], np.ndarray | None] = {}
    for w, t, ans in teacher_answers(args.model, windows, settings, indices=range(n), n_parallel=args.parallel,
                                     threads=args.threads,
                                     progress=lambda d, s: print(f"{d} answers, {s:.0f} s", flush=True)):
        answers[(w, t)] = ans
    save_answers(args.out, answers, settings, sha256_of(args.model), n, sha256_of(args.data_dir / "meta.json"))
    ended = [a for a in answers.values() if a is not None]
    lengths = np.array([a.size for a in ended])
    print(json.dumps({"answers": len(answers), "ended": len(ended), "mean_tokens": round(float(lengths.mean()), 2),
                      "median_tokens": float(np.median(lengths)), "seconds": round(time.perf_counter() - t0, 1),
                      "out": str(args.out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
