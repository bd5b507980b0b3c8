"""Ground truth from real PyTorch FSDP2 (fully_shard) on CPU/gloo with HF models.

Usage: .venv/bin/python harness/fsdp2_oracle.py [CASE ...]      (default: every case in cases.py)
       .venv/bin/python harness/fsdp2_oracle.py --list
Writes tests/fixtures/fsdp2/<case>.json.

Per case: world_size processes (torch.multiprocessing spawn, gloo, 127.0.0.1, a free port).
Each rank builds the HF model (torch.manual_seed(0), fp32), calls fully_shard on every
instance of model._no_split_modules, then on the root, runs 2 training steps (Adam lr 1e-3 unless the case names AdamW or SGD,
loss = model(input_ids, labels=labels).loss, labels a copy of the ids) inside FSDPMemTracker and records step 2:
  - the collectives FSDP issues (Python-level patch of torch.distributed.* , cross-checked
    against the c10d ops seen at dispatch level), attributed to the FSDP group being
    unsharded / post-backward'ed;
  - the FSDPMemTracker peak snapshot of step 2 (peak reset after step 1) and where it happened;
  - the FSDP groups (param order, sharded / padded sizes).
"""
import collections
import copy
import inspect
import functools
import os
import re
import sys
import tempfile
import time
import json

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

common.check_versions()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import transformers  # noqa: E402
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # noqa: E402
from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402
from torch.utils.weak import WeakIdKeyDictionary  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from transformers.modeling_layers import GradientCheckpointingLayer  # noqa: E402

import cases as cases_mod  # noqa: E402

CATEGORY_KEYS = {
    "Sharded Param": "sharded_param",
    "Unsharded Param": "unsharded_param",
    "Sharded Grad": "sharded_grad",
    "Unsharded Grad": "unsharded_grad",
    "Activation": "activation",
    "Temp": "temp",
    "All Gather": "all_gather",
    "Reduce Scatter": "reduce_scatter",
    "OptState": "optstate",
    "Inputs": "inputs",
    "Buffer": "buffer",
    "Total": "total",
}

# ----------------------------------------------------------------------------------------
# Collective logging


class _Log:
    gloo = True          # False under fsdp2_fake.py's fake process group
    recording = False
    events = []          # collectives of the recorded step, in issue order
    group_stack = []     # (FSDPParamGroup, hook name) currently running


def _current_unit():
    if not _Log.group_stack:
        return None, None, None
    group, hook = _Log.group_stack[-1]
    return group._module_fqn, hook, group._training_state.name


def _storages(args, kwargs):
    seen, out = set(), []
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.Tensor):
            st = a.untyped_storage()
            if st.data_ptr() not in seen:
                seen.add(st.data_ptr())
                out.append(st)
    return out


def _wait_for_release(sts, counts, name, timeout=30.0):
    """ProcessGroupGloo's worker thread keeps its own references to the collective's tensors
    for a moment after work.wait() returns, and drops them whenever it next gets the GIL.
    If FSDP has already dropped its references, the storage is then freed at a random point
    of the main thread's op stream, which made FSDPMemTracker peaks flip between runs
    (seen: an AG buffer counted twice at the next prefetch). Wait here until the storages'
    use counts are back to what they were before the call, so frees happen where FSDP
    drops its references, as with NCCL/CUDA stream-ordered frees."""
    deadline = time.monotonic() + timeout
    while any(torch._C._storage_Use_Count(st._cdata) > c for st, c in zip(sts, counts)):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name}: gloo did not release its tensor references")
        time.sleep(2e-5)


def _patch_collectives():
    """Wrap the torch.distributed functions FSDP2 calls. In torch 2.11,
    _fsdp_collectives.py does `import torch.distributed as dist` and calls
    `dist.all_gather_into_tensor` / `dist.reduce_scatter_tensor` / `dist.all_reduce` through
    the module attribute at call time, so patching the attributes of torch.distributed is
    what FSDP sees. (torch >= 2.13 calls all_gather_single / reduce_scatter_single instead;
    those are wrapped too when present.)"""
    specs = [
        ("all_gather_into_tensor", "all_gather", "output_tensor"),
        ("all_gather_single", "all_gather", "output"),
        ("reduce_scatter_tensor", "reduce_scatter", "input"),
        ("reduce_scatter_single", "reduce_scatter", "input"),
        ("all_reduce", "all_reduce", "tensor"),
    ]
    for fname, kind, argname in specs:
        fn = getattr(dist, fname, None)
        if fn is None or getattr(fn, "_oracle_wrapped", False):
            continue
        sig = inspect.signature(fn)

        def wrapper(*args, __fn=fn, __sig=sig, __kind=kind, __arg=argname, __name=fname, **kwargs):
            if _Log.recording:
                ba = __sig.bind(*args, **kwargs)
                ba.apply_defaults()
                t = ba.arguments[__arg]
                group = ba.arguments.get("group")
                unit, hook, state = _current_unit()
                ev = {
                    "kind": __kind,
                    "unit": unit,
                    "numel": t.numel(),
                    "dtype": common.dtype_name(t.dtype),
                    "group_size": dist.get_world_size(group),
                    "hook": hook,
                    "training_state": state,
                    "fn": __name,
                }
                if "op" in ba.arguments:
                    ev["op"] = str(ba.arguments["op"])
                _Log.events.append(ev)
            if not _Log.gloo:  # fake process group (fsdp2_fake.py): no storages to wait for
                return __fn(*args, **kwargs)
            sts = _storages(args, kwargs)
            counts = [torch._C._storage_Use_Count(st._cdata) for st in sts]
            out = __fn(*args, **kwargs)
            if out is None:  # synchronous: make gloo's tensor release deterministic
                _wait_for_release(sts, counts, __name)
            return out

        wrapper._oracle_wrapped = True
        setattr(dist, fname, wrapper)


def _patch_group_context():
    """Attribute collectives to FSDP groups: every AG is issued inside FSDPParamGroup.unshard
    (own unshard or a prefetch of the target group), every RS / HSDP AR inside
    FSDPParamGroup.post_backward. Patched on the class before FSDPMemTracker instruments the
    instances, so the tracker's wrappers call through these."""
    for meth in ("unshard", "post_backward"):
        orig = getattr(FSDPParamGroup, meth)
        if getattr(orig, "_oracle_wrapped", False):
            continue

        def wrapped(self, *args, __orig=orig, __meth=meth, **kwargs):
            _Log.group_stack.append((self, __meth))
            try:
                return __orig(self, *args, **kwargs)
            finally:
                _Log.group_stack.pop()

        wrapped._oracle_wrapped = True
        setattr(FSDPParamGroup, meth, wrapped)


# ----------------------------------------------------------------------------------------
# Memory tracker that also records where the peak happened

_C10D = torch.ops.c10d
_COMM_OPS = {
    _C10D._allgather_base_.default: "all_gather",
    _C10D._reduce_scatter_base_.default: "reduce_scatter",
    _C10D.allreduce_.default: "all_reduce",
}


class WhereTracker(FSDPMemTracker):
    """FSDPMemTracker with where the peak is, the collectives it saw at dispatch, and unit
    groups kept intact: PyTorch 2.11's tracker replaces each FSDP module's forward hooks
    with plain per-module ones, which for `fully_shard([m0, m1])` (one state, group hooks:
    gather before the first module, reshard after the last) gathers and reshards at every
    member and reduce-scatters per member — another schedule than FSDP2 runs untracked. Here
    a state shared by several modules is instrumented once, through the group hooks. It stays
    out of torch.compile's tracing and sees the compiled code's ops when they run
    (`ignore_compile_internals`)."""

    @classmethod
    def ignore_compile_internals(cls):
        return True

    def _instrument_fsdp_module(self):
        from torch.distributed._tools.fsdp2_mem_tracker import _SavedFSDPMethods
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.fsdp._fully_shard._fsdp_state import _register_group_forward_hooks
        states = {}
        for module in self._root_mod.modules():
            if isinstance(module, FSDPModule):
                st = module._get_fsdp_state()
                if st._fsdp_param_group and len(st._modules) > 1:
                    states.setdefault(id(st), (st, module))
        if not states:
            return super()._instrument_fsdp_module()
        # groups: take them out of the module walk the tracker does, instrument them here
        grouped = {id(m) for st, _ in states.values() for m in st._modules}
        orig_modules = self._root_mod.modules

        def modules_without_groups():
            return (m for m in orig_modules() if id(m) not in grouped)
        self._root_mod.modules = modules_without_groups
        try:
            super()._instrument_fsdp_module()
        finally:
            del self._root_mod.modules
        for st, first in states.values():
            group = st._fsdp_param_group
            st._pre_forward_hook_handle.remove()
            self._instrument_fsdp_sharded_params_grads(group)
            handle = _register_group_forward_hooks(
                st._modules,
                self._fsdp_state_pre_forward(first, st._pre_forward),
                self._fsdp_state_post_forward(first, st._post_forward),
                st._modules_to_run_forward,
            )
            st._pre_forward_hook_handle = handle
            st._post_forward_hook_handle = handle
            self._fsdp_mod_to_saved_methods[first] = _SavedFSDPMethods(group.pre_backward, group.post_backward)
            group.pre_backward = self._fsdp_param_group_pre_backward(first, group.pre_backward)
            group.post_backward = self._fsdp_param_group_post_backward(first, group.post_backward)
        self._groups = list(states.values())

    def _deregister_module_and_optimizer_hooks(self):
        from torch.distributed.fsdp._fully_shard._fsdp_state import _register_group_forward_hooks
        groups = getattr(self, "_groups", [])
        group_saved = {}
        for st, first in groups:
            group_saved[id(st)] = self._fsdp_mod_to_saved_methods.pop(first, None)
        super()._deregister_module_and_optimizer_hooks()
        for st, first in groups:
            st._pre_forward_hook_handle.remove()
            handle = _register_group_forward_hooks(st._modules, st._pre_forward, st._post_forward, st._modules_to_run_forward)
            st._pre_forward_hook_handle = handle
            st._post_forward_hook_handle = handle
            sv = group_saved[id(st)]
            if sv is not None:
                st._fsdp_param_group.pre_backward = sv.pre_backward
                st._fsdp_param_group.post_backward = sv.post_backward
        self._groups = []

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self._cur_func = None
        self.peak_where = None
        self.count_comms = False
        self.dispatch_comm_counts = collections.Counter()
        self.trace = []
        # ORACLE_LIVE: which op made each storage, and the live ones at the newest peak
        self._made_by = WeakIdKeyDictionary()
        self.live_at_peak = []
        # the device whose peak is recorded (None: the only one); the host's is kept beside it
        self.main_device = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not any(t == DTensor for t in types):
            self._cur_func = func
            if self.count_comms and func in _COMM_OPS:
                self.dispatch_comm_counts[_COMM_OPS[func]] += 1
        res = super().__torch_dispatch__(func, types, args, kwargs)
        if self.count_comms and os.environ.get("ORACLE_TRACE") and not any(t == DTensor for t in types):
            snap = next((v for d, v in self._curr_mem_snap.items()
                         if self.main_device is None or d.type == self.main_device))
            deepest = max(self._mod_tracker.parents, key=lambda p: p.count("."), default="")
            self.trace.append((str(func), self._fsdp_state.name, "bw" if self._mod_tracker.is_bw else "fw", deepest,
                               {getattr(k, "value", k): v for k, v in snap.items()}))
        if self.count_comms and os.environ.get("ORACLE_LIVE"):
            for t in res if isinstance(res, (tuple, list)) else [res]:
                if isinstance(t, torch.Tensor) and not isinstance(t, DTensor):
                    st = t.untyped_storage()
                    if st not in self._made_by:
                        deepest = max(self._mod_tracker.parents, key=lambda p: p.count("."), default="")
                        self._made_by[st] = (str(func), "bw" if self._mod_tracker.is_bw else "fw", deepest,
                                             str(t.dtype).removeprefix("torch."), list(t.shape))
        return res

    def _update_peak_stats(self, peak_state):
        before = {d: v for d, v in self._peak_mem.items() if self.main_device in (None, d.type)}
        super()._update_peak_stats(peak_state)
        if {d: v for d, v in self._peak_mem.items() if self.main_device in (None, d.type)} != before:
            parents = sorted(self._mod_tracker.parents)
            root_name = type(self._root_mod).__name__
            named = [p for p in parents if p == root_name or p.startswith(root_name + ".")]
            deepest = max(named, key=lambda p: p.count("."), default=None)
            if deepest is not None:
                deepest = deepest[len(root_name) + 1:] if deepest != root_name else ""
            self.peak_where = {
                "op": str(self._cur_func),
                "module": deepest,
                "modules": parents,
                "pass": "bw" if self._mod_tracker.is_bw else "fw",
                "fsdp_state": self._fsdp_state.name,
                "in_optimizer_step": bool(self._in_opt),
            }
            if self.count_comms and os.environ.get("ORACLE_LIVE"):
                self.live_at_peak = sorted(
                    # (a storage made inside the op at the peak is not in _made_by yet)
                    ({"category": w.reftype.value, "bytes": w.mem_consumed,
                      "made_by": list(self._made_by.get(st, (f"{self._cur_func} at the peak, or before step 2", "")))}
                     for st, (w, _) in list(self._WINFO.items())),
                    key=lambda e: (e["category"], -e["bytes"]))

    def reset_peak(self):
        cur = self.get_tracker_snapshot("current")
        self._peak_mem_snap = cur
        self._peak_mem = {dev: snap[FSDP_TOTAL] for dev, snap in cur.items()}
        self.peak_where = None


FSDP_TOTAL = "Total"


def _breakdown(snap_by_dev, device=None):
    """One device's snapshot by category: the only device, or `device` (a device type) of a
    run that has the host beside it (fakegpu cases)."""
    if device is None:
        assert len(snap_by_dev) == 1, snap_by_dev.keys()
        (snap,) = snap_by_dev.values()
    else:
        snap = next((v for d, v in snap_by_dev.items() if d.type == device), {})
    out = {k: 0 for k in CATEGORY_KEYS.values()}
    for k, v in snap.items():
        key = getattr(k, "value", k)
        out[CATEGORY_KEYS[key]] = int(v)
    return out


# ----------------------------------------------------------------------------------------
# One rank


def _dtype(name):
    return None if name is None else getattr(torch, name)


def _units(model):
    units = []
    seen = set()
    for fqn, mod in model.named_modules():
        get_state = getattr(mod, "_get_fsdp_state", None)
        if get_state is None:
            continue
        # (modules fully_shard'ed together share one state: one unit, named by its first)
        if id(get_state()) in seen:
            continue
        seen.add(id(get_state()))
        group = get_state()._fsdp_param_group
        if group is None:
            units.append({"name": fqn, "params": [], "param_info": [], "numel": 0, "padded_numel": 0})
            continue
        info = []
        for fp in group.fsdp_params:
            numel = fp._orig_size.numel()
            padded_shard = fp.padded_sharded_param_size.numel()
            shard_ws = group.mesh_info.shard_mesh_size  # ws, or the shard dim for HSDP
            info.append({
                "name": fp._param_fqn,
                "shape": list(fp._orig_size),
                "numel": numel,
                "sharded_numel": fp.sharded_size.numel(),
                "padded_sharded_numel": padded_shard,
                "padded_numel": padded_shard * shard_ws,
                "dtype": common.dtype_name(fp.orig_dtype),
            })
        units.append({
            "name": fqn,
            "params": [p["name"] for p in info],
            "numel": sum(p["numel"] for p in info),
            "padded_numel": sum(p["padded_numel"] for p in info),
            "reshard_after_forward": group.post_forward_mesh_info is not None,
            "param_info": info,
        })
    return units


def op_sac_context_fn():
    """torchtitan's op-level selective AC (parallelize_llama.py @9dec370, `_apply_ac_to_transformer_block`):
    per checkpoint call, MUST_SAVE the outputs of every other aten.mm (the 1st, 3rd, ...), of
    SDPA's kernel (the CPU flash kernel too: these runs are on the CPU) and of `abs` and `max`
    ("for low precision training": float8's amax), PREFER_RECOMPUTE the rest."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
    aten = torch.ops.aten
    save = {aten.mm.default, aten._scaled_dot_product_efficient_attention.default,
            aten._scaled_dot_product_flash_attention.default,
            aten._scaled_dot_product_flash_attention_for_cpu.default,
            aten.abs.default, aten.max.default}
    meta = collections.defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        mode = "recompute" if ctx.is_recompute else "forward"
        if func == aten.mm.default:
            meta[f"{mode}_mm_count"] += 1
        to_save = func in save and not (func == aten.mm.default and meta[f"{mode}_mm_count"] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if to_save else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def enable_checkpointing(model, case, cfg):
    """HF's non-reentrant gradient checkpointing of the case's layer classes, or of the layers
    named by module path (a subset of the blocks). HF GradientCheckpointingLayer: __call__ runs
    torch.utils.checkpoint(partial(nn.Module.__call__)), so FSDP's module hooks run inside the
    checkpoint. An entry `NAME=selective-op` / `NAME=full` gives that layer (or class) its own
    mode (the layer's `_gradient_checkpointing_func`), else the case's ac_mode."""
    if not case["checkpoint"]:
        return
    default = case.get("ac_mode", "full")
    specs = {}
    for entry in case["checkpoint"]:
        name, _, mode = entry.partition("=")
        specs[name] = mode or default
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    # (compiled cases as torchtitan's checkpoint_wrapper calls it, preserve_rng_state=False:
    # under torch.compile saving the RNG state is a higher-order op the fake device has no
    # kernel for; the eager cases keep checkpoint's default)
    rng = {"preserve_rng_state": False} if case.get("compile") else {}
    funcs = {
        "full": functools.partial(torch.utils.checkpoint.checkpoint, use_reentrant=False, **rng),
        "selective-op": functools.partial(torch.utils.checkpoint.checkpoint, use_reentrant=False,
                                          context_fn=op_sac_context_fn, **rng),
    }
    names = set(specs)
    layers = [(path, m) for path, m in model.named_modules() if isinstance(m, GradientCheckpointingLayer)]
    outside = case.get("ac_wrapper", "hf") == "torchtitan"
    ckpt = []
    for path, m in layers:
        mode = specs.get(path, specs.get(type(m).__name__))
        if mode is not None:
            ckpt.append((path, type(m).__name__))
        if outside and mode is not None:
            # torchtitan's order: checkpoint_wrapper around the block, then fully_shard on the
            # wrapper — FSDP's hooks (the unshard; with float8 all-gather torchao's casts of the
            # weight shards: abs, max) run outside the checkpoint and SAC's cache, and not in the
            # recompute. HF's GradientCheckpointingLayer checkpoints nn.Module.__call__, hooks
            # inside. Here the block's own forward runs under the checkpoint (no FQN changes).
            m.gradient_checkpointing = False
            m.forward = functools.partial(funcs[mode], m.forward)
            continue
        m.gradient_checkpointing = mode is not None
        if mode is not None:
            m._gradient_checkpointing_func = funcs[mode]
    assert {p for p, _ in ckpt} | {c for _, c in ckpt} >= names, (names, ckpt)
    assert all(type(m).__name__ not in names for p, m in layers if (p, type(m).__name__) not in ckpt)


def _constant_folding_on_host():
    """Inductor's joint-graph pass folds uniform-valued tensors (`full`) by running their ops
    on one-element tensors of the graph's device; on the fake accelerator they run on the
    host instead (the same values: what is folded, and so what the partitioner sees, is
    unchanged)."""
    from torch._inductor.fx_passes import joint_graph
    cls = joint_graph.UniformValueConstantFolder
    orig = cls._deduce_value
    if getattr(orig, "_on_host", False):
        return

    def deduce(self, node):
        dev = node.kwargs.get("device") if node.op == "call_function" else None
        if dev is None or torch.device(dev).type in ("cpu", "meta"):
            return orig(self, node)
        kwargs = node.kwargs
        node.kwargs = dict(kwargs, device=torch.device("cpu"))
        try:
            return orig(self, node)
        finally:
            node.kwargs = kwargs
    deduce._on_host = True
    cls._deduce_value = deduce


def inductor_partition_backend():
    """torch.compile's inductor up to its code generation: AOTAutograd with inductor's
    decompositions and its partition function (its joint-graph passes, then the min-cut
    rematerialization partitioner: what the forward saves for the backward, what the backward
    recomputes), the partitioned graphs run as they are (no fusion; fake tensors have no data
    for generated kernels to read)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.backends.debugging import get_nop_func
    from torch._inductor import compile_fx
    _constant_folding_on_host()
    return aot_autograd(fw_compiler=get_nop_func(), bw_compiler=get_nop_func(),
                        decompositions=compile_fx.select_decomp_table(),
                        partition_fn=compile_fx.partition_fn)


def _rng_ops_through_tracker():
    """A compiled checkpoint's graphs wrap the ops that draw random numbers (SDPA's flash
    kernel) in `run_and_save_rng_state` / `run_with_rng_state` so that the recompute draws
    the same: higher-order ops, which FSDPMemTracker has no rule for. Its rule here runs the
    op under the tracker (its outputs counted as any op's) and makes the state a host tensor,
    as CUDA's `get_rng_state()` is (16 bytes: seed and offset)."""
    from torch._prims.rng_prims import run_and_save_rng_state, run_with_rng_state
    if WhereTracker in run_and_save_rng_state.python_key_table:
        return

    def save(mode, op, *args, **kwargs):
        state = torch.zeros(16, dtype=torch.uint8)
        with mode:
            return state, op(*args, **kwargs)

    def replay(mode, rng_state, op, *args, **kwargs):
        with mode:
            return op(*args, **kwargs)
    run_and_save_rng_state.py_impl(WhereTracker)(save)
    run_with_rng_state.py_impl(WhereTracker)(replay)


def compile_blocks(model, case):
    """torchtitan's --compile (parallelize_llama.py, `apply_compile`): every decoder block
    under `torch.compile(fullgraph=True)` after its checkpoint wrapper and before fully_shard
    (FSDP's hooks outside the compiled code), here each block's forward, with
    `inductor_partition_backend`. torchtitan's model has no KV cache (HF's DynamicCache is off:
    `use_cache=False`)."""
    if not case.get("compile"):
        return
    assert case.get("ac_wrapper", "hf") == "torchtitan" or not case["checkpoint"], case
    # (each case compiles from a fresh dynamo, as one training run does: cases run before it
    # in this process would otherwise make dynamo recompile these blocks with dynamic shapes,
    # whose graphs the partitioner cuts elsewhere)
    torch._dynamo.reset()
    model.config.use_cache = False
    _rng_ops_through_tracker()
    backend = inductor_partition_backend()
    blocks = [m for m in model.modules() if type(m).__name__ in model._no_split_modules]
    assert blocks, model._no_split_modules
    for m in blocks:
        m.forward = torch.compile(m.forward, backend=backend, fullgraph=True)


def make_mesh(case, device="cpu"):
    """The case's DeviceMesh on `device` (the CPU, or harness/fakegpu.py's fake accelerator):
    1-D, or 2-D (replicate, shard) for hybrid sharding."""
    ws = case["world_size"]
    if case["strategy"] == "hybrid-shard":
        sg = case["shard_group_size"]
        assert ws % sg == 0
        return init_device_mesh(device, (ws // sg, sg), mesh_dim_names=("replicate", "shard"))
    assert case["strategy"] == "full-shard" and case["shard_group_size"] is None
    return init_device_mesh(device, (ws,))


def _post_order(mod, prefix=""):
    """(path, module) of every submodule, children before their parent, siblings in order."""
    for name, child in mod.named_children():
        yield from _post_order(child, f"{prefix}.{name}" if prefix else name)
    yield prefix, mod


def wrap_policy(model, case):
    """The case's wrap as the planner's --policy (default: transformer:<_no_split_modules>)."""
    return case["wrap"] or "transformer:" + ",".join(model._no_split_modules)


def unit_reshard(case, units):
    """reshard_after_forward of each unit (its modules' (path, module) list, units in forward
    order): the case's default, over which `unit_reshard` names units by the path of one of
    their modules or a pattern of paths (`model.layers.{2..3}`: every unit it matches), or
    `last` for the last one (the planner's `--unit-reshard`)."""
    out = [case["reshard_after_forward"] for _ in units]
    for name, value in (case.get("unit_reshard") or {}).items():
        pattern = module_pattern(name)
        at = [i for i, unit in enumerate(units) if name == "last" and i == len(units) - 1
              or name != "last" and any(pattern.fullmatch(path) for path, _ in unit)]
        assert at, (name, [unit[0][0] for unit in units])
        for i in at:
            out[i] = value
    return out


def _float8_gemms_seen_by(tracker):
    """FSDPMemTracker is a dispatch mode: it counts what the ops it sees return. torchao's
    float8 GEMM runs inside Float8TrainingTensor's own __torch_dispatch__, where the tracker is
    off the mode stack: the operand copies `_scaled_mm` needs, the inverse scales and (rowwise)
    their outer product are allocated on the device but never counted. Here the tracker is
    pushed back onto the mode stack (not re-entered: no hooks, no reset) for the GEMM's
    insides, so that the truth counts every allocation the device makes."""
    from torch.utils._python_dispatch import _pop_mode, _push_mode
    from torchao.float8 import float8_ops
    global _FLOAT8_TRACKER
    _FLOAT8_TRACKER = tracker  # (one process runs several cases: the wrappers read this)
    table = float8_ops.FLOAT8_OPS_TABLE
    for op, fn in list(table.items()):
        if getattr(fn, "_seen", False) or fn.__name__ not in ("float8_mm", "float8_addmm"):
            continue

        def seen(aten_op, args, kwargs=None, _fn=fn):
            if torch._guards.TracingContext.try_get() is not None:
                # (torch.compile tracing the GEMM: no device memory; at run time the compiled
                # graph calls `_scaled_mm` itself, under the tracker)
                return _fn(aten_op, args, kwargs)
            _push_mode(_FLOAT8_TRACKER)
            try:
                return _fn(aten_op, args, kwargs)
            finally:
                _pop_mode()
        seen._seen = True
        table[op] = seen


_FLOAT8_TRACKER = None


def convert_float8(model, case):
    """torchao's float8 training (torchtitan's `--float8`): every nn.Linear but the output
    head whose dims are multiples of 16 (torchtitan's filter) becomes a Float8Linear with the case's recipe (tensorwise: dynamic scaling, e4m3
    input/weight, e5m2 grad; rowwise: torchao's "rowwise" recipe, scales per row / column,
    rounded to powers of 2, e4m3 everywhere); `float8_all_gather` all-gathers the weights in
    float8 (tensorwise only)."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    assert case["float8"] in ("tensorwise", "rowwise"), case["float8"]
    if case["float8"] == "rowwise":
        assert not case.get("float8_all_gather"), "torchao gathers float8 weights for tensorwise scaling only"
        cfg = Float8LinearConfig.from_recipe_name("rowwise")
    else:
        cfg = Float8LinearConfig(enable_fsdp_float8_all_gather=bool(case.get("float8_all_gather")))
    # torchtitan's module_filter_fn: dims multiples of 16, not the output head
    convert_to_float8_training(model, config=cfg, module_filter_fn=lambda mod, fqn: (
        fqn != "lm_head" and mod.in_features % 16 == 0 and mod.out_features % 16 == 0))


def module_pattern(name):
    """A `modules:` entry as the planner reads it (`planner/src/wrap.rs` glob_match): per
    path component, `*` any text within it, `{a..b}` a number from a to b."""
    parts = []
    for comp in re.split(r"\.(?![^{]*\})", name):
        m = re.fullmatch(r"(.*)\{(\d+)\.\.(\d+)\}(.*)", comp)
        if m:
            nums = "|".join(str(i) for i in range(int(m[2]), int(m[3]) + 1))
            parts.append(re.escape(m[1]) + f"(?:{nums})" + re.escape(m[4]))
        else:
            parts.append("[^.]*".join(re.escape(x) for x in comp.split("*")))
    return re.compile(r"\.".join(parts))


def shard_placement(model, rules):
    """FSDP2's `shard_placement_fn` for the case's `shard_dim` ([[param pattern, dim], ...],
    the planner's --shard-dim: the last matching entry wins; a param none matches keeps
    FSDP2's default Shard(0)). Names are taken before any fully_shard (it swaps the params)."""
    from torch.distributed.tensor import Shard
    rules = [(module_pattern(p), d) for p, d in rules]
    names = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(n)

    def placement(param):
        ns = names.get(id(param), [])
        for pat, d in reversed(rules):
            if any(pat.fullmatch(n) for n in ns):
                return Shard(d)
        return None
    return placement


def shard_model(model, case, mesh, cfg):
    """fully_shard on the case's modules (`wrap`; default every instance of
    model._no_split_modules, the decoder layers), children before parents, the case's explicit
    prefetch between the units in forward order, then on the root; returns the wrap as the planner's
    --policy."""
    kw = {"mesh": mesh}
    if case.get("offload"):
        # FSDP2's CPUOffloadPolicy; pin_memory=False only because fake tensors cannot be pinned
        # (aten._pin_memory has no fake kernel): the same bytes on the same devices, the
        # copies blocking instead of non_blocking
        from torch.distributed.fsdp import CPUOffloadPolicy
        kw["offload_policy"] = CPUOffloadPolicy(pin_memory=False)
    if case["param_dtype"] or case["reduce_dtype"]:
        kw["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=_dtype(case["param_dtype"]), reduce_dtype=_dtype(case["reduce_dtype"]))
    if case.get("shard_dim"):
        kw["shard_placement_fn"] = shard_placement(model, case["shard_dim"])
    policy = wrap_policy(model, case)
    if case.get("float8"):
        convert_float8(model, case)
    kind, _, names = policy.partition(":")
    names = names.split(",")
    assert kind in ("transformer", "modules") and names, policy
    # `a+b`: one unit of those modules, one `fully_shard([a, b])` call (torchtitan's
    # `fully_shard([model.norm, model.output])`; the planner's `wrap::group`)
    explicit = [n.split("+") for n in names if "+" in n] if kind == "modules" else []
    names = [m for n in names for m in n.split("+")] if kind == "modules" else names
    group_of = {m: i for i, g in enumerate(explicit) for m in g}
    patterns = [module_pattern(n) for n in names] if kind == "modules" else []
    targets = [(path, mod) for path, mod in _post_order(model) if path and (
        type(mod).__name__ in names if kind == "transformer" else any(p.fullmatch(path) for p in patterns))]
    assert targets and all(any(p.fullmatch(path) for path, _ in targets) for p in patterns), (policy, targets)
    # (fully_shard changes a module's class to FSDP<Class>: the decoder layers are found first)
    layers = [mod for _, mod in targets if type(mod).__name__ in model._no_split_modules]
    k = case.get("unit_group", 1)
    # the FSDP units, each the modules of one fully_shard call: with unit groups, runs of
    # consecutive sibling modules of one class (model.layers.0, model.layers.1, …) cut into
    # groups of k in forward order (a shorter last group), every other target alone — the
    # planner's `wrap::group`
    def numbered(path):
        pre, _, n = path.rpartition(".")
        return (pre, int(n)) if pre and n.isdigit() else None
    units = []
    explicit_units = [[] for _ in explicit]
    for path, mod in targets:
        if path in group_of:
            explicit_units[group_of[path]].append((path, mod))
            continue
        prev = units[-1][-1] if units else None
        run = prev is not None and numbered(path) is not None and numbered(prev[0]) is not None \
            and numbered(path) == (numbered(prev[0])[0], numbered(prev[0])[1] + 1) and type(mod) is type(prev[1])
        if k > 1 and run and len(units[-1]) < k:
            units[-1].append((path, mod))
        else:
            units.append([(path, mod)])
    # the units in forward order (module registration pre-order, the forward's for these models)
    order = {name: i for i, (name, _) in enumerate(model.named_modules())}
    for unit in explicit_units:
        unit.sort(key=lambda pm: order[pm[0]])
    if explicit_units:
        # (fully_shard called children first: each unit after every unit inside it)
        post = {path: i for i, (path, _) in enumerate(_post_order(model))}
        units = sorted(units + explicit_units, key=lambda unit: max(post[path] for path, _ in unit))
    forward = sorted(units, key=lambda unit: order[unit[0][0]])
    raf = dict(zip((id(unit) for unit in forward), unit_reshard(case, forward)))
    for unit in units:
        # (a list, as FSDP2's `fully_shard([block_i, …, block_i+k-1])`, when grouping)
        fully_shard([mod for _, mod in unit] if k > 1 or len(unit) > 1 else unit[0][1], reshard_after_forward=raf[id(unit)], **kw)
    if case["wrap"] is None:
        assert len(layers) == cfg.num_hidden_layers, (len(layers), policy)
    # explicit prefetch as torchtitan chains it (tok_embeddings -> block 0 -> … -> the output
    # head, and back): between the units in forward order, each through its first module (a
    # group's modules share one FSDP state, whose prefetch list is the group's)
    leaders = [unit[0][1] for unit in forward]
    if case["forward_prefetch"]:
        n = case["forward_prefetch"]
        for i, lead in enumerate(leaders):
            ahead = leaders[i + 1:i + 1 + n]
            if ahead:
                lead.set_modules_to_forward_prefetch(ahead)
    if case["backward_prefetch"]:
        n = case["backward_prefetch"]
        for i, lead in enumerate(leaders):
            behind = [leaders[j] for j in range(i - 1, i - 1 - n, -1) if j >= 0]
            if behind:
                lead.set_modules_to_backward_prefetch(behind)
    root_kw = dict(kw)
    if case["root_reshard_after_forward"] is not None:
        root_kw["reshard_after_forward"] = case["root_reshard_after_forward"]
    fully_shard(model, **root_kw)
    return policy


def make_optimizer(model, case):
    return {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW,
            "sgd": torch.optim.SGD}[case["optimizer"]](model.parameters(), lr=1e-3)


def train_two_steps(model, opt, case, input_ids, labels, tracker, record_losses):
    """Two training steps inside `tracker`, step 2 recorded (collectives; the tracker's peak
    is reset after step 1). Returns (losses or [], step 1's peak breakdown)."""
    ga = case["grad_accum"]
    losses = []
    with tracker:
        for step in (1, 2):
            if step == 2:
                _Log.recording = True
                tracker.count_comms = True
            # grad_accum > 1: the same batch per micro-batch, loss not rescaled, gradient
            # sync (reduce-scatter) only in the last micro-batch's backward (grad_sync
            # "each": in every one, FSDP2's default).
            for mb in range(ga):
                if ga > 1 and case.get("grad_sync", "last") == "last":
                    model.set_requires_gradient_sync(mb == ga - 1)
                if mb > 0:
                    # FSDPMemTracker refuses a second root forward while it holds the
                    # module stats of the first one; the global peak is not touched.
                    tracker.reset_mod_stats()
                if case.get("train_loop", "hf") == "torchtitan-2024":
                    # torchtitan before it freed the logits (83c879f): float32 logits out of
                    # the model, cross entropy on them, `pred` kept until reassigned
                    pred = model(input_ids=input_ids).logits.float()
                    loss = torch.nn.functional.cross_entropy(pred.flatten(0, 1), labels.flatten(0, 1))
                else:
                    loss = model(input_ids=input_ids, labels=labels).loss
                if step == 2 and mb == ga - 1:
                    # what the forward leaves for the backward (the saved activations)
                    tracker.after_forward = _breakdown(tracker.get_tracker_snapshot("current"), tracker.main_device)
                    # (diagnostic: each storage; with ORACLE_LIVE set, the op that made it)
                    if os.environ.get("ORACLE_LIVE_AFTER_FORWARD"):
                        common.write_json(os.environ["ORACLE_LIVE_AFTER_FORWARD"], sorted(
                            ({"category": w.reftype.value, "bytes": w.mem_consumed,
                              "made_by": list(tracker._made_by.get(st, ("before step 2", "")))}
                             for st, (w, _) in list(tracker._WINFO.items())),
                            key=lambda e: (e["category"], -e["bytes"])))
                loss.backward()
                if record_losses and mb < ga - 1:
                    losses.append(loss.item())
            if step == 2 and tracker.main_device is not None:
                # the host as the optimizer finds it (its step's own temporaries under fake
                # mode are decompositions a real kernel does not make: not recorded)
                tracker.host_before_step = _breakdown(tracker.get_tracker_snapshot("current"), "cpu")
            opt.step()
            opt.zero_grad()
            if record_losses:
                losses.append(loss.item())
            if step == 1:
                tracker.reset_mod_stats()
                step1_peak = _breakdown(tracker.get_tracker_snapshot("peak"), tracker.main_device)
                tracker.reset_peak()
        _Log.recording = False
        tracker.count_comms = False
    return losses, step1_peak


def _worker(rank, case_name, case, port, outdir):
    ws = case["world_size"]
    common.init_rank(rank, ws, port)
    try:
        _patch_collectives()
        _patch_group_context()

        cfg, model = common.build_fp32_model(case)
        enable_checkpointing(model, case, cfg)
        assert all(p.dtype == torch.float32 for p in model.parameters())
        hf_param_numel = sum(p.numel() for p in model.parameters())

        mesh = make_mesh(case)
        policy = shard_model(model, case, mesh, cfg)
        opt = make_optimizer(model, case)
        gen = torch.Generator().manual_seed(1234)
        input_ids = torch.randint(0, cfg.vocab_size, (case["batch"], case["seq"]), generator=gen)
        # HF training batches carry labels as their own tensor (a copy of the ids here).
        labels = input_ids.clone()

        tracker = WhereTracker(model, opt)
        if case.get("float8"):
            _float8_gemms_seen_by(tracker)
        tracker.track_inputs((input_ids, labels))
        losses, step1_peak = train_two_steps(model, opt, case, input_ids, labels, tracker, record_losses=True)
        peak = _breakdown(tracker.get_tracker_snapshot("peak"))

        disp_counts = checked_comm_counts(tracker)
        res = {
            "rank": rank,
            "hf_param_numel": hf_param_numel,
            "wrap": policy,
            "attn_impl_effective": model.config._attn_implementation,
            "experts_impl_effective": getattr(model.config, "_experts_implementation", None),
            "units": _units(model),
            "collectives": _Log.events,
            "dispatch_comm_counts": disp_counts,
            "peak": peak,
            "peak_at": tracker.peak_where,
            "step1_peak_total": step1_peak["total"],
            "losses": losses,
        }
        common.write_json(os.path.join(outdir, f"rank{rank}.json"), res)
        if os.environ.get("ORACLE_TRACE") and rank == 0:
            common.write_json(os.environ["ORACLE_TRACE"], tracker.trace)
        if os.environ.get("ORACLE_LIVE") and rank == 0:
            common.write_json(os.environ["ORACLE_LIVE"], tracker.live_at_peak)
    finally:
        dist.destroy_process_group()


# ----------------------------------------------------------------------------------------
# Driver


def _extra_options(case):
    """Options beyond the original schema, only when they differ from the defaults."""
    out = {}
    d = cases_mod.DEFAULTS
    if case["forward_prefetch"] != d["forward_prefetch"]:
        out["forward_prefetch"] = case["forward_prefetch"]
    if case["backward_prefetch"] != d["backward_prefetch"]:
        out["backward_prefetch"] = case["backward_prefetch"]
    if case["grad_accum"] != d["grad_accum"]:
        out["grad_accum"] = case["grad_accum"]
    if case.get("grad_sync", "last") != "last":
        out["grad_sync"] = case["grad_sync"]
    if case["strategy"] != d["strategy"]:
        out["strategy"] = case["strategy"]
        out["shard_group_size"] = case["shard_group_size"]
    if case["checkpoint"] != d["checkpoint"]:
        out["checkpoint"] = list(case["checkpoint"])
    if case.get("unit_group", 1) != 1:
        out["unit_group"] = case["unit_group"]
    if case.get("unit_reshard"):
        out["unit_reshard"] = dict(case["unit_reshard"])
    if case.get("ac_mode", "full") != "full":
        out["ac_mode"] = case["ac_mode"]
    if case.get("ac_wrapper", "hf") != "hf":
        out["ac_wrapper"] = case["ac_wrapper"]
    if case.get("train_loop", "hf") != "hf":
        out["train_loop"] = case["train_loop"]
    if case.get("shard_dim"):
        out["shard_dim"] = [list(r) for r in case["shard_dim"]]
    if case.get("offload"):
        out["offload"] = "cpu"
    if case.get("compile"):
        out["compile"] = True
    if case.get("float8"):
        out["float8"] = case["float8"]
        out["float8_all_gather"] = bool(case.get("float8_all_gather"))
    return out


def case_options(case, policy, backend):
    """A fixture's `options`: what the planner needs to plan the same run."""
    return {
        "world_size": case["world_size"],
        "batch": case["batch"],
        "seq": case["seq"],
        "attn_implementation": case["attn_implementation"],
        "param_dtype": case["param_dtype"],
        "reduce_dtype": case["reduce_dtype"],
        "reshard_after_forward": case["reshard_after_forward"],
        "root_reshard_after_forward": case["root_reshard_after_forward"],
        "optimizer": case["optimizer"],
        "lr": 1e-3,
        "steps": 2,
        "measured_step": 2,
        "wrap": policy,
        "device": "cpu",
        "backend": backend,
        **_extra_options(case),
    }


def checked_comm_counts(tracker):
    """The collectives FSDPMemTracker saw at dispatch, by kind; they must be the ones the
    Python-level log recorded."""
    py_counts = dict(collections.Counter(e["kind"] for e in _Log.events))
    disp_counts = dict(tracker.dispatch_comm_counts)
    assert py_counts == disp_counts, (
        f"python-level collective log {py_counts} != c10d ops seen at dispatch {disp_counts}")
    return disp_counts


def fixture_collectives(events):
    """The fixture's collective list: each logged collective's key and its context."""
    collectives = []
    for e in events:
        c = common.collective_key(e)
        c.update({k: e[k] for k in ("group_size", "hook", "training_state", "op") if k in e})
        collectives.append(c)
    return collectives


def run_case(name, case):
    ws = case["world_size"]
    with tempfile.TemporaryDirectory(prefix=f"fsdp2_{name}_") as tmp:
        mp.spawn(_worker, args=(name, case, common.free_port(), tmp), nprocs=ws, join=True)
        ranks = []
        for r in range(ws):
            with open(os.path.join(tmp, f"rank{r}.json")) as f:
                ranks.append(json.load(f))
    r0 = ranks[0]
    for r in ranks[1:]:
        assert [common.collective_key(e) for e in r["collectives"]] == [common.collective_key(e) for e in r0["collectives"]], \
            f"{name}: rank {r['rank']} issued different collectives than rank 0"
    units = copy.deepcopy(r0["units"])
    for ui, u in enumerate(units):
        for pi, p in enumerate(u["param_info"]):
            p["sharded_numel_per_rank"] = [r["units"][ui]["param_info"][pi]["sharded_numel"] for r in ranks]
            del p["sharded_numel"]
    collectives = fixture_collectives(r0["collectives"])
    return {
        "case": name,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "config": common.config_relpath(case["model"]),
        "options": case_options(case, r0["wrap"], "gloo"),
        "attn_implementation_effective": r0["attn_impl_effective"],
        "experts_implementation_effective": r0["experts_impl_effective"],
        "hf_param_numel": r0["hf_param_numel"],
        "losses_rank0": r0["losses"],
        "units": units,
        "collective_counts": r0["dispatch_comm_counts"],
        "collectives": collectives,
        "memory": {
            "rank": 0,
            "scope": "step 2 (tracker peak reset after step 1)",
            "peak_bytes": r0["peak"]["total"],
            "breakdown": r0["peak"],
            "peak_at": r0["peak_at"],
            "step1_peak_bytes": r0["step1_peak_total"],
            "per_rank": [
                {"rank": r["rank"], "peak_bytes": r["peak"]["total"], "breakdown": r["peak"],
                 "peak_at": r["peak_at"]}
                for r in ranks
            ],
        },
    }


def main(argv):
    common.case_main(argv, cases_mod.all_cases(), run_case, "fsdp2")


if __name__ == "__main__":
    main(sys.argv[1:])
