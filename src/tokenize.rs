//! `run --data corpus.txt --tokenizer tokenizer.json`: text in, token ids out. The corpus is
//! tokenized once (with HF tokenizers' own crate, from the tokenizer's `tokenizer.json`) into
//! a cached token file beside it — uint16 when the vocabulary fits, else uint32 — named by a
//! hash of the tokenizer and the text, and reused by later runs; whole lines are encoded a
//! chunk at a time, so memory stays bounded whatever the corpus's size.

use crate::io::*;
use anyhow::{bail, Result};
use sha2::{Digest, Sha256};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

/// Bytes of text encoded at once (whole lines).
const CHUNK: usize = 1 << 20;

/// Whether `--data` names text to tokenize (anything but a token file's extension).
pub(crate) fn is_text(path: &Path) -> bool {
    !matches!(path.extension().and_then(|e| e.to_str()), Some("bin" | "u16" | "u32" | "npy"))
}

/// The cached token file of `text` under `tokenizer` (made now if missing), and whether it
/// was made.
pub(crate) fn tokenized(text: &Path, tokenizer: &Path, vocab: u64) -> Result<(PathBuf, bool)> {
    let tok_bytes = std::fs::read(tokenizer).map_err(|e| user(format!("{}: {e}", tokenizer.display())))?;
    let tok = tokenizers::Tokenizer::from_bytes(&tok_bytes).map_err(|e| user(format!("{}: not a tokenizer.json (HF tokenizers): {e}", tokenizer.display())))?;
    let n = tok.get_vocab_size(true) as u64;
    if n > vocab {
        bail!(UserError(format!("{}: {n} tokens, more than the model's vocabulary of {vocab}: ids past it would not train", tokenizer.display())));
    }
    let meta = std::fs::metadata(text).map_err(|e| user(format!("{}: {e}", text.display())))?;
    let mut h = Sha256::new();
    h.update(&tok_bytes);
    h.update(meta.len().to_le_bytes());
    if let Ok(m) = meta.modified().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).map_err(std::io::Error::other)) {
        h.update(m.as_nanos().to_le_bytes());
    }
    let tag: String = h.finalize().iter().take(6).map(|b| format!("{b:02x}")).collect();
    let wide = n > 65536;
    let out = PathBuf::from(format!("{}.{tag}.{}", text.display(), if wide { "u32" } else { "bin" }));
    if out.exists() {
        return Ok((out, false));
    }
    let f = std::fs::File::open(text).map_err(|e| user(format!("{}: {e}", text.display())))?;
    let mut reader = std::io::BufReader::new(f);
    let tmp = fsdp_ir::tmp_sibling(&out);
    let mut w = std::io::BufWriter::new(std::fs::File::create(&tmp).map_err(|e| user(format!("{}: {e}", tmp.display())))?);
    let (mut chunk, mut line, mut count) = (String::new(), String::new(), 0u64);
    let mut flush = |chunk: &mut String, w: &mut std::io::BufWriter<std::fs::File>| -> Result<()> {
        if chunk.is_empty() {
            return Ok(());
        }
        let enc = tok.encode(chunk.as_str(), false).map_err(|e| anyhow::anyhow!("{}: tokenizing: {e}", text.display()))?;
        for &id in enc.get_ids() {
            let bytes: Vec<u8> = if wide { id.to_le_bytes().to_vec() } else { (id as u16).to_le_bytes().to_vec() };
            w.write_all(&bytes)?;
        }
        count += enc.get_ids().len() as u64;
        chunk.clear();
        Ok(())
    };
    let result = (|| -> Result<()> {
        loop {
            line.clear();
            let read = reader.read_line(&mut line).map_err(|e| user(format!("{}: {e} (not UTF-8 text? token files end in .bin, .u32 or .npy)", text.display())))?;
            if read == 0 {
                break;
            }
            chunk.push_str(&line);
            if chunk.len() >= CHUNK {
                flush(&mut chunk, &mut w)?;
            }
        }
        flush(&mut chunk, &mut w)?;
        w.flush()?;
        Ok(())
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    drop(w);
    std::fs::rename(&tmp, &out).map_err(|e| user(format!("{}: {e}", out.display())))?;
    eprintln!("data: tokenized {} with {} into {} ({count} tokens)", text.display(), tokenizer.display(), out.display());
    Ok((out, true))
}
