"""`dgchat serve`: a local OpenAI-compatible HTTP API (plus /v1/infill) over one loaded model.

HTTP is uvicorn with h11's parser and a small Starlette app (asgi.py, protocol.py); one worker
thread owns the engine (generation never runs on the event loop) with a bounded queue in front of
it (service.py); requests are parsed and checked in request_fields.py and openai_api.py (the
OpenAI routes) and infill.py (/v1/infill). See docs/SERVER.md.
"""

DEFAULT_PORT = 8765
