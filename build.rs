//! With the `runtime` feature the binary links libtorch (the venv's, through fsdp-runtime):
//! it gets an rpath to that directory, so that `fsdp-plan` runs without `scripts/env.sh`'s
//! LD_LIBRARY_PATH (fsdp-runtime's build script passes the directory as link metadata).

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_FSDP_SHIM_LIBTORCH_LIB");
    if let Ok(dir) = std::env::var("DEP_FSDP_SHIM_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg-bins=-Wl,-rpath,{dir}");
        println!("cargo:rustc-link-arg-tests=-Wl,-rpath,{dir}");
    }
}
