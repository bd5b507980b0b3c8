"""FSDP2 oracle cases. Every base case is run with attn_implementation "eager" and "sdpa"
(case name suffix _eager / _sdpa). Defaults: batch 2, seq 32, fp32, FSDP2 defaults."""

DEFAULTS = {
    "batch": 2,
    "seq": 32,
    "param_dtype": None,              # MixedPrecisionPolicy.param_dtype (None = off)
    "reduce_dtype": None,             # MixedPrecisionPolicy.reduce_dtype
    "reshard_after_forward": True,    # for the decoder-layer fully_shard calls
    "root_reshard_after_forward": None,  # None = FSDP2 default (root switched to False at lazy init)
}

BASE_CASES = {
    "gpt2_ws2": {"model": "tiny-gpt2", "world_size": 2},
    "gpt2_ws4": {"model": "tiny-gpt2", "world_size": 4},
    "llama_ws2": {"model": "tiny-llama", "world_size": 2},
    "llama_tied_ws2": {"model": "tiny-llama-tied", "world_size": 2},
    "llama_gqa_ws4": {"model": "tiny-llama-gqa", "world_size": 4},
    "qwen2_ws3": {"model": "tiny-qwen2", "world_size": 3},
    "mistral_bf16_ws2": {"model": "tiny-mistral", "world_size": 2,
                         "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    "llama_raf_false_ws2": {"model": "tiny-llama", "world_size": 2, "reshard_after_forward": False},
    "llama_root_raf_true_ws2": {"model": "tiny-llama", "world_size": 2, "root_reshard_after_forward": True},
    "mixtral_ws2": {"model": "tiny-mixtral", "world_size": 2},
}

ATTN_IMPLS = ("eager", "sdpa")


def all_cases():
    """name -> fully resolved case dict, in a stable order."""
    out = {}
    for base, spec in BASE_CASES.items():
        for impl in ATTN_IMPLS:
            c = dict(DEFAULTS)
            c.update(spec)
            c["attn_implementation"] = impl
            out[f"{base}_{impl}"] = c
    return out
