"""Generating NPC lines: N variants at once, templates with holes, banned words, keep/reject.

`NpcGenerator(engine).generate(spec, progress=..., cancel=...)` returns a `LineBatch` of
`spec.count` variants. Variant i uses seed `spec.seed + i`; everything else is a pure function of
the spec and the model, so the same spec on the same model gives the same lines (variants run
together in one batched decode per step; on the default, non-`precise` engine a sequence's floats
can depend on what else is in its batch, so reproduce with the same `count`).

Free lines (no template): the canvas is the line's length budget (LENGTH_PRESETS or a number of
tokens); the model ends the line early with its end token.

Block-diffusion models (SDAR, BD3LM) write free lines only: a line is written block after block
(the model's block size and steps per block), its budget is `max_tokens`; a template is refused
(NO_TEMPLATES: a block cannot see the text after a hole).

Templates: each hole's length is given, or chosen per variant among its candidates by the model's
own score: every candidate length is generated (one batch), scored by its mean pseudo-log-
likelihood over the whole line (`engine.pseudo_log_likelihood`), and the best kept; with several
auto-length holes this runs hole by hole, left to right, the others held at their chosen (or
middle) length. An end-of-turn token is fixed after the line so the model knows where it ends.

A variant whose generated text contains a banned word (or is empty) is generated again with seed
`seed + k * RETRY_SEED_STRIDE` (k = 1, 2, ...) up to `max_attempts` tries; if every try fails it is
returned rejected, with the reason.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from dgchat.model_backend.chat_template import TemplateRenderError
from dgchat.model_backend.engine_protocol import LocalEngine
from dgchat.model_backend.errors import GenerationCancelled, InvalidParameterError
from dgchat.model_backend.events import FinalEvent, StepEvent
from dgchat.model_backend import param_resolution
from dgchat.model_backend.param_resolution import Layer, merge, npc_line_layers
from dgchat.model_backend.params import DiffusionParams
from dgchat.model_backend.requests import CanvasTemplate
from dgchat.npc.banned import BannedWords
from dgchat.npc.cards import CharacterCard
from dgchat.npc.errors import NpcError, TemplateError
from dgchat.npc.templates import CanvasPlan, FilledTemplate, Tokenizer, parse_template, plan_canvas, read_canvas

LENGTH_PRESETS = {"bark": 12, "short": 24, "medium": 48, "long": 96}
_LENGTH_HINTS = {
    "bark": "as a short bark of a few words",
    "short": "in one sentence",
    "medium": "in one or two sentences",
    "long": "in a few sentences",
}
MAX_LINE_TOKENS = 512
MAX_COUNT = 64
MAX_BATCH = 16  # sequences per batched decode
RETRY_SEED_STRIDE = 1_000_003
DEFAULT_TEMPERATURE = 0.8  # masked and block-diffusion models: variants need sampling to differ by seed
MAX_TEXT = 4000
NO_TEMPLATES = ("a block-diffusion model writes left to right, block after block: it cannot see the text after a "
                "hole, so it cannot fill line templates; give the line a `length` instead (a free line)")


@dataclass(frozen=True)
class LineSpec:
    """What to generate: one line for one character, `count` variants of it."""

    card: CharacterCard
    context: str = ""  # context tag, e.g. "gate_night": carried into the export, shown to the model
    situation: str = ""  # what is happening, in words, for the model
    template: str | None = None  # a line template with holes; None: a free line
    variables: Mapping[str, Any] = field(default_factory=dict)
    length: int | str = "short"  # free lines: a LENGTH_PRESETS name or a number of tokens
    count: int = 1
    seed: int = 0
    params: DiffusionParams = field(default_factory=DiffusionParams)  # sampler overrides

    def validate(self) -> None:
        if isinstance(self.count, bool) or not isinstance(self.count, int) or not 1 <= self.count <= MAX_COUNT:
            raise NpcError(f"count must be an integer from 1 to {MAX_COUNT} (got {self.count!r})")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise NpcError(f"seed must be an integer >= 0 (got {self.seed!r})")
        for name, value in (("context", self.context), ("situation", self.situation)):
            if not isinstance(value, str) or len(value) > MAX_TEXT:
                raise NpcError(f"{name} must be a string of at most {MAX_TEXT} characters")
        if self.template is None:
            self.length_tokens  # noqa: B018 - validates
        if self.params.mode != "dgchat":
            raise NpcError("NPC lines use the default sampler mode (not --mode reference)")

    @property
    def length_tokens(self) -> int:
        value = self.length
        if isinstance(value, str):
            if value not in LENGTH_PRESETS:
                raise NpcError(f"length must be one of {', '.join(LENGTH_PRESETS)} or a number of tokens "
                               f"(got {value!r})")
            return LENGTH_PRESETS[value]
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LINE_TOKENS:
            raise NpcError(f"length must be 1..{MAX_LINE_TOKENS} tokens or a preset name (got {value!r})")
        return value


@dataclass
class HoleFill:
    text: str
    tokens: int  # the hole's length in tokens


@dataclass
class LineVariant:
    index: int  # 0-based within its batch
    seed: int  # the variant's seed: spec.seed + index
    attempt: int  # 0 for the first try; k for the k-th regeneration (sampler seed seed + k * RETRY_SEED_STRIDE)
    text: str
    holes: list[HoleFill]
    tokens: list[int]  # the answer / canvas tokens
    stop_reason: str
    score: float | None = None  # mean pseudo-log-likelihood, when hole lengths were chosen by score
    length_scores: list[tuple[list[int], float]] = field(default_factory=list)  # every length tried, last round
    problem: str | None = None  # why it was rejected automatically (a banned word, an empty line)
    status: str = "new"  # "new" | "kept" | "rejected"
    params: DiffusionParams | None = field(default=None, repr=False)  # resolved, as sampled (sampler seed)

    @property
    def settings(self) -> dict[str, Any]:
        return settings_of(self.params) if self.params is not None else {}

    @property
    def sampler_seed(self) -> int:
        return self.seed + self.attempt * RETRY_SEED_STRIDE


@dataclass(frozen=True)
class ModelMeta:
    file: str
    name: str
    architecture: str
    size_bytes: int
    fingerprint: str  # "sha256:" of the file size plus its first and last MiB (a quick identity check)

    @classmethod
    def from_engine(cls, engine: LocalEngine) -> ModelMeta:
        path = Path(engine.path)
        return cls(path.name, engine.info.name, engine.info.architecture, path.stat().st_size, model_fingerprint(path))

    def as_dict(self) -> dict[str, Any]:
        return {"file": self.file, "name": self.name, "architecture": self.architecture,
                "size_bytes": self.size_bytes, "fingerprint": self.fingerprint}


def model_fingerprint(path: str | Path, chunk: int = 1 << 20) -> str:
    path = Path(path)
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with path.open("rb") as f:
        h.update(f.read(chunk))
        if size > chunk:
            f.seek(max(chunk, size - chunk))
            h.update(f.read(chunk))
    return "sha256:" + h.hexdigest()


@dataclass
class LineBatch:
    """The variants of one spec, with the keep/reject choices made on them."""

    spec: LineSpec
    variants: list[LineVariant]
    settings: dict[str, Any]  # how the line was laid out: length and canvas, or the holes' candidate lengths
    model: ModelMeta

    def keep(self, index: int) -> None:
        self._set(index, "kept")

    def reject(self, index: int) -> None:
        self._set(index, "rejected")

    def keep_all(self) -> None:
        """Keep every variant not rejected automatically (the headless command's choice)."""
        for v in self.variants:
            if v.problem is None and v.status == "new":
                v.status = "kept"

    def _set(self, index: int, status: str) -> None:
        if not 0 <= index < len(self.variants):
            raise NpcError(f"no variant {index} (this batch has {len(self.variants)})")
        v = self.variants[index]
        if status == "kept" and v.problem is not None:
            raise NpcError(f"variant {index} cannot be kept: {v.problem}")
        v.status = status

    @property
    def kept(self) -> list[LineVariant]:
        return [v for v in self.variants if v.status == "kept"]


@dataclass(frozen=True)
class NpcProgress:
    """Reported after every denoising step (and scoring pass) of every sequence in flight."""

    phase: str  # "length" (trying hole lengths) | "score" | "generate" | "retry"
    done: int  # work units done: sequence-steps and scoring passes
    total: int  # planned work units; grows when a retry is needed
    variant: int | None  # which variant the event belongs to
    event: StepEvent | FinalEvent | None  # the raw event, to draw a live canvas


ProgressFn = Callable[[NpcProgress], None]


@dataclass
class _Job:
    variant: int
    seed: int
    attempt: int
    params: DiffusionParams  # resolved, with this job's seed
    plan: CanvasPlan | None
    final: FinalEvent | None = None
    score: float | None = None
    length_scores: list[tuple[list[int], float]] = field(default_factory=list)


class _Tracker:
    def __init__(self, callback: ProgressFn | None) -> None:
        self.callback = callback
        self.done = 0
        self.total = 0

    def add(self, units: int) -> None:
        self.total += units

    def tick(self, phase: str, units: int, variant: int | None, event) -> None:
        self.done += units
        if self.callback is not None:
            self.callback(NpcProgress(phase, self.done, max(self.total, self.done), variant, event))


def settings_of(params: DiffusionParams) -> dict[str, Any]:
    """The sampler settings recorded with a line: the resolved parameters without the per-sequence
    seed, canvas size and logit bias (those are recorded separately or derive from the card)."""
    d = params.as_dict()
    for key in ("seed", "logit_bias", "gen_length", "max_tokens"):
        d.pop(key, None)
    return d


class NpcGenerator:
    def __init__(self, engine: LocalEngine, *, max_attempts: int = 4, score_groups: int = 4,
                 max_batch: int = MAX_BATCH) -> None:
        if max_attempts < 1:
            raise InvalidParameterError("max_attempts must be >= 1")
        self.engine = engine
        self.max_attempts = max_attempts
        self.score_groups = score_groups
        self.max_batch = max(1, max_batch)
        self.tokenizer = Tokenizer.for_engine(engine)
        self.model = ModelMeta.from_engine(engine)
        self.end_token = engine.end_token
        self._control: tuple[int, ...] | None = None
        self._eog = tuple(int(t) for t in engine.eog_ids())

    # -- prompts and parameters -------------------------------------------------------------
    def messages(self, spec: LineSpec, filled: FilledTemplate | None = None) -> list[dict[str, str]]:
        """The conversation the model sees (docs/NPC.md, "What the model is told")."""
        lines = []
        if spec.context:
            lines.append(f"Context: {spec.context}")
        if spec.situation:
            lines.append(f"Situation: {spec.situation}")
        if filled is not None:
            lines.append(f"Say this line as {spec.card.name}, filling in each blank (___): {filled.display()}")
        else:
            hint = _LENGTH_HINTS.get(spec.length) if isinstance(spec.length, str) else None
            lines.append(f"Say {spec.card.name}'s next line" + (f" {hint}." if hint else "."))
        return [{"role": "system", "content": spec.card.system_prompt()}, {"role": "user", "content": "\n".join(lines)}]

    def prompt(self, spec: LineSpec, filled: FilledTemplate | None = None) -> np.ndarray:
        messages = self.messages(spec, filled)
        try:
            return self.engine.chat_prompt(messages)
        except TemplateRenderError:
            # some chat templates refuse a system turn: fold the persona into the user turn
            merged = [{"role": "user", "content": messages[0]["content"] + "\n\n" + messages[1]["content"]}]
            return self.engine.chat_prompt(merged)

    def _control_tokens(self) -> tuple[int, ...]:
        if self._control is None:
            self._control = self.engine.control_tokens()
        return self._control

    def bias_for(self, spec: LineSpec, *, template: bool) -> tuple[tuple[int, float], ...]:
        """Never sample control tokens (turn markers, BOS) nor single-token banned words; in a
        template's holes never an end token either (the line goes on after a hole)."""
        banned = set(self._control_tokens())
        banned.update(t for t, _ in BannedWords(spec.card.banned_words).logit_bias(self.tokenizer))
        if template:
            banned.update(self._eog)
        own = tuple((int(t), float(b)) for t, b in spec.params.logit_bias)
        return own + tuple((t, -100.0) for t in sorted(banned))

    def params_for(self, spec: LineSpec, *, canvas: int, to_fill: int, template: bool,
                   bias: tuple[tuple[int, float], ...]) -> DiffusionParams:
        """A variant's settings, resolved by the engine from `layers_for`."""
        p, _ = merge(self.layers_for(spec, canvas=canvas, to_fill=to_fill, template=template, bias=bias))
        return self.engine.resolve(p)

    def layers_for(self, spec: LineSpec, *, canvas: int, to_fill: int, template: bool,
                   bias: tuple[tuple[int, float], ...]) -> list[Layer]:
        """A variant's settings as layers, lowest first (`param_resolution.npc_line_layers`: NPC
        defaults under the card's and line's settings, the canvas, seed and bias over them; the
        model's own settings lie below them). `resolved_for(engine, layers)` names each value's
        source ("npc" for the NPC layers). The NPC default temperature is DEFAULT_TEMPERATURE on
        masked and block-diffusion models (greedy decoding would give every variant the same line;
        block diffusion's published decoding is greedy too)."""
        if self.engine.info.block_diffusion and template:
            raise TemplateError(NO_TEMPLATES)
        return npc_line_layers(self.engine.info, spec.params, canvas=canvas, to_fill=to_fill, template=template,
                               seed=spec.seed, bias=bias, temperature=DEFAULT_TEMPERATURE)

    # -- generation -------------------------------------------------------------------------
    def generate(self, spec: LineSpec, *, progress: ProgressFn | None = None,
                 cancel: threading.Event | None = None) -> LineBatch:
        spec.validate()
        if spec.template is not None and self.engine.info.block_diffusion:
            raise TemplateError(NO_TEMPLATES)
        tracker = _Tracker(progress)
        banned = BannedWords(spec.card.banned_words)
        if spec.template is None:
            prompt, jobs, settings = self._free_lines(spec, tracker, cancel)
        else:
            prompt, jobs, settings = self._template_lines(spec, tracker, cancel)
        variants = [self._variant(job, banned) for job in jobs]
        # another seed gives another line only if the run samples: the app's one rule for that
        # (param_resolution.uses_seed, which knows uniform-state canvases and autoregressive decoding)
        seed_matters = param_resolution.uses_seed(jobs[0].params, self.engine.info)
        for attempt in range(1, self.max_attempts if seed_matters else 1):
            failed = [v.index for v in variants if v.problem is not None]
            if not failed:
                break
            retry = [replace(jobs[i], attempt=attempt, final=None, score=None,
                             params=replace(jobs[i].params, seed=jobs[i].seed + attempt * RETRY_SEED_STRIDE))
                     for i in failed]
            self._run(retry, prompt, "retry", tracker, cancel)
            if jobs[failed[0]].score is not None:
                self._score(retry, prompt, tracker, cancel)
            for job in retry:
                jobs[job.variant] = job
                variants[job.variant] = self._variant(job, banned)
        return LineBatch(spec, variants, settings, self.model)

    def _free_lines(self, spec: LineSpec, tracker: _Tracker, cancel):
        prompt = self.prompt(spec)
        length = spec.length_tokens
        bias = self.bias_for(spec, template=False)
        base = self.params_for(spec, canvas=length, to_fill=length, template=False, bias=bias)
        jobs = [_Job(i, spec.seed + i, 0, replace(base, seed=spec.seed + i), None) for i in range(spec.count)]
        self._run(jobs, prompt, "generate", tracker, cancel)
        settings = {"length": spec.length, "canvas_tokens": int(base.gen_length)}
        if self.engine.info.block_diffusion:  # the canvas is one block; the line's budget is max_tokens
            settings["max_tokens"] = int(base.max_tokens)
        return prompt, jobs, settings

    def _template_lines(self, spec: LineSpec, tracker: _Tracker, cancel):
        filled = parse_template(spec.template).fill(spec.variables)
        holes = filled.holes
        if not holes:
            raise TemplateError(f"template {spec.template!r} has no hole ({{___}}): nothing for the model to fill")
        prompt = self.prompt(spec, filled)
        bias = self.bias_for(spec, template=True)
        fill_token = self._fill_token()
        lengths = [[h.default_length for h in holes] for _ in range(spec.count)]

        def job(variant: int, hole_lengths: Sequence[int]) -> _Job:
            plan = plan_canvas(filled, hole_lengths, self.tokenizer, fill_token=fill_token, end_token=self.end_token)
            params = self.params_for(replace(spec, seed=spec.seed + variant), canvas=int(plan.tokens.size),
                                     to_fill=plan.hole_tokens, template=True, bias=bias)
            return _Job(variant, spec.seed + variant, 0, params, plan)

        auto = [h for h in holes if h.auto]
        if not auto:
            best = [job(i, lengths[i]) for i in range(spec.count)]
            self._run(best, prompt, "generate", tracker, cancel)
        else:
            def trials(hole) -> list[_Job]:
                return [job(i, [*lengths[i][:hole.index], c, *lengths[i][hole.index + 1:]])
                        for i in range(spec.count) for c in hole.lengths]

            def units(jobs: list[_Job]) -> int:
                return sum(int(j.params.steps) + self.score_groups for j in jobs)

            # plan every round up front (at the default lengths) so the progress bar never runs back
            estimates = [units(trials(h)) for h in auto]
            tracker.add(sum(estimates))
            for n, hole in enumerate(auto):
                round_jobs = trials(hole)
                tracker.add(units(round_jobs) - estimates[n])
                self._run(round_jobs, prompt, "length", tracker, cancel, planned=True)
                self._score(round_jobs, prompt, tracker, cancel, planned=True)
                best = []
                for i in range(spec.count):
                    mine = [t for t in round_jobs if t.variant == i]
                    winner = max(mine, key=lambda t: (t.score, -t.plan.hole_tokens))  # ties: the shorter line
                    winner.length_scores = [(list(t.plan.lengths), float(t.score)) for t in mine]
                    lengths[i] = list(winner.plan.lengths)
                    best.append(winner)
        settings = {"hole_candidates": [list(h.lengths) for h in holes],
                    "score_groups": self.score_groups if auto else None}
        return prompt, best, settings

    def _fill_token(self) -> int:
        mask = self.engine.info.mask_token
        if mask is not None:
            return int(mask)
        return int(self.engine.eos if self.engine.eos is not None else 0)  # uniform-state: drafts

    def _run(self, jobs: list[_Job], prompt: np.ndarray, phase: str, tracker: _Tracker, cancel,
             planned: bool = False) -> None:
        """Run the jobs in batches of max_batch sequences; each job gets its FinalEvent."""
        if not planned:
            tracker.add(sum(self._steps(j.params) for j in jobs))
        for start in range(0, len(jobs), self.max_batch):
            chunk = jobs[start:start + self.max_batch]
            seen = [0] * len(chunk)
            templates = [CanvasTemplate(j.plan.tokens, j.plan.fixed) if j.plan is not None else None for j in chunk]
            events = self.engine.generate_batch([prompt] * len(chunk), [j.params for j in chunk], cancel=cancel,
                                                templates=templates if any(t is not None for t in templates) else None)
            for i, event in events:
                job = chunk[i]
                planned_steps = self._steps(job.params)
                if isinstance(event, FinalEvent):
                    job.final = event
                    tracker.tick(phase, max(0, planned_steps - seen[i]), job.variant, event)
                else:
                    seen[i] += 1
                    tracker.tick(phase, 1 if seen[i] <= planned_steps else 0, job.variant, event)
            if (cancel is not None and cancel.is_set()) or any(j.final.stop_reason == "cancelled" for j in chunk):
                raise GenerationCancelled("generation cancelled")

    def _steps(self, params: DiffusionParams) -> int:
        """A sequence's planned denoising steps (progress units): the steps of its canvas; block
        diffusion: steps per block times the blocks of a full-length line."""
        steps = int(params.steps)
        if self.engine.info.block_diffusion and params.gen_length:
            steps *= max(1, -(-int(params.max_tokens or 0) // int(params.gen_length)))
        return steps

    def _score(self, jobs: list[_Job], prompt: np.ndarray, tracker: _Tracker, cancel, planned: bool = False) -> None:
        groups = self.score_groups
        if not planned:
            tracker.add(groups * len(jobs))
        for job in jobs:
            if cancel is not None and cancel.is_set():
                raise GenerationCancelled("generation cancelled")
            scores = self.engine.pseudo_log_likelihood(prompt, job.final.tokens, groups=groups)
            job.score = float(np.mean(scores))
            tracker.tick("score", groups, job.variant, None)

    def _variant(self, job: _Job, banned: BannedWords) -> LineVariant:
        final = job.final
        assert final is not None
        if job.plan is None:
            text = final.text.strip()
            holes: list[HoleFill] = []
            spans = [(0, len(text))]
        else:
            text, hole_texts, spans = read_canvas(job.plan, final.tokens, self.tokenizer)
            holes = [HoleFill(t, n) for t, n in zip(hole_texts, job.plan.lengths, strict=True)]
        problem = None
        word = banned.find(text, spans)
        if word is not None:
            problem = f"contains the banned word {word!r}"
        elif not text.strip():
            problem = "the line is empty"
        return LineVariant(
            index=job.variant, seed=job.seed, attempt=job.attempt, text=text, holes=holes,
            tokens=[int(t) for t in final.tokens], stop_reason=final.stop_reason, score=job.score,
            length_scores=list(job.length_scores),
            problem=problem, status="rejected" if problem else "new", params=job.params,
        )
