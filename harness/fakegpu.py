"""A fake accelerator for FakeTensorMode: a device that is not the host, on a machine with no GPU.

Why: FSDP2's CPUOffloadPolicy keeps shards, gradients and the optimizer on the host and copies
to the device around every all-gather and reduce-scatter. On a CPU mesh host and device are one
(`.to(device)` returns the tensor itself) and fake CUDA tensors need a driver once autograd
touches them, so neither shows what offload moves. PyTorch's Python-backend hooks for
PrivateUse1 (torch.utils.backend_registration._setup_privateuseone_for_python_backend, as
test/test_privateuseone_python_backend.py uses them) give a device "fakegpu" with its own
FSDPMemTracker peak; under FakeTensorMode no kernel runs, so streams and events are no-ops.

SDPA picks its kernel per device type in C++ and has no choice for PrivateUse1 (it would run the
math path, which materializes the scores); `scaled_dot_product_attention` on the fake device
runs CUDA's FlashAttention op (`_scaled_dot_product_flash_attention`, whose meta kernel needs no
GPU: output, float32 logsumexp and the philox seed/offset saved, GQA native), as SDPA on an
H100 does for causal bf16 attention without a mask — or, where q and v differ in width or the
inputs are float32, its memory-efficient kernel, as SDPA does there.

An op with a CUDA kernel and a CompositeImplicitAutograd one (silu_backward, mish_backward,
_fused_rms_norm) would decompose on a backend without a kernel, above FakeTensorMode, into
other ops and temporaries CUDA never makes: each gets a PrivateUse1 kernel (never run: fake
mode answers first), so the fake device dispatches every op as CUDA does.
"""
import contextlib

import torch

NAME = "fakegpu"


class Stream:
    def __init__(self, *args, **kwargs):
        self.device = torch.device(NAME, 0)
        self.priority = kwargs.get("priority", 0)

    def wait_stream(self, stream):
        pass

    def wait_event(self, event):
        pass

    def record_event(self, event=None):
        return event or Event()

    def synchronize(self):
        pass

    def query(self):
        return True


class Event:
    def __init__(self, *args, **kwargs):
        pass

    def record(self, stream=None):
        pass

    def wait(self, stream=None):
        pass

    def synchronize(self):
        pass

    def query(self):
        return True


class Module:
    """What FSDP2 asks of torch.<device> (`_get_device_handle`)."""
    Stream = Stream
    Event = Event

    def is_initialized(self):
        return True

    def is_available(self):
        return True

    def current_device(self):
        return 0

    def set_device(self, device):
        pass

    def _is_in_bad_fork(self):
        return False

    def manual_seed_all(self, seed):
        pass

    # torch.utils.checkpoint keeps and restores the device's RNG state around a recompute
    def get_rng_state(self, device=None):
        return torch.zeros(16, dtype=torch.uint8)

    def set_rng_state(self, state, device=None):
        pass

    # ... and runs it under the forward's autocast state (torch.amp.autocast asks this)
    def get_amp_supported_dtype(self):
        return [torch.float16, torch.bfloat16]

    def device_count(self):
        return 1

    def current_stream(self, device=None):
        return Stream()

    def default_stream(self, device=None):
        return Stream()

    def stream(self, stream):
        return contextlib.nullcontext()

    def synchronize(self, device=None):
        pass


_installed = False


def install():
    global _installed
    if _installed:
        return
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend
    _setup_privateuseone_for_python_backend(rename=NAME, backend_module=Module())
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def flash_like_cuda(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                        enable_gqa=False):
        if query.device.type != NAME:
            return sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                        scale=scale, enable_gqa=enable_gqa)
        assert attn_mask is None and dropout_p == 0.0, (attn_mask, dropout_p)
        if query.dtype in (torch.float16, torch.bfloat16) and query.size(-1) == value.size(-1):
            return torch.ops.aten._scaled_dot_product_flash_attention(
                query, key, value, dropout_p, is_causal, scale=scale)[0]
        # CUDA's flash kernel wants one head width for q, k and v (and half or bf16): SDPA
        # takes the memory-efficient kernel (DeepSeek's latent attention, q/k 192 wide, v 128),
        # which saves its output, a logsumexp padded to 32 rows and the philox seed/offset
        assert query.size(1) == key.size(1), "the memory-efficient kernel takes no GQA"
        return torch.ops.aten._scaled_dot_product_efficient_attention(
            query, key, value, None, query.requires_grad or key.requires_grad, dropout_p, is_causal,
            scale=scale)[0]

    torch.nn.functional.scaled_dot_product_attention = flash_like_cuda
    # FSDPMemTracker rounds a CUDA storage up to the caching allocator's 512 B blocks: the fake
    # device's the same
    from torch.distributed._tools import mem_tracker
    info = mem_tracker._WeakRefInfo
    plain = info._calculate_mem_consumed

    def rounded(self):
        if self.device.type == NAME:
            return -(-self.size * self.element_size // mem_tracker._PYTORCH_MIN_ALLOCATE) * mem_tracker._PYTORCH_MIN_ALLOCATE
        return plain(self)
    info._calculate_mem_consumed = rounded
    global _lib
    _lib = torch.library.Library("aten", "IMPL")
    for name in torch._C._dispatch_get_all_op_names():
        if name.startswith("aten::") and all(
                torch._C._dispatch_has_kernel_for_dispatch_key(name, key)
                for key in ("CUDA", "CompositeImplicitAutograd")):
            _lib.impl(name.split("::")[1], _unreachable, "PrivateUse1")
    _installed = True


def _unreachable(*args, **kwargs):
    raise AssertionError("a fakegpu kernel ran outside FakeTensorMode")


_lib = None
