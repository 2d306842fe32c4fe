"""The model architectures dgchat runs, as both the header checks (model_check.py) and the model
classification (model_info.py) name them. Plain data: it imports nothing, so both can import it."""

# Architectures llama.cpp itself treats as diffusion models (llm_arch_is_diffusion): no KV memory.
NATIVE_DIFFUSION_ARCHS = ("llada", "llada-moe", "dream", "rnd1")
# Block diffusion: the largest block size (dgchat.engine.attention_block) a file may set; engine patch
# 0017 refuses anything outside 1..4096 when it loads the file
MAX_ATTENTION_BLOCK = 4096
# What an "unsupported model" error tells the user dgchat runs
SUPPORTED_HELP = (
    "llada, llada-moe, dream, rnd1, DiffusionGemma (gemma4 GGUFs converted by `dgchat convert`), "
    "their KV-cache conversions (llama, qwen2, qwen3moe, hy_v3 with attention.causal = false and a mask token), "
    "or block-diffusion models (SDAR, BD3LM: qwen3/qwen2 GGUFs converted by `dgchat convert`)"
)
