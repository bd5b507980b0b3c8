"""Dump HF parameter/buffer/module inventories (meta device) for every models/*.config.json.

Usage: .venv/bin/python harness/hf_params.py [NAME ...]   (default: all configs in models/)
Writes tests/fixtures/hf_params/<name>.json.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

common.check_versions()

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402


def inventory(name):
    cfg = common.load_config(name)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    params = []
    first_name = {}  # id(tensor) -> primary name
    for pname, p in model.named_parameters(remove_duplicate=False):
        rec = {"name": pname, "shape": list(p.shape), "dtype": common.dtype_name(p.dtype)}
        if id(p) in first_name:
            rec["tied_to"] = first_name[id(p)]
        else:
            first_name[id(p)] = pname
        params.append(rec)
    persistent_names = set(model.state_dict().keys())
    buffers = []
    for bname, b in model.named_buffers(remove_duplicate=False):
        mod_path, _, attr = bname.rpartition(".")
        mod = model.get_submodule(mod_path)
        buffers.append({
            "name": bname, "shape": list(b.shape), "dtype": common.dtype_name(b.dtype),
            "persistent": attr not in mod._non_persistent_buffers_set,
            "in_state_dict": bname in persistent_names,
        })
    modules = [{"path": path, "class": type(m).__name__} for path, m in model.named_modules()]
    return {
        "config": common.config_relpath(name),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "architecture": type(model).__name__,
        "no_split_modules": sorted(model._no_split_modules or []),
        "tie_word_embeddings": bool(getattr(cfg.get_text_config(), "tie_word_embeddings", False)),
        "total_numel": sum(p.numel() for p in model.parameters()),
        "params": params,
        "buffers": buffers,
        "modules": modules,
    }


def main():
    names = sys.argv[1:] or common.model_names()
    for name in names:
        out = os.path.join(common.FIXTURES, "hf_params", f"{name}.json")
        inv = inventory(name)
        common.write_json(out, inv)
        print(f"hf_params {name}: {inv['architecture']} total_numel={inv['total_numel']} "
              f"params={len(inv['params'])} -> {os.path.relpath(out, common.REPO)}")


if __name__ == "__main__":
    main()
