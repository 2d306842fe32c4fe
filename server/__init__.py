"""`dgchat serve`: a local OpenAI-compatible HTTP API (plus /v1/infill) over one loaded model.

HTTP is uvicorn with h11's parser and a small Starlette app (asgi.py, protocol.py); one worker
thread owns the engine (generation never runs on the event loop) with a bounded queue in front of
it (service.py); requests are parsed and checked in openai_api.py. See docs/SERVER.md.
"""

DEFAULT_PORT = 8765
