"""List what autograd saves for one HF model's forward (single process, no FSDP).

Usage: .venv/bin/python harness/saved_tensors.py CONFIG.json [--attn sdpa|eager] [--dtype bf16]
       [--batch 2 --seq 32]

Prints every distinct storage saved for backward, with the aten op that created it, its
bytes and dtype, grouped by module. A diagnostic for planner/src/activation.rs: it shows
which tensors autograd keeps, so the activation model can name them.
"""
import argparse, collections, json, os, sys
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
import transformers
from transformers import AutoConfig, AutoModelForCausalLM


class Creator(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.made = {}  # storage ptr -> (op, module)
        self.module = ""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and not t._is_view():
                # storages are reused after frees: the latest creator wins
                p = t.untyped_storage().data_ptr()
                self.made[p] = (str(func.overloadpacket.__name__), self.module)
        return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--attn", default="sdpa")
    ap.add_argument("--dtype", default="f32")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=32)
    a = ap.parse_args()
    cfg = AutoConfig.for_model(**{k: v for k, v in json.load(open(a.config)).items()})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=a.attn)
    if a.dtype in ("bf16", "bfloat16"):
        model = model.to(torch.bfloat16)
    model.train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    ids = torch.randint(0, cfg.vocab_size, (a.batch, a.seq))
    creator = Creator()
    hooks = []
    for name, mod in model.named_modules():
        def pre(m, args, name=name):
            creator.module = name
        hooks.append(mod.register_forward_pre_hook(pre))
    saved = collections.OrderedDict()

    def pack(t):
        p = t.untyped_storage().data_ptr()
        if p not in params and p not in saved:
            saved[p] = (t.untyped_storage().nbytes(), t.dtype, tuple(t.shape))
        return t

    with creator, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(input_ids=ids, labels=ids.clone())
    total = 0
    by_mod = collections.defaultdict(int)
    for p, (nb, dt, shape) in saved.items():
        op, mod = creator.made.get(p, ("(input)", ""))
        print(f"{nb:>10} B  {str(dt):<15} {str(shape):<22} {op:<28} {mod}")
        total += nb
        by_mod[mod.split(".self_attn")[0].split(".mlp")[0]] += nb
    print(f"total saved {total} B")
    out.loss.backward()


if __name__ == "__main__":
    main()
