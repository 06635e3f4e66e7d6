//! Writing checkpoints atomically: everything goes to a temporary sibling of the output (same directory, so the
//! final `rename` is atomic), is fsynced, and only then renamed into place. On any error, or a panic, the
//! temporary is removed, so an output is either complete or absent.

use super::{RawTensor, StDtype, CONFIG_FILE, INDEX_FILE, MODEL_FILE};
use crate::error::{Error, Result};
use crate::tensor::{Tensor, TensorRef};
use serde_json::Value;
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A tensor to write: any safetensors dtype; its bytes owned, borrowed (from an input's mapping), or computed when
/// the writer reaches it.
#[derive(Debug)]
pub struct OutTensor<'a> {
    pub dtype: StDtype,
    pub shape: Vec<usize>,
    pub data: TensorData<'a>,
}

/// The bytes of an [`OutTensor`].
pub enum TensorData<'a> {
    /// Bytes at hand.
    Bytes(Cow<'a, [u8]>),
    /// Bytes computed when the writer gets to this tensor and dropped once written, so an output larger than memory
    /// (dequantized weights) streams through. An error aborts the write and leaves no output.
    Deferred(Box<dyn Fn() -> Result<Vec<u8>> + 'a>),
}

impl std::fmt::Debug for TensorData<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TensorData::Bytes(b) => write!(f, "Bytes({} bytes)", b.len()),
            TensorData::Deferred(_) => f.write_str("Deferred"),
        }
    }
}

impl<'a> OutTensor<'a> {
    /// A tensor whose bytes `produce` computes when the writer reaches it.
    pub fn deferred(dtype: StDtype, shape: Vec<usize>, produce: impl Fn() -> Result<Vec<u8>> + 'a) -> Self {
        OutTensor {
            dtype,
            shape,
            data: TensorData::Deferred(Box::new(produce)),
        }
    }

    /// The bytes, unless they are deferred.
    pub fn bytes(&self) -> Option<&[u8]> {
        match &self.data {
            TensorData::Bytes(b) => Some(b),
            TensorData::Deferred(_) => None,
        }
    }

    /// The byte length its dtype and shape call for (`None` on overflow or for a sub-byte remainder).
    pub fn expected_len(&self) -> Option<usize> {
        let numel = self.shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))?;
        let bits = numel.checked_mul(self.dtype.bitsize())?;
        (bits % 8 == 0).then_some(bits / 8)
    }
}

impl From<Tensor> for OutTensor<'static> {
    fn from(t: Tensor) -> Self {
        OutTensor {
            dtype: super::dtype_to_st(t.dtype),
            shape: t.shape,
            data: TensorData::Bytes(Cow::Owned(t.data)),
        }
    }
}

impl<'a> From<RawTensor<'a>> for OutTensor<'a> {
    fn from(t: RawTensor<'a>) -> Self {
        OutTensor {
            dtype: t.dtype,
            shape: t.shape.to_vec(),
            data: TensorData::Bytes(Cow::Borrowed(t.data)),
        }
    }
}

impl<'a> From<&TensorRef<'a>> for OutTensor<'a> {
    fn from(t: &TensorRef<'a>) -> Self {
        OutTensor {
            dtype: super::dtype_to_st(t.dtype),
            shape: t.shape.clone(),
            data: TensorData::Bytes(Cow::Borrowed(t.data)),
        }
    }
}

/// Fails unless `output` may be written: it must not be the input (inputs are never modified), must not exist
/// unless `force`, and its parent directory must exist.
pub fn check_output(output: &Path, input: &Path, force: bool) -> Result<()> {
    // An output that does not exist yet is resolved through its parent directory.
    let resolved = std::fs::canonicalize(output).or_else(|_| {
        let name = output.file_name().unwrap_or_default();
        std::fs::canonicalize(parent_dir(output)).map(|p| p.join(name))
    });
    let same = match (resolved, std::fs::canonicalize(input)) {
        (Ok(o), Ok(i)) => o == i || o.starts_with(&i) && i.is_dir(),
        _ => false,
    };
    if same {
        return Err(Error::invalid(
            "--output",
            output.display(),
            "must not be or lie inside the input (inputs are never modified)",
        ));
    }
    if output.symlink_metadata().is_ok() && !force {
        return Err(Error::OutputExists {
            path: output.to_path_buf(),
        });
    }
    let parent = parent_dir(output);
    if !parent.is_dir() {
        return Err(Error::io(
            output,
            std::io::Error::new(std::io::ErrorKind::NotFound, "parent directory does not exist"),
        ));
    }
    Ok(())
}

/// The directory `path` lives in (`.` for a bare file name).
fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// A temporary file or directory next to `target`, removed on drop unless [`Staged::commit`] renamed it.
struct Staged {
    tmp: PathBuf,
    target: PathBuf,
    committed: bool,
}

impl Staged {
    fn new(target: &Path) -> Self {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let name = target
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "output".into());
        let unique = format!("{}.{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed));
        Staged {
            tmp: parent_dir(target).join(format!(".{name}.lowbit-tmp.{unique}")),
            target: target.to_path_buf(),
            committed: false,
        }
    }

    /// Moves the staged output into place; an existing target is replaced only if `force`.
    fn commit(mut self, force: bool) -> Result<()> {
        let target = self.target.clone();
        let exists = target.symlink_metadata().is_ok();
        if exists && !force {
            return Err(Error::OutputExists { path: target });
        }
        let replacing_dir = exists && target.is_dir() && !target.is_symlink();
        if replacing_dir {
            // A directory cannot be renamed over another: move the old one aside, then drop it.
            let old = parent_dir(&target).join(format!(
                ".{}.lowbit-old.{}",
                self.tmp.file_name().unwrap_or_default().to_string_lossy(),
                std::process::id()
            ));
            std::fs::rename(&target, &old).map_err(|e| Error::io(&target, e))?;
            if let Err(e) = std::fs::rename(&self.tmp, &target) {
                let _ = std::fs::rename(&old, &target);
                return Err(Error::io(&target, e));
            }
            self.committed = true;
            std::fs::remove_dir_all(&old).map_err(|e| Error::io(&old, e))?;
        } else {
            std::fs::rename(&self.tmp, &target).map_err(|e| Error::io(&target, e))?;
            self.committed = true;
        }
        sync_dir(&parent_dir(&target));
        Ok(())
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.committed {
            let _ = if self.tmp.is_dir() {
                std::fs::remove_dir_all(&self.tmp)
            } else {
                std::fs::remove_file(&self.tmp)
            };
        }
    }
}

/// Makes a rename durable. Best effort: some filesystems cannot open or fsync a directory.
fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

/// The byte length of `t`'s data as its dtype and shape require, or an error naming the tensor.
fn checked_len(name: &str, t: &OutTensor<'_>, have: Option<usize>) -> Result<usize> {
    match (t.expected_len(), have) {
        (Some(want), Some(have)) if want == have => Ok(want),
        (Some(want), None) => Ok(want),
        (want, have) => Err(Error::invalid(
            name,
            format!(
                "{} bytes for shape {:?} {:?}",
                have.map_or("?".into(), |h| h.to_string()),
                t.shape,
                t.dtype
            ),
            format!(
                "data length must equal product(shape) * dtype size{}",
                want.map_or(String::new(), |w| format!(" = {w}"))
            ),
        )),
    }
}

/// Checks names are unique and each tensor's bytes at hand match its dtype and shape; returns every byte length.
fn validate(tensors: &[(String, OutTensor<'_>)]) -> Result<Vec<usize>> {
    let mut seen = std::collections::HashSet::new();
    tensors
        .iter()
        .map(|(name, t)| {
            if !seen.insert(name.as_str()) {
                return Err(Error::invalid(
                    name,
                    "a second tensor of this name",
                    "tensor names must be unique",
                ));
            }
            let have = match &t.data {
                TensorData::Bytes(b) => Some(b.len()),
                TensorData::Deferred(_) => None,
            };
            checked_len(name, t, have)
        })
        .collect()
}

/// Writes a safetensors file to `path` (not atomically: callers write into a staged temporary) and fsyncs it.
/// Tensors are laid out as the safetensors crate does (by descending dtype alignment, then name); `report` names
/// the path in errors.
fn write_safetensors_at(
    path: &Path,
    report: &Path,
    tensors: &[(String, OutTensor<'_>)],
    metadata: Option<&HashMap<String, String>>,
) -> Result<()> {
    let lens = validate(tensors)?;
    let mut order: Vec<(&String, &OutTensor<'_>, usize)> = tensors
        .iter()
        .zip(lens)
        .map(|((name, t), len)| (name, t, len))
        .collect();
    order.sort_by(|(ln, l, _), (rn, r, _)| r.dtype.cmp(&l.dtype).then(ln.cmp(rn)));

    let mut header = serde_json::Map::new();
    if let Some(meta) = metadata.filter(|m| !m.is_empty()) {
        let sorted: BTreeMap<_, _> = meta.iter().collect();
        header.insert(
            "__metadata__".into(),
            serde_json::to_value(sorted).expect("strings serialise"),
        );
    }
    let mut offset = 0usize;
    for (name, t, len) in &order {
        let end = offset + len;
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": t.dtype, "shape": t.shape, "data_offsets": [offset, end]}),
        );
        offset = end;
    }
    let mut header = serde_json::to_vec(&header).expect("a JSON map serialises");
    // Tensor data starts 8-byte aligned, as the format recommends: pad the header with spaces.
    header.resize(header.len().next_multiple_of(8), b' ');

    let io = |e| Error::io(report, e);
    let file = File::create(path).map_err(io)?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    w.write_all(&(header.len() as u64).to_le_bytes()).map_err(io)?;
    w.write_all(&header).map_err(io)?;
    for (name, t, _) in &order {
        match &t.data {
            TensorData::Bytes(b) => w.write_all(b).map_err(io)?,
            TensorData::Deferred(produce) => {
                let bytes = produce()?;
                checked_len(name, t, Some(bytes.len()))?;
                w.write_all(&bytes).map_err(io)?;
            }
        }
    }
    let file = w.into_inner().map_err(|e| Error::io(report, e.into_error()))?;
    file.sync_all().map_err(io)
}

/// Writes `tensors` to the safetensors file `path` atomically, with `metadata` as its `__metadata__`.
/// An existing `path` is replaced only if `force`.
pub fn write_safetensors(
    path: &Path,
    tensors: &[(String, OutTensor<'_>)],
    metadata: Option<&HashMap<String, String>>,
    force: bool,
) -> Result<()> {
    if path.symlink_metadata().is_ok() && !force {
        return Err(Error::OutputExists {
            path: path.to_path_buf(),
        });
    }
    let staged = Staged::new(path);
    write_safetensors_at(&staged.tmp, path, tensors, metadata)?;
    staged.commit(force)
}

/// Writes `bytes` to `path` atomically (temporary file, fsync, rename). An existing `path` is replaced only if `force`.
pub fn write_file_atomic(path: &Path, bytes: &[u8], force: bool) -> Result<()> {
    if path.symlink_metadata().is_ok() && !force {
        return Err(Error::OutputExists {
            path: path.to_path_buf(),
        });
    }
    let staged = Staged::new(path);
    write_synced(&staged.tmp, bytes).map_err(|e| Error::io(path, e))?;
    staged.commit(force)
}

/// A model config.json with `quantization_config` set to `quant` (or removed when `None`), keeping every other key
/// of `base`.
pub fn config_with_quantization(base: Option<&Value>, quant: Option<Value>) -> Value {
    let mut obj = base.and_then(Value::as_object).cloned().unwrap_or_default();
    match quant {
        Some(q) => obj.insert("quantization_config".into(), q),
        None => obj.remove("quantization_config"),
    };
    Value::Object(obj)
}

/// Whether a file of a source model directory holds weights (which the new checkpoint replaces) rather than
/// tokenizer, generation config and the like (which are copied).
fn is_weight_file(name: &str) -> bool {
    name == CONFIG_FILE
        || name == INDEX_FILE
        || name.ends_with(".safetensors")
        || name.ends_with(".safetensors.index.json")
        || name.starts_with("pytorch_model") && (name.ends_with(".bin") || name.ends_with(".bin.index.json"))
        || name.starts_with('.')
}

/// Writes a model directory `out` atomically: `model.safetensors` holding `tensors`, `config.json` = `config`,
/// and a copy of every other top-level file of `copy_from` (tokenizer, generation config, ...; weight files and
/// subdirectories are not copied). An existing `out` is replaced only if `force`.
pub fn write_model_dir(
    out: &Path,
    tensors: &[(String, OutTensor<'_>)],
    metadata: Option<&HashMap<String, String>>,
    config: &Value,
    copy_from: Option<&Path>,
    force: bool,
) -> Result<()> {
    if out.symlink_metadata().is_ok() && !force {
        return Err(Error::OutputExists {
            path: out.to_path_buf(),
        });
    }
    let staged = Staged::new(out);
    std::fs::create_dir(&staged.tmp).map_err(|e| Error::io(out, e))?;

    write_safetensors_at(&staged.tmp.join(MODEL_FILE), &out.join(MODEL_FILE), tensors, metadata)?;

    let config_out = out.join(CONFIG_FILE);
    let mut text = serde_json::to_string_pretty(config).expect("a JSON value serialises");
    text.push('\n');
    write_synced(&staged.tmp.join(CONFIG_FILE), text.as_bytes()).map_err(|e| Error::io(&config_out, e))?;

    if let Some(src) = copy_from {
        for entry in std::fs::read_dir(src).map_err(|e| Error::io(src, e))? {
            let entry = entry.map_err(|e| Error::io(src, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let from = entry.path();
            if is_weight_file(&name) || !from.is_file() {
                continue;
            }
            let bytes = std::fs::read(&from).map_err(|e| Error::io(&from, e))?;
            write_synced(&staged.tmp.join(&name), &bytes).map_err(|e| Error::io(out.join(&name), e))?;
        }
    }
    sync_dir(&staged.tmp);
    staged.commit(force)
}

fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = File::create(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}
