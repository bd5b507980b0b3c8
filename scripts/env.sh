# Source me: points tch's build (LIBTORCH_USE_PYTORCH) and the loader at .venv's libtorch.
_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PATH="$_root/.venv/bin:$PATH"
export LIBTORCH_USE_PYTORCH=1
_torchlib="$("$_root/.venv/bin/python" -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
export LD_LIBRARY_PATH="$_torchlib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# MKL's GEMM kernels differ by CPU vendor and ISA; its AVX2 branch runs on every x86-64 machine
# the tests run on, so that results compared with recorded fixtures depend only on libtorch's
# CPU capability (harness/common.py pins the same; see harness/README.md).
export MKL_CBWR="${MKL_CBWR:-AVX2}"
