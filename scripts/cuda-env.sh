# Source me (after scripts/setup-venv.sh) for the GPU backend (`--features cuda`): everything
# scripts/env.sh sets, plus a `libnccl.so` for cudarc. cudarc dlopens the CUDA driver
# (libcuda.so.1, from the NVIDIA driver) and NCCL by name at run time; the venv's PyTorch
# wheel ships NCCL only as nvidia/nccl/lib/libnccl.so.2, a name cudarc does not try, so we
# link it as target/nccl-lib/libnccl.so and put that first on LD_LIBRARY_PATH.
_cuda_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$_cuda_root/scripts/env.sh"
_nccl="$("$_cuda_root/.venv/bin/python" -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null || true)"
if [ -n "$_nccl" ] && [ -e "$_nccl" ]; then
  mkdir -p "$_cuda_root/target/nccl-lib"
  ln -sf "$_nccl" "$_cuda_root/target/nccl-lib/libnccl.so"
  export LD_LIBRARY_PATH="$_cuda_root/target/nccl-lib:$LD_LIBRARY_PATH"
else
  echo "cuda-env.sh: the venv has no nvidia-nccl package (libnccl.so.2); NCCL must come from the system" >&2
fi
unset _cuda_root _nccl
