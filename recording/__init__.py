"""Recordings of the denoising: an answer's step history (history.py), the one renderer of a canvas
frame as terminal text (frame_text.py), asciicast files made from them (asciicast.py) and how an
answer written block after block (block diffusion) counts its progress (blocks.py). Shared by
`dgchat generate --visual / --record` and the app's replay and export; no UI framework here."""
