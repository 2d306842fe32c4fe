"""`dgchat serve`: a local OpenAI-compatible HTTP API (plus /v1/infill) over one loaded model.

No UI and no third-party web framework: asyncio streams for HTTP/1.1, one worker thread that owns
the engine (generation never runs on the event loop), a bounded queue in front of it. See
docs/SERVER.md.
"""

DEFAULT_PORT = 8765
