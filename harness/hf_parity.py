"""HF single-rank forward/backward/AdamW ground truth for the runtime's architecture-parity test.

Usage: .venv/bin/python harness/hf_parity.py [NAME ...]   (default: PARITY_MODELS below)
Writes tests/fixtures/runtime/<name>/{weights,inputs,grads}.safetensors and expected.json.

Per model: every dropout probability in the config is set to 0.0 (so train mode is
deterministic), `torch.manual_seed(0)`, `AutoModelForCausalLM.from_config(cfg,
attn_implementation="sdpa")` in float32, `model.train()`; one batch
`torch.randint(0, vocab, (2, 16), generator=Generator().manual_seed(1234))`, labels = the same
ids (HF shifts them inside the loss: mean CE over batch*(seq-1) tokens); `loss.backward()`;
then one AdamW step and a second forward loss on the same batch.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

common.check_versions()

import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

PARITY_MODELS = [
    "tiny-gpt2",
    "tiny-llama",
    "tiny-llama-tied",
    "tiny-llama-gqa",
    "tiny-mistral",
    "tiny-qwen2",
    "tiny-mixtral",
    "tiny-llama31",
    "tiny-qwen3",
    "tiny-qwen3-moe",
    "tiny-olmo2",
    "tiny-gemma3",
    "tiny-gemma2",
    "tiny-phi3",
    "tiny-deepseek-v2",
    "tiny-deepseek-v3",
    # (NAME.eager: the model under eager attention, where Gemma 2 soft-caps the scores)
    "tiny-gemma2.eager",
    "tiny-deepseek-v2.eager",
    "tiny-deepseek-v3.eager",
]
BATCH = 2
SEQ = 16
ATTN = "sdpa"
# Every config key that is a dropout probability in the supported architectures.
DROPOUT_KEYS = ["resid_pdrop", "embd_pdrop", "attn_pdrop", "attention_dropout",
                "summary_first_dropout", "hidden_dropout", "mlp_dropout"]
ADAMW = {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01}


def out_dir(name):
    return os.path.join(common.FIXTURES, "runtime", name)


def save_safetensors(path, tensors):
    """safetensors.torch.save_file, atomically (temp file in the same directory + rename)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    save_file({k: v.detach().contiguous().clone() for k, v in tensors.items()}, tmp)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def f64(t):
    return t.detach().to(torch.float64)


def primary_params(model):
    """(name, param) for every parameter once, under its first (primary) name, plus aliases."""
    prim, aliases, seen = [], {}, {}
    for pname, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            aliases[pname] = seen[id(p)]
        else:
            seen[id(p)] = pname
            prim.append((pname, p))
    assert [n for n, _ in prim] == [n for n, _ in model.named_parameters()]
    return prim, aliases


def variant(name):
    """`NAME` or `NAME.ATTN`: the model config's name and the attention implementation."""
    base, _, attn = name.partition(".")
    return base, attn or ATTN


def build(name, seed):
    base, attn = variant(name)
    cfg = common.load_config(base)
    zeroed = {}
    for k in DROPOUT_KEYS:
        if hasattr(cfg, k):
            zeroed[k] = getattr(cfg, k)
            setattr(cfg, k, 0.0)
    if getattr(cfg, "router_jitter_noise", 0.0):  # the only other train-mode randomness (MoE)
        raise SystemExit(f"{name}: router_jitter_noise must be 0")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=torch.float32)
    model.train()
    for mname, m in model.named_modules():
        if isinstance(m, torch.nn.Dropout) and m.p != 0.0:
            raise SystemExit(f"{name}: dropout {mname} p={m.p} after zeroing the config")
    return cfg, model, zeroed


def check_loaded(model, res, aliases):
    """`load_state_dict(weights, strict=False)`'s result: nothing unexpected, nothing missing
    but the tied aliases and the persistent buffers the model initializes to zeros and never
    trains (DeepSeek's e_score_correction_bias: not in the weights file, zeros in the runtime)."""
    zero_buffers = {n for n, b in model.named_buffers() if n.endswith("e_score_correction_bias") and not b.any()}
    assert not res.unexpected_keys and set(res.missing_keys) <= set(aliases) | zero_buffers, res


def self_check(name, input_ids, labels, loss, grads, aliases):
    """Fresh model (other init seed) + weights.safetensors only -> bitwise the same loss/grads."""
    from safetensors.torch import load_file

    _, model, _ = build(name, seed=1)
    w = load_file(os.path.join(out_dir(name), "weights.safetensors"))
    check_loaded(model, model.load_state_dict(w, strict=False), aliases)
    out = model(input_ids=input_ids, labels=labels)
    out.loss.backward()
    assert torch.equal(out.loss.detach(), loss.detach()), f"{name}: reload loss differs"
    for n, p in model.named_parameters():
        assert torch.equal(p.grad, grads[n]), f"{name}: reload grad {n} differs"


def run(name):
    cfg, model, zeroed = build(name, seed=0)
    params, aliases = primary_params(model)
    assert all(p.dtype == torch.float32 for _, p in params)

    gen = torch.Generator().manual_seed(1234)
    input_ids = torch.randint(0, cfg.vocab_size, (BATCH, SEQ), generator=gen)
    labels = input_ids.clone()

    d = out_dir(name)
    save_safetensors(os.path.join(d, "weights.safetensors"), {n: p for n, p in params})
    save_safetensors(os.path.join(d, "inputs.safetensors"), {"input_ids": input_ids, "labels": labels})

    out = model(input_ids=input_ids, labels=labels)
    loss = out.loss
    logits = out.logits.detach()
    loss.backward()
    grads = {}
    for n, p in params:
        assert p.grad is not None, f"{name}: no grad for {n}"
        grads[n] = p.grad.detach().clone()
    save_safetensors(os.path.join(d, "grads.safetensors"), grads)
    self_check(name, input_ids, labels, loss, grads, aliases)

    opt = torch.optim.AdamW([p for _, p in params], lr=ADAMW["lr"], betas=tuple(ADAMW["betas"]),
                            eps=ADAMW["eps"], weight_decay=ADAMW["weight_decay"], foreach=False)
    opt.step()
    opt.zero_grad(set_to_none=True)
    with torch.no_grad():
        loss2 = model(input_ids=input_ids, labels=labels).loss

    exp = {
        "config": common.config_relpath(variant(name)[0]),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "architecture": type(model).__name__,
        "attn_implementation": model.config._attn_implementation,
        "experts_implementation": (model.config._experts_implementation if any(
            type(m).__name__.endswith("Experts") for m in model.modules()) else None),
        "dtype": "float32",
        "train_mode": True,
        "dropout_zeroed": True,
        "dropout_config_before": zeroed,
        "seed_init": 0,
        "seed_inputs": 1234,
        "batch": BATCH,
        "seq": SEQ,
        "vocab_size": cfg.vocab_size,
        "loss": loss.item(),
        "logits_shape": list(logits.shape),
        "logits_sum": f64(logits).sum().item(),
        "logits_abs_sum": f64(logits).abs().sum().item(),
        "tied": aliases,
        "weights_file": "weights.safetensors",
        "inputs_file": "inputs.safetensors",
        "grads_file": "grads.safetensors",
        "grads": {
            n: {"norm": f64(g).norm().item(), "sum": f64(g).sum().item(), "shape": list(g.shape)}
            for n, g in grads.items()
        },
        "adamw": {**ADAMW, "foreach": False, "amsgrad": False, "maximize": False},
        "adamw_step1_loss2": loss2.item(),
    }
    common.write_json(os.path.join(d, "expected.json"), exp)
    return exp


def main():
    if sys.argv[1:] == ["--list"]:
        print("\n".join(PARITY_MODELS))
        return
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    names = sys.argv[1:] or PARITY_MODELS
    for name in names:
        exp = run(name)
        n = len(exp["grads"])
        print(f"hf_parity {name}: {exp['architecture']} loss={exp['loss']!r} "
              f"loss2={exp['adamw_step1_loss2']!r} params={n} "
              f"-> {os.path.relpath(out_dir(name), common.REPO)}/")


if __name__ == "__main__":
    main()
