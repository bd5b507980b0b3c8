"""torch.optim ground truth for the runtime's optimizers (AdamW, Adam, SGD) over several steps,
computed on the machine that checks the runtime (runtime/tests/hf_parity.rs runs it).

Usage: [ATEN_CPU_CAPABILITY=default|avx2|avx512] .venv/bin/python harness/optim_parity.py --out DIR [NAME ...]
(default: hf_parity.PARITY_MODELS). Reads tests/fixtures/runtime/<name>/{weights,inputs}.safetensors
(written by hf_parity.py) and writes DIR/<name>/optim.<cap>.json, plus optim_final.<cap>.safetensors
for FINAL_MODELS, <cap> being the CPU capability libtorch's kernels run at
(torch.backends.cpu.get_cpu_capability(), lowercase). Adam turns the rounding noise of a gradient
that is zero in exact arithmetic (GPT-2's and Qwen2's key biases, Gemma-3's keys under its k_norm)
into updates of order lr, so torch's own results differ by more than the tolerance between
capabilities (kernel widths sum in another order) and between machines at one capability
(recorded on one x86-64 machine, they were up to 7.9e-5 off torch's on a Sapphire Rapids, with
MKL pinned to its AVX2 branch, strict or not): the runtime is held to torch on the same machine at
the capability it runs at, so these figures are made when the test runs, not recorded.

Per model and optimizer: the HF model (dropout zeroed, sdpa, float32, train mode) loaded with
the fixture's weights, then STEPS steps of: zero grads, loss of the fixture's batch, backward,
`opt.step()` with torch's single-tensor path (foreach=False); then the loss once more. The
JSON holds the STEPS + 1 losses and, per parameter, the norm and sum (float64) of
`final - initial`, so that the update itself is checked, not just the weights it moved. For
FINAL_MODELS the final parameters are saved too, as `<optimizer>.<param name>`.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

common.check_versions()

import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

import hf_parity  # noqa: E402

STEPS = 3
# torch's defaults except the learning rate of SGD, which is raised so that its three steps
# move the loss by far more than the 1e-5 tolerance (torch's default lr is 1e-3 for all three).
OPTIMIZERS = {
    "adamw": {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01},
    "adam": {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0},
    "sgd": {"lr": 0.1, "momentum": 0.0, "dampening": 0.0, "weight_decay": 0.0, "nesterov": False},
}
FINAL_MODELS = ["tiny-llama-tied"]


def make(kind, params, h):
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=h["lr"], betas=tuple(h["betas"]), eps=h["eps"],
                                 weight_decay=h["weight_decay"], foreach=False)
    if kind == "adam":
        return torch.optim.Adam(params, lr=h["lr"], betas=tuple(h["betas"]), eps=h["eps"],
                                weight_decay=h["weight_decay"], foreach=False)
    return torch.optim.SGD(params, lr=h["lr"], momentum=h["momentum"], dampening=h["dampening"],
                           weight_decay=h["weight_decay"], nesterov=h["nesterov"], foreach=False)


def run(name, out):
    d = hf_parity.out_dir(name)
    weights = load_file(os.path.join(d, "weights.safetensors"))
    inputs = load_file(os.path.join(d, "inputs.safetensors"))
    exp = {"config": common.config_relpath(hf_parity.variant(name)[0]), "torch_version": torch.__version__,
           "transformers_version": transformers.__version__, "steps": STEPS, "optimizers": {}}
    final = {}
    for kind, h in OPTIMIZERS.items():
        _, model, _ = hf_parity.build(name, seed=1)
        params, aliases = hf_parity.primary_params(model)
        hf_parity.check_loaded(model, model.load_state_dict(weights, strict=False), aliases)
        start = {n: p.detach().clone() for n, p in params}
        opt = make(kind, [p for _, p in params], h)
        losses = []
        for _ in range(STEPS):
            opt.zero_grad(set_to_none=True)
            loss = model(input_ids=inputs["input_ids"], labels=inputs["labels"]).loss
            losses.append(loss.item())
            loss.backward()
            opt.step()
        with torch.no_grad():
            losses.append(model(input_ids=inputs["input_ids"], labels=inputs["labels"]).loss.item())
        delta = {n: hf_parity.f64(p) - hf_parity.f64(start[n]) for n, p in params}
        exp["optimizers"][kind] = {
            **h, "foreach": False, "losses": losses,
            "delta": {n: {"norm": t.norm().item(), "sum": t.sum().item()} for n, t in delta.items()},
        }
        if name in FINAL_MODELS:
            final.update({f"{kind}.{n}": p for n, p in params})
    cap = capability()
    exp["cpu_capability"] = cap
    o = os.path.join(out, name)
    os.makedirs(o, exist_ok=True)
    common.write_json(os.path.join(o, f"optim.{cap}.json"), exp)
    path = os.path.join(o, f"optim_final.{cap}.safetensors")
    if final:
        hf_parity.save_safetensors(path, final)
    elif os.path.exists(path):
        os.remove(path)
    return exp


def capability():
    return torch.backends.cpu.get_cpu_capability().lower()


def main():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    args = sys.argv[1:]
    if "--out" not in args or args.index("--out") + 1 >= len(args):
        sys.exit("usage: optim_parity.py --out DIR [NAME ...]")
    i = args.index("--out")
    out, names = args[i + 1], args[:i] + args[i + 2:]
    for name in names or hf_parity.PARITY_MODELS:
        exp = run(name, out)
        print(f"optim_parity {name} ({capability()}): " + "  ".join(
            f"{k} {v['losses'][0]:.6f}->{v['losses'][-1]:.6f}" for k, v in exp["optimizers"].items()))


if __name__ == "__main__":
    main()
