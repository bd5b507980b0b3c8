"""CPU training throughput of real PyTorch FSDP2 (fully_shard, gloo), to set beside
`fsdp-plan run … --format json` on the same model, world size, batch and sequence length.

    .venv/bin/python bench/fsdp2_cpu_tokens.py CONFIG --world-size N --batch B --seq S \
        --steps K [--warmup W]

CONFIG is an HF config.json (or a name under models/, e.g. tiny-llama). One process per rank
(spawn, gloo on 127.0.0.1, a free port), each with torch.set_num_threads(1) (the Rust runtime
runs one thread per rank with libtorch at one thread too). Per rank: the HF model from the
config with torch.manual_seed(0), fp32, sdpa attention, every dropout probability set to 0
(the runtime runs dropout at p = 0), model.train(); fully_shard on every instance of
model._no_split_modules, then on the root (FSDP2 defaults: reshard_after_forward=True, no
mixed precision, implicit prefetch); Adam(lr=1e-3). Each step: fresh random token ids
[B, S] per rank (labels = a copy, HF shifts inside the loss), loss = model(...).loss,
backward, opt.step(), opt.zero_grad(), loss.item().

Timing on rank 0: W warmup steps, then K measured steps, each as dist.barrier(); t0 =
time.perf_counter(); <whole step>; t1. Prints JSON: tokens_per_s = global batch tokens
(N·B·S) / median step time, step_times (s, the K measured steps), and the settings.
"""
import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import transformers  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

DROPOUT_KEYS = ("attention_dropout", "hidden_dropout", "dropout", "resid_pdrop", "embd_pdrop",
                "attn_pdrop", "summary_first_dropout", "activation_dropout", "classifier_dropout")


def config_path(arg):
    if os.path.exists(arg):
        return arg
    p = os.path.join(REPO, "models", f"{arg}.config.json")
    if os.path.exists(p):
        return p
    sys.stderr.write(f"error: {arg}: no such config (a path or a name under models/)\n")
    sys.exit(2)


def load_config(path):
    with open(path) as f:
        d = json.load(f)
    for k in DROPOUT_KEYS:
        if isinstance(d.get(k), (int, float)):
            d[k] = 0.0
    return AutoConfig.for_model(**d)


def _worker(rank, a, port, outdir):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    ws = a.world_size
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    try:
        cfg = load_config(a.config)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)
        model.train()
        for m in model.modules():
            if isinstance(m, torch.nn.Dropout):
                m.p = 0.0
        assert not any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())
        assert all(p.dtype == torch.float32 for p in model.parameters())
        n_params = sum(p.numel() for p in model.parameters())
        mesh = init_device_mesh("cpu", (ws,))
        wrap = set(model._no_split_modules)
        n_wrapped = 0
        for m in model.modules():
            if type(m).__name__ in wrap:
                fully_shard(m, mesh=mesh)
                n_wrapped += 1
        assert n_wrapped == cfg.num_hidden_layers, (n_wrapped, wrap)
        fully_shard(model, mesh=mesh)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        gen = torch.Generator().manual_seed(1234 + rank)

        times, losses = [], []
        for i in range(a.warmup + a.steps):
            ids = torch.randint(0, cfg.vocab_size, (a.batch, a.seq), generator=gen)
            labels = ids.clone()
            dist.barrier()
            t0 = time.perf_counter()
            loss = model(input_ids=ids, labels=labels).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            lv = loss.item()
            t1 = time.perf_counter()
            if i >= a.warmup:
                times.append(t1 - t0)
                losses.append(lv)
        if rank == 0:
            with open(os.path.join(outdir, "rank0.json"), "w") as f:
                json.dump({"step_times": times, "losses": losses, "n_params": n_params,
                           "wrapped": sorted(wrap), "n_wrapped": n_wrapped,
                           "attn": model.config._attn_implementation}, f)
    finally:
        dist.destroy_process_group()


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config")
    ap.add_argument("--world-size", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--warmup", type=int, default=3)
    a = ap.parse_args()
    a.config = config_path(a.config)
    if a.world_size < 1 or a.batch < 1 or a.seq < 1 or a.steps < 1 or a.warmup < 0:
        sys.stderr.write("error: --world-size/--batch/--seq/--steps must be >= 1, --warmup >= 0\n")
        sys.exit(2)
    with tempfile.TemporaryDirectory(prefix="fsdp2_cpu_tokens_") as tmp:
        mp.spawn(_worker, args=(a, _free_port(), tmp), nprocs=a.world_size, join=True)
        with open(os.path.join(tmp, "rank0.json")) as f:
            r0 = json.load(f)
    tokens = a.world_size * a.batch * a.seq
    med = statistics.median(r0["step_times"])
    print(json.dumps({
        "tokens_per_s": tokens / med,
        "median_step_s": med,
        "step_times": r0["step_times"],
        "losses_rank0": r0["losses"],
        "config": os.path.relpath(a.config, os.getcwd()),
        "world_size": a.world_size, "batch": a.batch, "seq": a.seq,
        "steps": a.steps, "warmup": a.warmup,
        "global_batch_tokens": tokens,
        "n_params": r0["n_params"],
        "wrapped": r0["wrapped"],
        "attn_implementation": r0["attn"],
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "threads_per_rank": 1,
        "backend": "gloo",
    }))


if __name__ == "__main__":
    main()
