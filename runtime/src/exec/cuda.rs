//! CUDA devices, streams and events for the GPU backend, through cudarc's driver API
//! (libcuda is loaded at run time, so building needs no CUDA toolkit). The device's primary
//! context is the one libtorch uses, so tch tensors and these streams share memory.
//!
//! Without the `cuda` feature the same API exists and every constructor returns
//! [`CudaError::NotBuilt`].

/// Errors of the GPU backend.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CudaError {
    #[error("built without CUDA (feature `cuda`): rebuild with `cargo build --features runtime,cuda` (fsdp-runtime: `--features cuda`)")]
    NotBuilt,
    #[error("CUDA driver not found ({0}): no NVIDIA driver on this machine?")]
    NoDriver(String),
    #[error("no CUDA device{0}")]
    NoDevice(String),
    #[error("CUDA driver: {what}: {error}")]
    Driver { what: String, error: String },
    #[error("NCCL library not found ({0}); `source scripts/cuda-env.sh` links the venv's libnccl.so.2 as libnccl.so")]
    NoNccl(String),
    #[error("NCCL: {what}: {error}")]
    Nccl { what: String, error: String },
    #[error("{0}")]
    Tensor(String),
}

pub use imp::*;

impl crate::watchdog::Mark for Event {
    /// (the device's context must be current on the watchdog's thread)
    fn done(&self) -> Result<bool, String> {
        self.query().map_err(|e| e.to_string())
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use super::CudaError;
    use cudarc::driver::{result, sys};

    fn drv(what: &str) -> impl FnOnce(result::DriverError) -> CudaError + '_ {
        move |e| CudaError::Driver { what: what.to_string(), error: format!("{e:?}") }
    }

    /// Loads libcuda and initializes the driver (once).
    pub fn init() -> Result<(), CudaError> {
        // once per process (it is reached from every device handle and collective wait)
        static INIT: std::sync::OnceLock<Result<(), CudaError>> = std::sync::OnceLock::new();
        INIT.get_or_init(|| {
            // cudarc panics when the library is missing: look first.
            if !unsafe { sys::is_culib_present() } {
                return Err(CudaError::NoDriver("libcuda.so not loadable".into()));
            }
            result::init().map_err(drv("cuInit"))
        })
        .clone()
    }

    /// Loads libtorch_cuda (once), so that libtorch has its CUDA kernels and allocator: the
    /// linker drops it from our binaries (`--as-needed`; nothing of ours names one of its
    /// symbols), and tch would then see no CUDA. It is found beside the libtorch_cpu this
    /// process runs (`/proc/self/maps`), else on the loader's path.
    pub fn load_torch_cuda() -> Result<(), CudaError> {
        static LOADED: std::sync::OnceLock<Result<(), CudaError>> = std::sync::OnceLock::new();
        LOADED
            .get_or_init(|| {
                let beside = std::fs::read_to_string("/proc/self/maps").ok().and_then(|m| {
                    m.lines().filter_map(|l| l.split_whitespace().nth(5)).find(|p| p.ends_with("/libtorch_cpu.so")).map(|p| std::path::Path::new(p).with_file_name("libtorch_cuda.so"))
                });
                let path = beside.filter(|p| p.is_file()).map(|p| p.into_os_string()).unwrap_or_else(|| "libtorch_cuda.so".into());
                // SAFETY: loading libtorch's own CUDA library runs its static initializers
                // (kernel and allocator registration), as `import torch` does.
                let lib = unsafe { libloading::os::unix::Library::open(Some(&path), libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL) }
                    .map_err(|e| CudaError::NoDevice(format!(": cannot load {} ({e}); is the venv's PyTorch a CUDA build?", std::path::Path::new(&path).display())))?;
                std::mem::forget(lib); // kept for the life of the process
                Ok(())
            })
            .clone()
    }

    /// Number of CUDA devices (0 when the driver finds none).
    pub fn device_count() -> Result<usize, CudaError> {
        init()?;
        Ok(result::device::get_count().map_err(drv("cuDeviceGetCount"))?.max(0) as usize)
    }

    /// A device's primary context, made current on the calling thread by [`Device::bind`].
    #[derive(Debug)]
    pub struct Device {
        pub ordinal: usize,
        dev: sys::CUdevice,
        ctx: sys::CUcontext,
    }

    // The primary context handle is process-wide; binding it on any thread is allowed.
    unsafe impl Send for Device {}
    unsafe impl Sync for Device {}

    impl Device {
        pub fn new(ordinal: usize) -> Result<Device, CudaError> {
            let n = device_count()?;
            if ordinal >= n {
                return Err(CudaError::NoDevice(format!(" with ordinal {ordinal} ({n} visible; check CUDA_VISIBLE_DEVICES and LOCAL_RANK)")));
            }
            let dev = result::device::get(ordinal as i32).map_err(drv("cuDeviceGet"))?;
            let ctx = unsafe { result::primary_ctx::retain(dev) }.map_err(drv("cuDevicePrimaryCtxRetain"))?;
            let d = Device { ordinal, dev, ctx };
            d.bind()?;
            Ok(d)
        }
        /// Makes this device's primary context current on the calling thread.
        pub fn bind(&self) -> Result<(), CudaError> {
            unsafe { result::ctx::set_current(self.ctx) }.map_err(drv("cuCtxSetCurrent"))
        }
        pub fn name(&self) -> Result<String, CudaError> {
            result::device::get_name(self.dev).map_err(drv("cuDeviceGetName"))
        }
        pub fn synchronize(&self) -> Result<(), CudaError> {
            self.bind()?;
            result::ctx::synchronize().map_err(drv("cuCtxSynchronize"))
        }
    }

    impl Drop for Device {
        fn drop(&mut self) {
            unsafe {
                let _ = result::primary_ctx::release(self.dev);
            }
        }
    }

    /// A CUDA stream: one we created (non-blocking), or the legacy default stream, which is
    /// where libtorch (through tch, which never changes the current stream) runs kernels.
    #[derive(Debug)]
    pub struct Stream {
        raw: sys::CUstream,
        owned: bool,
    }

    unsafe impl Send for Stream {}
    unsafe impl Sync for Stream {}

    impl Stream {
        /// A new stream that does not synchronize implicitly with the default stream.
        pub fn new(dev: &Device) -> Result<Stream, CudaError> {
            dev.bind()?;
            let raw = result::stream::create(result::stream::StreamKind::NonBlocking).map_err(drv("cuStreamCreate"))?;
            Ok(Stream { raw, owned: true })
        }
        /// The legacy default stream (libtorch's compute stream here).
        pub fn legacy_default() -> Result<Stream, CudaError> {
            init()?;
            Ok(Stream { raw: std::ptr::null_mut(), owned: false })
        }
        pub fn raw(&self) -> *mut std::ffi::c_void {
            self.raw as *mut std::ffi::c_void
        }
        /// Later work on this stream waits for `ev`'s last record.
        pub fn wait(&self, ev: &Event) -> Result<(), CudaError> {
            unsafe { result::stream::wait_event(self.raw, ev.raw, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT) }.map_err(drv("cuStreamWaitEvent"))
        }
        pub fn synchronize(&self) -> Result<(), CudaError> {
            unsafe { result::stream::synchronize(self.raw) }.map_err(drv("cuStreamSynchronize"))
        }
    }

    impl Drop for Stream {
        fn drop(&mut self) {
            if self.owned {
                unsafe {
                    let _ = result::stream::destroy(self.raw);
                }
            }
        }
    }

    /// A CUDA event (timing optional).
    #[derive(Debug)]
    pub struct Event {
        raw: sys::CUevent,
    }

    unsafe impl Send for Event {}
    unsafe impl Sync for Event {}

    impl Event {
        pub fn new(dev: &Device, timing: bool) -> Result<Event, CudaError> {
            dev.bind()?;
            let flags = if timing { sys::CUevent_flags::CU_EVENT_DEFAULT } else { sys::CUevent_flags::CU_EVENT_DISABLE_TIMING };
            Ok(Event { raw: result::event::create(flags).map_err(drv("cuEventCreate"))? })
        }
        pub fn record(&self, s: &Stream) -> Result<(), CudaError> {
            unsafe { result::event::record(self.raw, s.raw) }.map_err(drv("cuEventRecord"))
        }
        pub fn synchronize(&self) -> Result<(), CudaError> {
            unsafe { result::event::synchronize(self.raw) }.map_err(drv("cuEventSynchronize"))
        }
        /// Milliseconds from `self` to `end` (both recorded with timing, both complete).
        pub fn elapsed_ms(&self, end: &Event) -> Result<f32, CudaError> {
            unsafe { result::event::elapsed(self.raw, end.raw) }.map_err(drv("cuEventElapsedTime"))
        }
        /// Whether the work before the last record has completed (`cuEventQuery`; the
        /// context must be current on the calling thread).
        pub fn query(&self) -> Result<bool, CudaError> {
            match unsafe { result::event::query(self.raw) } {
                Ok(()) => Ok(true),
                Err(result::DriverError(sys::cudaError_enum::CUDA_ERROR_NOT_READY)) => Ok(false),
                Err(e) => Err(drv("cuEventQuery")(e)),
            }
        }
    }

    impl Drop for Event {
        fn drop(&mut self) {
            unsafe {
                let _ = result::event::destroy(self.raw);
            }
        }
    }
}

#[cfg(not(feature = "cuda"))]
mod imp {
    use super::CudaError;
    use std::convert::Infallible;

    pub fn init() -> Result<(), CudaError> {
        Err(CudaError::NotBuilt)
    }
    pub fn device_count() -> Result<usize, CudaError> {
        Err(CudaError::NotBuilt)
    }
    pub fn load_torch_cuda() -> Result<(), CudaError> {
        Err(CudaError::NotBuilt)
    }

    #[derive(Debug)]
    pub struct Device {
        pub ordinal: usize,
        never: Infallible,
    }
    impl Device {
        pub fn new(_ordinal: usize) -> Result<Device, CudaError> {
            Err(CudaError::NotBuilt)
        }
        pub fn bind(&self) -> Result<(), CudaError> {
            match self.never {}
        }
        pub fn name(&self) -> Result<String, CudaError> {
            match self.never {}
        }
        pub fn synchronize(&self) -> Result<(), CudaError> {
            match self.never {}
        }
    }

    #[derive(Debug)]
    pub struct Stream {
        never: Infallible,
    }
    impl Stream {
        pub fn new(_dev: &Device) -> Result<Stream, CudaError> {
            Err(CudaError::NotBuilt)
        }
        pub fn legacy_default() -> Result<Stream, CudaError> {
            Err(CudaError::NotBuilt)
        }
        pub fn raw(&self) -> *mut std::ffi::c_void {
            match self.never {}
        }
        pub fn wait(&self, _ev: &Event) -> Result<(), CudaError> {
            match self.never {}
        }
        pub fn synchronize(&self) -> Result<(), CudaError> {
            match self.never {}
        }
    }

    #[derive(Debug)]
    pub struct Event {
        never: Infallible,
    }
    impl Event {
        pub fn new(_dev: &Device, _timing: bool) -> Result<Event, CudaError> {
            Err(CudaError::NotBuilt)
        }
        pub fn record(&self, _s: &Stream) -> Result<(), CudaError> {
            match self.never {}
        }
        pub fn synchronize(&self) -> Result<(), CudaError> {
            match self.never {}
        }
        pub fn elapsed_ms(&self, _end: &Event) -> Result<f32, CudaError> {
            match self.never {}
        }
        pub fn query(&self) -> Result<bool, CudaError> {
            match self.never {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libtorch_cuda_loads_with_the_cuda_feature() {
        match load_torch_cuda() {
            Ok(()) => {
                // libtorch now has its CUDA backend: it answers (false without a GPU) instead
                // of lacking CUDA altogether
                let n = tch::Cuda::device_count();
                eprintln!("libtorch_cuda loaded; tch sees {n} CUDA device(s)");
                match crate::shim::cuda_allocator_bytes(0, false) {
                    Ok(x) => eprintln!("CUDA allocator on device 0: {x:?}"),
                    Err(e) => {
                        assert_eq!(n, 0, "{e}");
                        eprintln!("SKIPPED: no CUDA device ({e})");
                        // the GPU arena's allocator goes in front of libtorch's (found by
                        // its symbol) and passes the failure of its first allocation on
                        #[cfg(feature = "cuda")]
                        {
                            let e = crate::shim::Arena::new_cuda(4096, 0).err().expect("no arena without a GPU");
                            assert!(e.to_string().starts_with("cannot make a 4096-byte arena on cuda:0: "), "{e}");
                            eprintln!("{e}");
                        }
                    }
                }
            }
            Err(e) => {
                #[cfg(feature = "cuda")]
                panic!("{e}");
                #[cfg(not(feature = "cuda"))]
                assert_eq!(e, CudaError::NotBuilt);
            }
        }
    }

    #[test]
    fn without_a_gpu_the_api_reports_why() {
        match device_count() {
            Ok(n) => eprintln!("CUDA devices: {n}"),
            Err(e) => {
                #[cfg(not(feature = "cuda"))]
                assert_eq!(e, CudaError::NotBuilt);
                assert!(!e.to_string().is_empty());
                eprintln!("SKIPPED: no CUDA ({e})");
            }
        }
        #[cfg(not(feature = "cuda"))]
        assert_eq!(
            Device::new(0).unwrap_err().to_string(),
            "built without CUDA (feature `cuda`): rebuild with `cargo build --features runtime,cuda` (fsdp-runtime: `--features cuda`)"
        );
    }
}
