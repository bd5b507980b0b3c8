//! Training data: token files read through a memory map, one rank's slice of one step at a
//! time (the pipeline holds O(one step) whatever the file's size), or synthetic tokens.
//!
//! Formats: raw `uint16` (nanoGPT's `.bin`), raw `uint32` (`.u32`), and `.npy` (u2, u4, i4,
//! i8, C order, one dimension), little-endian. Step `s` reads the file's `s`-th window of
//! `global batch × seq` tokens (windows in order, none overlapping); the window is the global
//! batch, rank `r` takes its rows `r·accum·batch …` in micro-batch order, so that every world
//! size with the same global batch trains on the same sequences. A pass over the whole
//! windows is an epoch; the next step starts over at the first window.

use crate::error::RtError;
use std::path::{Path, PathBuf};

/// How a token file stores its ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elem {
    U16,
    U32,
    I32,
    I64,
}

impl Elem {
    pub fn size(self) -> usize {
        match self {
            Elem::U16 => 2,
            Elem::U32 | Elem::I32 => 4,
            Elem::I64 => 8,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Elem::U16 => "uint16",
            Elem::U32 => "uint32",
            Elem::I32 => "int32",
            Elem::I64 => "int64",
        }
    }
}

/// `--data-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// By the file's extension: `.bin`/`.u16` raw uint16, `.u32` raw uint32, `.npy`.
    Auto,
    Raw(Elem),
    Npy,
}

impl Format {
    pub fn parse(s: &str) -> Option<Format> {
        Some(match s {
            "auto" => Format::Auto,
            "u16" | "uint16" => Format::Raw(Elem::U16),
            "u32" | "uint32" => Format::Raw(Elem::U32),
            "npy" => Format::Npy,
            _ => return None,
        })
    }
}

fn err(path: &Path, message: impl Into<String>) -> RtError {
    RtError::File { file: path.display().to_string(), message: message.into() }
}

/// A token file, mapped.
pub struct TokenFile {
    pub path: PathBuf,
    map: memmap2::Mmap,
    elem: Elem,
    /// Bytes before the first id (the `.npy` header).
    header: usize,
    /// Ids in the file.
    pub len: u64,
}

/// The dtype and length of a `.npy` file from its header (format 1.0–3.0), and the header's size.
fn npy_header(path: &Path, bytes: &[u8]) -> Result<(Elem, u64, usize), RtError> {
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err(err(path, "not a .npy file (no \\x93NUMPY magic): give --data-format u16 or u32 for raw ids"));
    }
    let major = bytes[6];
    let (len_bytes, start) = if major == 1 { (2, 8) } else { (4, 8) };
    let hlen = if len_bytes == 2 { u16::from_le_bytes([bytes[8], bytes[9]]) as usize } else if bytes.len() >= 12 { u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize } else { 0 };
    let header_end = start + len_bytes + hlen;
    let Some(text) = bytes.get(start + len_bytes..header_end).and_then(|h| std::str::from_utf8(h).ok()) else {
        return Err(err(path, "a .npy header cut short"));
    };
    let field = |k: &str| text.split(&format!("'{k}':")).nth(1).map(|r| r.trim_start());
    let descr = field("descr").and_then(|r| r.strip_prefix('\'')).and_then(|r| r.split('\'').next()).unwrap_or("");
    let elem = match descr {
        "<u2" | "|u2" => Elem::U16,
        "<u4" => Elem::U32,
        "<i4" => Elem::I32,
        "<i8" => Elem::I64,
        d => return Err(err(path, format!(".npy dtype `{d}`: token ids are read as little-endian u2, u4, i4 or i8"))),
    };
    if field("fortran_order").is_some_and(|r| r.starts_with("True")) {
        return Err(err(path, ".npy in Fortran order: save the ids as a C-order array"));
    }
    let shape = field("shape").and_then(|r| r.strip_prefix('(')).and_then(|r| r.split(')').next()).unwrap_or("");
    let dims: Vec<u64> = shape.split(',').map(str::trim).filter(|d| !d.is_empty()).map(|d| d.parse::<u64>()).collect::<Result<_, _>>().map_err(|_| err(path, format!(".npy shape ({shape}) is not a tuple of integers")))?;
    let n = dims.iter().product::<u64>();
    if dims.len() != 1 {
        return Err(err(path, format!(".npy shape ({shape}): expected one dimension of token ids (flatten it: ids.reshape(-1))")));
    }
    Ok((elem, n, header_end))
}

impl TokenFile {
    pub fn open(path: &Path, format: Format) -> Result<TokenFile, RtError> {
        let f = std::fs::File::open(path).map_err(|e| err(path, e.to_string()))?;
        // SAFETY: the map is read-only; the file is not written while the run reads it (a
        // change under the run would show as other token ids, never as undefined behaviour
        // of this process beyond reading different bytes).
        let map = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| err(path, format!("cannot map the file: {e}")))?;
        let format = match format {
            Format::Auto => match path.extension().and_then(|e| e.to_str()).unwrap_or("") {
                "bin" | "u16" => Format::Raw(Elem::U16),
                "u32" => Format::Raw(Elem::U32),
                "npy" => Format::Npy,
                ext => {
                    return Err(err(
                        path,
                        format!("cannot tell the format of a `.{ext}` file: give --data-format u16 (nanoGPT's .bin), u32 or npy; text is read with --tokenizer tokenizer.json"),
                    ))
                }
            },
            f => f,
        };
        let (elem, len, header) = match format {
            Format::Npy => {
                let (e, n, h) = npy_header(path, &map)?;
                let want = h as u64 + n * e.size() as u64;
                if (map.len() as u64) < want {
                    return Err(err(path, format!("{} bytes, but its header announces {n} {} ids ({want} bytes)", map.len(), e.name())));
                }
                (e, n, h)
            }
            Format::Raw(e) => {
                if map.len() % e.size() != 0 {
                    return Err(err(path, format!("{} bytes: not a whole number of {} token ids ({} bytes each); is --data-format right?", map.len(), e.name(), e.size())));
                }
                (e, (map.len() / e.size()) as u64, 0)
            }
            Format::Auto => unreachable!("resolved above"),
        };
        if len == 0 {
            return Err(err(path, "no token ids"));
        }
        Ok(TokenFile { path: path.to_path_buf(), map, elem, header, len })
    }

    /// Ids `start .. start + n`, each checked against `vocab` (an error names the first bad
    /// one's index and byte offset).
    pub fn read(&self, start: u64, n: u64, vocab: i64) -> Result<Vec<i64>, RtError> {
        let sz = self.elem.size();
        let from = self.header + start as usize * sz;
        let bytes = self.map.get(from..from + n as usize * sz).ok_or_else(|| err(&self.path, format!("ids {start}..{} past the end ({} ids)", start + n, self.len)))?;
        let mut out = Vec::with_capacity(n as usize);
        for (i, c) in bytes.chunks_exact(sz).enumerate() {
            let v = match self.elem {
                Elem::U16 => u16::from_le_bytes([c[0], c[1]]) as i64,
                Elem::U32 => u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64,
                Elem::I32 => i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64,
                Elem::I64 => i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]),
            };
            if v < 0 || v >= vocab {
                let at = start + i as u64;
                let hint = match self.elem {
                    Elem::U32 if v > 65535 => " (a uint16 file read as uint32? nanoGPT's .bin is --data-format u16)",
                    _ => "",
                };
                return Err(err(
                    &self.path,
                    format!("token {v} at index {at} (byte {}) is not below the model's vocabulary size {vocab}{hint}", self.header as u64 + at * sz as u64),
                ));
            }
            out.push(v);
        }
        Ok(out)
    }
}

/// Where a run's tokens come from.
pub enum Source {
    /// Ids from a hash of (seed, global position): the same sequences on every world size.
    Synthetic { seed: u64 },
    File(TokenFile),
}

/// The run's data: `per_step` tokens a step (the global batch), `vocab` the ids' bound.
pub struct Data {
    pub source: Source,
    pub per_step: u64,
    pub vocab: i64,
}

impl Data {
    /// Whole windows in the file (steps per epoch); `None` for synthetic data.
    pub fn windows(&self) -> Option<u64> {
        match &self.source {
            Source::File(f) => Some(f.len / self.per_step),
            Source::Synthetic { .. } => None,
        }
    }

    /// The epoch step `step` (0-based) reads from (0 for synthetic data).
    pub fn epoch(&self, step: u64) -> u64 {
        self.windows().map_or(0, |w| step / w.max(1))
    }

    /// Tokens `offset .. offset + n` of step `step`'s window (offset within the window).
    pub fn read(&self, step: u64, offset: u64, n: u64) -> Result<Vec<i64>, RtError> {
        match &self.source {
            Source::File(f) => {
                let start = crate::train::window_start(f.len, self.per_step, step)
                    .ok_or_else(|| err(&f.path, format!("{} tokens, but a step needs {} (world size × grad accum × batch × seq)", f.len, self.per_step)))?;
                f.read(start + offset, n, self.vocab)
            }
            Source::Synthetic { seed } => {
                let base = step * self.per_step + offset;
                Ok((0..n).map(|i| (crate::ops::mix(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (base + i)) % self.vocab.max(1) as u64) as i64).collect())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch directory, removed when the guard drops (a failing test's too).
    fn scratch(prefix: &str) -> tempfile::TempDir {
        tempfile::Builder::new().prefix(prefix).tempdir().unwrap()
    }

    fn file(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }

    fn data(p: &Path, format: Format, per_step: u64, vocab: i64) -> Data {
        Data { source: Source::File(TokenFile::open(p, format).unwrap()), per_step, vocab }
    }

    #[test]
    fn a_file_of_exactly_n_steps_is_each_window_once_in_order_then_again() {
        let ids: Vec<u16> = (0..24).collect();
        let tmp = scratch("fsdp-data-");
        let p = file(tmp.path(), "six.bin", &ids.iter().flat_map(|t| t.to_le_bytes()).collect::<Vec<u8>>());
        let d = data(&p, Format::Auto, 4, 100);
        assert_eq!(d.windows(), Some(6));
        for step in 0..6u64 {
            assert_eq!(d.read(step, 0, 4).unwrap(), (4 * step as i64..4 * step as i64 + 4).collect::<Vec<_>>());
            assert_eq!(d.epoch(step), 0);
        }
        assert_eq!(d.read(6, 0, 4).unwrap(), vec![0, 1, 2, 3]);
        assert_eq!((d.epoch(6), d.epoch(11), d.epoch(12)), (1, 1, 2));
        // a rank's slice of the window
        assert_eq!(d.read(2, 2, 2).unwrap(), vec![10, 11]);
    }

    #[test]
    fn npy_and_raw_formats_read_the_same_ids() {
        let ids: Vec<u32> = vec![7, 1, 65535, 3];
        let tmp = scratch("fsdp-data-");
        let raw = file(tmp.path(), "ids.u32", &ids.iter().flat_map(|t| t.to_le_bytes()).collect::<Vec<u8>>());
        let mut npy = b"\x93NUMPY\x01\x00".to_vec();
        let mut header = "{'descr': '<i8', 'fortran_order': False, 'shape': (4,), }".to_string();
        while !(10 + header.len() + 1).is_multiple_of(64) {
            header.push(' ');
        }
        header.push('\n');
        npy.extend((header.len() as u16).to_le_bytes());
        npy.extend(header.as_bytes());
        npy.extend(ids.iter().flat_map(|&t| (t as i64).to_le_bytes()));
        let npy = file(tmp.path(), "ids.npy", &npy);
        let want: Vec<i64> = ids.iter().map(|&t| t as i64).collect();
        assert_eq!(data(&raw, Format::Auto, 4, 1 << 20).read(0, 0, 4).unwrap(), want);
        assert_eq!(data(&npy, Format::Auto, 4, 1 << 20).read(0, 0, 4).unwrap(), want);
        // a uint32 id past the vocabulary is named by index and byte, with the likely cause
        let e = data(&raw, Format::Auto, 4, 1000).read(0, 0, 4).unwrap_err().to_string();
        assert!(e.contains("token 65535 at index 2 (byte 8) is not below the model's vocabulary size 1000"), "{e}");
        let e = TokenFile::open(&file(tmp.path(), "odd.bin", b"abc"), Format::Auto).err().unwrap().to_string();
        assert!(e.contains("3 bytes: not a whole number of uint16 token ids"), "{e}");
        let h = b"{'descr': '<f4', 'shape': (2,)}";
        let mut f4 = b"\x93NUMPY\x01\x00".to_vec();
        f4.extend((h.len() as u16).to_le_bytes());
        f4.extend(h);
        f4.extend([0u8; 8]);
        let e = TokenFile::open(&file(tmp.path(), "two.npy", &f4), Format::Auto).err().unwrap().to_string();
        assert!(e.contains(".npy dtype `<f4`"), "{e}");
    }

    /// A 6 GiB (sparse) token file: opened and read at its last window without reading the
    /// rest — the pipeline's memory is one step's ids whatever the file's size.
    #[test]
    fn a_file_larger_than_memory_budgets_is_read_a_window_at_a_time() {
        let tmp = scratch("fsdp-data-big-");
        let p = tmp.path().join("huge.bin");
        let f = std::fs::File::create(&p).unwrap();
        let ids: u64 = 3 << 30; // 3 Gi uint16 ids = 6 GiB, all zero (a hole) …
        f.set_len(ids * 2).unwrap();
        // … but the last window's, written at the end
        use std::os::unix::fs::FileExt;
        let per_step = 1024u64;
        let last: Vec<u8> = (0..per_step as u16).flat_map(|t| (t % 100).to_le_bytes()).collect();
        f.write_all_at(&last, (ids - per_step) * 2).unwrap();
        let t0 = std::time::Instant::now();
        let data = Data { source: Source::File(TokenFile::open(&p, Format::Auto).unwrap()), per_step, vocab: 100 };
        let windows = data.windows().unwrap();
        assert_eq!(windows, ids / per_step);
        let got = data.read(windows - 1, 0, per_step).unwrap();
        assert_eq!(got, (0..per_step as i64).map(|t| t % 100).collect::<Vec<_>>());
        assert_eq!(data.read(0, 0, 4).unwrap(), vec![0; 4]);
        assert!(t0.elapsed().as_secs_f64() < 5.0, "took {:?}: read more than its windows?", t0.elapsed());
    }

    #[test]
    fn synthetic_tokens_depend_on_the_position_only() {
        let d = Data { source: Source::Synthetic { seed: 3 }, per_step: 8, vocab: 50 };
        let whole = d.read(5, 0, 8).unwrap();
        assert_eq!(d.read(5, 4, 4).unwrap(), whole[4..].to_vec());
        assert!(whole.iter().all(|&t| (0..50).contains(&t)));
        assert_ne!(d.read(6, 0, 8).unwrap(), whole);
    }
}
