"""Bounds on what dgchat reads from a server (docs/SECURITY.md, "What a server can send").

A server is not trusted: every size, count, depth and time it could make grow is bounded here, and
going past a bound ends the request with one line (RemoteApiError "... sent ...", or RemoteTimeout),
never a traceback, a hang or gigabytes of memory. The bounds are far above what dgchat serve or vLLM
send for any request dgchat makes; where a legitimate answer grows with the request (an answer's
text, a canvas), the bound is derived from the request's own max_tokens (`AnswerBudget`).
"""

from __future__ import annotations

from dataclasses import dataclass

KIB = 1024
MIB = 1024 * KIB

# -- bodies (decompressed bytes: a gzip bomb is counted as it inflates, in 1 MiB pieces) ------------
MAX_MODELS_BYTES = 4 * MIB  # GET /v1/models: a few KB per model
MAX_ERROR_BYTES = 64 * KIB  # an error answer: read this much for its message, the rest is not read
MAX_JSON_BYTES = 4 * MIB  # any other JSON answer not sized by its request (/health, ...)
MAX_INFILL_BYTES_PER_LINE = 256 * KIB  # /v1/infill: per variant asked for (`n`), plus MAX_JSON_BYTES
# -- JSON (remote.wire.loads): dgchat.strict_json's bounds (nesting 64, integers of 20 digits) ------
# -- numbers and counts dgchat reads --------------------------------------------------------------
MAX_VOCAB = 1 << 24  # n_vocab (the largest real vocabularies are about 2**18)
MAX_CONTEXT = 1 << 24  # context_length / max_model_len
MAX_END_TOKENS = 4096
MAX_MODELS = 4096  # entries of /v1/models
MAX_NAME_CHARS = 1024  # model ids, names, file names
MAX_WORD_CHARS = 64  # stop reasons, finish reasons, families, error codes
MAX_COUNT = (1 << 31) - 1  # steps, canvas indexes, committed counts, usage counts
MAX_CHOICES = 64  # choices of one answer (dgchat serve takes n <= 8, NPC lines count <= 64)
# -- pieces the remote engine caches (token id -> text, for drawing canvases) ----------------------
MAX_PIECE_CHARS = 256  # one token's text (real vocabularies: a few dozen characters at most)
MAX_PIECES = 1 << 19  # distinct tokens cached (a 262,144-token vocabulary fits twice)
MAX_PIECE_TOTAL_CHARS = 1 << 24  # all cached pieces together
# -- answers ---------------------------------------------------------------------------------------
MAX_TOKEN_BYTES = 256  # answer text per token asked for (max_tokens), UTF-8
ANSWER_SLACK_BYTES = 4 * KIB
EVENT_BYTES_PER_POSITION = 512  # one canvas position in an event: its id, text (JSON-escaped), state
EVENT_SLACK_BYTES = 64 * KIB
DEFAULT_MAX_TOKENS = 8192  # the budget of a request that does not say its max_tokens
# -- time -----------------------------------------------------------------------------------------
DEFAULT_DEADLINE = 1800.0  # seconds for a whole request (every try, the wait between, the answer)
METADATA_DEADLINE = 60.0  # GET requests (/v1/models, /health): a few KB, answered at once
MAX_RETRY_AFTER = 5.0  # a server's Retry-After is capped to this many seconds
MAX_RETRY_WAIT = 15.0  # all the waits between tries of one request together
# -- what error messages quote of a server's text -------------------------------------------------
QUOTE_CHARS = 200


@dataclass(frozen=True)
class AnswerBudget:
    """What one streamed answer may hold, from its request: `max_tokens` per choice (the client
    enforces it too), `canvas` positions per canvas event, `n` choices."""

    max_tokens: int
    canvas: int
    n: int = 1

    @classmethod
    def of(cls, body: dict) -> AnswerBudget:
        """The budget of a completion request body as RemoteEngine.request_body builds it."""
        max_tokens = body.get("max_tokens")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            max_tokens = DEFAULT_MAX_TOKENS
        ext = body.get("dgchat") if isinstance(body.get("dgchat"), dict) else {}
        gen = ext.get("gen_length")
        gen = gen if isinstance(gen, int) and not isinstance(gen, bool) and gen > 0 else 0
        suffix = body.get("suffix")
        # a completion with a suffix is a canvas of max_tokens positions plus the suffix's tokens
        # (at most one per byte); dgchat serve may round a canvas up to whole blocks (< gen_length)
        extra = len(suffix.encode("utf-8", "replace")) if isinstance(suffix, str) else 0
        canvas = max(max_tokens, gen) + gen + extra + 64
        n = body.get("n")
        n = n if isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_CHOICES else 1
        return cls(max_tokens, canvas, n)

    @property
    def answer_tokens(self) -> int:
        """Tokens of an answer's finished canvases (a canvas may run past max_tokens before the cut)."""
        return self.max_tokens + self.canvas

    @property
    def text_bytes(self) -> int:
        """UTF-8 bytes of one choice's text."""
        return ANSWER_SLACK_BYTES + MAX_TOKEN_BYTES * self.max_tokens

    @property
    def event_bytes(self) -> int:
        """One server-sent event: a canvas (and on a canvas's first step, the answer before it)."""
        return EVENT_SLACK_BYTES + EVENT_BYTES_PER_POSITION * (self.canvas + self.answer_tokens)
