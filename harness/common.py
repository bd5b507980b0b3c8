"""Shared helpers for the ground-truth harness (version pin, config loading, JSON output)."""
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# MKL (libtorch's BLAS on x86-64) picks its kernels by CPU vendor and ISA: Intel AVX-512 parts
# and AMD ones round float32 GEMMs differently. Pinned to its AVX2 branch (Conditional
# Numerical Reproducibility), as scripts/env.sh pins it for the tests, results depend only on
# libtorch's own CPU capability (ATEN_CPU_CAPABILITY), not on the machine that recorded them.
os.environ.setdefault("MKL_CBWR", "AVX2")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS_DIR = os.path.join(REPO, "models")
FIXTURES = os.path.join(REPO, "tests", "fixtures")

TORCH_PIN = "2.11.0"
TRANSFORMERS_PIN = "5.17.0"


def check_versions():
    """Exit 2 unless torch == 2.11.0(+local) and transformers == 5.17.0."""
    import torch
    import transformers

    tv = torch.__version__.split("+")[0]
    if tv != TORCH_PIN or transformers.__version__ != TRANSFORMERS_PIN:
        sys.stderr.write(
            f"error: fixtures must be generated with torch=={TORCH_PIN} and "
            f"transformers=={TRANSFORMERS_PIN}; found torch {torch.__version__}, "
            f"transformers {transformers.__version__}\n"
        )
        sys.exit(2)


def config_relpath(name):
    return f"models/{name}.config.json"


def fixture_head(case_name, model):
    """A case fixture's first keys: the case, the pinned versions it was recorded with, the
    model's config."""
    import torch
    import transformers
    return {"case": case_name, "torch_version": torch.__version__,
            "transformers_version": transformers.__version__, "config": config_relpath(model)}


def model_names():
    return sorted(f[: -len(".config.json")] for f in os.listdir(MODELS_DIR) if f.endswith(".config.json"))


def load_config(name):
    from transformers import AutoConfig

    with open(os.path.join(MODELS_DIR, f"{name}.config.json")) as f:
        d = json.load(f)
    cfg = AutoConfig.for_model(**d)
    # A Gemma 3 multimodal config: its text model (Gemma3ForCausalLM), as the importer reads it
    if cfg.model_type == "gemma3":
        text = cfg.text_config
        text.dtype = cfg.dtype
        return text
    return cfg


def dtype_name(dt):
    return str(dt).replace("torch.", "")


def write_json(path, obj):
    """Write JSON atomically (temp file in the same directory + rename); a path that is not a
    file (`ORACLE_LIVE=/dev/null`) is written in place, never replaced by one."""
    if os.path.exists(path) and not os.path.isfile(path):
        with open(path, "w") as f:
            json.dump(obj, f)
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def init_rank(rank, world_size, port):
    """One spawned rank: loopback gloo process group, one torch thread, quiet transformers."""
    import torch
    import torch.distributed as dist
    import transformers

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def build_fp32_model(case):
    """The case's HF model from its config, seed 0, float32, train mode."""
    import torch
    from transformers import AutoModelForCausalLM

    cfg = load_config(case["model"])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        cfg, attn_implementation=case["attn_implementation"], dtype=torch.float32)
    model.train()
    return cfg, model


def free_port():
    """A free TCP port on loopback for a process group."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def collective_key(ev):
    """What the fixtures compare of a logged collective."""
    return {k: ev[k] for k in ("kind", "unit", "numel", "dtype")}


def fixture_path(name, case, subdir):
    """Where a case's result is recorded: tests/fixtures/<subdir>/<case>.json — a case on
    harness/fakegpu.py's fake accelerator in `<subdir>gpu` (which the conformance suite plans
    with --device cuda), one with torch.compile'd blocks in `fsdp2_compile` (what inductor's
    partitioner saves)."""
    where = subdir + "gpu" if case.get("device", "cpu") != "cpu" else subdir
    if case.get("compile"):
        where = "fsdp2_compile"
    return os.path.join(FIXTURES, where, f"{name}.json")


def case_main(argv, all_cases, run_case, subdir):
    """The oracle scripts' command line: `--list`, or run the named cases (default: all) and
    write each result to tests/fixtures/<subdir>/<case>.json."""
    import collections
    import time
    if "--list" in argv:
        print("\n".join(all_cases))
        return
    names = argv or list(all_cases)
    unknown = [n for n in names if n not in all_cases]
    if unknown:
        sys.stderr.write(f"unknown case(s): {unknown}; see --list\n")
        sys.exit(2)
    for name in names:
        t0 = time.time()
        res = run_case(name, all_cases[name])
        out = fixture_path(name, all_cases[name], subdir)
        write_json(out, res)
        n = collections.Counter(c["kind"] for c in res["collectives"])
        peak = f" peak={res['memory']['peak_bytes']} B" if res.get("memory") else ""
        where = os.path.basename(os.path.dirname(out))
        print(f"{where} {name}: {dict(n)}{peak} ({time.time() - t0:.1f}s) -> {os.path.relpath(out, REPO)}", flush=True)
