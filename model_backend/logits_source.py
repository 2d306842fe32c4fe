"""Answers the samplers' logits requests with llama.cpp, reusing the KV cache where it may.

Cache modes (architectures with KV memory only; llada/dream/rnd1 GGUFs have none and always run
the whole sequence):
- "none":   every step runs the whole sequence (exact, the reference computation).
- "prefix": Fast-dLLM's prefix cache. The first step of a block runs the whole sequence and keeps
            the KV cells before the block; later steps of the block run only the block against
            that cached prefix, and the block's cells are dropped after each step. The suffix after
            the block is not seen on those steps.
- "dual":   like prefix, but the cells after the block (the masked suffix) stay cached too.
The first step of every block is always a full pass, so its logits equal the "none" mode's.
Several requests (sequences) are answered with one llama_decode, one sequence id each.

Requests that carry a `sample` spec are answered, with `on_backend`, with the RowStats the
context's diffusion head computes in llama.cpp's graph (only O(rows) numbers come back); otherwise
with logits, which the sampler reads on the host.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from dgchat.model_backend import sampling
from dgchat.model_backend.errors import InvalidParameterError
from dgchat.model_backend.llamacpp import HeadRequest, HeadSetup, LlamaContext, engine_info
from dgchat.model_backend.requests import LogitsRequest

if TYPE_CHECKING:  # the engine holds its sources: a type only, not an import cycle
    from dgchat.model_backend.engine import DiffusionEngine


# the head configuration of masked models: no self-conditioning (one object, so contexts configure it once)
PLAIN_HEAD = HeadSetup()


def head_request(ctx: LlamaContext, specs: Sequence[sampling.SampleSpec], spec_of_row: np.ndarray,
                 uniform_index: np.ndarray | None = None, **extra) -> HeadRequest:
    """The diffusion head's inputs for a decode whose output rows are sampled under `specs`
    (`spec_of_row[i]`: the spec of output row i; row i draws with `uniform[uniform_index[i]]` of
    its spec, by default the rows of a spec in order). Sets the context's bias table."""
    first = specs[0]
    if any((sp.top_k, sp.top_p) != (first.top_k, first.top_p) for sp in specs):
        raise InvalidParameterError("sequences decoded together must share top-k and top-p")
    spec_of_row = np.asarray(spec_of_row, dtype=np.int64)
    if uniform_index is None:  # position of each row among the rows of its spec
        starts = np.flatnonzero(np.r_[True, spec_of_row[1:] != spec_of_row[:-1]])
        uniform_index = np.arange(spec_of_row.size) - np.repeat(starts, np.diff(np.r_[starts, spec_of_row.size]))
    uniform = np.array([0.0 if specs[k].uniform is None else specs[k].uniform[j]
                        for k, j in zip(spec_of_row, uniform_index)], dtype=np.float32)
    table, index = sampling.bias_table(specs, ctx.model.n_vocab)
    ctx.set_head_bias(table)
    return HeadRequest(
        inv_temp=np.array([specs[k].inv_temp for k in spec_of_row], dtype=np.float32), uniform=uniform,
        top_k=first.top_k, top_p=first.top_p, margin=any(sp.margin for sp in specs),
        bias_row=index[spec_of_row].astype(np.int32) if table is not None and table.shape[0] > 1 else None, **extra,
    )


class LlamaLogits:
    """The masked denoisers' logits source (driver.LogitsSource): each request's sequence under its
    own sequence id, all of a round in one decode."""

    def __init__(self, engine: DiffusionEngine, cache: str = "none", n_seq: int = 1, *,
                 on_backend: bool = False) -> None:
        self.engine = engine
        self.on_backend = on_backend
        # tests: called as check(requests, stats, logits) after every backend-sampled decode, which
        # then also returns its logits
        self.check: Callable | None = engine.step_check
        self.cache = cache if engine.info.has_kv_memory else "none"
        if self.cache == "dual" and not engine_info().noncontiguous_positions:
            # stock llama.cpp requires each batch to continue its sequence's cached positions
            raise InvalidParameterError(
                "--cache dual needs dgchat's patched llama.cpp (README's install command); "
                "this llama-cpp-python is a stock build: use --cache prefix"
            )
        self.n_seq = n_seq
        self._fresh = True

    def _ctx(self, total_tokens: int, longest: int):
        return self.engine.context_for(longest, n_seq=self.n_seq, batch_tokens=total_tokens)

    def logits(self, request: LogitsRequest) -> np.ndarray | sampling.RowStats:
        """One request of sequence 0."""
        return self.answer([(0, request)])[0]

    def answer(self, items: Sequence[tuple[int, LogitsRequest]]) -> list[np.ndarray | sampling.RowStats]:
        seqs = [int(s) for s, _ in items]
        requests = [r for _, r in items]
        plans = [self._plan(r) for r in requests]
        total = sum(p[1].size for p in plans)
        longest = max(r.sequence.size for r in requests)
        ctx = self._ctx(total, longest)
        if self._fresh:
            ctx.clear()  # nothing from an earlier generation may leak into this one
            self._fresh = False
        tokens = np.concatenate([p[1] for p in plans])
        positions = np.concatenate([p[2] for p in plans])
        seq_ids = np.concatenate([np.full(p[1].size, s, np.int32) for s, p in zip(seqs, plans)])
        offsets = np.cumsum([0] + [p[1].size for p in plans])
        outputs = np.concatenate([offsets[i] + p[3] for i, p in enumerate(plans)])
        for s, (drop_before, *_rest) in zip(seqs, plans):
            if drop_before is not None:
                ctx.seq_rm(s, drop_before)
        sizes = [p[3].size for p in plans]
        if self.on_backend and all(r.sample is not None for r in requests):
            ctx.configure_head(PLAIN_HEAD)
            specs = [r.sample for r in requests]
            head = head_request(ctx, specs, np.repeat(np.arange(len(specs)), sizes), keep_logits=self.check is not None)
            out = ctx.decode_tokens(tokens, positions, seq_ids=seq_ids, outputs=outputs, head=head)
            if self.check is not None:
                self.check(requests, *out)
                out = out[0]
            results = out.split(sizes)
        else:
            rows = ctx.decode_tokens(tokens, positions, seq_ids=seq_ids, outputs=outputs)
            # rows come back in batch order for the requested outputs: split them per request
            starts = np.cumsum([0] + sizes)
            results = [rows[starts[i]:starts[i + 1]] for i in range(len(requests))]
        for s, req in zip(seqs, requests):
            self._after(ctx, s, req)
        return results

    def _plan(self, req: LogitsRequest):
        """(remove cells from this position first, tokens to decode, their positions, output indices)."""
        b_start, b_end = req.block
        lo = int(min(b_start, req.rows.min())) if req.rows.size else b_start
        full = self.cache == "none" or req.block_start
        if full:
            positions = np.arange(req.sequence.size, dtype=np.int32)
            return 0, req.sequence, positions, req.rows.astype(np.int64)
        positions = np.arange(lo, b_end, dtype=np.int32)
        return None, req.sequence[lo:b_end], positions, (req.rows - lo).astype(np.int64)

    def _after(self, ctx, seq: int, req: LogitsRequest) -> None:
        if self.cache == "none":
            if ctx.has_memory:
                ctx.seq_rm(seq, 0)
            return
        b_start, b_end = req.block
        lo = int(min(b_start, req.rows.min())) if req.rows.size else b_start
        if self.cache == "prefix":
            ctx.seq_rm(seq, lo)  # keep [0, lo)
        else:  # dual
            ctx.seq_rm(seq, lo, b_end)  # keep the prefix and the suffix after the block

    def reset(self) -> None:
        self._fresh = True
