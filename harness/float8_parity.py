"""Float8 training ground truth for `fsdp-plan run --float8 tensorwise`: HF transformers'
tiny Llama (or tiny-qwen2-wide: q/k/v with a bias) on one device with torchao 0.18.0's float8
linears (torchtitan's `--float8`: `convert_to_float8_training` with the tensorwise recipe,
every nn.Linear whose dims are multiples of 16 but the output head), trained by
`train_parity`'s loop (AdamW, warmup + cosine, clip_grad_norm) on the same initial weights and
tokens as `tests/fixtures/train/<model>/`.

Usage: .venv/bin/python harness/float8_parity.py [--model tiny-llama|tiny-qwen2-wide] --out FILE.json
(torchao 0.18.0 in .venv: scripts/setup-venv.sh installs it)
Writes FILE.json: for 1, 2 and 3 data-parallel ranks, per step the loss, the learning rate and
the gradient norm before clipping (the clip threshold: the median norm of an unclipped run on
one rank). Each rank's float8 linears scale by the amax of its own rows, so the truth for N
ranks is one device running each batch as N micro-batches.

The runtime's test (`runtime/tests/train_parity.rs`) runs this script itself, at the CPU
capability it runs at, rather than reading a committed file: float8 rounding turns the ulps by
which two machines' (or two capabilities') kernels differ into whole float8 steps, so a truth
recorded on one machine is not another's (measured here: 1.0e-4 apart in a first step's
gradient norm on 3 ranks between ATEN_CPU_CAPABILITY=avx2 and default). On one machine at one
capability the runtime's float8 losses equal torchao's bit for bit.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

common.check_versions()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torchao  # noqa: E402
import transformers  # noqa: E402

import fsdp2_oracle  # noqa: E402
import train_parity as tp  # noqa: E402

NAME = "tiny-llama"


def convert(model):
    """The fixture's initial weights (a fresh build from the same seed differs between CPU
    capabilities: torch's normal_ kernels do), then the float8 linears."""
    from safetensors.torch import load_file
    saved = load_file(os.path.join(common.FIXTURES, "train", NAME, "weights.safetensors"))
    with torch.no_grad():
        for n, p in tp.hf_parity.primary_params(model)[0]:
            p.copy_(saved.pop(n))
    assert not saved, sorted(saved)
    fsdp2_oracle.convert_float8(model, {"float8": "tensorwise"})
    converted = [n for n, m in model.named_modules() if type(m).__name__ == "Float8Linear"]
    assert len(converted) == 7 * model.config.num_hidden_layers, converted
    assert not any(n.endswith("lm_head") for n in converted)


MODELS = ("tiny-llama", "tiny-qwen2-wide")


def main():
    global NAME
    args = sys.argv[1:]
    if len(args) == 4 and args[0] == "--model" and args[1] in MODELS:
        NAME = args[1]
        args = args[2:]
    if len(args) != 2 or args[0] != "--out":
        sys.exit(f"usage: float8_parity.py [--model {'|'.join(MODELS)}] --out FILE.json")
    out = args[1]
    assert torchao.__version__ == "0.18.0", torchao.__version__
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    src = os.path.join(common.FIXTURES, "train", NAME)
    cfg = common.load_config(NAME)
    tokens = np.fromfile(os.path.join(src, "tokens.bin"), dtype=np.uint16)
    assert len(tokens) == tp.STEPS * tp.GLOBAL_BATCH * tp.SEQ and tokens.max() < cfg.vocab_size
    _, _, _, _, _, free = tp.train(NAME, tokens, None, convert)
    clip = float(np.median(free))
    # a float8 linear scales by the amax of the rows it sees: on `ws` data-parallel ranks each
    # rank's own, so the truth for ws ranks is one device running the batch as ws micro-batches
    runs = {}
    for ws in (1, 2, 3):
        _, _, _, losses, lrs, norms = tp.train(NAME, tokens, clip, convert, split=ws)
        clipped = sum(n > clip for n in norms)
        assert 0 < clipped < tp.STEPS, (ws, clip, norms)
        runs[str(ws)] = {"losses": losses, "lrs": lrs, "grad_norms": norms, "clipped_steps": clipped}
    # (the scales do differ: the runs are not one)
    assert runs["1"]["losses"][0] != runs["2"]["losses"][0]
    exp = {
        "config": common.config_relpath(NAME),
        "inputs": os.path.relpath(src, common.REPO),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "torchao_version": torchao.__version__,
        "float8": "tensorwise",
        "global_batch": tp.GLOBAL_BATCH, "seq": tp.SEQ, "steps": tp.STEPS,
        "adamw": {"lr": tp.LR, "betas": list(tp.BETAS), "eps": tp.EPS, "weight_decay": tp.WEIGHT_DECAY, "foreach": False},
        "schedule": {"kind": "cosine", "warmup_steps": tp.WARMUP, "min_lr": tp.MIN_LR},
        "clip_grad_norm": clip,
        "world_sizes": runs,
    }
    common.write_json(out, exp)
    for ws, r in runs.items():
        print(f"float8_parity {NAME} on {ws} rank(s): losses {r['losses'][0]:.6f} -> {r['losses'][-1]:.6f}, "
              f"clip {clip:.4f} on {r['clipped_steps']}/{tp.STEPS} steps")


if __name__ == "__main__":
    main()
