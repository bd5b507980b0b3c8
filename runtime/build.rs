//! Compiles `csrc/shim.cpp` (the counting CPU allocator, storage resize, version-preserving
//! copy and autograd-edge backward that tch does not expose) against the same libtorch tch
//! links: the venv's PyTorch, found like torch-sys finds it (`LIBTORCH_USE_PYTORCH=1`,
//! `python` on PATH, or `LIBTORCH` pointing at an unpacked libtorch).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=csrc/shim.cpp");
    for v in ["LIBTORCH", "LIBTORCH_USE_PYTORCH", "LIBTORCH_INCLUDE", "LIBTORCH_CXX11_ABI", "PYTHON_SYS_EXECUTABLE"] {
        println!("cargo:rerun-if-env-changed={v}");
    }
    let (includes, abi, lib) = match torch_paths() {
        Ok(x) => x,
        Err(e) => panic!("fsdp-runtime: cannot find libtorch's headers ({e}); run `bash scripts/setup-venv.sh && source scripts/env.sh` first"),
    };
    // The binaries find libtorch where they were built against it, without LD_LIBRARY_PATH:
    // this crate's tests here, the `fsdp-plan` binary through its build script (the
    // `links` metadata: DEP_FSDP_SHIM_LIBTORCH_LIB).
    println!("cargo:libtorch_lib={}", lib.display());
    println!("cargo:rustc-link-arg-tests=-Wl,-rpath,{}", lib.display());
    let mut build = cc::Build::new();
    // The GPU arena's allocator wraps libtorch's CUDA allocator: it needs c10/cuda's headers,
    // which need the CUDA runtime's (the venv's nvidia-cuda-runtime wheel has them). Only
    // headers: nothing links CUDA (the allocator object is looked up when libtorch_cuda loads).
    if std::env::var_os("CARGO_FEATURE_CUDA").is_some() {
        match cuda_include() {
            Some(dir) => {
                build.include(dir).define("FSDP_CUDA", None);
            }
            None => println!("cargo:warning=fsdp-runtime: no CUDA runtime headers (cuda_runtime_api.h) found beside the venv's PyTorch; the GPU arena is left out (GPU runs allocate from libtorch's caching allocator)"),
        }
    }
    build
        .cpp(true)
        .file("csrc/shim.cpp")
        .includes(&includes)
        .flag("-std=c++17")
        .flag(format!("-D_GLIBCXX_USE_CXX11_ABI={abi}"))
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-deprecated-declarations")
        .warnings(false)
        .compile("fsdp_shim");
}

/// The directory with `cuda_runtime_api.h`: `CUDA_INCLUDE`, else the venv's `nvidia/*/include`
/// (pip's CUDA runtime wheel), else `/usr/local/cuda/include`.
fn cuda_include() -> Option<PathBuf> {
    println!("cargo:rerun-if-env-changed=CUDA_INCLUDE");
    let has = |d: &PathBuf| d.join("cuda_runtime_api.h").is_file();
    if let Some(d) = std::env::var_os("CUDA_INCLUDE").map(PathBuf::from) {
        return has(&d).then_some(d);
    }
    let python = std::env::var("PYTHON_SYS_EXECUTABLE").unwrap_or_else(|_| "python".into());
    let found = Command::new(&python)
        .args(["-c", "import glob, os, nvidia\nfor p in nvidia.__path__:\n    for h in sorted(glob.glob(os.path.join(p, '*', 'include', 'cuda_runtime_api.h'))): print(os.path.dirname(h))"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8_lossy(&o.stdout).lines().map(|l| PathBuf::from(l.trim())).find(|d| has(d)));
    found.or_else(|| Some(PathBuf::from("/usr/local/cuda/include")).filter(has))
}

/// libtorch's include directories, its C++ ABI flag and its library directory.
fn torch_paths() -> Result<(Vec<PathBuf>, String, PathBuf), String> {
    if std::env::var("LIBTORCH_USE_PYTORCH").is_ok() {
        let python = std::env::var("PYTHON_SYS_EXECUTABLE").unwrap_or_else(|_| "python".into());
        let out = Command::new(&python)
            .args([
                "-c",
                "import os, torch\nfrom torch.utils import cpp_extension\nprint('ABI', int(torch._C._GLIBCXX_USE_CXX11_ABI))\nprint('LIB', os.path.join(os.path.dirname(torch.__file__), 'lib'))\nfor p in cpp_extension.include_paths(): print('INC', p)",
            ])
            .output()
            .map_err(|e| format!("running {python}: {e}"))?;
        if !out.status.success() {
            return Err(format!("{python} could not import torch: {}", String::from_utf8_lossy(&out.stderr)));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let mut inc = vec![];
        let mut abi = "1".to_string();
        let mut lib = PathBuf::new();
        for line in text.lines() {
            if let Some(p) = line.strip_prefix("INC ") {
                inc.push(PathBuf::from(p));
            } else if let Some(a) = line.strip_prefix("ABI ") {
                abi = a.trim().to_string();
            } else if let Some(l) = line.strip_prefix("LIB ") {
                lib = PathBuf::from(l.trim());
            }
        }
        return Ok((inc, abi, lib));
    }
    let root = std::env::var("LIBTORCH_INCLUDE").or_else(|_| std::env::var("LIBTORCH")).map_err(|_| "neither LIBTORCH_USE_PYTORCH nor LIBTORCH is set".to_string())?;
    let root = PathBuf::from(root);
    let abi = std::env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".into());
    let lib = std::env::var("LIBTORCH").map(|l| PathBuf::from(l).join("lib")).unwrap_or_else(|_| root.join("lib"));
    Ok((vec![root.join("include"), root.join("include/torch/csrc/api/include")], abi, lib))
}
