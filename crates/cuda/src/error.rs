//! [`Error`]: why the CUDA driver is unavailable, or what a call attempted and what the driver
//! answered.

use std::fmt;

use crate::sys::CUresult;

/// A CUDA driver error: the driver could not be loaded (or is disabled), lacks a function, or
/// a call failed with a `CUresult`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// `LF_DISABLE_CUDA=1` keeps the driver from being loaded.
    Disabled,
    /// The driver library could not be opened.
    LibraryMissing {
        /// The name or path that was opened.
        library: String,
        /// The dynamic loader's reason.
        reason: String,
    },
    /// The driver library lacks a function (an older driver than the call needs).
    SymbolMissing { library: String, symbol: &'static str },
    /// A driver call returned an error.
    Call {
        /// What was attempted: the function, and where the caller said, on what.
        what: String,
        /// The `CUresult`.
        code: CUresult,
        /// `cuGetErrorName` of the code (`CUDA_ERROR_OUT_OF_MEMORY`), where the driver knows it.
        name: Option<&'static str>,
        /// `cuGetErrorString` of the code (`out of memory`), where the driver knows it.
        description: Option<&'static str>,
    },
}

impl Error {
    /// The `CUresult` of a failed call; `None` when the driver is unavailable.
    pub fn code(&self) -> Option<CUresult> {
        match self {
            Error::Call { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// Whether the driver could not be used at all (disabled, missing, or missing a function),
    /// as opposed to a call that failed.
    pub fn is_unavailable(&self) -> bool {
        !matches!(self, Error::Call { .. })
    }

    /// The same error, saying what was attempted in the caller's words: `what` replaces the
    /// bare function name of a failed call ("cuMemAlloc_v2 of 4096 bytes"). Other errors are
    /// returned unchanged.
    pub fn context(self, what: impl Into<String>) -> Error {
        match self {
            Error::Call { code, name, description, .. } => Error::Call { what: what.into(), code, name, description },
            other => other,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Disabled => write!(
                f,
                "CUDA is disabled by {}=1; unset it to let lava-flow use the CUDA driver",
                crate::DISABLE_CUDA_ENV
            ),
            Error::LibraryMissing { library, reason } => write!(
                f,
                "no CUDA driver was found: {library} could not be loaded ({reason}); install the NVIDIA driver \
                 (nvidia-smi shows it) or put its libcuda.so.1 on the loader's path (LD_LIBRARY_PATH)"
            ),
            Error::SymbolMissing { library, symbol } => write!(
                f,
                "the CUDA driver {library} has no {symbol}: the NVIDIA driver is too old for this call; update it"
            ),
            Error::Call { what, code, name, description } => {
                write!(f, "{what}: CUDA error {code}")?;
                if let Some(name) = name {
                    write!(f, " {name}")?;
                }
                if let Some(description) = description {
                    write!(f, " ({description})")?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for Error {}

/// A result of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
