"""The one loop that runs denoisers against a logits source.

A denoiser (masked_diffusion.masked_denoiser, diffusion_gemma_denoiser.dg_denoiser,
block_denoiser.block_denoiser, ar_decoder.ar_decoder) is a coroutine that yields requests
(requests.py) and events (events.py). `drive` runs one or several in lock-step: every round it lets
each unfinished denoiser run until it asks for something, then answers all the round's requests
with one `LogitsSource.answer` call (so a source can put them in one llama.cpp decode). One denoiser
is the single-sequence case of the same loop.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Sequence
from typing import Protocol

import numpy as np

from dgchat.model_backend.errors import GenerationCancelled
from dgchat.model_backend.events import FinalEvent, StepEvent
from dgchat.model_backend.requests import REQUEST_TYPES, Request
from dgchat.model_backend.sampling import RowStats

# what a denoiser yields (a request, an event) and is sent back (the request's answer; None after an event)
Denoiser = Generator["Request | StepEvent | FinalEvent", "np.ndarray | RowStats | None", None]


class LogitsSource(Protocol):
    """Answers the requests of a round: `requests` holds (sequence index, request) pairs, the index
    being the denoiser's position in the list given to `drive` (a source keeps each sequence's
    cache under it). Returns one answer per request, in order: logits, or RowStats for a request
    that carries a sample spec and a source that samples in llama.cpp's graph. May raise
    GenerationCancelled (an aborted decode): every denoiser of the round is told."""

    def answer(self, requests: Sequence[tuple[int, Request]]) -> list[np.ndarray | RowStats]: ...


def drive(denoisers: Sequence[Denoiser], source: LogitsSource) -> Iterator[tuple[int, StepEvent | FinalEvent]]:
    """Run the denoisers in lock-step, one batched round of requests at a time. Yields (index,
    event); each index ends with its FinalEvent."""
    pending: dict[int, object] = {i: next(d) for i, d in enumerate(denoisers)}
    while pending:
        # let every denoiser run until it asks for something or finishes
        for i in list(pending):
            message = pending[i]
            while not isinstance(message, REQUEST_TYPES):
                yield i, message  # type: ignore[misc]
                if isinstance(message, FinalEvent):
                    del pending[i]
                    break
                message = next(denoisers[i])
            else:
                pending[i] = message
        if not pending:
            return
        order = list(pending)
        try:
            results = source.answer([(i, pending[i]) for i in order])  # type: ignore[misc]
        except GenerationCancelled as exc:
            for i in order:
                pending[i] = denoisers[i].throw(exc)
            continue
        for i, answer in zip(order, results):
            pending[i] = denoisers[i].send(answer)


def drive_one(denoiser: Denoiser, source: LogitsSource) -> Iterator[StepEvent | FinalEvent]:
    """`drive` of a single denoiser, without the index."""
    for _, event in drive([denoiser], source):
        yield event
