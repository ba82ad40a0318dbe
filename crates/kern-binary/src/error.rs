//! The one error type of the binary readers: every error names the file, where in it (byte
//! offset, and for nested images the container entry), and what was wrong.

/// Result of a binary reader.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The bytes are not in a format kern reads.
    #[error("{file}: not a GPU binary kern can read: {reason}")]
    Unrecognized { file: String, reason: String },
    /// The file is in a known format but is corrupt, truncated or hostile.
    #[error("{file}: {location}at byte offset {offset:#x}: {reason}")]
    Malformed {
        file: String,
        /// Where inside the file, for nested images ("fatbin entry 2 (ELF, sm_90) at 0x50: "),
        /// empty for a top-level error.
        location: String,
        offset: u64,
        reason: String,
    },
    /// The file could not be read from disk.
    #[error("{file}: {cause}")]
    Io {
        file: String,
        cause: std::io::Error,
    },
}

impl Error {
    /// The byte offset the error refers to, where there is one.
    pub fn offset(&self) -> Option<u64> {
        match self {
            Error::Malformed { offset, .. } => Some(*offset),
            _ => None,
        }
    }
}

/// Where a reader is: the file name and the location prefix of a nested image. Readers build
/// errors through this so that nested errors name the container entry as well as the offset.
#[derive(Clone, Debug)]
pub(crate) struct Ctx {
    pub file: String,
    pub location: String,
}

impl Ctx {
    pub fn new(file: &str) -> Self {
        Ctx { file: file.to_string(), location: String::new() }
    }

    /// A context for an image nested inside this one.
    pub fn nested(&self, what: String) -> Self {
        Ctx { file: self.file.clone(), location: format!("{}{}: ", self.location, what) }
    }

    pub fn err(&self, offset: u64, reason: impl Into<String>) -> Error {
        Error::Malformed {
            file: self.file.clone(),
            location: self.location.clone(),
            offset,
            reason: reason.into(),
        }
    }
}

/// Bounds-checked little-endian reads over a byte slice. Every method returns `None` when the
/// read would go past the end, so callers turn that into an error with their own offset.
pub(crate) trait LeBytes {
    fn u16_at(&self, off: usize) -> Option<u16>;
    fn u32_at(&self, off: usize) -> Option<u32>;
    fn u64_at(&self, off: usize) -> Option<u64>;
    fn slice_at(&self, off: usize, len: usize) -> Option<&[u8]>;
}

impl LeBytes for [u8] {
    fn u16_at(&self, off: usize) -> Option<u16> {
        let b = self.get(off..off.checked_add(2)?)?;
        Some(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32_at(&self, off: usize) -> Option<u32> {
        let b = self.get(off..off.checked_add(4)?)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64_at(&self, off: usize) -> Option<u64> {
        let b = self.get(off..off.checked_add(8)?)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Some(u64::from_le_bytes(a))
    }
    fn slice_at(&self, off: usize, len: usize) -> Option<&[u8]> {
        self.get(off..off.checked_add(len)?)
    }
}
