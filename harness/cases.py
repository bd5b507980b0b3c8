"""FSDP2 oracle cases. Every base case is run with attn_implementation "eager" and "sdpa"
(case name suffix _eager / _sdpa). Defaults: batch 2, seq 32, fp32, FSDP2 defaults."""

DEFAULTS = {
    "batch": 2,
    "seq": 32,
    "param_dtype": None,              # MixedPrecisionPolicy.param_dtype (None = off)
    "reduce_dtype": None,             # MixedPrecisionPolicy.reduce_dtype
    "reshard_after_forward": True,    # for the decoder-layer fully_shard calls
    "root_reshard_after_forward": None,  # None = FSDP2 default (root switched to False at lazy init)
    # Options below are recorded in the fixture's "options" only when they differ from these
    # defaults, so fixtures of cases that do not use them keep their exact bytes.
    "forward_prefetch": 0,            # n: units[i].set_modules_to_forward_prefetch(units[i+1..=i+n])
    "backward_prefetch": None,        # n: units[i].set_modules_to_backward_prefetch(units[i-1..=i-n])
                                      # (units: the non-root FSDP units in forward order)
    "grad_accum": 1,                  # micro-batches per step; grad sync only on the last
    "grad_sync": "last",              # "each": every micro-batch reduce-scatters (torchtitan's
                                      # loop: no set_requires_gradient_sync(False); --grad-sync)
    "strategy": "full-shard",         # or "hybrid-shard": 2-D mesh (replicate, shard)
    "shard_group_size": None,         # hybrid-shard: size of the shard mesh dim
    "checkpoint": None,               # module classes or paths under HF gradient checkpointing
                                      # (non-reentrant); `NAME=full|selective-op`: its own mode
    "ac_mode": "full",                # "selective-op": torchtitan's op-level SAC in the checkpoints
    "unit_reshard": None,             # {module path, pattern or "last": bool}: reshard_after_forward of
                                      # those units (the planner's --unit-reshard)
    "wrap": None,                     # the modules fully_shard'ed before the root, as the planner's
                                      # --policy: "transformer:<Class>[,…]" or "modules:<path>[,…]"
                                      # (`a+b`: one fully_shard([a, b]) call, as the planner's);
                                      # None: every instance of model._no_split_modules
    "optimizer": "adam",              # torch.optim.Adam | AdamW | SGD, lr 1e-3, torch's defaults
    "unit_group": 1,                  # k: fully_shard([block_i, …, block_i+k-1]), k consecutive
                                      # decoder layers per unit (the planner's --unit-group)
    "float8": None,                   # "tensorwise": torchao's convert_to_float8_training on every
                                      # nn.Linear but lm_head (torchtitan's filter), before
                                      # fully_shard (the planner's --float8; needs torchao 0.18.0)
    "float8_all_gather": False,       # Float8LinearConfig.enable_fsdp_float8_all_gather
    "train_loop": "hf",               # "torchtitan-2024": float32 logits out of the model, kept by
                                      # the loop until reassigned (the planner's --train-loop)
    "device": "cpu",                  # fsdp2_fake.py only: "fakegpu", harness/fakegpu.py's fake
                                      # accelerator (the host beside it: Adam's step counters there)
    "offload": False,                 # fsdp2_fake.py on "fakegpu": CPUOffloadPolicy on every unit
                                      # (the planner's --offload cpu)
    "compile": False,                 # fsdp2_fake.py: torchtitan's per-block torch.compile with
                                      # inductor's partitioner (fsdp2_oracle.compile_blocks; the
                                      # planner's --compile); fixtures add `after_forward`
    "ac_wrapper": "hf",               # "torchtitan": checkpoint_wrapper before fully_shard (the
                                      # blocks' FSDP hooks outside their checkpoints; the planner's
                                      # --ac-wrapper); "hf": HF's gradient checkpointing (inside)
}

BASE_CASES = {
    "gpt2_ws2": {"model": "tiny-gpt2", "world_size": 2},
    "gpt2_ws4": {"model": "tiny-gpt2", "world_size": 4},
    "llama_ws2": {"model": "tiny-llama", "world_size": 2},
    "llama_tied_ws2": {"model": "tiny-llama-tied", "world_size": 2},
    "llama_gqa_ws4": {"model": "tiny-llama-gqa", "world_size": 4},
    "qwen2_ws3": {"model": "tiny-qwen2", "world_size": 3},
    # Qwen3: per-head q/k RMSNorm (head_dim 16 != hidden 40 / 4 heads); bf16 upcasts in it
    "qwen3_ws2": {"model": "tiny-qwen3", "world_size": 2},
    "qwen3_bf16_ws3": {"model": "tiny-qwen3", "world_size": 3,
                       "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    "mistral_bf16_ws2": {"model": "tiny-mistral", "world_size": 2,
                         "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    "llama_raf_false_ws2": {"model": "tiny-llama", "world_size": 2, "reshard_after_forward": False},
    "llama_root_raf_true_ws2": {"model": "tiny-llama", "world_size": 2, "root_reshard_after_forward": True},
    "mixtral_ws2": {"model": "tiny-mixtral", "world_size": 2},
    # Explicit prefetch 2 deep needs more than 2 layers to differ from depth 1: 4-layer llama.
    # unit groups: two decoder layers per fully_shard call (one all-gather / reduce-scatter
    # for both), and three over 4 layers (a short last group)
    # reshard_after_forward=int: after forward each block keeps a 1/2 slice (the post-forward
    # mesh: groups of 2 consecutive ranks), gathered over that group in backward; fp32 and
    # bf16 params (the slices in the param dtype), and under checkpointing
    "llama_raf2_ws4": {"model": "tiny-llama-4l", "world_size": 4, "reshard_after_forward": 2},
    # reshard_after_forward=2 on some units only (the first two blocks), the last kept, the
    # others resharding fully (the planner's --unit-reshard UNIT=N)
    "llama_unit_raf2_ws4": {"model": "tiny-llama-4l", "world_size": 4,
                            "unit_reshard": {"model.layers.{0..1}": 2, "last": False}},
    "llama_unit_raf2_bf16_ac_ws4": {"model": "tiny-llama-4l", "world_size": 4, "checkpoint": ["LlamaDecoderLayer"],
                                    "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                    "unit_reshard": {"model.layers.{1..2}": 2}},
    "llama_raf2_bf16_ws4": {"model": "tiny-llama-4l", "world_size": 4, "reshard_after_forward": 2,
                            "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    "llama_raf2_ac_ws4": {"model": "tiny-llama-4l", "world_size": 4, "reshard_after_forward": 2,
                          "checkpoint": ["LlamaDecoderLayer"]},
    "llama_group2_ws2": {"model": "tiny-llama-4l", "world_size": 2, "unit_group": 2},
    "llama_group3_bf16_ws3": {"model": "tiny-llama-4l", "world_size": 3, "unit_group": 3,
                              "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    "llama_group2_ac_ws2": {"model": "tiny-llama-4l", "world_size": 2, "unit_group": 2,
                            "checkpoint": ["LlamaDecoderLayer"]},
    # unit groups with explicit prefetch (between the groups), with the embeddings and the
    # head as units of their own, and explicit prefetch through those edge units (torchtitan's
    # chain: tok_embeddings -> block 0 -> ... -> output and back), what tune combines
    # (`last`: the last unit in forward order, the last group / the head, kept after forward)
    "llama_group2_prefetch_ws2": {"model": "tiny-llama-4l", "world_size": 2, "unit_group": 2,
                                  "forward_prefetch": 1, "backward_prefetch": 2,
                                  "unit_reshard": {"last": False}},
    "llama_group2_edges_ws2": {"model": "tiny-llama-4l", "world_size": 2, "unit_group": 2,
                               "wrap": "modules:model.embed_tokens,model.layers.*,lm_head",
                               "unit_reshard": {"last": False}},
    # the last units kept after forward (what tune's "all but the last r" plans): the head
    # and the last two blocks, by a pattern
    "llama_keep3_edges_ws2": {"model": "tiny-llama-4l", "world_size": 2,
                              "wrap": "modules:model.embed_tokens,model.layers.*,lm_head",
                              "unit_reshard": {"lm_head": False, "model.layers.{2..3}": False}},
    # torchtitan's wrapping: the final norm and the head one unit (`fully_shard([model.norm,
    # model.output])`, the planner's `model.norm+lm_head`), the root left without params
    "llama_norm_head_unit_ws2": {"model": "tiny-llama", "world_size": 2,
                                 "wrap": "modules:model.embed_tokens,model.layers.*,model.norm+lm_head"},
    # ... kept after forward (torchtitan's default for it), with unit groups, explicit prefetch
    # through it, mixed precision and checkpointed blocks
    "llama_group2_norm_head_bf16_ac_ws2": {"model": "tiny-llama-4l", "world_size": 2, "unit_group": 2,
                                           "wrap": "modules:model.embed_tokens,model.layers.*,model.norm+lm_head",
                                           "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                           "checkpoint": ["LlamaDecoderLayer"], "forward_prefetch": 1,
                                           "backward_prefetch": 2, "unit_reshard": {"last": False}},
    "llama_edges_prefetch_ws2": {"model": "tiny-llama-4l", "world_size": 2,
                                 "wrap": "modules:model.embed_tokens,model.layers.*,lm_head",
                                 "forward_prefetch": 1, "backward_prefetch": 2},
    # torchao float8 (tensorwise) linears: bf16 params, weights all-gathered in float8 (uint8
    # buffers holding float8 weights and the norms' bf16 bytes), and f32 params gathered as is
    "llama_f8ag_bf16_ws2": {"model": "tiny-llama", "world_size": 2, "param_dtype": "bfloat16",
                            "reduce_dtype": "float32", "float8": "tensorwise", "float8_all_gather": True},
    "llama_f8_ws2": {"model": "tiny-llama", "world_size": 2, "float8": "tensorwise"},
    # MoE: the attention's linears in float8; the router's (4 × 32: dims not multiples of 16,
    # torchtitan's filter) and the fused experts (no nn.Linear) stay in high precision
    "mixtral_f8_ws2": {"model": "tiny-mixtral", "world_size": 2, "float8": "tensorwise"},
    # a wide MLP (512) over a small vocab: the peak inside a float8 linear's backward (its
    # casts, layout copies and scales), plain, gathered in float8 under bf16, and recomputed
    "llama_wide_f8_ws2": {"model": "tiny-llama-wide", "world_size": 2, "float8": "tensorwise"},
    "llama_wide_f8ag_bf16_b8_ws2": {"model": "tiny-llama-wide", "world_size": 2, "batch": 8, "param_dtype": "bfloat16",
                                    "reduce_dtype": "float32", "float8": "tensorwise", "float8_all_gather": True},
    "llama_wide_f8_ac_ws2": {"model": "tiny-llama-wide", "world_size": 2, "float8": "tensorwise",
                             "checkpoint": ["LlamaDecoderLayer"]},
    "llama_fwd_prefetch2_ws2": {"model": "tiny-llama-4l", "world_size": 2, "forward_prefetch": 2},
    "llama_bwd_prefetch2_ws2": {"model": "tiny-llama-4l", "world_size": 2, "backward_prefetch": 2},
    "llama_grad_accum2_ws2": {"model": "tiny-llama", "world_size": 2, "grad_accum": 2},
    "llama_hsdp_ws4": {"model": "tiny-llama", "world_size": 4,
                       "strategy": "hybrid-shard", "shard_group_size": 2},
    "llama_ac_ws2": {"model": "tiny-llama", "world_size": 2, "checkpoint": ["LlamaDecoderLayer"]},
    # GPT-2 (dropout 0.1, fused qkv, no rotary) under checkpointing, and GQA eager/sdpa with it
    "gpt2_ac_ws3": {"model": "tiny-gpt2", "world_size": 3, "checkpoint": ["GPT2Block"]},
    "llama_gqa_ac_ws2": {"model": "tiny-llama-gqa", "world_size": 2, "checkpoint": ["LlamaDecoderLayer"]},
    "qwen2_ac_ws3": {"model": "tiny-qwen2", "world_size": 3, "checkpoint": ["Qwen2DecoderLayer"]},
    "llama_tied_ac_ws2": {"model": "tiny-llama-tied", "world_size": 2, "checkpoint": ["LlamaDecoderLayer"]},
    "llama_bf16_ga2_ws2": {"model": "tiny-llama", "world_size": 2, "grad_accum": 2,
                           "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    # every micro-batch reduce-scatters, adding into the sharded grads (f32, and a bf16 master's
    # cast of the f32 reduction; HSDP's all-reduce input kept to the end of the backward)
    "llama_sync_each_ga3_ws2": {"model": "tiny-llama", "world_size": 2, "grad_accum": 3, "grad_sync": "each"},
    "llama_bf16_sync_each_ga2_ws2": {"model": "tiny-llama", "world_size": 2, "grad_accum": 2, "grad_sync": "each",
                                     "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    "llama_bf16_hsdp_sync_each_ga2_ws4": {"model": "tiny-llama", "world_size": 4, "grad_accum": 2, "grad_sync": "each",
                                          "strategy": "hybrid-shard", "shard_group_size": 2,
                                          "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    "llama_bf16_hsdp_ga2_ws4": {"model": "tiny-llama", "world_size": 4, "grad_accum": 2,
                                "strategy": "hybrid-shard", "shard_group_size": 2,
                                "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    "gpt2_bf16_ws2": {"model": "tiny-gpt2", "world_size": 2,
                      "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    # bf16 with dropout on the CPU, at the longest sequence tiny-gpt2 takes: SDPA runs its
    # math kernel in f32 (its f32 saved tensors and grads; the peaks are the MLP's backward
    # under checkpointing, the loss's without)
    "gpt2_bf16_ac_s64_ws2": {"model": "tiny-gpt2", "world_size": 2, "batch": 8, "seq": 64,
                             "checkpoint": ["GPT2Block"],
                             "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    "gpt2_bf16_b4s64_ws2": {"model": "tiny-gpt2", "world_size": 2, "batch": 4, "seq": 64,
                            "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    "qwen3_ac_raf_false_ws2": {"model": "tiny-qwen3", "world_size": 2, "checkpoint": ["Qwen3DecoderLayer"],
                               "reshard_after_forward": False},
    "mistral_bf16_ac_ga2_ws2": {"model": "tiny-mistral", "world_size": 2, "checkpoint": ["MistralDecoderLayer"],
                                "param_dtype": "bfloat16", "reduce_dtype": "float32", "grad_accum": 2},
    "llama_sgd_ws2": {"model": "tiny-llama", "world_size": 2, "optimizer": "sgd"},
    # more option mixes (exact on their first run, but the prefetch one)
    "llama_bf16_reduce_bf16_ws2": {"model": "tiny-llama", "world_size": 2,
                                   "param_dtype": "bfloat16", "reduce_dtype": "bfloat16"},
    "qwen2_bf16_ac_ws3": {"model": "tiny-qwen2", "world_size": 3,
                          "checkpoint": ["Qwen2DecoderLayer"], "param_dtype": "bfloat16",
                          "reduce_dtype": "float32"},
    "mixtral_bf16_ws2": {"model": "tiny-mixtral", "world_size": 2, "param_dtype": "bfloat16",
                         "reduce_dtype": "float32"},
    "llama_gqa_bf16_hsdp_ws4": {"model": "tiny-llama-gqa", "world_size": 4,
                                "strategy": "hybrid-shard", "shard_group_size": 2,
                                "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    "gpt2_bf16_raf_false_ws2": {"model": "tiny-gpt2", "world_size": 2,
                                "reshard_after_forward": False, "param_dtype": "bfloat16",
                                "reduce_dtype": "float32"},
    # explicit backward prefetch under checkpointing: the prefetched all-gathers are in flight at
    # the peak, which FSDPMemTracker counts as temp (issued after the param group's pre-backward)
    "llama4l_prefetch_ac_ws2": {"model": "tiny-llama-4l", "world_size": 2, "forward_prefetch": 1,
                                "backward_prefetch": 2, "checkpoint": ["LlamaDecoderLayer"]},
    "llama_b1s64_ws4": {"model": "tiny-llama", "world_size": 4, "batch": 1, "seq": 64},
    "mistral_ac_sgd_ws3": {"model": "tiny-mistral", "world_size": 3,
                           "checkpoint": ["MistralDecoderLayer"], "optimizer": "sgd"},
    "qwen3_adamw_ga2_ac_ws2": {"model": "tiny-qwen3", "world_size": 2,
                               "checkpoint": ["Qwen3DecoderLayer"], "optimizer": "adamw",
                               "grad_accum": 2},
    "llama_adamw_ws2": {"model": "tiny-llama", "world_size": 2, "optimizer": "adamw"},
    # and more, exact on their first run
    "llama4l_fwd_prefetch2_raf_false_ws2": {"model": "tiny-llama-4l", "world_size": 2,
                                            "forward_prefetch": 2, "reshard_after_forward": False},
    "llama_root_raf_true_ac_ws2": {"model": "tiny-llama", "world_size": 2,
                                   "root_reshard_after_forward": True,
                                   "checkpoint": ["LlamaDecoderLayer"]},
    "llama_hsdp_bf16_ac_ws4": {"model": "tiny-llama", "world_size": 4, "strategy": "hybrid-shard",
                               "shard_group_size": 2, "checkpoint": ["LlamaDecoderLayer"],
                               "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    "llama4l_hsdp_prefetch_ws4": {"model": "tiny-llama-4l", "world_size": 4,
                                  "strategy": "hybrid-shard", "shard_group_size": 2,
                                  "forward_prefetch": 1, "backward_prefetch": 2},
    "gpt2_bf16_ga2_ws2": {"model": "tiny-gpt2", "world_size": 2, "grad_accum": 2,
                          "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    "mixtral_ga2_ws2": {"model": "tiny-mixtral", "world_size": 2, "grad_accum": 2},
    "llama_tied_bf16_ac_ws2": {"model": "tiny-llama-tied", "world_size": 2,
                               "checkpoint": ["LlamaDecoderLayer"], "param_dtype": "bfloat16",
                               "reduce_dtype": "float32"},
    "qwen3_bf16_hsdp_ws4": {"model": "tiny-qwen3", "world_size": 4, "strategy": "hybrid-shard",
                            "shard_group_size": 2, "param_dtype": "bfloat16",
                            "reduce_dtype": "float32"},
    "mistral_s64_ac_ws2": {"model": "tiny-mistral", "world_size": 2, "seq": 64,
                           "checkpoint": ["MistralDecoderLayer"]},
    "llama4l_prefetch2_ws3": {"model": "tiny-llama-4l", "world_size": 3, "forward_prefetch": 2,
                              "backward_prefetch": 2},
    "gpt2_sgd_ac_ws4": {"model": "tiny-gpt2", "world_size": 4, "optimizer": "sgd",
                        "checkpoint": ["GPT2Block"]},
    # Checkpointed regions and units that do not coincide (HF checkpoints the decoder layers;
    # FSDP2's hooks run inside the checkpoint, so recomputing a layer re-gathers the units in it)
    # - the region contains units: each layer's MLP, or its attention, is a unit; the rest of
    #   the layer (norms, residual adds) belongs to the root
    "llama4l_ac_mlp_units_ws2": {"model": "tiny-llama-4l", "world_size": 2,
                                 "checkpoint": ["LlamaDecoderLayer"], "wrap": "transformer:LlamaMLP"},
    "llama4l_ac_attn_units_ws2": {"model": "tiny-llama-4l", "world_size": 2,
                                  "checkpoint": ["LlamaDecoderLayer"],
                                  "wrap": "transformer:LlamaAttention"},
    # - the region straddles a parent unit and its child: each layer a unit, its MLP another
    "llama4l_ac_nested_ws2": {"model": "tiny-llama-4l", "world_size": 2,
                              "checkpoint": ["LlamaDecoderLayer"],
                              "wrap": "transformer:LlamaDecoderLayer,LlamaMLP"},
    # - the region is contained in a unit: the base model is the only unit besides the root
    "llama4l_ac_in_unit_ws2": {"model": "tiny-llama-4l", "world_size": 2,
                               "checkpoint": ["LlamaDecoderLayer"], "wrap": "modules:model"},
    # - what --policy size:5000 wraps on tiny-llama (the base model, the embedding, each MLP,
    #   the head), under checkpointing
    "llama_ac_size5000_ws2": {"model": "tiny-llama", "world_size": 2,
                              "checkpoint": ["LlamaDecoderLayer"],
                              "wrap": "modules:model,model.embed_tokens,model.layers.0.mlp,"
                                      "model.layers.1.mlp,lm_head"},
    # torchtitan's wrapping: the last block not resharded after forward (FSDP2 would gather it
    # right back), alone and with checkpointing of a subset of the blocks (by path)
    "llama4l_last_raf_false_ws2": {"model": "tiny-llama-4l", "world_size": 2,
                                   "unit_reshard": {"last": False}},
    "llama4l_ac_blocks_1_3_ws2": {"model": "tiny-llama-4l", "world_size": 2,
                                  "checkpoint": ["model.layers.1", "model.layers.3"],
                                  "unit_reshard": {"last": False}},
    "llama4l_ac_block_0_ws3": {"model": "tiny-llama-4l", "world_size": 3,
                               "checkpoint": ["model.layers.0"]},
    # an AC mode per block: full, op-level SAC, none (what `tune` mixes)
    "llama4l_ac_mixed_ws2": {"model": "tiny-llama-4l", "world_size": 2,
                             "checkpoint": ["model.layers.0=full", "model.layers.1=selective-op",
                                            "model.layers.2=selective-op"],
                             "unit_reshard": {"last": False}, "param_dtype": "bfloat16",
                             "reduce_dtype": "float32"},
    "llama4l_ac_class_sac_block_ws3": {"model": "tiny-llama-4l", "world_size": 3,
                                       "checkpoint": ["LlamaDecoderLayer",
                                                      "model.layers.2=selective-op"]},
    # torchtitan's op-level selective AC: every other mm's output and SDPA's kept, the rest
    # recomputed (the last mm's kept output is never popped: held to the end of the block's backward)
    "llama_sac_op_ws2": {"model": "tiny-llama", "world_size": 2, "checkpoint": ["LlamaDecoderLayer"],
                         "ac_mode": "selective-op"},
    "llama4l_sac_op_tt_ws2": {"model": "tiny-llama-4l", "world_size": 2,
                              "checkpoint": ["LlamaDecoderLayer"], "ac_mode": "selective-op",
                              "unit_reshard": {"last": False}, "param_dtype": "bfloat16",
                              "reduce_dtype": "float32"},
    "llama_gqa_sac_op_ws2": {"model": "tiny-llama-gqa", "world_size": 2,
                             "checkpoint": ["LlamaDecoderLayer"], "ac_mode": "selective-op"},
    # q/k/v with a bias are addmm: only o_proj, up_proj (the 1st and 3rd mm) are kept
    "qwen2_sac_op_ws3": {"model": "tiny-qwen2", "world_size": 3, "checkpoint": ["Qwen2DecoderLayer"],
                         "ac_mode": "selective-op"},
    "mixtral_sac_op_ws2": {"model": "tiny-mixtral", "world_size": 2,
                           "checkpoint": ["MixtralDecoderLayer"], "ac_mode": "selective-op"},
    # Qwen3-MoE: experts of their own width, top-k not renormalized (norm_topk_prob false),
    # a dense layer among the sparse ones (mlp_only_layers), per-head q/k norm
    "qwen3_moe_ws2": {"model": "tiny-qwen3-moe", "world_size": 2},
    "qwen3_moe_ac_ws3": {"model": "tiny-qwen3-moe", "world_size": 3, "checkpoint": ["Qwen3MoeDecoderLayer"]},
    "qwen3_moe_bf16_ws2": {"model": "tiny-qwen3-moe", "world_size": 2, "param_dtype": "bfloat16",
                           "reduce_dtype": "float32"},
    "qwen3_moe_bf16_sac_op_ws2": {"model": "tiny-qwen3-moe", "world_size": 2, "param_dtype": "bfloat16",
                                  "reduce_dtype": "float32", "checkpoint": ["Qwen3MoeDecoderLayer"],
                                  "ac_mode": "selective-op"},
    # OLMo-2: norms after the sublayers, q/k norm over the whole projection, the weight
    # multiplied in float32 before the cast back
    "olmo2_ws2": {"model": "tiny-olmo2", "world_size": 2},
    "olmo2_bf16_ws2": {"model": "tiny-olmo2", "world_size": 2, "param_dtype": "bfloat16",
                       "reduce_dtype": "float32"},
    # (checkpointing with bf16 params fails in PyTorch itself for OLMo-2: its recomputed RoPE
    # products come out float32 where the forward's were bf16 — torch.utils.checkpoint's
    # metadata check refuses them; so these run in fp32)
    "olmo2_ac_ws3": {"model": "tiny-olmo2", "world_size": 3, "checkpoint": ["Olmo2DecoderLayer"]},
    "olmo2_sac_op_ws2": {"model": "tiny-olmo2", "world_size": 2, "checkpoint": ["Olmo2DecoderLayer"],
                         "ac_mode": "selective-op"},
    # Gemma 3: embeddings times sqrt(hidden), four (1 + weight) RMSNorms per block, per-head
    # q/k norms, local (window 4 < seq 32: a sliding-window mask) and global layers with their
    # own rotary tables, softmax scale query_pre_attn_scalar ** -0.5, gelu_pytorch_tanh, tied
    "gemma3_ws2": {"model": "tiny-gemma3", "world_size": 2},
    "gemma3_bf16_ws2": {"model": "tiny-gemma3", "world_size": 2, "param_dtype": "bfloat16",
                        "reduce_dtype": "float32"},
    "gemma3_ac_ws3": {"model": "tiny-gemma3", "world_size": 3, "checkpoint": ["Gemma3DecoderLayer"]},
    "gemma3_bf16_ac_ws2": {"model": "tiny-gemma3", "world_size": 2, "param_dtype": "bfloat16",
                           "reduce_dtype": "float32", "checkpoint": ["Gemma3DecoderLayer"]},
    "gemma3_sac_op_ws2": {"model": "tiny-gemma3", "world_size": 2, "checkpoint": ["Gemma3DecoderLayer"],
                          "ac_mode": "selective-op"},
    # Phi-3: fused qkv_proj and gate_up_proj (q/k/v and gate/up are views of one output)
    "phi3_ws2": {"model": "tiny-phi3", "world_size": 2},
    "phi3_bf16_ws2": {"model": "tiny-phi3", "world_size": 2, "param_dtype": "bfloat16",
                      "reduce_dtype": "float32"},
    "phi3_ac_ws3": {"model": "tiny-phi3", "world_size": 3, "checkpoint": ["Phi3DecoderLayer"]},
    # more tokens: the peak inside a block's backward (the slices' grads)
    "phi3_ac_b8s64_ws2": {"model": "tiny-phi3", "world_size": 2, "batch": 8, "seq": 64,
                          "checkpoint": ["Phi3DecoderLayer"]},
    # the embeddings and the LM head as units of their own (torchtitan's wrapping): the root
    # keeps only the final norm
    "llama_embed_head_units_ws2": {"model": "tiny-llama", "world_size": 2,
                                   "wrap": "modules:model.embed_tokens,model.layers.*,lm_head"},
    # ... or either alone, the other left to the root (what tune also searches)
    "llama_embed_unit_ws2": {"model": "tiny-llama", "world_size": 2,
                             "wrap": "modules:model.embed_tokens,model.layers.*"},
    "llama_head_unit_bf16_ac_ws2": {"model": "tiny-llama", "world_size": 2,
                                    "wrap": "modules:model.layers.*,lm_head",
                                    "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                    "checkpoint": ["LlamaDecoderLayer"], "unit_reshard": {"last": False}},
    "llama_embed_head_units_bf16_ac_ws2": {"model": "tiny-llama", "world_size": 2,
                                           "wrap": "modules:model.embed_tokens,model.layers.*,lm_head",
                                           "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                           "checkpoint": ["LlamaDecoderLayer"]},
    # MoE experts as FSDP units of their own inside their layer's (a `modules:` pattern policy):
    # Qwen3-MoE's dense layer has none; Mixtral in bf16, and under checkpointing (in fp32:
    # with bf16 params PyTorch refuses the recompute — the experts unit's forward-input cast
    # of the float32 routing weights is not replayed, torch.utils.checkpoint's metadata check
    # fails)
    "qwen3_moe_expert_units_ws2": {"model": "tiny-qwen3-moe", "world_size": 2,
                                   "wrap": "modules:model.layers.*.mlp.experts,model.layers.*"},
    "mixtral_expert_units_bf16_ws2": {"model": "tiny-mixtral", "world_size": 2,
                                      "wrap": "modules:model.layers.*.mlp.experts,model.layers.{0..1}",
                                      "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    # FSDP2's shard_placement_fn (`--shard-dim`): the experts (units of their own, as torchtitan
    # wraps them) sharded on dim 1 — torchtitan's choice where the shard group outnumbers the
    # experts; params on dims 1 and 2 of a block unit under checkpointing; and under
    # accumulation in bf16 (the kept upcast grads are what foreach_reduce lays out)
    "mixtral_experts_shard1_bf16_ws4": {"model": "tiny-mixtral", "world_size": 4,
                                        "wrap": "modules:model.layers.*.mlp.experts,model.layers.*",
                                        "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                        "shard_dim": [["model.layers.*.mlp.experts.*", 1]]},
    "mixtral_shard_dims_ac_ws2": {"model": "tiny-mixtral", "world_size": 2,
                                  "checkpoint": ["MixtralDecoderLayer"],
                                  "shard_dim": [["model.layers.*.mlp.experts.*", 1],
                                                ["model.layers.*.mlp.experts.down_proj", 2],
                                                ["model.layers.*.self_attn.q_proj.weight", 1],
                                                ["model.layers.1.post_attention_layernorm.weight", 0]]},
    "mixtral_shard_dims_ga2_bf16_ws2": {"model": "tiny-mixtral", "world_size": 2, "grad_accum": 2,
                                        "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                        "shard_dim": [["model.layers.*.mlp.experts.gate_up_proj", 1],
                                                      ["model.layers.*.mlp.gate.weight", 1]]},
    "mixtral_expert_units_ac_ws3": {"model": "tiny-mixtral", "world_size": 3,
                                    "wrap": "modules:model.layers.*.mlp.experts,model.layers.*",
                                    "checkpoint": ["MixtralDecoderLayer"]},
    # Gemma 2: alternating local (window 4) and global layers, the attention scores soft-capped
    # (eager; HF's SDPA path ignores it) and the logits soft-capped (tanh(l / 3) * 3)
    "gemma2_ws2": {"model": "tiny-gemma2", "world_size": 2},
    "gemma2_bf16_ws2": {"model": "tiny-gemma2", "world_size": 2, "param_dtype": "bfloat16",
                        "reduce_dtype": "float32"},
    "gemma2_ac_ws3": {"model": "tiny-gemma2", "world_size": 3, "checkpoint": ["Gemma2DecoderLayer"]},
    "gemma2_bf16_sac_op_ws2": {"model": "tiny-gemma2", "world_size": 2, "param_dtype": "bfloat16",
                               "reduce_dtype": "float32", "checkpoint": ["Gemma2DecoderLayer"],
                               "ac_mode": "selective-op"},
    # MoE under checkpointing: the experts' grouped_mm backward chain is the peak
    "mixtral_ac_ws2": {"model": "tiny-mixtral", "world_size": 2, "checkpoint": ["MixtralDecoderLayer"]},
    "mixtral_bf16_ac_ws2": {"model": "tiny-mixtral", "world_size": 2, "checkpoint": ["MixtralDecoderLayer"],
                            "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    # DeepSeek-V3: latent attention (low-rank q, a shared kv latent and one rotary key head,
    # q/k heads 12 wide and v heads 6: SDPA's math path on the CPU), interleaved YaRN RoPE, a
    # dense first layer, then MoE with a sigmoid group-limited float32 router, routed and
    # shared experts
    "deepseek_v3_ws2": {"model": "tiny-deepseek-v3", "world_size": 2},
    "deepseek_v3_bf16_ws2": {"model": "tiny-deepseek-v3", "world_size": 2, "param_dtype": "bfloat16",
                             "reduce_dtype": "float32"},
    "deepseek_v3_ac_ws3": {"model": "tiny-deepseek-v3", "world_size": 3, "checkpoint": ["DeepseekV3DecoderLayer"]},
    "deepseek_v3_bf16_ac_ws2": {"model": "tiny-deepseek-v3", "world_size": 2, "param_dtype": "bfloat16",
                                "reduce_dtype": "float32", "checkpoint": ["DeepseekV3DecoderLayer"]},
    "deepseek_v3_sac_op_ws2": {"model": "tiny-deepseek-v3", "world_size": 2,
                               "checkpoint": ["DeepseekV3DecoderLayer"], "ac_mode": "selective-op"},
    # more tokens: the peak inside a block's backward
    "deepseek_v3_ac_b8s64_ws2": {"model": "tiny-deepseek-v3", "world_size": 2, "batch": 8, "seq": 64,
                                 "checkpoint": ["DeepseekV3DecoderLayer"]},
    # long rows: the attention's [b, h, s, s] probs dominate, the peak inside its backward
    "deepseek_v3_ac_b1s128_ws2": {"model": "tiny-deepseek-v3", "world_size": 2, "batch": 1, "seq": 128,
                                  "checkpoint": ["DeepseekV3DecoderLayer"]},
    "deepseek_v3_bf16_ac_b1s128_ws2": {"model": "tiny-deepseek-v3", "world_size": 2, "batch": 1, "seq": 128,
                                       "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                       "checkpoint": ["DeepseekV3DecoderLayer"]},
    "deepseek_v3_bf16_b1s128_ws2": {"model": "tiny-deepseek-v3", "world_size": 2, "batch": 1, "seq": 128,
                                    "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    # DeepSeek-V2: latent attention with one q_proj (V2-Lite's), complex RoPE in float32, a
    # softmax router, group-limited and scaled, routed and two shared experts
    "deepseek_v2_ws2": {"model": "tiny-deepseek-v2", "world_size": 2},
    "deepseek_v2_bf16_ws2": {"model": "tiny-deepseek-v2", "world_size": 2, "param_dtype": "bfloat16",
                             "reduce_dtype": "float32"},
    "deepseek_v2_ac_ws3": {"model": "tiny-deepseek-v2", "world_size": 3, "checkpoint": ["DeepseekV2DecoderLayer"]},
    "deepseek_v2_bf16_ac_b1s128_ws2": {"model": "tiny-deepseek-v2", "world_size": 2, "batch": 1, "seq": 128,
                                       "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                       "checkpoint": ["DeepseekV2DecoderLayer"]},
    "deepseek_v2_sac_op_ws2": {"model": "tiny-deepseek-v2", "world_size": 2,
                               "checkpoint": ["DeepseekV2DecoderLayer"], "ac_mode": "selective-op"},
    "deepseek_v2_expert_units_bf16_ws2": {"model": "tiny-deepseek-v2", "world_size": 2,
                                          "wrap": "modules:model.layers.*.mlp.experts,model.layers.*",
                                          "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    "deepseek_v3_expert_units_ws2": {"model": "tiny-deepseek-v3", "world_size": 2,
                                     "wrap": "modules:model.layers.*.mlp.experts,model.layers.*"},
    # more tokens than weights: activations dominate
    "mixtral_ac_b4s64_ws4": {"model": "tiny-mixtral", "world_size": 4, "batch": 4, "seq": 64,
                             "checkpoint": ["MixtralDecoderLayer"]},
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


# ----------------------------------------------------------------------------------------
# FSDP1 (FullyShardedDataParallel, use_orig_params=False, FULL_SHARD) cases for
# harness/fsdp1_oracle.py. One attn_implementation each (collectives only; no memory).
# "wrap": "transformer" wraps every instance of model._no_split_modules;
# "size:<n>" is size_based_auto_wrap_policy(min_num_params=n).

FSDP1_DEFAULTS = {
    "batch": 2,
    "seq": 32,
    "attn_implementation": "sdpa",
    "backward_prefetch": "pre",       # BackwardPrefetch.BACKWARD_PRE | BACKWARD_POST
}

FSDP1_CASES = {
    "f1_llama_transformer_pre_ws2": {"model": "tiny-llama", "world_size": 2, "wrap": "transformer",
                                     "backward_prefetch": "pre", "grad_accum": 1, "device": "cpu"},
    "f1_llama_transformer_post_ws2": {"model": "tiny-llama", "world_size": 2, "wrap": "transformer",
                                      "backward_prefetch": "post"},
    # tiny-gpt2 block = 12704 params, its biggest child (mlp) 8352, root remainder 8864:
    # min 10000 wraps exactly the two blocks.
    "f1_gpt2_size_ws4": {"model": "tiny-gpt2", "world_size": 4, "wrap": "size:10000"},
    "f1_qwen2_transformer_ws3": {"model": "tiny-qwen2", "world_size": 3, "wrap": "transformer"},
}


def _resolved(defaults, specs):
    """name -> the case's spec over the defaults, in a stable order."""
    out = {}
    for name, spec in specs.items():
        c = dict(defaults)
        c.update(spec)
        out[name] = c
    return out


def fsdp1_cases():
    return _resolved(FSDP1_DEFAULTS, FSDP1_CASES)


# FSDP1's memory for harness/fsdp1_fake.py: one process, a fake process group, the model
# trained under FakeTensorMode with torch's MemTracker (FSDPMemTracker is FSDP2's). Transformer
# wrap, BACKWARD_PRE, use_orig_params=False; "mp": MixedPrecision(param_dtype=bfloat16,
# reduce_dtype=float32); "checkpoint": torchtitan's order (March 2024: checkpoint_wrapper
# around each block, then FSDP1 wraps the wrapper), full or its op-level SAC
FSDP1_FAKE_DEFAULTS = {"batch": 2, "seq": 32, "attn_implementation": "sdpa", "model_dtype": "float32",
                       "mp": False, "checkpoint": False, "ac_mode": "full", "train_loop": "hf",
                       "optimizer": "adamw", "strategy": "full-shard", "shard_group_size": None,
                       "backward_prefetch": "pre", "grad_accum": 1, "device": "cpu"}

FSDP1_FAKE_CASES = {
    "f1_llama_ws2": {"model": "tiny-llama", "world_size": 2},
    "f1_llama_mp_ws2": {"model": "tiny-llama", "world_size": 2, "mp": True},
    "f1_llama_mp_ac_ws2": {"model": "tiny-llama", "world_size": 2, "mp": True, "checkpoint": True},
    "f1_llama_mp_sac_ws2": {"model": "tiny-llama", "world_size": 2, "mp": True, "checkpoint": True,
                            "ac_mode": "selective-op"},
    "f1_llama_mp_ac_tt2024_ws2": {"model": "tiny-llama", "world_size": 2, "mp": True, "checkpoint": True,
                                  "train_loop": "torchtitan-2024"},
    # the other sharding strategies, BACKWARD_POST, and GPT-2 (LayerNorm, Conv1D, tied
    # embeddings, dropout) and Qwen2 (biased q/k/v) blocks
    "f1_llama_sgo_ws2": {"model": "tiny-llama", "world_size": 2, "mp": True, "strategy": "shard-grad-op"},
    "f1_llama_noshard_ws2": {"model": "tiny-llama", "world_size": 2, "strategy": "no-shard"},
    "f1_llama_hsdp_ws4": {"model": "tiny-llama", "world_size": 4, "mp": True, "strategy": "hybrid-shard",
                          "shard_group_size": 2},
    "f1_llama_post_ac_ws2": {"model": "tiny-llama", "world_size": 2, "mp": True, "checkpoint": True,
                             "backward_prefetch": "post"},
    "f1_llama_post_ws4": {"model": "tiny-llama", "world_size": 4, "batch": 1, "seq": 16,
                          "backward_prefetch": "post"},
    "f1_gpt2_mp_ws2": {"model": "tiny-gpt2", "world_size": 2, "mp": True},
    # gradient accumulation (no_sync), with and without mixed precision
    "f1_llama_ga2_ws2": {"model": "tiny-llama", "world_size": 2, "grad_accum": 2},
    "f1_llama_mp_ac_ga2_ws2": {"model": "tiny-llama", "world_size": 2, "mp": True, "checkpoint": True,
                               "grad_accum": 2},
    "f1_qwen2_ac_ws3": {"model": "tiny-qwen2", "world_size": 3, "checkpoint": True},
    # on harness/fakegpu.py's fake accelerator (planned --device cuda)
    "f1_llama_gpu_ws2": {"model": "tiny-llama", "world_size": 2, "device": "fakegpu"},
    "f1_llama_mp_ac_gpu_ws2": {"model": "tiny-llama", "world_size": 2, "mp": True, "checkpoint": True,
                               "device": "fakegpu"},
    # torchtitan PR #165's FSDP1 runs (Llama-2-7B, 8 ranks, 8 x 2048, bf16 / f32, the loop of
    # March 2024 that kept the float32 logits): full AC and op-level SAC
    "f1_llama2_7b_ac_pr165_ws8": {"model": "llama-2-7b", "world_size": 8, "batch": 8, "seq": 2048, "mp": True,
                                  "checkpoint": True, "train_loop": "torchtitan-2024"},
    "f1_llama2_7b_sac_pr165_ws8": {"model": "llama-2-7b", "world_size": 8, "batch": 8, "seq": 2048, "mp": True,
                                   "checkpoint": True, "ac_mode": "selective-op", "train_loop": "torchtitan-2024"},
    # ... and on the fake accelerator (CUDA's kernels and blocks: as the rows are planned)
    "f1_llama2_7b_ac_pr165_gpu_ws8": {"model": "llama-2-7b", "world_size": 8, "batch": 8, "seq": 2048, "mp": True,
                                      "checkpoint": True, "train_loop": "torchtitan-2024", "device": "fakegpu"},
    "f1_llama2_7b_sac_pr165_gpu_ws8": {"model": "llama-2-7b", "world_size": 8, "batch": 8, "seq": 2048, "mp": True,
                                       "checkpoint": True, "ac_mode": "selective-op", "train_loop": "torchtitan-2024",
                                       "device": "fakegpu"},
}


def fsdp1_fake_cases():
    return _resolved(FSDP1_FAKE_DEFAULTS, FSDP1_FAKE_CASES)


# ----------------------------------------------------------------------------------------
# Real-size FSDP2 cases for harness/fsdp2_fake.py: one process, a fake process group of
# world_size ranks, the model built and trained under FakeTensorMode (no compute, no
# memory), FSDPMemTracker counting the storages FSDP2 and autograd would hold. Options as
# DEFAULTS above; "model_dtype": None builds the model in its config's torch_dtype (as
# from_config does), "float32" forces fp32 master weights.

FAKE_DEFAULTS = dict(DEFAULTS, attn_implementation="sdpa", model_dtype=None)

FAKE_CASES = {
    # the README's main command: bf16 Llama-3-8B, 8 GPUs, 1 × 4096 tokens, f32 reduce
    "llama3_8b_bf16_ws8": {"model": "llama-3-8b", "world_size": 8, "batch": 1, "seq": 4096,
                           "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    # fp32 master weights and optimizer state, bf16 compute
    "llama3_8b_f32master_ws8": {"model": "llama-3-8b", "world_size": 8, "batch": 1, "seq": 2048,
                                "model_dtype": "float32",
                                "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    "qwen3_8b_bf16_ws8": {"model": "qwen3-8b", "world_size": 8, "batch": 2, "seq": 2048,
                          "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    # eager attention materializes the [batch, heads, seq, seq] scores: 16 GPUs, GQA 8:1
    "llama3_70b_eager_ws16": {"model": "llama-3-70b", "world_size": 16, "batch": 1, "seq": 1024,
                              "attn_implementation": "eager",
                              "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    # activation checkpointing at real size: every decoder layer recomputed in its backward
    "llama3_8b_bf16_ac_ws8": {"model": "llama-3-8b", "world_size": 8, "batch": 2, "seq": 4096,
                              "checkpoint": ["LlamaDecoderLayer"],
                              "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    "mixtral_8x7b_bf16_ac_ws8": {"model": "mixtral-8x7b", "world_size": 8, "batch": 1, "seq": 4096,
                                 "checkpoint": ["MixtralDecoderLayer"],
                                 "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    # gradient accumulation under mixed precision: unsynced grads kept upcast to f32
    "llama3_8b_bf16_ga2_ws8": {"model": "llama-3-8b", "world_size": 8, "batch": 1, "seq": 4096,
                               "grad_accum": 2, "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    # torchtitan's accumulation: every micro-batch reduce-scatters into the sharded grads
    # (bf16 masters: each f32 reduction cast, then added), and with f32 masters
    "llama3_8b_bf16_sync_each_ga3_ws8": {"model": "llama-3-8b", "world_size": 8, "batch": 1, "seq": 4096,
                                         "grad_accum": 3, "grad_sync": "each",
                                         "checkpoint": ["LlamaDecoderLayer"],
                                         "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    "llama3_8b_f32master_sync_each_ga2_ws8": {"model": "llama-3-8b", "world_size": 8, "batch": 1, "seq": 4096,
                                              "grad_accum": 2, "grad_sync": "each", "model_dtype": "float32",
                                              "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    # params far over the activations (batch 1 × seq 8): the peak at a later micro-batch's
    # reduction, beside the sharded grads it adds into (its f32 output; the cast of it for bf16
    # masters; under HSDP the all-reduce's input held)
    "llama_wide_sync_each_ga2_ws2": {"model": "tiny-llama-wide", "world_size": 2, "batch": 1, "seq": 8,
                                     "model_dtype": "float32", "grad_accum": 2, "grad_sync": "each"},
    "llama_wide_bf16master_sync_each_ga2_ws2": {"model": "tiny-llama-wide", "world_size": 2, "batch": 1, "seq": 8,
                                                "model_dtype": "bfloat16", "grad_accum": 2, "grad_sync": "each",
                                                "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    "llama_wide_bf16master_hsdp_sync_each_ga2_ws4": {"model": "tiny-llama-wide", "world_size": 4, "batch": 1, "seq": 8,
                                                     "model_dtype": "bfloat16", "grad_accum": 2, "grad_sync": "each",
                                                     "strategy": "hybrid-shard", "shard_group_size": 2,
                                                     "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    # the same, tiny, under HSDP with bf16 masters (the all-reduce's input held, the cast added)
    "llama_bf16master_hsdp_sync_each_ga2_ws4": {"model": "tiny-llama", "world_size": 4, "grad_accum": 2,
                                                "grad_sync": "each", "model_dtype": "bfloat16",
                                                "strategy": "hybrid-shard", "shard_group_size": 2,
                                                "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    # HSDP: 4 replicas of 8-way sharding, with the replicas' all-reduces
    "llama3_70b_hsdp_ws32": {"model": "llama-3-70b", "world_size": 32, "batch": 1, "seq": 4096,
                             "strategy": "hybrid-shard", "shard_group_size": 8,
                             "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    # ... and with short sequences, where the held f32 all-reduce inputs of every layer
    # (FSDP2 frees them at the end of the backward) make the peak
    "llama3_8b_hsdp_s512_ws16": {"model": "llama-3-8b", "world_size": 16, "batch": 1, "seq": 512,
                                 "strategy": "hybrid-shard", "shard_group_size": 8,
                                 "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    # probes across the other shipped families
    "qwen3_8b_bf16_ac_ws8": {"model": "qwen3-8b", "world_size": 8, "batch": 2, "seq": 4096,
                             "checkpoint": ["Qwen3DecoderLayer"],
                             "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    "gpt2_ws8": {"model": "gpt2", "world_size": 8, "batch": 8, "seq": 1024},
    # bf16 with dropout on the CPU: SDPA's math kernel upcasts to f32, and its backward's
    # f32 grads make the peak
    "gpt2_xl_bf16_ac_ws4": {"model": "gpt2-xl", "world_size": 4, "batch": 4, "seq": 1024,
                            "checkpoint": ["GPT2Block"],
                            "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    # ... and without checkpointing: HF's KV cache holds its k/v copies through the forward,
    # and the loss's locals (f32 logits, padded labels) make the peak at nll_loss
    "gpt2_xl_bf16_ws16": {"model": "gpt2-xl", "world_size": 16, "batch": 2, "seq": 1024,
                          "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    "mistral_7b_bf16_s8192_ws8": {"model": "mistral-7b", "world_size": 8, "batch": 1, "seq": 8192,
                                  "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    "qwen2_7b_bf16_raf_false_ws8": {"model": "qwen2-7b", "world_size": 8, "batch": 1, "seq": 4096,
                                    "reshard_after_forward": False,
                                    "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    "llama3_8b_bf16_prefetch2_ws8": {"model": "llama-3-8b", "world_size": 8, "batch": 1, "seq": 4096,
                                     "forward_prefetch": 2, "backward_prefetch": 2,
                                     "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    "mistral_7b_eager_s8192_ws8": {"model": "mistral-7b", "world_size": 8, "batch": 1, "seq": 8192,
                                   "attn_implementation": "eager",
                                   "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    "llama_1b_f32_sgd_ws2": {"model": "llama-1b", "world_size": 2, "batch": 8, "seq": 2048,
                             "model_dtype": "float32", "optimizer": "sgd"},
    # more of the families and options at real size (all exact on the first run)
    "llama2_7b_bf16_b2_ws8": {"model": "llama-2-7b", "world_size": 8, "batch": 2, "seq": 4096,
                              "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    "llama31_8b_bf16_ac_b4s2048_ws8": {"model": "llama-3.1-8b", "world_size": 8, "batch": 4,
                                       "seq": 2048, "checkpoint": ["LlamaDecoderLayer"],
                                       "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    "qwen3_8b_eager_ws8": {"model": "qwen3-8b", "world_size": 8, "batch": 1, "seq": 2048,
                           "attn_implementation": "eager", "param_dtype": "bfloat16",
                           "reduce_dtype": "float32"},
    "mistral_7b_bf16_ac_s8192_ws8": {"model": "mistral-7b", "world_size": 8, "batch": 1,
                                     "seq": 8192, "checkpoint": ["MistralDecoderLayer"],
                                     "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    "llama3_8b_hsdp_ac_ws16": {"model": "llama-3-8b", "world_size": 16, "batch": 2, "seq": 2048,
                               "strategy": "hybrid-shard", "shard_group_size": 8,
                               "checkpoint": ["LlamaDecoderLayer"], "param_dtype": "bfloat16",
                               "reduce_dtype": "float32"},
    "mixtral_8x7b_raf_false_ws8": {"model": "mixtral-8x7b", "world_size": 8, "batch": 1,
                                   "seq": 2048, "reshard_after_forward": False,
                                   "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    "gpt2_eager_ws4": {"model": "gpt2", "world_size": 4, "batch": 4, "seq": 1024,
                       "attn_implementation": "eager"},
    "qwen2_7b_f32master_ga2_ws8": {"model": "qwen2-7b", "world_size": 8, "batch": 1, "seq": 2048,
                                   "grad_accum": 2, "model_dtype": "float32",
                                   "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    # long context, pure bf16, MoE at 16 ranks, more optimizers and accumulation (exact on first run)
    "llama3_8b_pure_bf16_ws8": {"model": "llama-3-8b", "world_size": 8, "batch": 1, "seq": 4096,
                                "model_dtype": "bfloat16"},
    "llama3_8b_bf16_ac_s32768_ws8": {"model": "llama-3-8b", "world_size": 8, "batch": 1,
                                     "seq": 32768, "checkpoint": ["LlamaDecoderLayer"],
                                     "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    "mixtral_8x7b_bf16_ac_b2_ws16": {"model": "mixtral-8x7b", "world_size": 16, "batch": 2,
                                     "seq": 4096, "checkpoint": ["MixtralDecoderLayer"],
                                     "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    "qwen2_7b_eager_b2_ws8": {"model": "qwen2-7b", "world_size": 8, "batch": 2, "seq": 2048,
                              "attn_implementation": "eager", "param_dtype": "bfloat16",
                              "reduce_dtype": "float32"},
    "gpt2_xl_ac_ws8": {"model": "gpt2-xl", "world_size": 8, "batch": 4, "seq": 1024,
                       "checkpoint": ["GPT2Block"]},
    "llama_1b_bf16_sgd_ga4_ws4": {"model": "llama-1b", "world_size": 4, "batch": 4, "seq": 2048,
                                  "grad_accum": 4, "optimizer": "sgd", "param_dtype": "bfloat16",
                                  "reduce_dtype": "float32"},
    # MoE at real size: 8 experts, top-2, grouped_mm experts
    # torchtitan's MoE sharding past the experts' count: Mixtral-8x7B on 64 ranks, the experts
    # units of their own sharded on dim 1 (Shard(0) would leave each rank 1/8 of them)
    "mixtral_8x7b_experts_shard1_bf16_ws64": {"model": "mixtral-8x7b", "world_size": 64, "batch": 1,
                                              "seq": 4096, "model_dtype": "float32",
                                              "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                              "optimizer": "adamw",
                                              "wrap": "modules:model.layers.*.mlp.experts,model.layers.*",
                                              "shard_dim": [["model.layers.*.mlp.experts.*", 1]]},
    # ... and with few tokens (dim 0, FSDP2's default: 1/8 of the experts on every rank), where the
    # router's renormalized weights, kept by its own node, outlive the experts' backward
    "mixtral_8x7b_experts_bf16_s256_ws64": {"model": "mixtral-8x7b", "world_size": 64, "batch": 1,
                                            "seq": 256, "model_dtype": "float32",
                                            "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                            "optimizer": "adamw",
                                            "wrap": "modules:model.layers.*.mlp.experts,model.layers.*"},
    "mixtral_8x7b_bf16_ws8": {"model": "mixtral-8x7b", "world_size": 8, "batch": 1, "seq": 4096,
                              "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    # checkpointed layers whose MLPs are units of their own (the recompute re-gathers nothing:
    # each MLP's pre-backward gathered it first), and nested units (layer + its MLP)
    "llama3_8b_bf16_ac_mlp_units_ws8": {"model": "llama-3-8b", "world_size": 8, "batch": 1,
                                        "seq": 4096, "checkpoint": ["LlamaDecoderLayer"],
                                        "wrap": "transformer:LlamaMLP",
                                        "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    "llama3_8b_bf16_ac_nested_ws8": {"model": "llama-3-8b", "world_size": 8, "batch": 2,
                                     "seq": 2048, "checkpoint": ["LlamaDecoderLayer"],
                                     "wrap": "transformer:LlamaDecoderLayer,LlamaMLP",
                                     "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    # the attention a unit inside each checkpointed layer: the recompute waits for its
    # prefetched all-gather before the layer's attention runs again
    "qwen3_8b_bf16_ac_attn_units_ws8": {"model": "qwen3-8b", "world_size": 8, "batch": 1,
                                        "seq": 4096, "checkpoint": ["Qwen3DecoderLayer"],
                                        "wrap": "transformer:Qwen3Attention",
                                        "param_dtype": "bfloat16", "reduce_dtype": "float32"},
}
FAKE_CASES.update({
    # torchao float8 linears (tensorwise) on Llama-3.1-8B: bf16 weights gathered as is, and
    # gathered in float8 (torchtitan's enable_fsdp_float8_all_gather); under full AC
    "llama31_8b_f8_bf16_ws8": {"model": "llama-3.1-8b", "world_size": 8, "batch": 1, "seq": 4096,
                               "param_dtype": "bfloat16", "reduce_dtype": "float32",
                               "optimizer": "adamw", "float8": "tensorwise"},
    "llama31_8b_f8ag_bf16_ws8": {"model": "llama-3.1-8b", "world_size": 8, "batch": 1, "seq": 4096,
                                 "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                 "optimizer": "adamw", "float8": "tensorwise", "float8_all_gather": True},
    "llama31_8b_f8row_bf16_ws8": {"model": "llama-3.1-8b", "world_size": 8, "batch": 1, "seq": 4096,
                                  "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                  "optimizer": "adamw", "float8": "rowwise"},
    # rowwise scaling (torch._scaled_mm has no rowwise kernel on CPU: fake mode only), where
    # the peak is inside a float8 linear's backward: f32 (the GEMM's bf16 output cast back),
    # bf16, and recomputed
    "llama_wide_f8row_ws2": {"model": "tiny-llama-wide", "world_size": 2, "batch": 2, "seq": 32,
                             "float8": "rowwise"},
    "llama_wide_f8row_bf16_b8_ws2": {"model": "tiny-llama-wide", "world_size": 2, "batch": 8, "seq": 32,
                                     "param_dtype": "bfloat16", "reduce_dtype": "float32", "float8": "rowwise"},
    "llama_wide_f8row_ac_ws2": {"model": "tiny-llama-wide", "world_size": 2, "batch": 2, "seq": 32,
                                "float8": "rowwise", "checkpoint": ["LlamaDecoderLayer"]},
    # a short batch: the peak in layer 0's backward with layer 1's reduce-scatter in flight
    "llama_wide_f8ag_bf16_b1s8_ws2": {"model": "tiny-llama-wide", "world_size": 2, "batch": 1, "seq": 8,
                                      "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                      "float8": "tensorwise", "float8_all_gather": True},
    "llama31_8b_f8ag_ac_b2_ws8": {"model": "llama-3.1-8b", "world_size": 8, "batch": 2, "seq": 2048,
                                  "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                  "optimizer": "adamw", "float8": "tensorwise", "float8_all_gather": True,
                                  "checkpoint": ["LlamaDecoderLayer"]},
})
FAKE_CASES.update({
    # reshard_after_forward=8 at real size: Llama-3.1-8B on 16 ranks (two nodes' worth), each
    # block keeping a 1/8 slice after forward and gathering it back inside its group of 8
    "llama31_8b_raf8_bf16_ws16": {"model": "llama-3.1-8b", "world_size": 16, "batch": 1, "seq": 4096,
                                  "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                  "reshard_after_forward": 8, "optimizer": "adamw"},
    # the first half of the blocks to the node, the second half fully, the last kept
    "llama31_8b_unit_raf8_bf16_ws16": {"model": "llama-3.1-8b", "world_size": 16, "batch": 1, "seq": 4096,
                                       "param_dtype": "bfloat16", "reduce_dtype": "float32", "optimizer": "adamw",
                                       "unit_reshard": {"model.layers.{0..15}": 8, "last": False}},
    # reshard_after_forward ints differing per unit (FSDP2 builds each unit's post-forward
    # mesh from its own int): the first half of the blocks to groups of 8, the next to groups
    # of 4, the last kept; and on the 4-block model at 8 ranks, 2 and 4, with checkpointing
    "llama31_8b_unit_raf8_raf4_bf16_ws16": {"model": "llama-3.1-8b", "world_size": 16, "batch": 1, "seq": 4096,
                                            "param_dtype": "bfloat16", "reduce_dtype": "float32", "optimizer": "adamw",
                                            "unit_reshard": {"model.layers.{0..15}": 8, "model.layers.{16..30}": 4, "last": False}},
    "llama_unit_raf2_raf4_ws8": {"model": "tiny-llama-4l", "world_size": 8, "batch": 2, "seq": 64,
                                 "unit_reshard": {"model.layers.{0..1}": 2, "model.layers.{2..3}": 4}},
    "llama_unit_raf4_raf2_bf16_ac_ws8": {"model": "tiny-llama-4l", "world_size": 8, "batch": 2, "seq": 64,
                                         "param_dtype": "bfloat16", "reduce_dtype": "float32", "checkpoint": ["LlamaDecoderLayer"],
                                         "unit_reshard": {"model.layers.{0..1}": 4, "model.layers.2": 2, "last": False}},
    # unit groups at real size: Llama-3.1-8B, two decoder layers per fully_shard call
    "llama31_8b_group2_bf16_ws8": {"model": "llama-3.1-8b", "world_size": 8, "batch": 1, "seq": 4096,
                                   "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                   "unit_group": 2, "optimizer": "adamw"},
    # the last 8 blocks kept after forward (tune's "all but the last 8")
    "llama31_8b_keep8_bf16_ws8": {"model": "llama-3.1-8b", "world_size": 8, "batch": 1, "seq": 4096,
                                  "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                  "unit_reshard": {"model.layers.{24..31}": False}, "optimizer": "adamw"},
    # ... with the embeddings and the head as units of their own and explicit prefetch (forward
    # 1, backward 2) through them: the combination tune searches
    # torchtitan's wrapping at real size: the final norm and the head one unit, kept after
    # forward, the root without params
    "llama31_8b_tt_wrap_bf16_ws8": {"model": "llama-3.1-8b", "world_size": 8, "batch": 1, "seq": 4096,
                                    "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                    "wrap": "modules:model.embed_tokens,model.layers.*,model.norm+lm_head",
                                    "unit_reshard": {"last": False}, "optimizer": "adamw"},
    # the embeddings alone, or the head alone, a unit of their own (the other the root's)
    "llama31_8b_embed_unit_bf16_ws8": {"model": "llama-3.1-8b", "world_size": 8, "batch": 1,
                                       "seq": 4096, "param_dtype": "bfloat16",
                                       "reduce_dtype": "float32",
                                       "wrap": "modules:model.embed_tokens,model.layers.*",
                                       "unit_reshard": {"last": False}, "optimizer": "adamw"},
    "llama31_8b_head_unit_prefetch_bf16_ws8": {"model": "llama-3.1-8b", "world_size": 8, "batch": 1,
                                               "seq": 4096, "param_dtype": "bfloat16",
                                               "reduce_dtype": "float32",
                                               "wrap": "modules:model.layers.*,lm_head",
                                               "forward_prefetch": 1, "backward_prefetch": 2,
                                               "unit_reshard": {"last": False}, "optimizer": "adamw"},
    "llama31_8b_group2_edges_prefetch_bf16_ws8": {"model": "llama-3.1-8b", "world_size": 8, "batch": 1,
                                                  "seq": 4096, "param_dtype": "bfloat16",
                                                  "reduce_dtype": "float32", "unit_group": 2,
                                                  "wrap": "modules:model.embed_tokens,model.layers.*,lm_head",
                                                  "forward_prefetch": 1, "backward_prefetch": 2,
                                                  "optimizer": "adamw"},
    # torchtitan's Llama-3.1-8B wrapping at its published shape: last block kept, fp32 masters,
    # every other block checkpointed (selective layer AC)
    "llama31_8b_tt_last_raf_false_ws8": {"model": "llama-3.1-8b", "world_size": 8, "batch": 1,
                                         "seq": 8192, "model_dtype": "float32",
                                         "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                         "unit_reshard": {"last": False},
                                         "checkpoint": [f"model.layers.{i}" for i in range(1, 32, 2)]},
    # ... and its published configuration: op-level selective AC on every block, 2 x 8192
    "llama31_8b_tt_sac_op_ws8": {"model": "llama-3.1-8b", "world_size": 8, "batch": 2,
                                 "seq": 8192, "model_dtype": "float32",
                                 "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                 "unit_reshard": {"last": False}, "optimizer": "adamw",
                                 "checkpoint": ["LlamaDecoderLayer"], "ac_mode": "selective-op"},
    # OLMo-2-7B (post-norms, f32-weight RMSNorms) at a 4k sequence
    "olmo2_7b_bf16_ws8": {"model": "olmo-2-7b", "world_size": 8, "batch": 1, "seq": 4096,
                          "param_dtype": "bfloat16", "reduce_dtype": "float32", "optimizer": "adamw"},
    "olmo2_13b_bf16_ws8": {"model": "olmo-2-13b", "world_size": 8, "batch": 1, "seq": 2048,
                           "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    # Gemma-3-27B's text model (62 layers, 5 local : 1 global, window 1024 < seq 4096: the
    # sliding layers' masks; 262k vocabulary tied to the head), fp32 masters, bf16 compute
    "gemma3_27b_bf16_ws8": {"model": "gemma-3-27b", "world_size": 8, "batch": 1, "seq": 4096,
                            "model_dtype": "float32", "param_dtype": "bfloat16",
                            "reduce_dtype": "float32", "optimizer": "adamw"},
    "gemma3_27b_bf16_ac_ws8": {"model": "gemma-3-27b", "world_size": 8, "batch": 2, "seq": 4096,
                               "model_dtype": "float32", "param_dtype": "bfloat16",
                               "reduce_dtype": "float32", "optimizer": "adamw",
                               "checkpoint": ["Gemma3DecoderLayer"]},
    # Gemma-2-9B (42 layers alternating local/global, window 4096 < seq 8192, soft-capped
    # logits over a 256k vocabulary), eager (soft-capped scores) and sdpa
    "gemma2_9b_bf16_ws8": {"model": "gemma-2-9b", "world_size": 8, "batch": 1, "seq": 8192,
                           "param_dtype": "bfloat16", "reduce_dtype": "float32", "optimizer": "adamw",
                           "checkpoint": ["Gemma2DecoderLayer"]},
    "gemma2_9b_eager_ws8": {"model": "gemma-2-9b", "world_size": 8, "batch": 1, "seq": 2048,
                            "attn_implementation": "eager",
                            "param_dtype": "bfloat16", "reduce_dtype": "float32", "optimizer": "adamw"},
    # float8 linears under torchtitan's op-level SAC (its save list keeps each cast's abs and
    # max as well): f32, bf16, on one layer only, and at real size (weights gathered as they
    # are: float8 all-gather under SAC is not planned yet)
    "llama_wide_f8_sac_ws2": {"model": "tiny-llama-wide", "world_size": 2, "model_dtype": "float32",
                              "float8": "tensorwise", "checkpoint": ["LlamaDecoderLayer"],
                              "ac_mode": "selective-op"},
    "llama_wide_f8_sac_bf16_ws2": {"model": "tiny-llama-wide", "world_size": 2, "model_dtype": "float32",
                                   "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                   "float8": "tensorwise", "checkpoint": ["LlamaDecoderLayer"],
                                   "ac_mode": "selective-op"},
    "llama_wide_f8_sac_l1_ws2": {"model": "tiny-llama-wide", "world_size": 2, "model_dtype": "float32",
                                 "float8": "tensorwise", "checkpoint": ["model.layers.1"],
                                 "ac_mode": "selective-op"},
    # float8 linears with a bias (Qwen2's q/k/v: `output + bias` after the GEMM, its grad
    # made first): plain, under op-level SAC (the recompute of a kept GEMM with a bias), and
    # torchtitan's recipe (bf16, gathered in float8, its checkpoint wrapper)
    "qwen2_wide_f8_ws2": {"model": "tiny-qwen2-wide", "world_size": 2, "model_dtype": "float32",
                          "float8": "tensorwise"},
    "qwen2_wide_f8_sac_ws2": {"model": "tiny-qwen2-wide", "world_size": 2, "model_dtype": "float32",
                              "float8": "tensorwise", "checkpoint": ["Qwen2DecoderLayer"],
                              "ac_mode": "selective-op"},
    "qwen2_wide_f8ag_sac_tt_bf16_ws2": {"model": "tiny-qwen2-wide", "world_size": 2, "model_dtype": "float32",
                                        "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                        "float8": "tensorwise", "float8_all_gather": True,
                                        "checkpoint": ["Qwen2DecoderLayer"], "ac_mode": "selective-op",
                                        "ac_wrapper": "torchtitan"},
    # (batch 8: the peak in layer 1's down_proj backward, after a recompute that runs the
    # float8 linear whole — a custom autograd Function packs what it saves after its forward)
    "llama_wide_f8_sac_bf16_b8_ws2": {"model": "tiny-llama-wide", "world_size": 2, "batch": 8, "model_dtype": "float32",
                                      "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                      "float8": "tensorwise", "checkpoint": ["LlamaDecoderLayer"],
                                      "ac_mode": "selective-op"},
    # torchtitan's structure (--ac-wrapper torchtitan: checkpoint_wrapper before fully_shard,
    # the blocks' FSDP hooks outside their checkpoints, the recompute counted as temp): plain
    # SAC, full AC, and float8 all-gather under SAC (torchtitan's float8 recipe) f32 and bf16
    "llama_wide_sac_tt_ws2": {"model": "tiny-llama-wide", "world_size": 2, "model_dtype": "float32",
                              "checkpoint": ["LlamaDecoderLayer"], "ac_mode": "selective-op",
                              "ac_wrapper": "torchtitan"},
    "llama_wide_ac_tt_bf16_b8_ws2": {"model": "tiny-llama-wide", "world_size": 2, "batch": 8,
                                     "model_dtype": "float32", "param_dtype": "bfloat16",
                                     "reduce_dtype": "float32", "checkpoint": ["LlamaDecoderLayer"],
                                     "ac_wrapper": "torchtitan"},
    "llama_wide_f8ag_sac_tt_ws2": {"model": "tiny-llama-wide", "world_size": 2, "model_dtype": "float32",
                                   "float8": "tensorwise", "float8_all_gather": True,
                                   "checkpoint": ["LlamaDecoderLayer"], "ac_mode": "selective-op",
                                   "ac_wrapper": "torchtitan"},
    "llama_wide_f8ag_sac_tt_bf16_b8_ws2": {"model": "tiny-llama-wide", "world_size": 2, "batch": 8,
                                           "model_dtype": "float32", "param_dtype": "bfloat16",
                                           "reduce_dtype": "float32", "float8": "tensorwise",
                                           "float8_all_gather": True, "checkpoint": ["LlamaDecoderLayer"],
                                           "ac_mode": "selective-op", "ac_wrapper": "torchtitan"},
    "llama31_8b_f8ag_sac_tt_bf16_ws8": {"model": "llama-3.1-8b", "world_size": 8, "batch": 1, "seq": 2048,
                                        "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                        "optimizer": "adamw", "float8": "tensorwise", "float8_all_gather": True,
                                        "checkpoint": ["LlamaDecoderLayer"], "ac_mode": "selective-op",
                                        "ac_wrapper": "torchtitan"},
    # torchtitan's training loop of the PR #165 runs (--train-loop torchtitan-2024): f32 and
    # bf16, under AC; Llama-2-7B as PR #165 ran it (8 × 2048 per rank, full AC, ws 8) under
    # that loop and HF's (there the last block's prefetched all-gather is in flight at the
    # loss's backward; with the loss outside the model it starts after it)
    "llama_wide_titan_loop_ws2": {"model": "tiny-llama-wide", "world_size": 2, "model_dtype": "float32",
                                  "train_loop": "torchtitan-2024"},
    "llama_wide_titan_loop_bf16_ac_ws2": {"model": "tiny-llama-wide", "world_size": 2, "model_dtype": "float32",
                                          "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                          "checkpoint": ["LlamaDecoderLayer"], "train_loop": "torchtitan-2024"},
    "llama2_7b_titan_loop_ac_ws8": {"model": "llama-2-7b", "world_size": 8, "batch": 8, "seq": 2048,
                                    "param_dtype": "bfloat16", "reduce_dtype": "float32", "optimizer": "adamw",
                                    "checkpoint": ["LlamaDecoderLayer"], "ac_wrapper": "torchtitan",
                                    "train_loop": "torchtitan-2024"},
    "llama2_7b_ac_tt_ws8": {"model": "llama-2-7b", "world_size": 8, "batch": 8, "seq": 2048,
                                    "param_dtype": "bfloat16", "reduce_dtype": "float32", "optimizer": "adamw",
                                    "checkpoint": ["LlamaDecoderLayer"], "ac_wrapper": "torchtitan"},
    "llama31_8b_f8_sac_bf16_ws8": {"model": "llama-3.1-8b", "world_size": 8, "batch": 1, "seq": 2048,
                                   "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                   "optimizer": "adamw", "float8": "tensorwise",
                                   "checkpoint": ["LlamaDecoderLayer"], "ac_mode": "selective-op"},
    # Phi-3-mini (fused qkv and gate_up; its 2047-token window < seq 4096: the sliding mask)
    # and Phi-4 (GQA 4:1) under checkpointing
    "phi3_mini_bf16_ws8": {"model": "phi-3-mini-4k", "world_size": 8, "batch": 1, "seq": 4096,
                           "model_dtype": "float32", "param_dtype": "bfloat16",
                           "reduce_dtype": "float32", "optimizer": "adamw"},
    "phi4_bf16_ac_ws8": {"model": "phi-4", "world_size": 8, "batch": 2, "seq": 4096,
                         "model_dtype": "float32", "param_dtype": "bfloat16",
                         "reduce_dtype": "float32", "optimizer": "adamw",
                         "checkpoint": ["Phi3DecoderLayer"]},
    "phi4_bf16_ws8": {"model": "phi-4", "world_size": 8, "batch": 1, "seq": 4096,
                      "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    # Qwen3-30B-A3B with each layer's experts an FSDP unit inside the layer's
    "qwen3_30b_a3b_expert_units_bf16_ac_ws8": {"model": "qwen3-30b-a3b", "world_size": 8, "batch": 1,
                                               "seq": 4096, "model_dtype": "float32",
                                               "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                               "optimizer": "adamw", "checkpoint": ["Qwen3MoeDecoderLayer"],
                                               "wrap": "modules:model.layers.*.mlp.experts,model.layers.*"},
    # Qwen3-30B-A3B (128 experts, top-8 renormalized, weights cast back to bf16)
    "qwen3_30b_a3b_bf16_ac_ws8": {"model": "qwen3-30b-a3b", "world_size": 8, "batch": 1, "seq": 4096,
                                  "model_dtype": "float32", "param_dtype": "bfloat16",
                                  "reduce_dtype": "float32", "optimizer": "adamw",
                                  "checkpoint": ["Qwen3MoeDecoderLayer"]},
    # DeepSeek-V3 671B (61 layers: 3 dense, 58 MoE of 256 routed + 1 shared experts; latent
    # attention with 128 heads, q/k 192 and v 128 wide: SDPA's math path on the CPU)
    "deepseek_v3_bf16_ac_ws256": {"model": "deepseek-v3", "world_size": 256, "batch": 1, "seq": 4096,
                                  "model_dtype": "float32", "param_dtype": "bfloat16",
                                  "reduce_dtype": "float32", "optimizer": "adamw",
                                  "checkpoint": ["DeepseekV3DecoderLayer"]},
    "deepseek_v3_bf16_ws128": {"model": "deepseek-v3", "world_size": 128, "batch": 1, "seq": 1024,
                               "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    "deepseek_v3_expert_units_bf16_ac_ws256": {"model": "deepseek-v3", "world_size": 256, "batch": 2,
                                               "seq": 2048, "model_dtype": "float32",
                                               "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                               "optimizer": "adamw", "checkpoint": ["DeepseekV3DecoderLayer"],
                                               "wrap": "modules:model.layers.*.mlp.experts,model.layers.*"},
    # DeepSeek-V2-Lite 15.7B (27 layers: 1 dense, 26 MoE of 64 routed + 2 shared experts, greedy
    # routing; latent attention without a q latent)
    "deepseek_v2_lite_bf16_ws8": {"model": "deepseek-v2-lite", "world_size": 8, "batch": 1, "seq": 4096,
                                  "model_dtype": "float32", "param_dtype": "bfloat16",
                                  "reduce_dtype": "float32", "optimizer": "adamw"},
    "deepseek_v2_lite_bf16_ac_ws8": {"model": "deepseek-v2-lite", "world_size": 8, "batch": 2, "seq": 4096,
                                     "model_dtype": "float32", "param_dtype": "bfloat16",
                                     "reduce_dtype": "float32", "optimizer": "adamw",
                                     "checkpoint": ["DeepseekV2DecoderLayer"]},
    "qwen3_30b_a3b_bf16_ws8": {"model": "qwen3-30b-a3b", "world_size": 8, "batch": 1, "seq": 2048,
                               "param_dtype": "bfloat16", "reduce_dtype": "float32"},
    # a mode per block at torchtitan's shape: 8 blocks full, 16 op-SAC, 8 none
    "llama31_8b_tt_mixed_ac_ws8": {"model": "llama-3.1-8b", "world_size": 8, "batch": 2,
                                   "seq": 8192, "model_dtype": "float32",
                                   "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                   "unit_reshard": {"last": False}, "optimizer": "adamw",
                                   "checkpoint": [f"model.layers.{i}=full" for i in range(8)]
                                   + [f"model.layers.{i}=selective-op" for i in range(8, 24)]},
    "qwen3_8b_sac_op_ws8": {"model": "qwen3-8b", "world_size": 8, "batch": 1, "seq": 4096,
                            "param_dtype": "bfloat16", "reduce_dtype": "float32",
                            "checkpoint": ["Qwen3DecoderLayer"], "ac_mode": "selective-op"},
})
FAKE_CASES.update({
    # FSDP2's CPUOffloadPolicy on a fake accelerator (harness/fakegpu.py): shards, gradients and
    # Adam on the host, an H2D copy per parameter before each all-gather, a D2H copy per
    # parameter after each reduce-scatter. First without offload: the device changes what the
    # planner's --device cuda models (512 B blocks, Adam's step counters on the host, CUDA
    # flash attention's philox seed and offset), nothing else (a CPU case and its fakegpu twin
    # differ by exactly the step counters)
    "llama_wide_gpu_bf16_ws2": {"model": "tiny-llama-wide", "world_size": 2, "model_dtype": "float32",
                                "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu"},
    "llama3_8b_gpu_bf16_ws8": {"model": "llama-3-8b", "world_size": 8, "batch": 1, "seq": 4096,
                               "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu"},
    # where the optimizer step is the peak: a GPU's foreach AdamW copies every exp_avg_sq
    # (`_foreach_sqrt`) on top of the shards, grads and state (f32 masters, 2 ranks, short
    # checkpointed sequences)
    "llama3_8b_gpu_adamw_ac_ws2": {"model": "llama-3-8b", "world_size": 2, "batch": 1, "seq": 256,
                                   "model_dtype": "float32", "param_dtype": "bfloat16",
                                   "reduce_dtype": "float32", "optimizer": "adamw",
                                   "checkpoint": ["LlamaDecoderLayer"], "device": "fakegpu"},
    "llama_wide_offload_bf16_ws2": {"model": "tiny-llama-wide", "world_size": 2, "model_dtype": "float32",
                                    "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                    "device": "fakegpu", "offload": True},
    "llama_wide_offload_bf16_ac_ws2": {"model": "tiny-llama-wide", "world_size": 2, "model_dtype": "float32",
                                       "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                       "checkpoint": ["LlamaDecoderLayer"],
                                       "device": "fakegpu", "offload": True},
    # a short batch (the peak where the shards are copied in), no mixed precision (the H2D
    # copies are the all-gather's inputs) under eager attention (CUDA's flash takes no f32),
    # and grads reduced in bf16 (cast back to f32 on the device before going to the host)
    "llama_wide_offload_bf16_b1s8_ws2": {"model": "tiny-llama-wide", "world_size": 2, "batch": 1, "seq": 8,
                                         "model_dtype": "float32", "param_dtype": "bfloat16",
                                         "reduce_dtype": "float32", "device": "fakegpu", "offload": True},
    "llama_wide_offload_eager_ws2": {"model": "tiny-llama-wide", "world_size": 2, "model_dtype": "float32",
                                     "attn_implementation": "eager", "device": "fakegpu", "offload": True},
    "llama_wide_offload_bf16r_b1s8_ws2": {"model": "tiny-llama-wide", "world_size": 2, "batch": 1, "seq": 8,
                                          "model_dtype": "float32", "param_dtype": "bfloat16",
                                          "reduce_dtype": "bfloat16", "device": "fakegpu", "offload": True},
    # gradient accumulation (unsynced grads kept on the device, the last micro-batch's
    # reduction goes to the host) and HSDP (the replicas' all-reduce on the device, its input
    # held until the next post-backward)
    "llama_wide_offload_bf16_ga2_ws2": {"model": "tiny-llama-wide", "world_size": 2, "model_dtype": "float32",
                                        "param_dtype": "bfloat16", "reduce_dtype": "float32", "grad_accum": 2,
                                        "device": "fakegpu", "offload": True},
    "llama_wide_offload_hsdp_bf16_ws4": {"model": "tiny-llama-wide", "world_size": 4, "model_dtype": "float32",
                                         "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                         "strategy": "hybrid-shard", "shard_group_size": 2,
                                         "device": "fakegpu", "offload": True},
    # --grad-sync each under offload (torchtitan's loop with enable_cpu_offload and gradient
    # accumulation): every micro-batch's reduced shard goes to the host, the later ones added
    # there to the host's grads (a blocking copy, then the CPU's add); bf16 reduction (cast to
    # f32 on the device first); HSDP (each micro-batch's all-reduce input held)
    "llama_wide_offload_bf16_sync_each_ga2_ws2": {"model": "tiny-llama-wide", "world_size": 2, "model_dtype": "float32",
                                                  "param_dtype": "bfloat16", "reduce_dtype": "float32", "grad_accum": 2,
                                                  "grad_sync": "each", "device": "fakegpu", "offload": True},
    "llama_wide_offload_bf16r_sync_each_ga3_b1s8_ws2": {"model": "tiny-llama-wide", "world_size": 2, "batch": 1, "seq": 8,
                                                        "model_dtype": "float32", "param_dtype": "bfloat16",
                                                        "reduce_dtype": "bfloat16", "grad_accum": 3, "grad_sync": "each",
                                                        "device": "fakegpu", "offload": True},
    "llama_wide_offload_hsdp_sync_each_ga2_ws4": {"model": "tiny-llama-wide", "world_size": 4, "model_dtype": "float32",
                                                  "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                                  "strategy": "hybrid-shard", "shard_group_size": 2, "grad_accum": 2,
                                                  "grad_sync": "each", "device": "fakegpu", "offload": True},
    # offload with unit groups (two blocks per fully_shard call: one group's params copied in
    # before its one all-gather) and with Shard(dim > 0) params (the experts on dim 1: the
    # host shards are dim-1 chunks, copied in whole and laid out by the all-gather's copy-out)
    "llama_offload_group2_bf16_ws2": {"model": "tiny-llama-4l", "world_size": 2, "model_dtype": "float32",
                                      "param_dtype": "bfloat16", "reduce_dtype": "float32", "unit_group": 2,
                                      "device": "fakegpu", "offload": True},
    "llama_offload_group2_ac_ga2_ws2": {"model": "tiny-llama-4l", "world_size": 2, "model_dtype": "float32",
                                        "unit_group": 2, "checkpoint": ["LlamaDecoderLayer"], "grad_accum": 2,
                                        "attn_implementation": "eager",
                                        "device": "fakegpu", "offload": True},
    "mixtral_offload_experts_shard1_bf16_ws4": {"model": "tiny-mixtral", "world_size": 4, "model_dtype": "float32",
                                                "wrap": "modules:model.layers.*.mlp.experts,model.layers.*",
                                                "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                                "shard_dim": [["model.layers.*.mlp.experts.*", 1]],
                                                "device": "fakegpu", "offload": True},
    "mixtral_offload_shard_dims_ga2_ws2": {"model": "tiny-mixtral", "world_size": 2, "model_dtype": "float32",
                                           "grad_accum": 2, "grad_sync": "each",
                                           "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                           "shard_dim": [["model.layers.*.mlp.experts.*", 1],
                                                         ["model.layers.*.mlp.experts.down_proj", 2]],
                                           "device": "fakegpu", "offload": True},
    "llama3_8b_offload_bf16_sync_each_ga2_ws8": {"model": "llama-3-8b", "world_size": 8, "batch": 1, "seq": 4096,
                                                 "model_dtype": "float32", "param_dtype": "bfloat16",
                                                 "reduce_dtype": "float32", "optimizer": "adamw", "grad_accum": 2,
                                                 "grad_sync": "each", "device": "fakegpu", "offload": True},
    "llama3_8b_offload_bf16_ws8": {"model": "llama-3-8b", "world_size": 8, "batch": 1, "seq": 4096,
                                   "model_dtype": "float32", "param_dtype": "bfloat16",
                                   "reduce_dtype": "float32", "optimizer": "adamw",
                                   "device": "fakegpu", "offload": True},
})
FAKE_CASES.update({
    # torchtitan's --compile: each decoder block under torch.compile with inductor's
    # partitioner (fsdp2_oracle.compile_blocks), on the fake accelerator; recorded: what the
    # forward leaves for the backward (`after_forward`). Without AC, op-level SAC and full AC
    # (torchtitan's checkpoint wrapper), on the fake accelerator and the CPU; tiny models of
    # four families, float8, and Llama-3-8B, Qwen3-8B and torchtitan's two compiled runs
    "llama_wide_compile_bf16_ws2": {"model": "tiny-llama-wide", "world_size": 2, "model_dtype": "float32",
                                    "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                    "device": "fakegpu", "compile": True},
    "llama_wide_compile_sac_bf16_ws2": {"model": "tiny-llama-wide", "world_size": 2, "model_dtype": "float32",
                                        "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                        "checkpoint": ["LlamaDecoderLayer"], "ac_mode": "selective-op",
                                        "ac_wrapper": "torchtitan", "device": "fakegpu", "compile": True},
    "llama_wide_compile_ac_bf16_ws2": {"model": "tiny-llama-wide", "world_size": 2, "model_dtype": "float32",
                                       "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                       "checkpoint": ["LlamaDecoderLayer"], "ac_wrapper": "torchtitan",
                                       "device": "fakegpu", "compile": True},
    "llama3_8b_compile_bf16_ws8": {"model": "llama-3-8b", "world_size": 8, "batch": 1, "seq": 4096,
                                   "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                   "device": "fakegpu", "compile": True},
    # on the CPU (its SDPA flash kernel, float32, no 512 B blocks)
    "llama_wide_compile_cpu_ws2": {"model": "tiny-llama-wide", "world_size": 2, "model_dtype": "float32",
                                   "compile": True},
    "llama_wide_compile_sac_cpu_ws2": {"model": "tiny-llama-wide", "world_size": 2, "model_dtype": "float32",
                                       "checkpoint": ["LlamaDecoderLayer"], "ac_mode": "selective-op",
                                       "ac_wrapper": "torchtitan", "compile": True},
    # other families' blocks: biased q/k/v (Qwen2), fused qkv and gate_up with a partial
    # rotary (Phi-3), float32-weighted q/k and output norms (OLMo-2). (Mistral's sliding
    # window under a shorter window than the sequence does not compile with fullgraph: an
    # assert with a non-string message in HF's mask code)
    **{f"{m}_compile_bf16_ws2": {
        "model": f"tiny-{m}", "world_size": 2, "model_dtype": "float32", "param_dtype": "bfloat16",
        "reduce_dtype": "float32", "device": "fakegpu", "compile": True}
       for m in ("qwen2", "phi3", "olmo2")},
    # torchtitan's Llama-3.1-8B run with --compile (8 × H100, 2 × 8192, op-level SAC)
    "llama31_8b_compile_sac_tt_ws8": {"model": "llama-3.1-8b", "world_size": 8, "batch": 2, "seq": 8192,
                                      "model_dtype": "float32", "param_dtype": "bfloat16",
                                      "reduce_dtype": "float32", "optimizer": "adamw",
                                      "unit_reshard": {"last": False}, "checkpoint": ["LlamaDecoderLayer"],
                                      "ac_mode": "selective-op", "ac_wrapper": "torchtitan",
                                      "device": "fakegpu", "compile": True},
    # torchtitan's float8 recipe under op-level SAC (tensorwise, weights gathered in float8):
    # tiny, and the compiled float8 Llama-3.1-8B run
    "llama_wide_compile_f8ag_sac_ws2": {"model": "tiny-llama-wide", "world_size": 2, "model_dtype": "float32",
                                        "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                        "float8": "tensorwise", "float8_all_gather": True,
                                        "checkpoint": ["LlamaDecoderLayer"], "ac_mode": "selective-op",
                                        "ac_wrapper": "torchtitan", "device": "fakegpu", "compile": True},
    # (the weights cast in the forward, not gathered in float8: each linear's weight cast
    # inside the compiled graph too)
    "llama_wide_compile_f8_sac_ws2": {"model": "tiny-llama-wide", "world_size": 2, "model_dtype": "float32",
                                      "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                      "float8": "tensorwise",
                                      "checkpoint": ["LlamaDecoderLayer"], "ac_mode": "selective-op",
                                      "ac_wrapper": "torchtitan", "device": "fakegpu", "compile": True},
    # float8 linears with a bias compiled (Qwen2's q/k/v): plain, under op-level SAC with
    # the weights cast in the forward, and torchtitan's recipe (gathered in float8, its
    # checkpoint wrapper)
    "qwen2_wide_compile_f8_ws2": {"model": "tiny-qwen2-wide", "world_size": 2, "model_dtype": "float32",
                                  "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                  "float8": "tensorwise", "device": "fakegpu", "compile": True},
    "qwen2_wide_compile_f8_sac_ws2": {"model": "tiny-qwen2-wide", "world_size": 2, "model_dtype": "float32",
                                      "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                      "float8": "tensorwise",
                                      "checkpoint": ["Qwen2DecoderLayer"], "ac_mode": "selective-op",
                                      "ac_wrapper": "torchtitan", "device": "fakegpu", "compile": True},
    "qwen2_wide_compile_f8ag_sac_ws2": {"model": "tiny-qwen2-wide", "world_size": 2, "model_dtype": "float32",
                                        "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                        "float8": "tensorwise", "float8_all_gather": True,
                                        "checkpoint": ["Qwen2DecoderLayer"], "ac_mode": "selective-op",
                                        "ac_wrapper": "torchtitan", "device": "fakegpu", "compile": True},
    "llama31_8b_compile_f8ag_sac_tt_ws8": {"model": "llama-3.1-8b", "world_size": 8, "batch": 2, "seq": 8192,
                                           "model_dtype": "float32", "param_dtype": "bfloat16",
                                           "reduce_dtype": "float32", "optimizer": "adamw",
                                           "float8": "tensorwise", "float8_all_gather": True,
                                           "unit_reshard": {"last": False}, "checkpoint": ["LlamaDecoderLayer"],
                                           "ac_mode": "selective-op", "ac_wrapper": "torchtitan",
                                           "device": "fakegpu", "compile": True},
    # float8 without checkpointing: the three recipes on tiny (weights gathered in float8 or
    # cast in the forward; rowwise), full AC, OLMo-2's and Phi-3's blocks, and torchtitan's
    # compiled float8 Llama-3.1-8B run without AC
    **{f"llama_wide_compile_{k}_ws2": {
        "model": "tiny-llama-wide", "world_size": 2, "model_dtype": "float32", "param_dtype": "bfloat16",
        "reduce_dtype": "float32", "seq": 48, "device": "fakegpu", "compile": True, **extra}
       for k, extra in (("f8ag", {"float8": "tensorwise", "float8_all_gather": True}),
                        ("f8", {"float8": "tensorwise"}),
                        ("f8row", {"float8": "rowwise"}),
                        ("f8ag_ac", {"float8": "tensorwise", "float8_all_gather": True,
                                     "checkpoint": ["LlamaDecoderLayer"], "ac_wrapper": "torchtitan"}))},
    **{f"{m}_compile_f8ag_ws2": {
        "model": f"tiny-{m}", "world_size": 2, "model_dtype": "float32", "param_dtype": "bfloat16",
        "reduce_dtype": "float32", "seq": 48, "float8": "tensorwise", "float8_all_gather": True,
        "device": "fakegpu", "compile": True}
       for m in ("phi3", "olmo2")},
    "llama31_8b_compile_f8ag_tt_ws8": {"model": "llama-3.1-8b", "world_size": 8, "batch": 2, "seq": 8192,
                                       "model_dtype": "float32", "param_dtype": "bfloat16",
                                       "reduce_dtype": "float32", "optimizer": "adamw",
                                       "float8": "tensorwise", "float8_all_gather": True,
                                       "unit_reshard": {"last": False}, "device": "fakegpu", "compile": True},
    "qwen3_8b_compile_bf16_ws8": {"model": "qwen3-8b", "world_size": 8, "batch": 1, "seq": 4096,
                                  "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                  "device": "fakegpu", "compile": True},
})
# torchtitan's compiled Llama-3.1-8B SAC run at 128 GPUs (16 nodes, the same per-rank batch)
FAKE_CASES["llama31_8b_compile_sac_tt_ws128"] = dict(FAKE_CASES["llama31_8b_compile_sac_tt_ws8"], world_size=128)
# real-size cases again on the fake accelerator (planned --device cuda): checkpointing, op-level
# SAC, MoE, HSDP, gradient accumulation, torchtitan's mixed AC with the last block kept
for _name in ("llama3_8b_bf16_ac_ws8", "qwen3_8b_sac_op_ws8", "mixtral_8x7b_bf16_ac_ws8",
              "llama3_70b_hsdp_ws32", "llama3_8b_bf16_ga2_ws8", "llama31_8b_tt_mixed_ac_ws8",
              "llama3_8b_bf16_sync_each_ga3_ws8",
              "llama31_8b_f8ag_sac_tt_bf16_ws8", "llama31_8b_f8row_bf16_ws8",
              "deepseek_v2_lite_bf16_ws8", "deepseek_v2_lite_bf16_ac_ws8",
              "qwen3_8b_bf16_ws8", "qwen3_30b_a3b_bf16_ws8", "llama3_70b_eager_ws16"):
    FAKE_CASES["gpu_" + _name] = dict(FAKE_CASES[_name], device="fakegpu")
# Qwen3-30B-A3B under op-level SAC on the fake GPU (what tune answers for it on 8 H100s)
FAKE_CASES["gpu_qwen3_30b_a3b_sac_op_ws8"] = dict(FAKE_CASES["qwen3_30b_a3b_bf16_ws8"], checkpoint=["Qwen3MoeDecoderLayer"],
                                                  ac_mode="selective-op", device="fakegpu")
# DeepSeek-V2-Lite under op-level SAC on the fake GPU (latent attention's kernel outputs cached)
FAKE_CASES["gpu_deepseek_v2_lite_sac_op_ws8"] = dict(FAKE_CASES["deepseek_v2_lite_bf16_ac_ws8"], ac_mode="selective-op",
                                                     device="fakegpu")
# tune's answers in the README, as `plan` runs them, on the fake GPU: Llama-3-8B on 8 (its
# first block under op-level SAC, 2 micro-batches syncing each) and Llama-3-70B on 64 (35
# blocks fully checkpointed, 45 under SAC); both keep the last block after forward and make the
# embeddings and the head units of their own
_TUNED = {"batch": 1, "seq": 8192, "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32",
          "optimizer": "adamw", "unit_reshard": {"last": False}, "device": "fakegpu",
          "wrap": "modules:model.embed_tokens,model.layers.*,lm_head"}
FAKE_CASES["gpu_llama3_8b_tune_answer_ws8"] = dict(_TUNED, model="llama-3-8b", world_size=8, grad_accum=2,
                                                   grad_sync="each", checkpoint=["model.layers.0=selective-op"])
# ... with torchtitan's [norm, head] unit, on the fake GPU
FAKE_CASES["gpu_llama3_8b_tt_wrap_sac_ws8"] = dict(FAKE_CASES["gpu_llama3_8b_tune_answer_ws8"],
                                                   wrap="modules:model.embed_tokens,model.layers.*,model.norm+lm_head")
FAKE_CASES["gpu_llama3_70b_tune_answer_ws64"] = dict(
    _TUNED, model="llama-3-70b", world_size=64,
    checkpoint=[f"model.layers.{i}=full" for i in range(35)] + [f"model.layers.{i}=selective-op" for i in range(35, 80)])
# ... and its answers for other families at global batch 2 × the GPUs and seq 8192: Qwen2-7B,
# Phi-4 and Qwen3-8B on 8 (the first blocks under SAC, 2 micro-batches syncing each),
# Mixtral-8x7B on 64 (the experts and the router on dim 1, 23 blocks under SAC)
_SAC = lambda n: [f"model.layers.{i}=selective-op" for i in range(n)]
FAKE_CASES["gpu_qwen2_7b_tune_answer_ws8"] = dict(_TUNED, model="qwen2-7b", world_size=8, grad_accum=2,
                                                  grad_sync="each", checkpoint=_SAC(3))
FAKE_CASES["gpu_phi4_tune_answer_ws8"] = dict(_TUNED, model="phi-4", world_size=8, grad_accum=2,
                                              grad_sync="each", checkpoint=_SAC(36))
FAKE_CASES["gpu_qwen3_8b_tune_answer_ws8"] = dict(_TUNED, model="qwen3-8b", world_size=8, grad_accum=2,
                                                  grad_sync="each", unit_reshard=None, checkpoint=_SAC(11))
FAKE_CASES["gpu_mixtral_8x7b_tune_answer_ws64"] = dict(
    _TUNED, model="mixtral-8x7b", world_size=64, batch=2, wrap=None, checkpoint=_SAC(23),
    shard_dim=[["model.layers.*.mlp.gate.weight", 1], ["model.layers.*.mlp.experts.gate_up_proj", 1],
               ["model.layers.*.mlp.experts.down_proj", 1]])
FAKE_CASES["gpu_llama31_405b_tune_answer_ws2048"] = dict(
    _TUNED, model="llama-3.1-405b", world_size=2048, strategy="hybrid-shard", shard_group_size=1024,
    checkpoint=[f"model.layers.{i}=full" for i in range(122)] + [f"model.layers.{i}=selective-op" for i in (122, 123)])
# the experts on dim 1 at few tokens on the fake accelerator (CUDA's foreach AdamW): the step
# peaks in an experts unit's reduce-scatter, each expert grad laid out rank by rank first
# (chunk-cat), the last one's old grad held. (On the CPU, FSDP2's for-loop AdamW gathers these
# 3-dim DTensors in `addcdiv_`, which the plan does not count: `plan` says so.)
FAKE_CASES["gpu_mixtral_8x7b_experts_shard1_bf16_s256_ws64"] = dict(
    FAKE_CASES["mixtral_8x7b_experts_bf16_s256_ws64"], device="fakegpu",
    shard_dim=[["model.layers.*.mlp.experts.*", 1]])
# offloaded at real size: Mixtral-8x7B's experts on dim 1 at 64 ranks (f32 masters on the
# host), and Llama-3-8B two blocks per unit on 8
FAKE_CASES["gpu_mixtral_8x7b_offload_experts_shard1_s256_ws64"] = dict(
    FAKE_CASES["gpu_mixtral_8x7b_experts_shard1_bf16_s256_ws64"], model_dtype="float32", offload=True)
FAKE_CASES["llama3_8b_offload_group2_bf16_ws8"] = dict(
    FAKE_CASES["llama3_8b_offload_bf16_ws8"], unit_group=2)
# ... with torchtitan's [norm, head] unit and the embeddings a unit (the root without params)
FAKE_CASES["llama3_8b_offload_tt_wrap_bf16_ws8"] = dict(
    FAKE_CASES["llama3_8b_offload_bf16_ws8"], wrap="modules:model.embed_tokens,model.layers.*,model.norm+lm_head")
# CPUOffloadPolicy with reshard_after_forward=N: each block keeps its 1/N post-forward slice
# on the device (FSDP2's post-forward mesh), its sharded params, grads and step on the host
FAKE_CASES.update({
    "llama_offload_raf2_bf16_ws4": {"model": "tiny-llama-4l", "world_size": 4, "model_dtype": "float32",
                                    "reshard_after_forward": 2, "param_dtype": "bfloat16",
                                    "reduce_dtype": "float32", "device": "fakegpu", "offload": True},
    "llama_offload_raf2_ac_sync_each_ga2_ws4": {"model": "tiny-llama-4l", "world_size": 4, "model_dtype": "float32",
                                                "reshard_after_forward": 2, "checkpoint": ["LlamaDecoderLayer"],
                                                "grad_accum": 2, "grad_sync": "each",
                                                "attn_implementation": "eager",
                                                "device": "fakegpu", "offload": True},
    "llama_offload_raf2_group2_ga2_ws4": {"model": "tiny-llama-4l", "world_size": 4, "model_dtype": "float32",
                                               "unit_group": 2, "reshard_after_forward": 2,
                                               "grad_accum": 2, "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                               "device": "fakegpu", "offload": True},
    # torchao float8 linears (tensorwise, rowwise; weights gathered in bf16 or in float8)
    "llama_wide_offload_f8_bf16_ws2": {"model": "tiny-llama-wide", "world_size": 2, "model_dtype": "float32",
                                       "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                       "float8": "tensorwise", "device": "fakegpu", "offload": True},
    "llama_wide_offload_f8row_bf16_ws2": {"model": "tiny-llama-wide", "world_size": 2, "model_dtype": "float32",
                                          "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                          "float8": "rowwise", "device": "fakegpu", "offload": True},
    "llama_wide_offload_f8ag_bf16_ws2": {"model": "tiny-llama-wide", "world_size": 2, "model_dtype": "float32",
                                         "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                         "float8": "tensorwise", "float8_all_gather": True,
                                         "device": "fakegpu", "offload": True},
    # batch 1 × seq 8: the params far over the activations (the peak at an all-gather's copy-in)
    "llama_wide_offload_f8ag_bf16_b1s8_ws2": {"model": "tiny-llama-wide", "world_size": 2, "model_dtype": "float32",
                                              "batch": 1, "seq": 8, "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                              "float8": "tensorwise", "float8_all_gather": True,
                                              "device": "fakegpu", "offload": True},
    # ... reducing in bf16: the peak at a backward all-gather's copy-in (each float8 weight's
    # f32 shard copied to the device, then cast by torchao's fsdp_pre_all_gather)
    "llama_wide_offload_f8ag_bf16r_b1s8_ws2": {"model": "tiny-llama-wide", "world_size": 2, "model_dtype": "float32",
                                               "batch": 1, "seq": 8, "param_dtype": "bfloat16", "reduce_dtype": "bfloat16",
                                               "float8": "tensorwise", "float8_all_gather": True,
                                               "device": "fakegpu", "offload": True},
    "llama_wide_offload_f8ag_ac_sync_each_ga2_ws2": {"model": "tiny-llama-wide", "world_size": 2, "model_dtype": "float32",
                                                     "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                                     "float8": "tensorwise", "float8_all_gather": True,
                                                     "checkpoint": ["LlamaDecoderLayer"], "grad_accum": 2, "grad_sync": "each",
                                                     "device": "fakegpu", "offload": True},
    # float8 all-gather under full AC: FSDPMemTracker's pre-forward, run again in the
    # recompute, counts the scales the backward's all-gather made as unsharded param
    "llama_wide_f8ag_ac_sync_each_ga2_gpu_ws2": {"model": "tiny-llama-wide", "world_size": 2, "model_dtype": "float32",
                                                     "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                                     "float8": "tensorwise", "float8_all_gather": True,
                                                     "checkpoint": ["LlamaDecoderLayer"], "grad_accum": 2, "grad_sync": "each",
                                                     "device": "fakegpu"},
    "fake_llama_wide_f8ag_ac_bf16_ws2": {"model": "tiny-llama-wide", "world_size": 2, "model_dtype": "float32",
                                                     "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                                     "float8": "tensorwise", "float8_all_gather": True,
                                                     "checkpoint": ["LlamaDecoderLayer"]},
    "llama_wide_offload_f8ag_ac_ws2": {"model": "tiny-llama-wide", "world_size": 2, "model_dtype": "float32",
                                                     "param_dtype": "bfloat16", "reduce_dtype": "float32",
                                                     "float8": "tensorwise", "float8_all_gather": True,
                                                     "checkpoint": ["LlamaDecoderLayer"],
                                                     "device": "fakegpu", "offload": True},
    # real size: Llama-3-8B on 16 ranks (two nodes' worth), the blocks resharded to the node
    "llama3_8b_offload_raf8_bf16_ws16": dict(FAKE_CASES["llama3_8b_offload_bf16_ws8"], world_size=16,
                                             reshard_after_forward=8),
    # ... and with torchtitan's float8 recipe (tensorwise, weights gathered in float8) at 8
    "llama3_8b_offload_f8ag_bf16_ws8": dict(FAKE_CASES["llama3_8b_offload_bf16_ws8"], float8="tensorwise",
                                            float8_all_gather=True),
    # op-level SAC on DeepSeek's latent attention on the fake GPU (the memory-efficient kernel:
    # SAC caches its output and log-sum-exp, not the q and k copies made before it), one block
    # under SAC; and mixed with full AC, offloaded, syncing each of 2 micro-batches
    "dsv2_sac_block1_bf16_gpu_ws2": {"model": "tiny-deepseek-v2", "world_size": 2, "batch": 1,
                                     "model_dtype": "float32", "param_dtype": "bfloat16",
                                     "reduce_dtype": "float32", "checkpoint": ["model.layers.1=selective-op"],
                                     "device": "fakegpu"},
    "dsv3_sac_block1_bf16_gpu_ws2": {"model": "tiny-deepseek-v3", "world_size": 2, "batch": 1,
                                     "model_dtype": "float32", "param_dtype": "bfloat16",
                                     "reduce_dtype": "float32", "checkpoint": ["model.layers.1=selective-op"],
                                     "device": "fakegpu"},
    "dsv2_offload_mixed_sac_sync_each_ga2_ws2": {"model": "tiny-deepseek-v2", "world_size": 2, "batch": 1,
                                                 "model_dtype": "float32", "param_dtype": "bfloat16",
                                                 "reduce_dtype": "float32", "grad_accum": 2, "grad_sync": "each",
                                                 "unit_reshard": {"last": False},
                                                 "wrap": "modules:model.embed_tokens,model.layers.*,lm_head",
                                                 "checkpoint": ["model.layers.0=full", "model.layers.1=selective-op",
                                                                "model.layers.2=selective-op"],
                                                 "device": "fakegpu", "offload": True},
    # op-level SAC on one block (the second) on the fake GPU, across families
    "llama_gqa_sac_block1_bf16_gpu_ws2": {"model": "tiny-llama-gqa", "world_size": 2, "batch": 1, "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "checkpoint": ["model.layers.1=selective-op"], "device": "fakegpu"},
    "mixtral_sac_block1_bf16_gpu_ws2": {"model": "tiny-mixtral", "world_size": 2, "batch": 1, "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "checkpoint": ["model.layers.1=selective-op"], "device": "fakegpu"},
    "qwen2_sac_block1_bf16_gpu_ws2": {"model": "tiny-qwen2", "world_size": 2, "batch": 1, "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "checkpoint": ["model.layers.1=selective-op"], "device": "fakegpu"},
    "qwen3_sac_block1_bf16_gpu_ws2": {"model": "tiny-qwen3", "world_size": 2, "batch": 1, "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "checkpoint": ["model.layers.1=selective-op"], "device": "fakegpu"},
    "qwen3_moe_sac_block1_bf16_gpu_ws2": {"model": "tiny-qwen3-moe", "world_size": 2, "batch": 1, "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "checkpoint": ["model.layers.1=selective-op"], "device": "fakegpu"},
    "phi3_sac_block1_bf16_gpu_ws2": {"model": "tiny-phi3", "world_size": 2, "batch": 1, "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "checkpoint": ["model.layers.1=selective-op"], "device": "fakegpu"},
    "llama31_sac_block1_bf16_gpu_ws2": {"model": "tiny-llama31", "world_size": 2, "batch": 1, "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "checkpoint": ["model.layers.1=selective-op"], "device": "fakegpu"},
    # DeepSeek-V2's routed experts on the fake GPU (float32 routing weights times bf16 expert
    # outputs: the grad's cast back is the peak), with no AC and with the first, dense block
    # checkpointed; op-level SAC on the first block (or mixed with full AC) across families
    "dsv2_bf16_gpu_ws2": {"model": "tiny-deepseek-v2", "world_size": 2, "batch": 1, "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu"},
    "dsv2_full_block0_bf16_gpu_ws2": {"model": "tiny-deepseek-v2", "world_size": 2, "batch": 1, "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "checkpoint": ["model.layers.0=full"]},
    "llama_tied_sac_block0_bf16_gpu_ws2": {"model": "tiny-llama-tied", "world_size": 2, "batch": 1, "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "checkpoint": ["model.layers.0=selective-op"]},
    "llama_tied_sac_block1_bf16_gpu_ws2": {"model": "tiny-llama-tied", "world_size": 2, "batch": 1, "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "checkpoint": ["model.layers.1=selective-op"]},
    "llama_wide_sac_block1_bf16_gpu_ws2": {"model": "tiny-llama-wide", "world_size": 2, "batch": 1, "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "checkpoint": ["model.layers.1=selective-op"]},
    "llama_4l_full0_sac2_bf16_gpu_ws2": {"model": "tiny-llama-4l", "world_size": 2, "batch": 1, "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "checkpoint": ["model.layers.0=full", "model.layers.2=selective-op"]},
    "qwen2_sac_block0_bf16_gpu_ws2": {"model": "tiny-qwen2", "world_size": 2, "batch": 1, "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "checkpoint": ["model.layers.0=selective-op"]},
    "mixtral_sac_block0_bf16_gpu_ws2": {"model": "tiny-mixtral", "world_size": 2, "batch": 1, "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "checkpoint": ["model.layers.0=selective-op"]},
    "dsv2_sac_block0_bf16_gpu_ws2": {"model": "tiny-deepseek-v2", "world_size": 2, "batch": 1, "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "checkpoint": ["model.layers.0=selective-op"]},
    "qwen3_moe_sac_block0_bf16_gpu_ws2": {"model": "tiny-qwen3-moe", "world_size": 2, "batch": 1, "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "checkpoint": ["model.layers.0=selective-op"]},
    "phi3_sac_block0_bf16_gpu_ws2": {"model": "tiny-phi3", "world_size": 2, "batch": 1, "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "checkpoint": ["model.layers.0=selective-op"]},
    "llama31_full0_sac1_bf16_gpu_ws4": {"model": "tiny-llama31", "world_size": 4, "batch": 1, "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "checkpoint": ["model.layers.0=full", "model.layers.1=selective-op"]},
    "qwen3_sac_block0_bf16_gpu_ga2_ws2": {"model": "tiny-qwen3", "world_size": 2, "batch": 1, "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "grad_accum": 2, "checkpoint": ["model.layers.0=selective-op"]},
    "dsv3_sac_block0_bf16_gpu_ws2": {"model": "tiny-deepseek-v3", "world_size": 2, "batch": 1, "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "checkpoint": ["model.layers.0=selective-op"]},
    # MoE families on the fake GPU under more options: HSDP, experts as units of their own (the
    # reduce output is temp to FSDPMemTracker until foreach_reduce returns), torchtitan's AC
    # wrapper, offload, no reshard after forward, accumulation syncing each, larger batches.
    # (float32 experts do not run here: the fake GPU's grouped_mm takes bf16 only)
    "dsv3_b2s64_bf16_gpu_ws2": {"model": "tiny-deepseek-v3", "world_size": 2, "batch": 2, "seq": 64, "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu"},
    "dsv2_hsdp_sac_block1_bf16_gpu_ws4": {"model": "tiny-deepseek-v2", "world_size": 4, "batch": 1, "strategy": "hybrid-shard", "shard_group_size": 2, "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "checkpoint": ["model.layers.1=selective-op"]},
    "dsv2_expert_units_sac_block1_bf16_gpu_ws2": {"model": "tiny-deepseek-v2", "world_size": 2, "batch": 1, "wrap": "modules:model.layers.*.mlp.experts,model.layers.*", "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "checkpoint": ["model.layers.1=selective-op"]},
    "dsv2_expert_units_full_block2_bf16_gpu_ws2": {"model": "tiny-deepseek-v2", "world_size": 2, "batch": 1, "wrap": "modules:model.layers.*.mlp.experts,model.layers.*", "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "checkpoint": ["model.layers.2=full"]},
    "qwen3_moe_mixed_sac_sync_each_ga2_bf16_gpu_ws2": {"model": "tiny-qwen3-moe", "world_size": 2, "batch": 1, "grad_accum": 2, "grad_sync": "each", "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "checkpoint": ["model.layers.0=selective-op", "model.layers.2=full"]},
    "mixtral_tt_sac_block1_bf16_gpu_ws2": {"model": "tiny-mixtral", "world_size": 2, "batch": 1, "ac_wrapper": "torchtitan", "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "checkpoint": ["model.layers.1=selective-op"]},
    "dsv2_tt_full_block1_bf16_gpu_ws2": {"model": "tiny-deepseek-v2", "world_size": 2, "batch": 1, "ac_wrapper": "torchtitan", "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "checkpoint": ["model.layers.1=full"]},
    "mixtral_offload_sac_block0_bf16_gpu_ws2": {"model": "tiny-mixtral", "world_size": 2, "batch": 1, "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "offload": True, "checkpoint": ["model.layers.0=selective-op"]},
    "dsv3_raf_false_sac_block2_bf16_gpu_ws2": {"model": "tiny-deepseek-v3", "world_size": 2, "batch": 1, "reshard_after_forward": False, "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "checkpoint": ["model.layers.2=selective-op"]},
    "qwen3_moe_b4s16_bf16_gpu_ws2": {"model": "tiny-qwen3-moe", "world_size": 2, "batch": 4, "seq": 16, "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu"},
    # op-level SAC on one block (or mixed with full AC) on the fake GPU under the other knobs:
    # unit groups, reshard to 2, kept units, experts on dim 1, float8 (weights gathered in float8
    # with torchtitan's wrapper: the linear's input grad is handed on as its node returns, alive
    # through the weight's grad), HSDP offloaded, 3 micro-batches, eager attention, prefetch 2,
    # torchtitan's 2024 loop, SGD
    "llama_wide_f8ag_tt_sac_block1_bf16_gpu_ws2": {"model": "tiny-llama-wide", "world_size": 2, "batch": 1, "float8": "tensorwise", "float8_all_gather": True, "ac_wrapper": "torchtitan", "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "checkpoint": ["model.layers.1=selective-op"]},
    "llama_wide_f8ag_tt_full_block0_bf16_gpu_ws2": {"model": "tiny-llama-wide", "world_size": 2, "batch": 1, "float8": "tensorwise", "float8_all_gather": True, "ac_wrapper": "torchtitan", "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "checkpoint": ["model.layers.0=full"]},
    "llama_wide_f8ag_tt_full_block1_bf16_gpu_ws2": {"model": "tiny-llama-wide", "world_size": 2, "batch": 1, "float8": "tensorwise", "float8_all_gather": True, "ac_wrapper": "torchtitan", "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "checkpoint": ["model.layers.1=full"]},
    "llama_wide_f8ag_b1_bf16_gpu_ws2": {"model": "tiny-llama-wide", "world_size": 2, "batch": 1, "float8": "tensorwise", "float8_all_gather": True, "ac_wrapper": "torchtitan", "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu"},
    "llama_4l_group2_sac_bf16_gpu_ws2": {"model": "tiny-llama-4l", "world_size": 2, "batch": 1, "unit_group": 2, "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "checkpoint": ["model.layers.2=selective-op", "model.layers.3=selective-op"]},
    "llama_4l_raf2_sac_block1_bf16_gpu_ws4": {"model": "tiny-llama-4l", "world_size": 4, "batch": 1, "reshard_after_forward": 2, "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "checkpoint": ["model.layers.1=selective-op"]},
    "llama_4l_kept2_mixed_bf16_gpu_ws2": {"model": "tiny-llama-4l", "world_size": 2, "batch": 1, "unit_reshard": {"model.layers.2": False, "model.layers.3": False}, "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "checkpoint": ["model.layers.2=selective-op", "model.layers.3=full"]},
    "mixtral_shard_dim1_sac_block0_bf16_gpu_ws2": {"model": "tiny-mixtral", "world_size": 2, "batch": 1, "shard_dim": [["model.layers.*.mlp.experts.*", 1]], "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "checkpoint": ["model.layers.0=selective-op"]},
    "llama_wide_f8_sac_block1_bf16_gpu_ws2": {"model": "tiny-llama-wide", "world_size": 2, "batch": 1, "float8": "tensorwise", "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "checkpoint": ["model.layers.1=selective-op"]},
    "llama_wide_f8ag_tt_full0_sac1_bf16_gpu_ws2": {"model": "tiny-llama-wide", "world_size": 2, "batch": 1, "float8": "tensorwise", "float8_all_gather": True, "ac_wrapper": "torchtitan", "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "checkpoint": ["model.layers.0=full", "model.layers.1=selective-op"]},
    "llama_4l_hsdp_offload_sac_block1_bf16_gpu_ws4": {"model": "tiny-llama-4l", "world_size": 4, "batch": 1, "strategy": "hybrid-shard", "shard_group_size": 2, "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "offload": True, "checkpoint": ["model.layers.1=selective-op"]},
    "qwen2_sac_block1_ga3_bf16_gpu_ws2": {"model": "tiny-qwen2", "world_size": 2, "batch": 1, "grad_accum": 3, "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "checkpoint": ["model.layers.1=selective-op"]},
    "llama_gqa_eager_sac_block1_bf16_gpu_ws2": {"model": "tiny-llama-gqa", "world_size": 2, "batch": 1, "attn_implementation": "eager", "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "checkpoint": ["model.layers.1=selective-op"]},
    "phi3_eager_sac_block1_bf16_gpu_ws2": {"model": "tiny-phi3", "world_size": 2, "batch": 1, "attn_implementation": "eager", "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "checkpoint": ["model.layers.1=selective-op"]},
    "dsv3_eager_sac_block2_bf16_gpu_ws2": {"model": "tiny-deepseek-v3", "world_size": 2, "batch": 1, "attn_implementation": "eager", "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "checkpoint": ["model.layers.2=selective-op"]},
    "llama_4l_prefetch2_sac_block2_bf16_gpu_ws2": {"model": "tiny-llama-4l", "world_size": 2, "batch": 1, "forward_prefetch": 2, "backward_prefetch": 2, "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "checkpoint": ["model.layers.2=selective-op"]},
    "mixtral_tt2024_sac_block1_bf16_gpu_ws2": {"model": "tiny-mixtral", "world_size": 2, "batch": 1, "train_loop": "torchtitan-2024", "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "checkpoint": ["model.layers.1=selective-op"]},
    "qwen3_sgd_sac_block1_bf16_gpu_ws2": {"model": "tiny-qwen3", "world_size": 2, "batch": 1, "optimizer": "sgd", "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "checkpoint": ["model.layers.1=selective-op"]},
    # float8 linears on the fake GPU across families and knobs (rowwise, DeepSeek, Qwen3,
    # Mixtral, Phi-3, offloaded, syncing each of 2, HSDP) and Qwen3-MoE's experts as units under HSDP
    "qwen3_moe_expert_units_hsdp_sac_block0_bf16_gpu_ws4": {"model": "tiny-qwen3-moe", "world_size": 4, "batch": 1, "strategy": "hybrid-shard", "shard_group_size": 2, "wrap": "modules:model.layers.*.mlp.experts,model.layers.*", "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "checkpoint": ["model.layers.0=selective-op"]},
    "llama_wide_f8row_sac_block1_bf16_gpu_ws2": {"model": "tiny-llama-wide", "world_size": 2, "batch": 1, "float8": "rowwise", "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "checkpoint": ["model.layers.1=selective-op"]},
    "llama_wide_f8row_full_block0_b2_bf16_gpu_ws2": {"model": "tiny-llama-wide", "world_size": 2, "batch": 2, "float8": "rowwise", "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "checkpoint": ["model.layers.0=full"]},
    "dsv2_f8_bf16_gpu_ws2": {"model": "tiny-deepseek-v2", "world_size": 2, "batch": 1, "float8": "tensorwise", "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu"},
    "qwen3_f8_sac_block0_bf16_gpu_ws2": {"model": "tiny-qwen3", "world_size": 2, "batch": 1, "float8": "tensorwise", "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "checkpoint": ["model.layers.0=selective-op"]},
    "llama_wide_f8_offload_sac_block1_bf16_gpu_ws2": {"model": "tiny-llama-wide", "world_size": 2, "batch": 1, "float8": "tensorwise", "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "offload": True, "checkpoint": ["model.layers.1=selective-op"]},
    "llama_wide_f8ag_sync_each_ga2_bf16_gpu_ws2": {"model": "tiny-llama-wide", "world_size": 2, "batch": 1, "float8": "tensorwise", "float8_all_gather": True, "grad_accum": 2, "grad_sync": "each", "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu"},
    "llama_wide_f8ag_hsdp_bf16_gpu_ws4": {"model": "tiny-llama-wide", "world_size": 4, "batch": 1, "float8": "tensorwise", "float8_all_gather": True, "strategy": "hybrid-shard", "shard_group_size": 2, "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu"},
    "mixtral_f8_sac_block1_bf16_gpu_ws2": {"model": "tiny-mixtral", "world_size": 2, "batch": 1, "float8": "tensorwise", "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "checkpoint": ["model.layers.1=selective-op"]},
    "phi3_f8_b2_bf16_gpu_ws2": {"model": "tiny-phi3", "world_size": 2, "batch": 2, "float8": "tensorwise", "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu"},
    # torchtitan's per-block compile with an AC mode per block (full, SAC, none), also
    # accumulating syncing each: what the compiled forward keeps, exact
    # ... Mixtral's MoE blocks compiled: without AC, the first block fully checkpointed, the
    # first under SAC, every block under SAC, at more tokens (and a dense twin)
    "mixtral_compile_tt_bf16_gpu_ws2": {"model": "tiny-mixtral", "world_size": 2, "batch": 1, "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "compile": True, "ac_wrapper": "torchtitan"},
    "mixtral_compile_full_block0_tt_bf16_gpu_ws2": {"model": "tiny-mixtral", "world_size": 2, "batch": 1, "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "compile": True, "ac_wrapper": "torchtitan", "checkpoint": ["model.layers.0=full"]},
    "mixtral_compile_sac_block0_tt_bf16_gpu_ws2": {"model": "tiny-mixtral", "world_size": 2, "batch": 1, "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "compile": True, "ac_wrapper": "torchtitan", "checkpoint": ["model.layers.0=selective-op"]},
    "mixtral_compile_sac_tt_bf16_gpu_ws2": {"model": "tiny-mixtral", "world_size": 2, "batch": 1, "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "compile": True, "ac_wrapper": "torchtitan", "checkpoint": ["MixtralDecoderLayer"], "ac_mode": "selective-op"},
    "llama_compile_tt_b4s64_bf16_gpu_ws2": {"model": "tiny-llama", "world_size": 2, "batch": 4, "seq": 64, "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "compile": True, "ac_wrapper": "torchtitan"},
    "mixtral_compile_tt_b2s64_bf16_gpu_ws2": {"model": "tiny-mixtral", "world_size": 2, "batch": 2, "seq": 64, "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "compile": True, "ac_wrapper": "torchtitan"},
    "mixtral_compile_tt_b1s128_bf16_gpu_ws2": {"model": "tiny-mixtral", "world_size": 2, "batch": 1, "seq": 128, "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "compile": True, "ac_wrapper": "torchtitan"},
    "mixtral_compile_tt_b4s64_bf16_gpu_ws2": {"model": "tiny-mixtral", "world_size": 2, "batch": 4, "seq": 64, "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "compile": True, "ac_wrapper": "torchtitan"},
    "qwen3_compile_sac_block1_tt_bf16_gpu_ws2": {"model": "tiny-qwen3", "world_size": 2, "batch": 1, "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "compile": True, "ac_wrapper": "torchtitan", "checkpoint": ["model.layers.1=selective-op"]},
    "llama31_compile_full0_sac1_tt_bf16_gpu_ws2": {"model": "tiny-llama31", "world_size": 2, "batch": 1, "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "compile": True, "ac_wrapper": "torchtitan", "checkpoint": ["model.layers.0=full", "model.layers.1=selective-op"]},
    "llama_4l_compile_full0_sac2_sync_each_ga2_tt_gpu_ws2": {"model": "tiny-llama-4l", "world_size": 2, "batch": 1, "grad_accum": 2, "grad_sync": "each", "model_dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32", "device": "fakegpu", "compile": True, "ac_wrapper": "torchtitan", "checkpoint": ["model.layers.0=full", "model.layers.2=selective-op"]},
})
# the tiny checkpointed-region cases of BASE_CASES again, on the deterministic fake group
for _name in ("llama4l_ac_mlp_units_ws2", "llama4l_ac_attn_units_ws2", "llama4l_ac_nested_ws2",
              "llama4l_ac_in_unit_ws2", "llama_ac_size5000_ws2"):
    FAKE_CASES["fake_" + _name] = dict(BASE_CASES[_name], model_dtype="float32")


def fake_cases():
    return _resolved(FAKE_DEFAULTS, FAKE_CASES)
