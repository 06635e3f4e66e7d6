//! Checkpoints on disk: `.safetensors` files and model directories, read memory-mapped, written atomically.
//!
//! - [`Checkpoint::open`] takes a `.safetensors` file or a model directory (`config.json` plus `model.safetensors`,
//!   or shards listed in `model.safetensors.index.json`) and hands out tensors by name as [`TensorRef`]s borrowing
//!   the mapped files. Its `quantization_config` is parsed into a [`QuantConfig`].
//! - [`Checkpoint::quantized_layers`] finds the quantized linear layers by their tensor names and shapes
//!   ([`QuantLayer`]).
//! - [`write_safetensors`] and [`write_model_dir`] write outputs through a temporary sibling that is fsynced and
//!   renamed into place, so an output is either complete or absent; they refuse to replace an existing output
//!   unless told to, and never write over their input.
//!
//! Inputs are never modified. Every error names the file it concerns.

mod config;
mod layers;
mod write;

pub use config::{QuantConfig, QuantMethod};
pub use layers::{layer_suffixes, QuantLayer};
pub use write::{
    check_output, config_with_quantization, write_file_atomic, write_model_dir, write_safetensors, OutTensor,
    TensorData,
};

/// The safetensors crate's storage dtype (every dtype a file may hold, including those lowbit only copies).
pub use safetensors::Dtype as StDtype;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::TensorRef;
use memmap2::Mmap;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

/// Name of the single-file weights of a model directory.
pub const MODEL_FILE: &str = "model.safetensors";
/// Name of the shard index of a sharded model directory.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// Name of a model directory's configuration.
pub const CONFIG_FILE: &str = "config.json";

/// Key of the safetensors `__metadata__` entry in which lowbit stores a single file's `quantization_config` (as
/// JSON text), since a lone `.safetensors` file has no config.json.
pub const METADATA_QUANT_KEY: &str = "quantization_config";

/// Bytes of the little-endian u64 header length that starts every safetensors file.
const HEADER_LEN_BYTES: usize = 8;

/// The storage dtype lowbit computes with, if `dtype` is one.
pub fn dtype_from_st(dtype: StDtype) -> Option<DType> {
    Some(match dtype {
        StDtype::F32 => DType::F32,
        StDtype::F16 => DType::F16,
        StDtype::BF16 => DType::Bf16,
        StDtype::I32 => DType::I32,
        StDtype::I8 => DType::I8,
        StDtype::U8 => DType::U8,
        _ => return None,
    })
}

/// The safetensors dtype of a lowbit [`DType`].
pub fn dtype_to_st(dtype: DType) -> StDtype {
    match dtype {
        DType::F32 => StDtype::F32,
        DType::F16 => StDtype::F16,
        DType::Bf16 => StDtype::BF16,
        DType::I32 => StDtype::I32,
        DType::I8 => StDtype::I8,
        DType::U8 => StDtype::U8,
    }
}

/// A tensor of any safetensors dtype, borrowed from a mapped file: what is copied through unchanged.
#[derive(Debug, Clone, Copy)]
pub struct RawTensor<'a> {
    pub dtype: StDtype,
    pub shape: &'a [usize],
    pub data: &'a [u8],
}

/// One mapped safetensors file.
struct Shard {
    path: PathBuf,
    mmap: Mmap,
    /// `__metadata__` of the header.
    metadata: HashMap<String, String>,
}

impl Shard {
    fn bytes(&self) -> &[u8] {
        &self.mmap
    }
}

/// Where one tensor lives: its shard and absolute byte range in that shard's mapping.
#[derive(Debug)]
struct Entry {
    shard: usize,
    dtype: StDtype,
    shape: Vec<usize>,
    start: usize,
    end: usize,
}

/// An opened checkpoint: a `.safetensors` file or a model directory, memory-mapped.
pub struct Checkpoint {
    path: PathBuf,
    is_dir: bool,
    shards: Vec<Shard>,
    entries: BTreeMap<String, Entry>,
    config: Option<Value>,
    quant: Option<QuantConfig>,
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoint")
            .field("path", &self.path)
            .field("shards", &self.shards.iter().map(|s| &s.path).collect::<Vec<_>>())
            .field("tensors", &self.entries.len())
            .field("quantization_config", &self.quant)
            .finish()
    }
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| Error::parse(path, format!("invalid JSON: {e}")))
}

/// Maps `path` and checks its safetensors header against the file's length.
fn open_shard(path: &Path) -> Result<(Shard, Vec<(String, Entry)>)> {
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    let meta = file.metadata().map_err(|e| Error::io(path, e))?;
    if meta.is_dir() {
        return Err(Error::parse(path, "is a directory, expected a .safetensors file"));
    }
    let len = meta.len();
    if len < HEADER_LEN_BYTES as u64 {
        return Err(Error::parse(
            path,
            format!("truncated: {len} bytes, shorter than the 8-byte safetensors header length"),
        ));
    }
    // SAFETY: the mapping is read-only and lives as long as the `Shard`; as with every safetensors loader, a file
    // truncated by another process while mapped is outside what we can defend against.
    let mmap = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
    let bytes: &[u8] = &mmap;
    let header_len = u64::from_le_bytes(bytes[..HEADER_LEN_BYTES].try_into().expect("8 bytes checked above"));
    if header_len > len - HEADER_LEN_BYTES as u64 {
        return Err(Error::parse(
            path,
            format!(
                "header length {header_len} bytes extends beyond the end of the file ({len} bytes): \
                 truncated or not a safetensors file"
            ),
        ));
    }
    let (n, metadata) = safetensors::SafeTensors::read_metadata(bytes).map_err(|e| {
        use safetensors::SafeTensorError as E;
        let reason = match e {
            E::MetadataIncompleteBuffer => {
                format!("tensor data does not fill the file ({len} bytes): truncated or trailing bytes")
            }
            other => format!("corrupt safetensors header: {other}"),
        };
        Error::parse(path, reason)
    })?;
    let data_start = HEADER_LEN_BYTES + n;
    let entries = metadata
        .tensors()
        .into_iter()
        .map(|(name, info)| {
            let (s, e) = info.data_offsets;
            let entry = Entry {
                shard: 0,
                dtype: info.dtype,
                shape: info.shape.clone(),
                start: data_start + s,
                end: data_start + e,
            };
            (name, entry)
        })
        .collect();
    let shard = Shard {
        path: path.to_path_buf(),
        mmap,
        metadata: metadata.metadata().clone().unwrap_or_default(),
    };
    Ok((shard, entries))
}

impl Checkpoint {
    /// Opens a `.safetensors` file or a model directory.
    ///
    /// A directory holds `model.safetensors`, or `model.safetensors.index.json` and the shards it lists, or else
    /// exactly one `*.safetensors` file; its `config.json` is optional (unquantized models may come without).
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
        let mut ckpt = Checkpoint {
            path: path.to_path_buf(),
            is_dir: meta.is_dir(),
            shards: Vec::new(),
            entries: BTreeMap::new(),
            config: None,
            quant: None,
        };
        if !meta.is_dir() {
            ckpt.add_shard(path, None)?;
            // A lone file carries no config.json; lowbit records the quantization_config it wrote in the header.
            if let Some(text) = ckpt.metadata().get(METADATA_QUANT_KEY) {
                let qc: Value = serde_json::from_str(text)
                    .map_err(|e| Error::parse(path, format!("__metadata__.{METADATA_QUANT_KEY}: invalid JSON: {e}")))?;
                ckpt.quant = Some(QuantConfig::from_json(&qc, path)?);
            }
            return Ok(ckpt);
        }

        let config_path = path.join(CONFIG_FILE);
        if config_path.exists() {
            let config = read_json(&config_path)?;
            if let Some(qc) = config.get("quantization_config").filter(|v| !v.is_null()) {
                ckpt.quant = Some(QuantConfig::from_json(qc, &config_path)?);
            }
            ckpt.config = Some(config);
        }

        let index_path = path.join(INDEX_FILE);
        if path.join(MODEL_FILE).exists() {
            ckpt.add_shard(&path.join(MODEL_FILE), None)?;
        } else if index_path.exists() {
            ckpt.open_index(&index_path)?;
        } else {
            let candidates = safetensors_files(path)?;
            match &candidates[..] {
                [only] => ckpt.add_shard(only, None)?,
                [] => {
                    return Err(Error::parse(
                        path,
                        format!("no {MODEL_FILE}, {INDEX_FILE} or other .safetensors file in this directory"),
                    ))
                }
                _ => {
                    return Err(Error::parse(
                        path,
                        format!(
                            "{} .safetensors files but no {INDEX_FILE} saying which to read",
                            candidates.len()
                        ),
                    ))
                }
            }
        }
        Ok(ckpt)
    }

    /// Reads the shard index and maps every shard it names; every listed tensor must be in its shard.
    fn open_index(&mut self, index_path: &Path) -> Result<()> {
        let index = read_json(index_path)?;
        let weight_map = index
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| Error::parse(index_path, "no \"weight_map\" object"))?;
        let mut files: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (name, file) in weight_map {
            let file = file
                .as_str()
                .filter(|f| !f.contains('/') && !f.contains('\\') && *f != ".." && !f.is_empty())
                .ok_or_else(|| Error::parse(index_path, format!("weight_map.{name}: {file} is not a file name")))?;
            files.entry(file).or_default().push(name);
        }
        let dir = index_path.parent().expect("the index is inside the model directory");
        for (file, names) in files {
            let shard_path = dir.join(file);
            self.add_shard(&shard_path, Some(&names))?;
        }
        Ok(())
    }

    /// Maps one file and registers its tensors (only `only` if given: the index decides which shard owns what).
    fn add_shard(&mut self, path: &Path, only: Option<&[&str]>) -> Result<()> {
        let (shard, entries) = open_shard(path)?;
        let shard_idx = self.shards.len();
        let mut entries: HashMap<String, Entry> = entries.into_iter().collect();
        let names: Vec<String> = match only {
            Some(names) => names.iter().map(|s| s.to_string()).collect(),
            None => entries.keys().cloned().collect(),
        };
        for name in names {
            let Some(mut entry) = entries.remove(&name) else {
                return Err(Error::MissingTensor {
                    name,
                    context: Some(format!("listed in {INDEX_FILE}, absent from {}", path.display())),
                });
            };
            entry.shard = shard_idx;
            if self.entries.contains_key(&name) {
                return Err(Error::parse(
                    path,
                    format!("tensor {name} appears in more than one shard"),
                ));
            }
            self.entries.insert(name, entry);
        }
        self.shards.push(shard);
        Ok(())
    }

    /// The path this checkpoint was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether it was opened from a model directory (rather than a single `.safetensors` file).
    pub fn is_dir(&self) -> bool {
        self.is_dir
    }

    /// The safetensors files it reads (one, or the shards).
    pub fn files(&self) -> Vec<&Path> {
        self.shards.iter().map(|s| s.path.as_path()).collect()
    }

    /// The parsed `config.json` of a model directory.
    pub fn config(&self) -> Option<&Value> {
        self.config.as_ref()
    }

    /// The parsed `quantization_config`: a directory's config.json's, or the one lowbit recorded in a single file's
    /// `__metadata__` ([`METADATA_QUANT_KEY`]).
    pub fn quant_config(&self) -> Option<&QuantConfig> {
        self.quant.as_ref()
    }

    /// The `__metadata__` of the (first) safetensors file's header.
    pub fn metadata(&self) -> &HashMap<String, String> {
        static EMPTY: std::sync::OnceLock<HashMap<String, String>> = std::sync::OnceLock::new();
        self.shards
            .first()
            .map_or_else(|| EMPTY.get_or_init(HashMap::new), |s| &s.metadata)
    }

    /// Every tensor name, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds no tensors.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether a tensor of this name exists.
    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// Shape of a tensor, if it exists.
    pub fn shape(&self, name: &str) -> Option<&[usize]> {
        self.entries.get(name).map(|e| e.shape.as_slice())
    }

    /// Storage dtype of a tensor, if it exists.
    pub fn st_dtype(&self, name: &str) -> Option<StDtype> {
        self.entries.get(name).map(|e| e.dtype)
    }

    fn entry(&self, name: &str) -> Result<&Entry> {
        self.entries.get(name).ok_or_else(|| Error::MissingTensor {
            name: name.to_string(),
            context: Some(format!("not in {}", self.path.display())),
        })
    }

    /// A tensor of any dtype, as stored (for copying through unchanged).
    pub fn raw(&self, name: &str) -> Result<RawTensor<'_>> {
        let e = self.entry(name)?;
        Ok(RawTensor {
            dtype: e.dtype,
            shape: &e.shape,
            data: &self.shards[e.shard].bytes()[e.start..e.end],
        })
    }

    /// A tensor lowbit computes with (f32, f16, bf16, i32, i8, u8), borrowed from the mapped file.
    pub fn tensor(&self, name: &str) -> Result<TensorRef<'_>> {
        let raw = self.raw(name)?;
        let dtype = dtype_from_st(raw.dtype).ok_or_else(|| {
            Error::invalid(
                name,
                format!("dtype {:?}", raw.dtype),
                "dtype must be F32, F16, BF16, I32, I8 or U8",
            )
        })?;
        TensorRef::new(name, dtype, raw.shape.to_vec(), raw.data)
    }

    /// The tensor `name` if present (`Ok(None)` when absent, an error when present but unreadable).
    pub fn tensor_opt(&self, name: &str) -> Result<Option<TensorRef<'_>>> {
        if self.contains(name) {
            self.tensor(name).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Total bytes of tensor data.
    pub fn data_bytes(&self) -> u64 {
        self.entries.values().map(|e| (e.end - e.start) as u64).sum()
    }

    /// The quantized linear layers, found by tensor names and shapes (see [`QuantLayer`]), sorted by prefix.
    pub fn quantized_layers(&self) -> Result<Vec<QuantLayer>> {
        layers::detect(self)
    }
}

/// The `*.safetensors` files directly inside `dir`, sorted.
fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let p = entry.map_err(|e| Error::io(dir, e))?.path();
        if p.extension().is_some_and(|e| e == "safetensors") && p.is_file() {
            out.push(p);
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests;
