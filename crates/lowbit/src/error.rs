//! The one error type of the `lowbit` crate.
//!
//! Every error that comes from user input names the tensor (or file, or option), the offending value and the rule
//! it breaks, so that the CLI can print it as a single line and exit non-zero.

use std::path::PathBuf;

/// Everything that can go wrong in lowbit.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A tensor, option or parameter has a value that breaks a documented rule.
    #[error("{tensor}: {value} violates: {rule}")]
    Invalid {
        /// What the value belongs to (`"model.layers.0.q_proj.qweight"`, `"group_size"`, ...).
        tensor: String,
        /// The offending value, as the user would recognise it (`"shape [4096, 511]"`).
        value: String,
        /// The rule it breaks (`"N must be a multiple of 8"`).
        rule: String,
    },

    /// A tensor a format needs is absent.
    #[error("missing tensor {name}{}", context.as_deref().map(|c| format!(" ({c})")).unwrap_or_default())]
    MissingTensor { name: String, context: Option<String> },

    /// The information the target format needs is not in the source (e.g. act-order `g_idx` into AWQ).
    #[error("cannot convert {from} to {to}: {reason}")]
    Conversion { from: String, to: String, reason: String },

    /// A feature or combination lowbit does not implement.
    #[error("unsupported: {0}")]
    Unsupported(String),

    /// Reading or writing a file failed.
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },

    /// A safetensors file or a config.json could not be parsed.
    #[error("{}: {reason}", path.display())]
    Parse { path: PathBuf, reason: String },

    /// An output exists and overwriting was not asked for.
    #[error("{}: output exists (pass --force to overwrite)", path.display())]
    OutputExists { path: PathBuf },

    /// No usable CUDA device, driver or NVRTC; the message says which and why.
    #[error("CUDA unavailable: {0}")]
    CudaUnavailable(String),

    /// A CUDA driver, cuBLAS or launch failure, naming what was being done.
    #[error("CUDA error in {context}: {message}")]
    Cuda { context: String, message: String },

    /// NVRTC rejected a kernel source; the compiler log is included.
    #[error("NVRTC failed to compile {kernel} for {arch}:\n{log}")]
    Compile { kernel: String, arch: String, log: String },
}

/// `Result` with lowbit's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Shorthand for [`Error::Invalid`].
    pub fn invalid(tensor: impl Into<String>, value: impl std::fmt::Display, rule: impl Into<String>) -> Self {
        Error::Invalid {
            tensor: tensor.into(),
            value: value.to_string(),
            rule: rule.into(),
        }
    }

    /// Shorthand for [`Error::Io`].
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    /// Shorthand for [`Error::Parse`].
    pub fn parse(path: impl Into<PathBuf>, reason: impl std::fmt::Display) -> Self {
        Error::Parse {
            path: path.into(),
            reason: reason.to_string(),
        }
    }
}

/// Fails with [`Error::Invalid`] unless `cond` holds.
pub(crate) fn ensure(cond: bool, tensor: &str, value: impl std::fmt::Display, rule: &str) -> Result<()> {
    if cond {
        Ok(())
    } else {
        Err(Error::invalid(tensor, value, rule))
    }
}
