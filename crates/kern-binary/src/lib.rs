//! Readers for GPU binaries: which kernels does this file hold, and with what parameters?
//!
//! kern executes kernels it did not compile, so everything it knows about a kernel comes from
//! the kernel image itself. This crate reads the four forms a kernel arrives in:
//!
//! * a **cubin** (ELF, `EM_CUDA`): kernels are `STO_ENTRY` symbols; their parameter layout,
//!   register count, required block size and so on live in `.nv.info` records ([`nvinfo`]);
//! * **PTX** text: `.entry` declarations with typed `.param`s ([`ptx`]);
//! * a **fatbin** container holding several cubins / PTX files, possibly LZ4- or
//!   zstd-compressed ([`fatbin`]);
//! * a **host ELF** (`.so` or executable) that embeds fatbins in `.nv_fatbin` ([`host`]).
//!
//! [`read`] sniffs the format and returns a [`Binary`]: a list of [`Image`]s, each with its
//! [`Kernel`]s. [`Binary::select`] picks the image kern would load for a given SM.
//!
//! Every reader works on untrusted bytes: it never panics, never reads out of bounds, bounds
//! every allocation by the input size (or a fixed cap for decompression), and reports errors
//! as [`Error`] with the file name and the byte offset where reading failed.

pub mod arch;
pub mod cubin;
pub mod cute;
pub mod demangle;
pub mod error;
pub mod fatbin;
pub mod host;
pub mod nvinfo;
pub mod ptx;
mod read;

pub use arch::Arch;
pub use error::{Error, Result};
pub use read::{read, read_file};

use serde::Serialize;

/// What kind of file was read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    Cubin,
    Ptx,
    Fatbin,
    /// A host ELF (shared object or executable) with embedded device code.
    HostElf,
}

/// The kind of one device-code image.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ImageKind {
    Cubin,
    Ptx,
}

/// How an image was stored inside a fatbin.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Compression {
    None,
    Lz4,
    Zstd,
}

/// A whole file: one or more device-code images.
#[derive(Clone, Debug, Serialize)]
pub struct Binary {
    pub file: String,
    pub kind: FileKind,
    pub images: Vec<Image>,
}

/// One device-code image (a cubin or a PTX text), with the kernels it defines.
#[derive(Clone, Debug, Serialize)]
pub struct Image {
    pub kind: ImageKind,
    /// The SM this image was built for (`sm_90`, `sm_90a`), or for PTX its `.target`.
    pub arch: Option<Arch>,
    /// Whether the image was stored compressed in its container.
    pub compressed: bool,
    pub compression: Compression,
    /// Byte offset of this image's entry in the file it was read from (0 for a bare file).
    pub offset: u64,
    /// Which fatbin container (module) the image belongs to: a host binary built from several
    /// `.cu` files holds one container per file, each with its own images for each arch. 0 for
    /// a bare cubin or PTX file.
    pub container: u32,
    /// Size of the (decompressed) image in bytes.
    pub size: u64,
    /// The fatbin entry's object name, where it records one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// For a cubin: the toolkit version that built it (`13.0`), from the ELF header.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub toolkit: Option<String>,
    /// For PTX: the `.version` directive (`9.0`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ptx_version: Option<String>,
    pub kernels: Vec<Kernel>,
    /// The decompressed image bytes: what `cuModuleLoadData` takes (PTX without the NUL).
    #[serde(skip)]
    pub data: Vec<u8>,
}

/// One kernel (an entry point; helper functions are not kernels).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Kernel {
    /// The symbol as it is in the image (mangled).
    pub name: String,
    /// The Itanium-demangled signature, where the name is a C++ mangled name.
    pub demangled: Option<String>,
    /// The parameter types read from the demangled signature, one per parameter.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpp_params: Option<Vec<String>>,
    /// A CuTe DSL name decoded into its parts, where the name is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cute: Option<cute::CuteName>,
    /// Parameters in ordinal order.
    pub params: Vec<Param>,
    /// Total parameter bytes (CBANK_PARAM_SIZE for a cubin; computed for PTX).
    pub param_bytes: u32,
    pub registers: Option<u32>,
    /// Static shared memory (size of `.nv.shared.<kernel>`).
    pub shared_bytes: Option<u64>,
    /// Per-kernel local memory frame (stack) size.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frame_bytes: Option<u32>,
    /// `.maxntid` / `__launch_bounds__`: the largest block this kernel accepts.
    pub max_threads: Option<[u32; 3]>,
    /// `.reqntid`: the exact block this kernel must be launched with.
    pub required_block: Option<[u32; 3]>,
    /// Minimum number of CTAs per SM asked for (`.minnctapersm`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_ctas_per_sm: Option<u32>,
    /// Maximum register count the kernel was compiled with.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_registers: Option<u32>,
}

/// One kernel parameter, as the image lays it out in the parameter constant bank.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Param {
    pub ordinal: u32,
    pub offset: u32,
    pub size: u32,
    /// Alignment in bytes, where the image records it (PTX `.align`, or inferred).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub align: Option<u32>,
    /// The PTX type (`u64`, `f32`, `b8` for byte arrays), for PTX images.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ptx_type: Option<String>,
    /// Whether PTX marks the parameter `.ptr`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub pointer: bool,
}

impl Binary {
    /// The image kern would load on a device of architecture `arch`, for files with one
    /// container (module): an exact SASS match, else the newest PTX whose target is not newer
    /// than `arch` (see [`arch::select`]). For a file with several containers this is the
    /// choice in the first container whose choice has kernels; use [`Binary::selected`] or
    /// [`Binary::find_kernel`] there.
    pub fn select(&self, arch: Arch) -> Option<(usize, &Image)> {
        let sel = self.selected(arch);
        sel.iter()
            .find(|&&i| !self.images[i].kernels.is_empty())
            .or(sel.first())
            .map(|&i| (i, &self.images[i]))
    }

    /// The image kern would load from each container, in container order (containers where no
    /// image fits are left out).
    pub fn selected(&self, arch: Arch) -> Vec<usize> {
        let mut out = Vec::new();
        let mut containers: Vec<u32> = self.images.iter().map(|im| im.container).collect();
        containers.sort_unstable();
        containers.dedup();
        for c in containers {
            let idx: Vec<usize> = (0..self.images.len()).filter(|&i| self.images[i].container == c).collect();
            if let Some(j) = arch::select_among(&self.images, &idx, arch) {
                out.push(j);
            }
        }
        out
    }

    /// The loaded image that defines kernel `name`, and the kernel.
    pub fn find_kernel(&self, arch: Arch, name: &str) -> Option<(usize, &Image, &Kernel)> {
        self.selected(arch).into_iter().find_map(|i| {
            let im = &self.images[i];
            im.kernel(name).map(|k| (i, im, k))
        })
    }

    /// Every kernel in every image, with its image index.
    pub fn kernels(&self) -> impl Iterator<Item = (usize, &Kernel)> {
        self.images.iter().enumerate().flat_map(|(i, im)| im.kernels.iter().map(move |k| (i, k)))
    }
}

impl Image {
    pub fn kernel(&self, name: &str) -> Option<&Kernel> {
        self.kernels.iter().find(|k| k.name == name)
    }
}
