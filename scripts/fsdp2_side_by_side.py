"""PyTorch FSDP2 training run to set beside `fsdp-plan run` (same weights, same tokens, same
AdamW): per-step loss, tokens/s and peak memory.

    torchrun --nproc-per-node N scripts/fsdp2_side_by_side.py --model tiny-llama \
        --batch 2 --seq 32 --steps 10 [--device cuda|cpu] [--out DIR]

Rank 0 writes DIR/init.safetensors (HF-named fp32 weights, seed 0, dropout 0 as the runtime)
and DIR/tokens.u32 (random ids) unless they exist; every rank then `fully_shard`s each
`_no_split_modules` block and the root, and trains with AdamW(lr, (0.9, 0.999), 1e-8, 0.01,
foreach=False) on the batches `fsdp-plan run --data DIR/tokens.u32` takes (step s: the global
batch is tokens[s·P mod (n−P) :][:P], P = N·batch·seq, rank r its r-th [batch, seq] block).
It prints the matching `fsdp-plan` command. `--device cpu` runs on gloo (a check of this
script without a GPU); cuda uses NCCL, one GPU per LOCAL_RANK. `--float8 [--float8-all-gather]`
converts the linears with torchao 0.18 first, as torchtitan's `--float8` does.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import common  # noqa: E402  (sets HF offline mode)
import hf_parity  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny-llama", help="models/<name>.config.json")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--out", default=None, help="default: target/side-by-side/<model>")
    ap.add_argument("--json", default=None, help="rank 0 also writes its JSON summary here")
    ap.add_argument("--param-dtype", choices=["float32", "bfloat16"], default="float32",
                    help="MixedPrecisionPolicy(param_dtype=..., reduce_dtype=float32); shards stay float32")
    ap.add_argument("--float8", action="store_true",
                    help="torchao 0.18's float8 linears, tensorwise (torchtitan's --float8: every nn.Linear "
                         "but the LM head whose dims are multiples of 16)")
    ap.add_argument("--float8-all-gather", action="store_true",
                    help="with --float8: the weights all-gathered in float8 (enable_fsdp_float8_all_gather)")
    a = ap.parse_args()

    rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    if a.device == "cuda":
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=dev)
    else:
        dev = torch.device("cpu")
        torch.set_num_threads(1)
        dist.init_process_group("gloo")
    out = a.out or os.path.join(common.REPO, "target", "side-by-side", a.model)
    weights, tokens = os.path.join(out, "init.safetensors"), os.path.join(out, "tokens.u32")
    per_step = ws * a.batch * a.seq
    if rank == 0 and not (os.path.exists(weights) and os.path.exists(tokens)):
        cfg, model, _ = hf_parity.build(a.model, seed=0)
        params, _ = hf_parity.primary_params(model)
        hf_parity.save_safetensors(weights, {n: p for n, p in params})
        gen = torch.Generator().manual_seed(1)
        ids = torch.randint(0, cfg.vocab_size, ((a.steps + 1) * per_step,), generator=gen)
        tmp = f"{tokens}.tmp{os.getpid()}"
        ids.numpy().astype("<u4").tofile(tmp)
        os.replace(tmp, tokens)
    dist.barrier()

    cfg, model, _ = hf_parity.build(a.model, seed=0)
    _, aliases = hf_parity.primary_params(model)
    missing, unexpected = model.load_state_dict(load_file(weights), strict=False)
    if unexpected or set(missing) - set(aliases):  # only tied aliases may be absent
        raise SystemExit(f"{weights}: missing {sorted(set(missing) - set(aliases))}, unexpected {unexpected}")
    model.to(dev)
    if a.float8:
        import fsdp2_oracle
        fsdp2_oracle.convert_float8(model, {"float8": "tensorwise", "float8_all_gather": a.float8_all_gather})
    classes = set(getattr(model, "_no_split_modules", None) or [])
    mp = MixedPrecisionPolicy(param_dtype=getattr(torch, a.param_dtype), reduce_dtype=torch.float32)
    for m in model.modules():
        if type(m).__name__ in classes:
            fully_shard(m, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, foreach=False)
    ids = torch.from_numpy(np.fromfile(tokens, dtype="<u4").astype(np.int64))
    n = ids.numel()
    if n < per_step:
        raise SystemExit(f"{tokens} has {n} tokens, a step needs {per_step}")
    rows = []
    if a.device == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    t_prev = time.perf_counter()
    for s in range(a.steps):
        start = (s * per_step) % max(n - per_step, 1)
        g = ids[start:start + per_step].clamp(0, cfg.vocab_size - 1).reshape(ws, 1, a.batch, a.seq)
        x = g[rank, 0].to(dev)
        loss = model(input_ids=x, labels=x.clone()).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        avg = loss.detach().clone()
        dist.all_reduce(avg)
        avg = avg.item() / ws
        now = time.perf_counter()
        rows.append({"step": s + 1, "loss": avg, "tokens_per_s": per_step / (now - t_prev)})
        t_prev = now
        if rank == 0:
            print(f"step {s + 1:>4}  loss {avg:.6f}  {rows[-1]['tokens_per_s']:>10.1f} tokens/s", flush=True)
    peak = torch.cuda.max_memory_allocated(dev) if a.device == "cuda" else None
    if rank == 0:
        doc = {"model": a.model, "world_size": ws, "device": a.device, "batch": a.batch, "seq": a.seq,
               "param_dtype": a.param_dtype, "float8": a.float8, "float8_all_gather": a.float8_all_gather,
               "torch": torch.__version__,
               "gpu": torch.cuda.get_device_name(dev) if a.device == "cuda" else None,
               "steps": rows, "peak_allocated_bytes_rank0": peak}
        print(json.dumps(doc, indent=1))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(doc, f, indent=1)
        rel = os.path.relpath(out, common.REPO)
        print(f"\nsame run with fsdp-plan (loss should match step by step; the model file imported from a "
              f"dropout-free config, as this script builds the model, see scripts/gpu-check.sh):\n"
              f"  fsdp-plan run models/{a.model}.ron --world-size {ws} --batch {a.batch} --seq {a.seq} "
              f"--steps {a.steps} --lr {a.lr} --policy auto --optimizer adamw --weights {rel}/init.safetensors "
              f"--data {rel}/tokens.u32 --backend {'cuda' if a.device == 'cuda' else 'cpu'}"
              + (f" --param-dtype bf16 --reduce-dtype f32" if a.param_dtype == "bfloat16" else "")
              + (" --float8 tensorwise" if a.float8 else "") + (" --float8-all-gather" if a.float8_all_gather else ""))
    dist.destroy_process_group()
    # (the results are written: leave without the interpreter's teardown, where a process-group
    # thread still joinable at exit once aborted this rank — "terminate called without an
    # active exception" — after everything it had to do was done)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
