"""Conversion to GGUF, quantization, and the default model's training recipe."""
