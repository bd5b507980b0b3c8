//! NCCL collectives on real GPUs: one rank per visible device (at most 4), ranks as threads
//! of this process, the NCCL id sent over the TCP rendezvous (loopback). Needs
//! `--features cuda`, a CUDA libtorch (the venv's 2.11.0+cu130) and a GPU; otherwise it
//! prints why it is SKIPPED and passes. `bash scripts/gpu-check.sh` runs it on a GPU machine.

use fsdp_runtime::comm::Collective;
use fsdp_runtime::{cuda, launch::free_port, nccl, rendezvous, selftest};
use std::io::Write;
use std::time::Duration;

/// Straight to stderr, past the test harness' capture, so CI logs show what was skipped.
fn visible(msg: String) {
    let _ = writeln!(std::io::stderr(), "{msg}");
}

/// The GPU tests one at a time: a GPU arena, once entered, places every CUDA allocation of
/// the process.
static GPU: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn gpus() -> Result<usize, String> {
    if !cfg!(feature = "cuda") {
        return Err("built without feature `cuda`".into());
    }
    let n = cuda::device_count().map_err(|e| e.to_string())?;
    if n == 0 {
        return Err("the driver sees no device".into());
    }
    // libtorch's CUDA backend is a library the linker drops from test binaries too: load it
    // before asking tch
    cuda::load_torch_cuda().map_err(|e| e.to_string())?;
    if !tch::Cuda::is_available() {
        return Err(format!("{n} device(s), but this libtorch has no CUDA"));
    }
    Ok(n)
}

#[test]
fn nccl_collectives_on_every_visible_gpu() {
    let _one = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let n = match gpus() {
        Ok(n) => n.min(4),
        Err(why) => {
            visible(format!("SKIPPED: no CUDA device ({why}): nccl_collectives_on_every_visible_gpu"));
            return;
        }
    };
    let (maj, min, patch) = nccl::version().expect("NCCL loads");
    eprintln!("NCCL {maj}.{min}.{patch}, {n} rank(s)");
    let port = free_port().unwrap();
    let hs: Vec<_> = (0..n)
        .map(|r| {
            std::thread::spawn(move || -> Result<String, String> {
                let cfg = rendezvous::Config { master_addr: "127.0.0.1".into(), master_port: port, rank: r, world_size: n, timeout: Duration::from_secs(60) };
                let rz = nccl::rendezvous(&cfg)?;
                let g = nccl::NcclGroup::from_rendezvous(&rz, r).map_err(|e| e.to_string())?;
                // a healthy run must not trip the watchdog
                let (tripped_tx, tripped) = std::sync::mpsc::channel::<String>();
                let wd = nccl::watchdog(&[&g], Duration::from_secs(60), move |m| tripped_tx.send(m).unwrap_or(())).map_err(|e| e.to_string())?;
                let mut line = selftest::check_collectives(&g, tch::Device::Cuda(r))?;
                // communicators split off the world (hybrid sharding's groups): all of it as
                // one new communicator, and even / odd ranks
                let whole = g.split(0, r).map_err(|e| e.to_string())?;
                let parity = g.split(r % 2, r).map_err(|e| e.to_string())?;
                if (whole.size(), whole.rank(), parity.size(), parity.rank()) != (n, r, n / 2 + (n % 2) * (1 - r % 2), r / 2) {
                    return Err(format!("rank {r}: split sizes/ranks ({}, {}), ({}, {})", whole.size(), whole.rank(), parity.size(), parity.rank()));
                }
                line += &format!("\n  split whole: {}", selftest::check_collectives(&whole, tch::Device::Cuda(r))?);
                line += &format!("\n  split parity: {}", selftest::check_collectives(&parity, tch::Device::Cuda(r))?);
                drop(wd);
                if let Ok(m) = tripped.try_recv() {
                    return Err(format!("rank {r}: the watchdog tripped on a healthy run: {m}"));
                }
                rz.barrier(Some(Duration::from_secs(60))).map_err(|e| e.to_string())?;
                Ok(line)
            })
        })
        .collect();
    for h in hs {
        let line = h.join().expect("rank thread").unwrap_or_else(|e| panic!("{e}"));
        eprintln!("{line}");
    }
}

/// The GPU arena (`shim::Arena::new_cuda`): CUDA tensors allocated in a step land at the
/// plan's offsets in one block of libtorch's caching allocator, keep their contents apart,
/// and add nothing to the allocator's count; what has no planned buffer goes to the
/// caching allocator.
#[test]
fn gpu_arena_places_cuda_tensors_at_the_plans_offsets() {
    let _one = GPU.lock().unwrap_or_else(|e| e.into_inner());
    if let Err(why) = gpus() {
        visible(format!("SKIPPED: no CUDA device ({why}): gpu_arena_places_cuda_tensors_at_the_plans_offsets"));
        return;
    }
    use fsdp_runtime::shim::{cuda_allocator_bytes, Arena};
    use tch::{Device, Kind, Tensor};
    let dev = Device::Cuda(0);
    let _warm = Tensor::zeros([1], (Kind::Float, dev));
    let arena = Arena::new_cuda(1 << 20, 0).unwrap_or_else(|e| panic!("{e}"));
    assert!(arena.device_bytes() >= 1 << 20, "{}", arena.device_bytes());
    let (before, _) = cuda_allocator_bytes(0, false).unwrap();
    arena.expect(&[(0, 4096), (4096, 8192), (12288, 1024)]);
    arena.enter();
    let a = Tensor::full([1024], 1.0, (Kind::Float, dev));
    let b = Tensor::full([2048], 2.0, (Kind::Float, dev));
    let r = Tensor::full([250], 3.0, (Kind::Float, dev)); // 1000 bytes: the 1024-byte buffer
    let (placed_now, _) = cuda_allocator_bytes(0, false).unwrap();
    let c = &a + &a; // a third 4096-byte tensor: no planned buffer left for it
    arena.leave();
    let st = arena.stats();
    assert_eq!((st.placed, st.placed_bytes, st.heap), (3, 4096 + 8192 + 1024, 1), "{st:?}");
    assert_eq!(b.data_ptr() as usize - a.data_ptr() as usize, 4096, "the plan's offsets");
    assert_eq!(r.data_ptr() as usize - a.data_ptr() as usize, 12288, "sizes rounded to 512 bytes");
    assert_eq!(placed_now, before, "placed tensors add nothing to the caching allocator's count");
    let sums = (a.sum(Kind::Double).double_value(&[]), b.sum(Kind::Double).double_value(&[]), c.sum(Kind::Double).double_value(&[]));
    assert_eq!(sums, (1024.0, 4096.0, 2048.0));
    assert_eq!(r.sum(Kind::Double).double_value(&[]), 750.0);
    let log = arena.log();
    assert_eq!(log.len(), 4, "{log:?}");
    drop((a, b, c, r));
    assert!(arena.log().iter().all(|r| r.free.is_some()), "every free recorded");
    drop(arena);
    eprintln!("GPU arena: {st:?}");
}

#[test]
fn without_cuda_the_backend_says_how_to_get_it() {
    if cfg!(feature = "cuda") {
        eprintln!("SKIPPED: built with feature `cuda`");
        return;
    }
    let e = nccl::NcclGroup::new(0, 1, &[0u8; 128], 0).err().unwrap().to_string();
    assert!(e.starts_with("built without CUDA (feature `cuda`)"), "{e}");
    assert_eq!(nccl::unique_id().unwrap_err(), cuda::CudaError::NotBuilt);
}

/// `ncclGetVersion` needs no GPU: with `--features cuda` and `source scripts/cuda-env.sh`
/// this checks that cudarc finds the venv's NCCL.
#[test]
fn nccl_library_loads_when_present() {
    match nccl::version() {
        Ok((maj, min, patch)) => {
            eprintln!("NCCL {maj}.{min}.{patch} loaded");
            assert_eq!(maj, 2);
        }
        Err(e) => visible(format!("SKIPPED: NCCL not loadable ({e}): nccl_library_loads_when_present")),
    }
}
