//! Reading safetensors files (weights, checkpoints) with errors a user can act on: the
//! library's own ("HeaderTooLarge", "InvalidOffset") do not say that the file is not a
//! safetensors file at all, or which tensor a truncated file lost. The header is checked
//! here first; the tensors are then read by libtorch's reader.

use crate::error::RtError;
use std::io::Read;
use std::path::Path;
use tch::Tensor;

/// The most header bytes accepted (the format's own limit is 100 MB).
const MAX_HEADER: u64 = 100_000_000;

fn err(path: &Path, message: String) -> RtError {
    RtError::File { file: path.display().to_string(), message }
}

/// Bytes per element of a safetensors dtype name; `None` for a name the format does not have.
fn dtype_bytes(d: &str) -> Option<u64> {
    Some(match d {
        "BOOL" | "U8" | "I8" | "F8_E5M2" | "F8_E4M3" => 1,
        "I16" | "U16" | "F16" | "BF16" => 2,
        "I32" | "U32" | "F32" => 4,
        "I64" | "U64" | "F64" => 8,
        _ => return None,
    })
}

/// Checks the header of `path` (length, JSON, every tensor's dtype, shape and byte range
/// inside the file), then reads every tensor.
pub fn read(path: &Path) -> Result<Vec<(String, Tensor)>, RtError> {
    let mut f = std::fs::File::open(path).map_err(|e| err(path, e.to_string()))?;
    let len = f.metadata().map_err(|e| err(path, e.to_string()))?.len();
    let not_st = |why: String| err(path, format!("not a safetensors file: {why}"));
    if len < 8 {
        return Err(not_st(format!("{len} bytes, shorter than the 8-byte header length")));
    }
    let mut n = [0u8; 8];
    f.read_exact(&mut n).map_err(|e| err(path, e.to_string()))?;
    let n = u64::from_le_bytes(n);
    if n > MAX_HEADER || n > len - 8 {
        return Err(not_st(format!("its first 8 bytes give a header of {n} bytes in a file of {len}")));
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact(&mut header).map_err(|e| err(path, e.to_string()))?;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&header).map_err(|e| not_st(format!("the header is not a JSON object ({e})")))?;
    let data = len - 8 - n;
    for (name, t) in &header {
        if name == "__metadata__" {
            continue;
        }
        let bad = |why: &str| err(path, format!("tensor `{name}`: {why}"));
        let dtype = t["dtype"].as_str().ok_or_else(|| bad("no dtype"))?;
        let size = dtype_bytes(dtype).ok_or_else(|| bad(&format!("unknown dtype `{dtype}`")))?;
        let shape: Option<Vec<u64>> = t["shape"].as_array().and_then(|a| a.iter().map(|d| d.as_u64()).collect());
        let shape = shape.ok_or_else(|| bad("no shape"))?;
        let offsets: Option<Vec<u64>> = t["data_offsets"].as_array().and_then(|a| a.iter().map(|d| d.as_u64()).collect());
        let (b, e) = match offsets.as_deref() {
            Some(&[b, e]) if b <= e => (b, e),
            _ => return Err(bad("no valid data_offsets")),
        };
        let bytes = shape.iter().try_fold(size, |a, &d| a.checked_mul(d));
        if bytes != Some(e - b) {
            return Err(bad(&format!("shape {shape:?} of {dtype} does not fill its {} bytes", e - b)));
        }
        if e > data {
            return Err(bad(&format!("ends at data byte {e}, but the file holds {data}: truncated")));
        }
    }
    Tensor::read_safetensors(path).map_err(|e| err(path, format!("unreadable safetensors file: {e}")))
}
