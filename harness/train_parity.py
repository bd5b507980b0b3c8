"""Training-loop ground truth for `fsdp-plan run`: HF transformers on one device, torch's AdamW
(non-default betas and weight decay), a LambdaLR over torchtitan's warmup + cosine decay and
`torch.nn.utils.clip_grad_norm_`, on consecutive windows of a uint16 token file.

Usage: .venv/bin/python harness/train_parity.py [NAME ...]   (default: MODELS below)
Writes tests/fixtures/train/<name>/{weights.safetensors, tokens.bin, expected.json}: per step
the loss of the batch, the learning rate its update used and the gradient norm before
clipping. The clip threshold is the median norm of an unclipped run of the same steps, so that
clipping is active on some steps and not on others (checked).
"""
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

common.check_versions()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

import hf_parity  # noqa: E402

MODELS = ["tiny-llama", "tiny-gpt2", "tiny-qwen2-wide"]
GLOBAL_BATCH = 6   # sequences per step: ranks 1, 2 and 3 all split it evenly
SEQ = 16
STEPS = 12
LR = 3e-3
MIN_LR = 3e-4
WARMUP = 3
BETAS = (0.9, 0.95)
EPS = 1e-8
WEIGHT_DECAY = 0.1


def factor(i):
    """torchtitan's linear_warmup_stable_decay with cosine decay over every step after the
    warmup (no stable stretch), ending at MIN_LR / LR: the runtime's `lr::Schedule`."""
    if i < WARMUP:
        return (i + 1) / (WARMUP + 1)
    decay = STEPS - WARMUP
    progress = min((i + 1 - WARMUP) / decay, 1.0)
    m = MIN_LR / LR
    return m + (1 - m) * 0.5 * (1 + math.cos(math.pi * progress))


def train(name, tokens, clip, convert=None, split=1):
    """`convert(model)` swaps modules before the optimizer sees the params; `split` runs each
    step's batch as that many equal micro-batches, the gradient their mean — what `split`
    data-parallel ranks compute when a rank's kernels see its rows alone (float8_parity)."""
    cfg, model, _ = hf_parity.build(name, seed=0)
    if convert:
        convert(model)
    params, _ = hf_parity.primary_params(model)
    opt = torch.optim.AdamW([p for _, p in params], lr=LR, betas=BETAS, eps=EPS,
                            weight_decay=WEIGHT_DECAY, foreach=False)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    per_step = GLOBAL_BATCH * SEQ
    losses, lrs, norms = [], [], []
    for step in range(STEPS):
        ids = torch.from_numpy(tokens[step * per_step:(step + 1) * per_step].astype(np.int64)).view(GLOBAL_BATCH, SEQ)
        if split == 1:
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
        else:
            # each part's own mean loss backward, the grads summed, then divided: as ranks
            # reduce theirs (the 1/split never enters a part's backward)
            loss = 0.0
            for part in ids.chunk(split):
                part_loss = model(input_ids=part, labels=part).loss
                part_loss.backward()
                loss = loss + part_loss.detach()
            loss = loss / split
            with torch.no_grad():
                for _, p in params:
                    if p.grad is not None:
                        p.grad.div_(split)
        norm = torch.nn.utils.clip_grad_norm_([p for _, p in params], clip if clip else float("inf"))
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        norms.append(norm.item())
    return cfg, model, params, losses, lrs, norms


def run(name):
    cfg = common.load_config(name)
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, cfg.vocab_size, size=STEPS * GLOBAL_BATCH * SEQ, dtype=np.uint16)
    _, _, _, _, _, free = train(name, tokens, None)
    clip = float(np.median(free))
    cfg, model, params, losses, lrs, norms = train(name, tokens, clip)
    clipped = sum(n > clip for n in norms)
    assert 0 < clipped < STEPS, (name, clip, norms)
    d = os.path.join(common.FIXTURES, "train", name)
    os.makedirs(d, exist_ok=True)
    # the initial weights: a fresh model from the same seed
    _, init, _ = hf_parity.build(name, seed=0)
    ip, _ = hf_parity.primary_params(init)
    hf_parity.save_safetensors(os.path.join(d, "weights.safetensors"), {n: p for n, p in ip})
    tmp = os.path.join(d, f"tokens.bin.tmp{os.getpid()}")
    tokens.tofile(tmp)
    os.replace(tmp, os.path.join(d, "tokens.bin"))
    exp = {
        "config": common.config_relpath(name),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "global_batch": GLOBAL_BATCH, "seq": SEQ, "steps": STEPS,
        "adamw": {"lr": LR, "betas": list(BETAS), "eps": EPS, "weight_decay": WEIGHT_DECAY, "foreach": False},
        "schedule": {"kind": "cosine", "warmup_steps": WARMUP, "min_lr": MIN_LR,
                     "formula": "torchtitan linear_warmup_stable_decay, LambdaLR"},
        "clip_grad_norm": clip,
        "clipped_steps": clipped,
        "losses": losses, "lrs": lrs, "grad_norms": norms,
        "final_param_norm": sum(float(p.detach().double().norm()) ** 2 for _, p in params) ** 0.5,
    }
    common.write_json(os.path.join(d, "expected.json"), exp)
    return exp


def main():
    if sys.argv[1:] == ["--list"]:
        print("\n".join(MODELS))
        return
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    for name in sys.argv[1:] or MODELS:
        e = run(name)
        print(f"train_parity {name}: losses {e['losses'][0]:.6f} -> {e['losses'][-1]:.6f}, "
              f"clip {e['clip_grad_norm']:.4f} on {e['clipped_steps']}/{STEPS} steps")


if __name__ == "__main__":
    main()
