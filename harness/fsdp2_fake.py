"""Ground truth from PyTorch FSDP2 for real-size models, without their memory or compute.
Usage: .venv/bin/python harness/fsdp2_fake.py [CASE ...]      (default: every case of
       cases.FAKE_CASES)     .venv/bin/python harness/fsdp2_fake.py --list
Writes tests/fixtures/fsdp2_fake/<case>.json, in fsdp2_oracle.py's schema.

Per case, one process: a fake process group (torch.testing's FakeStore, backend "fake") of
world_size ranks and its DeviceMesh, built before entering FakeTensorMode; then, under it,
the HF model from its config (the config's torch_dtype unless the case names a `model_dtype`),
HF's non-reentrant gradient checkpointing of the decoder layers where the case says
"checkpoint", fully_shard on every instance of model._no_split_modules and the root, torch.optim (Adam
unless the case says otherwise, lr 1e-3) and 2 training steps on a random batch, inside the
same FSDPMemTracker subclass as fsdp2_oracle.py (peak reset after step 1). The collectives
FSDP2 issues are logged by the same patch. Losses are not recorded (fake tensors hold no
values). Rank 0's view: on the fake group every rank is rank 0, whose shards are the largest.
A case with `device: "fakegpu"` runs on harness/fakegpu.py's fake accelerator instead of the
CPU (the model built on meta, sharded, then materialized; `offload: true` adds FSDP2's
CPUOffloadPolicy) and is written to tests/fixtures/fsdp2_fakegpu/ with the host's figures.
"""
import contextlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

common.check_versions()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import transformers  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

import cases as cases_mod  # noqa: E402
import fakegpu  # noqa: E402
import fsdp2_oracle as oracle  # noqa: E402


def _patch_packed_sequence_check():
    """Without a KV cache (gradient checkpointing turns it off) HF looks for packed sequences
    in position_ids, a data-dependent check fake tensors cannot make: it then builds a full
    [batch, 1, seq, seq] bool mask a real run never has. The batch's position ids are one
    arange per row, so a real run finds no packing (None); the fake run is told the same."""
    from transformers import masking_utils
    orig = masking_utils.find_packed_sequence_indices

    def no_packed_sequences(position_ids):
        orig(position_ids)  # the same temporaries as the real check
        return None

    masking_utils.find_packed_sequence_indices = no_packed_sequences


def _real_post_forward_mesh():
    import torch.distributed.fsdp._fully_shard._fully_shard as fs
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    orig = fs._get_post_forward_mesh_info
    if getattr(orig, "_real_mesh", False):
        return

    def real(*a, **k):
        with unset_fake_temporarily():
            return orig(*a, **k)
    real._real_mesh = True
    fs._get_post_forward_mesh_info = real


def _place(model, offload):
    """A model built on meta and sharded, materialized as FSDP2 users do (torchtitan's
    `to_empty(device=init_device)`): on the device, or with CPU offload the shards on the host
    (FSDP2 keeps them there) and the buffers on the device (torchtitan's buffer_device)."""
    model.to_empty(device="cpu" if offload else fakegpu.NAME)
    if offload:
        for mod in model.modules():
            for key, buf in mod._buffers.items():
                if buf is not None:
                    mod._buffers[key] = buf.to(fakegpu.NAME)


def run_case(name, case):
    ws = case["world_size"]
    device = case.get("device", "cpu")
    assert device in ("cpu", fakegpu.NAME) and (device != "cpu" or not case.get("offload")), case
    if device != "cpu":
        fakegpu.install()
    transformers.logging.set_verbosity_error()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=ws)
    try:
        oracle._Log.gloo = False
        oracle._Log.events = []
        oracle._patch_collectives()
        oracle._patch_group_context()
        mesh = oracle.make_mesh(case, device)
        cfg = common.load_config(case["model"])
        # (reshard_after_forward=int: fully_shard builds the post-forward DeviceMesh from the
        # mesh's rank tensor — real data, built with fake mode set aside)
        _real_post_forward_mesh()
        with FakeTensorMode():
            kw = {"attn_implementation": case["attn_implementation"]}
            if case["model_dtype"]:
                kw["dtype"] = oracle._dtype(case["model_dtype"])
            with torch.device("meta") if device != "cpu" else contextlib.nullcontext():
                model = AutoModelForCausalLM.from_config(cfg, **kw)
            model.train()
            oracle.enable_checkpointing(model, case, cfg)
            oracle.compile_blocks(model, case)
            model_dtype = common.dtype_name(next(model.parameters()).dtype)
            hf_param_numel = sum(p.numel() for p in model.parameters())
            policy = oracle.shard_model(model, case, mesh, cfg)
            if device != "cpu":
                _place(model, case.get("offload"))
            opt = oracle.make_optimizer(model, case)
            if device == "cpu":
                input_ids = torch.randint(0, cfg.vocab_size, (case["batch"], case["seq"]))
            else:  # (no generator on the fake device; fake tensors hold no values anyway)
                input_ids = torch.zeros(case["batch"], case["seq"], dtype=torch.long, device=device)
            labels = input_ids.clone()
            tracker = oracle.WhereTracker(model, opt)
            tracker.main_device = None if device == "cpu" else device
            if case.get("float8"):
                oracle._float8_gemms_seen_by(tracker)
            tracker.track_inputs((input_ids, labels))
            _, step1_peak = oracle.train_two_steps(model, opt, case, input_ids, labels, tracker, record_losses=False)
            peak_snap = tracker.get_tracker_snapshot("peak")
            peak = oracle._breakdown(peak_snap, tracker.main_device)
            host = oracle._breakdown(peak_snap, "cpu") if device != "cpu" else None
            units = oracle._units(model)
            if os.environ.get("ORACLE_LIVE"):
                common.write_json(os.environ["ORACLE_LIVE"], tracker.live_at_peak)
            if os.environ.get("ORACLE_TRACE"):
                common.write_json(os.environ["ORACLE_TRACE"], tracker.trace)
        disp = oracle.checked_comm_counts(tracker)
        for u in units:
            for p in u["param_info"]:
                p["sharded_numel_per_rank"] = [p.pop("sharded_numel")]
        collectives = oracle.fixture_collectives(oracle._Log.events)
        options = dict(oracle.case_options(case, policy, "fake"), model_dtype=model_dtype)
        if device != "cpu":
            options["device"] = device
        return {
            "case": name,
            "torch_version": torch.__version__,
            "transformers_version": transformers.__version__,
            "config": common.config_relpath(case["model"]),
            "options": options,
            "attn_implementation_effective": model.config._attn_implementation,
            "hf_param_numel": hf_param_numel,
            "units": units,
            "collective_counts": disp,
            "collectives": collectives,
            "memory": {
                "rank": 0,
                "scope": "step 2 (tracker peak reset after step 1); fake tensors, exact storage bytes",
                "peak_bytes": peak["total"],
                "breakdown": peak,
                "peak_at": tracker.peak_where,
                "step1_peak_bytes": step1_peak["total"],
                **({"after_forward": tracker.after_forward} if case.get("compile") else {}),
                **({"host_peak_bytes": host["total"], "host_breakdown": host,
                    "host_before_optimizer_step": tracker.host_before_step} if host else {}),
            },
        }
    finally:
        dist.destroy_process_group()


def main(argv):
    _patch_packed_sequence_check()  # (HF makes the check only without a KV cache)
    common.case_main(argv, cases_mod.fake_cases(), run_case, "fsdp2_fake")


if __name__ == "__main__":
    main(sys.argv[1:])
