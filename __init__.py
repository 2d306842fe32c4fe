"""dgchat: a local terminal chat for text-diffusion language models."""

__version__ = "0.1.0"
