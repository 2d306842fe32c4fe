"""The API server's /v1/infill route: an NPC line (a template with holes, or a free line of a
given length) for a character card, written by dgchat.npc's generator on the server's worker.

`InfillRoute` is one ApiServer's handler: it parses and checks the request body into a LineSpec
(off the event loop, like the OpenAI routes' preparation), runs the generation as a job of the
server's queue, and answers with every variant and its holes, seeds and scores.
"""

from __future__ import annotations

import copy
import secrets
import threading
import time
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response

from dgchat.model_backend.engine_protocol import LocalEngine
from dgchat.model_backend.params import DiffusionParams
from dgchat.npc.cards import find_card, load_cards, parse_card
from dgchat.npc.generator import (
    LENGTH_PRESETS,
    MAX_COUNT,
    MAX_LINE_TOKENS,
    NO_TEMPLATES,
    LineBatch,
    LineSpec,
    NpcGenerator,
)
from dgchat.npc.templates import parse_template, plan_canvas
from dgchat.server.asgi import json_response
from dgchat.server.errors import ApiError
from dgchat.server.request_fields import STREAM_KEYS, bad, float_field, int_field, parse_dgchat, parse_seed, parse_top_p

if TYPE_CHECKING:  # the server owns this route; a type only (app.py imports this module)
    from dgchat.server.app import ApiServer

MAX_TEMPLATE = 4096  # characters of an /v1/infill template
MAX_VARIABLES = 256


class InfillRoute:
    """/v1/infill for one server; `handle` is the route's endpoint (a bound method: Starlette would
    take a callable object for an ASGI app). The NPC generator is made once (it scans the
    vocabulary) and shared by every request; `serve` makes it before the first request comes."""

    def __init__(self, server: ApiServer) -> None:
        self.server = server
        self._npc: NpcGenerator | None = None
        self._npc_lock = threading.Lock()  # the loop's helper threads prepare requests concurrently

    def generator(self) -> NpcGenerator:
        with self._npc_lock:
            if self._npc is None:
                self._npc = NpcGenerator(self.server.engine)
            return self._npc

    def prepare(self, body: Any) -> tuple[LineSpec, int, int]:
        """The request checked: its LineSpec, its prompt's length in tokens, its max_attempts."""
        engine = self.server.engine
        if not isinstance(body, dict):
            raise bad("the request body must be a JSON object")
        known = {"template", "length", "variables", "character", "context", "situation", "n", "seed", "temperature",
                 "top_p", "model", "max_attempts", "dgchat", "user"}
        unknown = [k for k in body if k not in known]
        if unknown:
            name = unknown[0][:40]
            raise bad(f"unknown field `{name}` (known: {', '.join(sorted(known))})", name)
        template = body.get("template")
        length = body.get("length")
        if template is None and length is not None:  # a free line: no template, a length budget
            if not ((isinstance(length, str) and length in LENGTH_PRESETS) or (
                    isinstance(length, int) and not isinstance(length, bool) and 1 <= length <= MAX_LINE_TOKENS)):
                raise bad(f"`length` must be one of {', '.join(LENGTH_PRESETS)} or 1..{MAX_LINE_TOKENS} "
                          "tokens", "length")
        elif length is not None:
            raise bad("give `template` (a line with holes) or `length` (a free line), not both", "length")
        elif not isinstance(template, str) or not template:
            raise bad("`template` must be a non-empty string, e.g. \"Halt, {player}! None may pass the "
                      "{___} after dark.\" (or give `length` for a free line)", "template")
        if template is not None and len(template) > MAX_TEMPLATE:
            raise bad(f"`template` must be at most {MAX_TEMPLATE} characters", "template")
        variables = body.get("variables", {})
        if not isinstance(variables, dict) or not all(
                isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in variables.values()):
            raise bad("`variables` must be an object of name -> string or number", "variables")
        if len(variables) > MAX_VARIABLES:
            raise bad(f"`variables` takes at most {MAX_VARIABLES} names", "variables")
        character = body.get("character")
        if character is None:
            card = parse_card({"name": "NPC"})
        elif isinstance(character, str):
            card = find_card(load_cards(self.server.config.cards), character)
        elif isinstance(character, dict):
            card = parse_card(character, "character")
        else:
            raise bad("`character` must be a card id, a card object, or absent", "character")
        for key in ("context", "situation"):
            if not isinstance(body.get(key, ""), str):
                raise bad(f"`{key}` must be a string", key)
        n = int_field(body, "n", 1, MAX_COUNT, 1)
        max_attempts = int_field(body, "max_attempts", 1, 8, 4)
        ext = parse_dgchat(body, engine)
        for key in STREAM_KEYS:
            ext.pop(key, None)
        params = DiffusionParams(temperature=float_field(body, "temperature", 0.0, 2.0),
                                 top_p=parse_top_p(body), **ext)
        params.validate()
        spec = LineSpec(card=card, context=body.get("context", ""), situation=body.get("situation", ""),
                        template=template, variables={str(k): str(v) for k, v in variables.items()}, count=n,
                        seed=parse_seed(body), params=params,
                        **({"length": length} if length is not None else {}))
        spec.validate()
        if template is not None and engine.info.block_diffusion:
            raise ApiError(400, f"`template` (a line with holes) is not supported by this model, {engine.label}: "
                                f"{NO_TEMPLATES}", param="template", code="unsupported_parameter")
        generator = self.generator()
        if template is None:
            return spec, int(generator.prompt(spec).size), max_attempts
        filled = parse_template(template).fill(spec.variables)
        if not filled.holes:
            raise bad("`template` has no hole ({___}): nothing for the model to fill", "template")
        prompt = generator.prompt(spec, filled)
        # lay the line out once now: a template the tokenizer cannot keep byte-identical fails here
        plan_canvas(filled, [h.default_length for h in filled.holes], generator.tokenizer, fill_token=0)
        return spec, int(prompt.size), max_attempts

    async def handle(self, request: Request) -> Response:
        body = await self.server.read_body(request)
        spec, prompt_tokens, max_attempts = await self.server.off_loop(lambda: self.prepare(body))
        generator = self.generator()

        def work(engine: LocalEngine, cancel: Any, emit: Any) -> LineBatch:
            g = replace_attempts(generator, max_attempts)
            return g.generate(spec, cancel=cancel)

        batch = await self.server.run_job(request, self.server.submit(work))
        choices = []
        completion = 0
        for v in batch.variants:
            completion += sum(h.tokens for h in v.holes) if v.holes else len(v.tokens)  # a free line: its tokens
            choices.append({"index": v.index, "text": v.text, "holes": [{"text": h.text, "tokens": h.tokens}
                                                                       for h in v.holes],
                            "seed": v.seed, "attempt": v.attempt, "score": v.score,
                            "finish_reason": "rejected" if v.problem else "stop", "problem": v.problem,
                            # what an export records (dgchat npc --server rebuilds the LineBatch from these)
                            "stop_reason": v.stop_reason, "tokens": v.tokens, "settings": v.settings,
                            "length_scores": [[list(lengths), score] for lengths, score in v.length_scores]})
        return json_response({"id": f"infill-{secrets.token_hex(12)}", "object": "dgchat.infill",
                              "created": int(time.time()), "model": self.server.model_id, "character": spec.card.id,
                              "choices": choices,
                              "dgchat": {"settings": batch.settings, "model": batch.model.as_dict()},
                              "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                                        "total_tokens": prompt_tokens + completion}})


def replace_attempts(generator: NpcGenerator, max_attempts: int) -> NpcGenerator:
    """The shared generator with another max_attempts (a shallow copy shares its caches)."""
    if generator.max_attempts == max_attempts:
        return generator
    g = copy.copy(generator)
    g.max_attempts = max_attempts
    return g


__all__ = ["MAX_TEMPLATE", "MAX_VARIABLES", "InfillRoute", "replace_attempts"]
