"""Ground truth from real PyTorch FSDP1 (FullyShardedDataParallel) on CPU/gloo with HF models.

Usage: .venv/bin/python harness/fsdp1_oracle.py [CASE ...]      (default: every FSDP1 case)
       .venv/bin/python harness/fsdp1_oracle.py --list
Writes tests/fixtures/fsdp1/<case>.json.

Per case (cases.py FSDP1_CASES): world_size processes (spawn, gloo, 127.0.0.1, a free port).
Each rank builds the HF model (torch.manual_seed(0), fp32) and wraps it in
  FullyShardedDataParallel(model, auto_wrap_policy=<transformer_auto_wrap_policy on
      model._no_split_modules | size_based_auto_wrap_policy(min_num_params=n)>,
      device_id=torch.device("cpu"), use_orig_params=False,
      sharding_strategy=FULL_SHARD, backward_prefetch=BACKWARD_PRE | BACKWARD_POST)
(everything else default: forward_prefetch=False, limit_all_gathers=True, no MixedPrecision),
then runs 2 steps of `loss = model(input_ids, labels).loss; backward; Adam(lr 1e-3).step;
zero_grad` on one fixed batch and records step 2's collectives in issue order. No memory: the
FSDPMemTracker is FSDP2-only, so "memory" is null.

Collectives: on CPU FSDP1 all-gathers a FlatParameter with `dist.all_gather(tensor_list, shard)`
(`_flat_param.py::FlatParamHandle._all_gather_flat_param`) and reduce-scatters with
`dist.reduce_scatter_tensor(out, padded_flat_grad)` (`_runtime_utils.py::_reduce_grad`); both are
called through the torch.distributed module attribute, which is what is wrapped here.
`numel` = all_gather: total output numel (the padded unsharded flat param, c*ws);
reduce_scatter: input numel (the flat grad padded to c*ws). `unit` = FQN of the FSDP instance's
wrapped module with the `_fsdp_wrapped_module.` prefixes removed ("" = root), taken from the
FlatParamHandle being all-gathered / reduced. Counts are cross-checked against the c10d ops seen
at dispatch level, and all ranks must issue the same sequence.
"""
import collections
import functools
import inspect
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

common.check_versions()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import transformers  # noqa: E402
from torch.distributed.fsdp import (  # noqa: E402
    BackwardPrefetch,
    FullyShardedDataParallel as FSDP,
    ShardingStrategy,
)
from torch.distributed.fsdp import _runtime_utils  # noqa: E402
from torch.distributed.fsdp._common_utils import clean_tensor_name  # noqa: E402
from torch.distributed.fsdp._flat_param import FlatParamHandle  # noqa: E402
from torch.distributed.fsdp.wrap import (  # noqa: E402
    size_based_auto_wrap_policy,
    transformer_auto_wrap_policy,
)
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

import cases as cases_mod  # noqa: E402

PREFETCH = {"pre": BackwardPrefetch.BACKWARD_PRE, "post": BackwardPrefetch.BACKWARD_POST}

# ----------------------------------------------------------------------------------------
# Collective logging


class _Log:
    recording = False
    events = []
    handle_stack = []     # FlatParamHandle being all-gathered / reduced
    hook_stack = []       # (hook name, FlatParamHandle) of the FSDP1 backward hook running
    unit_of = {}          # id(FlatParamHandle) -> unit FQN


def _unit(handle):
    return _Log.unit_of.get(id(handle), "?") if handle is not None else None


def _tensor_numel(x):
    if isinstance(x, torch.Tensor):
        return x.numel(), x.dtype
    numels = [t.numel() for t in x]
    return sum(numels), x[0].dtype


def _patch_collectives():
    """Wrap every torch.distributed collective FSDP1 may call at runtime."""
    specs = [
        ("all_gather", "all_gather", "tensor_list"),
        ("all_gather_into_tensor", "all_gather", "output_tensor"),
        ("reduce_scatter_tensor", "reduce_scatter", "input"),
        ("all_reduce", "all_reduce", "tensor"),
        ("broadcast", "broadcast", "tensor"),
    ]
    for fname, kind, argname in specs:
        fn = getattr(dist, fname)
        if getattr(fn, "_oracle_wrapped", False):
            continue
        sig = inspect.signature(fn)

        def wrapper(*args, __fn=fn, __sig=sig, __kind=kind, __arg=argname, __name=fname, **kwargs):
            if _Log.recording:
                ba = __sig.bind(*args, **kwargs)
                ba.apply_defaults()
                numel, dtype = _tensor_numel(ba.arguments[__arg])
                handle = _Log.handle_stack[-1] if _Log.handle_stack else None
                hook, hook_handle = _Log.hook_stack[-1] if _Log.hook_stack else ("forward", None)
                ev = {
                    "kind": __kind,
                    "unit": _unit(handle),
                    "numel": numel,
                    "dtype": common.dtype_name(dtype),
                    "group_size": dist.get_world_size(ba.arguments.get("group")),
                    "issued_in": hook,
                    "issued_by": _unit(hook_handle) if hook_handle is not None else None,
                    "training_state": handle._training_state.name if handle is not None else None,
                    "fn": __name,
                }
                if "op" in ba.arguments:
                    ev["op"] = str(ba.arguments["op"])
                _Log.events.append(ev)
            return __fn(*args, **kwargs)

        wrapper._oracle_wrapped = True
        setattr(dist, fname, wrapper)


def _push(stack, item, fn, *args, **kwargs):
    stack.append(item)
    try:
        return fn(*args, **kwargs)
    finally:
        stack.pop()


def _patch_attribution():
    """Attribute collectives to FlatParamHandles and to the hook that issued them.
    - FlatParamHandle._all_gather_flat_param (method; self = the handle all-gathered);
    - _runtime_utils._reduce_grad(state, handle) (looked up as a module global at call time);
    - _runtime_utils._pre_backward_hook(state, module, handle, ...) and
      _post_backward_hook(state, handle, ...): bound with functools.partial when registered in
      the first forward, so patching the module attributes before that is enough."""
    orig_ag = FlatParamHandle._all_gather_flat_param
    if not getattr(orig_ag, "_oracle_wrapped", False):
        @functools.wraps(orig_ag)
        def ag(self, *a, **k):
            return _push(_Log.handle_stack, self, orig_ag, self, *a, **k)
        ag._oracle_wrapped = True
        FlatParamHandle._all_gather_flat_param = ag

    orig_rg = _runtime_utils._reduce_grad
    if not getattr(orig_rg, "_oracle_wrapped", False):
        @functools.wraps(orig_rg)
        def rg(state, handle, *a, **k):
            return _push(_Log.handle_stack, handle, orig_rg, state, handle, *a, **k)
        rg._oracle_wrapped = True
        _runtime_utils._reduce_grad = rg

    orig_pre = _runtime_utils._pre_backward_hook
    if not getattr(orig_pre, "_oracle_wrapped", False):
        @functools.wraps(orig_pre)
        def pre(state, module, handle, *a, **k):
            return _push(_Log.hook_stack, ("pre_backward", handle), orig_pre, state, module, handle, *a, **k)
        pre._oracle_wrapped = True
        _runtime_utils._pre_backward_hook = pre

    orig_post = _runtime_utils._post_backward_hook
    if not getattr(orig_post, "_oracle_wrapped", False):
        @functools.wraps(orig_post)
        def post(state, handle, *a, **k):
            return _push(_Log.hook_stack, ("post_backward", handle), orig_post, state, handle, *a, **k)
        post._oracle_wrapped = True
        _runtime_utils._post_backward_hook = post


_C10D = torch.ops.c10d
_COMM_OPS = {
    _C10D.allgather_.default: "all_gather",
    _C10D._allgather_base_.default: "all_gather",
    _C10D._reduce_scatter_base_.default: "reduce_scatter",
    _C10D.reduce_scatter_.default: "reduce_scatter",
    _C10D.allreduce_.default: "all_reduce",
    _C10D.broadcast_.default: "broadcast",
}


class CommCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in _COMM_OPS:
            self.counts[_COMM_OPS[func]] += 1
        return func(*args, **(kwargs or {}))


# ----------------------------------------------------------------------------------------
# One rank


def _units(model):
    units = []
    for path, mod in model.named_modules():
        if not isinstance(mod, FSDP):
            continue
        name = clean_tensor_name(path)
        handle = mod._handle
        if handle is None:
            units.append({"name": name, "params": [], "numel": 0, "padded_numel": 0})
            continue
        fp = handle.flat_param
        prefix = f"{name}." if name else ""
        info = [
            {"name": prefix + clean_tensor_name(fqn), "shape": list(shape), "numel": numel}
            for fqn, shape, numel in zip(fp._fqns, fp._shapes, fp._numels)
        ]
        shared = [
            {"name": prefix + clean_tensor_name(f"{s.module_name}.{s.param_name}".lstrip(".")),
             "tied_to": prefix + clean_tensor_name(f"{s.prim_module_name}.{s.prim_param_name}".lstrip("."))}
            for s in fp._shared_param_infos
        ]
        units.append({
            "name": name,
            "is_root": bool(mod._is_root),
            "params": [p["name"] for p in info],
            "numel": fp._unpadded_unsharded_size.numel(),
            "padded_numel": fp._padded_unsharded_size.numel(),
            "sharded_numel": fp._sharded_size.numel(),
            "shard_numel_padded": fp._shard_numel_padded,
            "dtype": common.dtype_name(fp.dtype),
            "param_info": info,
            "shared_params": shared,
        })
    return units


def _wrap_policy(case, model):
    w = case["wrap"]
    if w == "transformer":
        classes = {type(m) for m in model.modules() if type(m).__name__ in model._no_split_modules}
        names = sorted(c.__name__ for c in classes)
        assert names == sorted(model._no_split_modules), (names, model._no_split_modules)
        return (functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=classes),
                ",".join(f"transformer:{n}" for n in names))
    if w.startswith("size:"):
        n = int(w[len("size:"):])
        return functools.partial(size_based_auto_wrap_policy, min_num_params=n), f"size:{n}"
    raise ValueError(w)


def _worker(rank, case_name, case, port, outdir):
    ws = case["world_size"]
    common.init_rank(rank, ws, port)
    try:
        _patch_collectives()
        _patch_attribution()

        cfg, model = common.build_fp32_model(case)
        assert all(p.dtype == torch.float32 for p in model.parameters())
        hf_param_numel = sum(p.numel() for p in model.parameters())

        policy, wrap_name = _wrap_policy(case, model)
        model = FSDP(
            model,
            auto_wrap_policy=policy,
            device_id=torch.device("cpu"),
            use_orig_params=False,
            sharding_strategy=ShardingStrategy.FULL_SHARD,
            backward_prefetch=PREFETCH[case["backward_prefetch"]],
        )
        for m in model.modules():
            if isinstance(m, FSDP) and m._handle is not None:
                _Log.unit_of[id(m._handle)] = clean_tensor_name(
                    next(p for p, x in model.named_modules() if x is m))

        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        gen = torch.Generator().manual_seed(1234)
        input_ids = torch.randint(0, cfg.vocab_size, (case["batch"], case["seq"]), generator=gen)
        labels = input_ids.clone()

        counter = CommCounter()
        losses = []
        for step in (1, 2):
            if step == 2:
                _Log.recording = True
                counter.__enter__()
            loss = model(input_ids=input_ids, labels=labels).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            if step == 2:
                counter.__exit__(None, None, None)
                _Log.recording = False
            losses.append(loss.item())

        py_counts = dict(collections.Counter(e["kind"] for e in _Log.events))
        disp_counts = dict(counter.counts)
        assert py_counts == disp_counts, (
            f"python-level collective log {py_counts} != c10d ops seen at dispatch {disp_counts}")
        assert set(py_counts) <= {"all_gather", "reduce_scatter"}, py_counts
        res = {
            "rank": rank,
            "hf_param_numel": hf_param_numel,
            "wrap": wrap_name,
            "attn_impl_effective": model.module.config._attn_implementation,
            "units": _units(model),
            "collectives": _Log.events,
            "dispatch_comm_counts": disp_counts,
            "losses": losses,
        }
        common.write_json(os.path.join(outdir, f"rank{rank}.json"), res)
    finally:
        dist.destroy_process_group()


# ----------------------------------------------------------------------------------------
# Driver


def run_case(name, case):
    ws = case["world_size"]
    with tempfile.TemporaryDirectory(prefix=f"fsdp1_{name}_") as tmp:
        mp.spawn(_worker, args=(name, case, common.free_port(), tmp), nprocs=ws, join=True)
        ranks = []
        for r in range(ws):
            with open(os.path.join(tmp, f"rank{r}.json")) as f:
                ranks.append(json.load(f))
    r0 = ranks[0]
    for r in ranks[1:]:
        assert [common.collective_key(e) for e in r["collectives"]] == [common.collective_key(e) for e in r0["collectives"]], \
            f"{name}: rank {r['rank']} issued different collectives than rank 0"
    units = r0["units"]
    for ui, u in enumerate(units):
        if "shard_numel_padded" in u:
            u["shard_numel_padded_per_rank"] = [r["units"][ui]["shard_numel_padded"] for r in ranks]
            del u["shard_numel_padded"]
    collectives = []
    for e in r0["collectives"]:
        c = common.collective_key(e)
        c.update({k: e[k] for k in ("group_size", "issued_in", "issued_by", "training_state", "op")
                  if k in e})
        collectives.append(c)
    return {
        **common.fixture_head(name, case["model"]),
        "options": {
            "world_size": ws,
            "batch": case["batch"],
            "seq": case["seq"],
            "attn_implementation": case["attn_implementation"],
            "param_dtype": None,
            "reduce_dtype": None,
            "reshard_after_forward": True,
            "root_reshard_after_forward": None,
            "optimizer": "adam",
            "lr": 1e-3,
            "steps": 2,
            "measured_step": 2,
            "wrap": r0["wrap"],
            "device": "cpu",
            "backend": "gloo",
            "layout": "flat",
            "strategy": "full-shard",
            "backward_prefetch": case["backward_prefetch"],
            "forward_prefetch": 0,
            "use_orig_params": False,
            "limit_all_gathers": True,
        },
        "attn_implementation_effective": r0["attn_impl_effective"],
        "hf_param_numel": r0["hf_param_numel"],
        "losses_rank0": r0["losses"],
        "units": units,
        "collective_counts": r0["dispatch_comm_counts"],
        "collectives": collectives,
        "memory": None,
    }


def main(argv):
    common.case_main(argv, cases_mod.fsdp1_cases(), run_case, "fsdp1")


if __name__ == "__main__":
    main(sys.argv[1:])
