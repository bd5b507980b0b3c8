"""FSDP1's memory at any size: FullyShardedDataParallel on a fake process group under
FakeTensorMode, counted by torch's MemTracker (`torch.distributed._tools.mem_tracker`; the
FSDPMemTracker is FSDP2's). MemTracker follows FSDP1's frees and re-allocations of the flat
parameters (`UntypedStorage.resize_`, which it patches) and counts every storage the ops make.

Usage: .venv/bin/python harness/fsdp1_fake.py [CASE ...]      (default: every case)
       .venv/bin/python harness/fsdp1_fake.py --list
Writes tests/fixtures/fsdp1_fake/<case>.json: the options as the planner reads them and step
2's peak by MemTracker's categories (params, buffers, grads, activations, temporaries,
optimizer state). Cases: cases.FSDP1_FAKE_CASES. The inputs are made inside the tracker (an
activation to it); HF's packed-sequence check is patched as in fsdp2_fake.py (fake tensors
hold no positions to check).
"""
import contextlib
import functools
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

common.check_versions()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import transformers  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.distributed._tools.mem_tracker import MemTracker  # noqa: E402
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper  # noqa: E402
from torch.distributed.fsdp import BackwardPrefetch, FullyShardedDataParallel, MixedPrecision, ShardingStrategy  # noqa: E402
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

import cases as cases_mod  # noqa: E402
import fakegpu  # noqa: E402
import fsdp2_fake  # noqa: E402
import fsdp2_oracle as oracle  # noqa: E402

STRATEGIES = {"full-shard": ShardingStrategy.FULL_SHARD, "shard-grad-op": ShardingStrategy.SHARD_GRAD_OP,
              "no-shard": ShardingStrategy.NO_SHARD, "hybrid-shard": ShardingStrategy.HYBRID_SHARD}
PREFETCH = {"pre": BackwardPrefetch.BACKWARD_PRE, "post": BackwardPrefetch.BACKWARD_POST}
# (FSDP1 reads its flat params' data pointers to check their storage; fake tensors warn)
warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
CATEGORIES = {"PARAM": "param", "BUFFER": "buffer", "GRAD": "grad", "ACT": "activation", "TEMP": "temp", "OPT": "optstate"}


def _checkpoint_blocks(model, case):
    """torchtitan's apply_ac of March 2024: each decoder block inside checkpoint_wrapper
    (non-reentrant, no RNG state), which FSDP1 then wraps; op-level SAC with torchtitan's
    policy (fsdp2_oracle.op_sac_context_fn). HF's KV cache off, as HF's own checkpointing
    turns it off."""
    model.config.use_cache = False
    kw = {"context_fn": oracle.op_sac_context_fn} if case["ac_mode"] == "selective-op" else {}
    layers = model.transformer.h if hasattr(model, "transformer") else model.model.layers
    for i in range(len(layers)):
        layers[i] = checkpoint_wrapper(layers[i], checkpoint_impl=CheckpointImpl.NO_REENTRANT,
                                       preserve_rng_state=False, **kw)


def _on_fake_accelerator():
    """FSDP1 on harness/fakegpu.py's fake accelerator (CUDA's kernels and 512 B blocks): its
    streams are the fake device's, which `Tensor.record_stream` does not take; FSDP1 records
    there only that the compute stream used an unsharded flat param (when the caching
    allocator may reuse its block: no bytes), so the record is skipped."""
    fakegpu.install()
    import torch.distributed.fsdp._common_utils as common_utils
    import torch.distributed.fsdp._flat_param as flat_param
    import torch.distributed.fsdp._runtime_utils as runtime_utils
    for m in (common_utils, flat_param, runtime_utils):
        if hasattr(m, "_no_dispatch_record_stream"):
            m._no_dispatch_record_stream = lambda tensor, stream: None


def run_case(name, case):
    ws = case["world_size"]
    device = case["device"]
    if device != "cpu":
        _on_fake_accelerator()
    transformers.logging.set_verbosity_error()
    fsdp2_fake._patch_packed_sequence_check()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=ws)
    try:
        cfg = common.load_config(case["model"])
        # (hybrid sharding: a (replicate, shard) mesh, as FSDP2's cases, built before fake mode)
        mesh = oracle.make_mesh(case) if case["strategy"] == "hybrid-shard" else None
        with FakeTensorMode():
            with torch.device(device):
                model = AutoModelForCausalLM.from_config(cfg, attn_implementation=case["attn_implementation"],
                                                         dtype=getattr(torch, case["model_dtype"]))
            model.train()
            layer_names = set(model._no_split_modules)
            layer_cls = {type(m) for m in model.modules() if type(m).__name__ in layer_names}
            if case["checkpoint"]:
                _checkpoint_blocks(model, case)
            mp = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if case["mp"] else None
            strategy = STRATEGIES[case["strategy"]]
            model = FullyShardedDataParallel(
                model, auto_wrap_policy=functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=layer_cls),
                device_id=torch.device(device) if device == "cpu" else torch.device(device, 0), use_orig_params=False, sharding_strategy=strategy, device_mesh=mesh,
                backward_prefetch=PREFETCH[case["backward_prefetch"]], mixed_precision=mp)
            opt = oracle.make_optimizer(model, case)
            tracker = MemTracker()
            tracker.track_external(model, opt)
            with tracker:
                # (no generator on the fake device; fake tensors hold no values anyway)
                input_ids = (torch.randint(0, cfg.vocab_size, (case["batch"], case["seq"])) if device == "cpu"
                             else torch.zeros(case["batch"], case["seq"], dtype=torch.long, device=device))
                labels = input_ids.clone()
                for step in (1, 2):
                    if step == 2:
                        # step 2's peak: from what step 1 left
                        tracker.reset_mod_stats()
                        cur = tracker.get_tracker_snapshot("current")
                        tracker._peak_mem_snap = cur
                        tracker._peak_mem = {d: v["Total"] for d, v in cur.items()}
                    # grad_accum > 1: the same batch per micro-batch, gradient sync only in
                    # the last one's backward (FSDP1's no_sync())
                    for mb in range(case["grad_accum"]):
                        if mb > 0:
                            tracker.reset_mod_stats()
                        sync = mb == case["grad_accum"] - 1
                        with contextlib.nullcontext() if sync else model.no_sync():
                            if case["train_loop"] == "torchtitan-2024":
                                pred = model(input_ids=input_ids).logits.float()
                                loss = torch.nn.functional.cross_entropy(pred.flatten(0, 1), labels.flatten(0, 1))
                            else:
                                loss = model(input_ids=input_ids, labels=labels).loss
                            loss.backward()
                    opt.step()
                    opt.zero_grad()
            snap = next(v for d, v in tracker.get_tracker_snapshot("peak").items() if d.type == device)
            breakdown = {CATEGORIES[k.name]: v for k, v in snap.items() if hasattr(k, "name") and k.name in CATEGORIES}
        wrap = "transformer:" + ",".join(sorted(layer_names))
        return {
            **common.fixture_head(name, case["model"]),
            "options": {
                "world_size": ws, "batch": case["batch"], "seq": case["seq"],
                "attn_implementation": case["attn_implementation"], "model_dtype": case["model_dtype"],
                "param_dtype": "bfloat16" if case["mp"] else None, "reduce_dtype": "float32" if case["mp"] else None,
                "optimizer": case["optimizer"], "wrap": wrap, "device": device, "layout": "flat",
                "strategy": case["strategy"], "shard_group_size": case["shard_group_size"],
                "backward_prefetch": case["backward_prefetch"], "use_orig_params": False,
                "checkpoint": sorted(layer_names) if case["checkpoint"] else None,
                "ac_mode": case["ac_mode"], "ac_wrapper": "torchtitan", "train_loop": case["train_loop"],
                "grad_accum": case["grad_accum"],
            },
            "collectives": [],
            "memory": {"peak_bytes": snap["Total"], "breakdown": breakdown},
        }
    finally:
        dist.destroy_process_group()


def main(argv):
    common.case_main(argv, cases_mod.fsdp1_fake_cases(), run_case, "fsdp1_fake")


if __name__ == "__main__":
    main(sys.argv[1:])
