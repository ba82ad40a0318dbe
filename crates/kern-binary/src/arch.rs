//! GPU architectures (`sm_90`, `sm_90a`) and the rule for choosing which image of a
//! multi-image file a device loads.

use crate::{Image, ImageKind};
use serde::{Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// A compute capability with its optional feature suffix: `sm_90` is `Arch { sm: 90, suffix:
/// None }`, `sm_90a` has suffix `a` (architecture-specific features such as wgmma, which run
/// only on that exact SM), `sm_100f` suffix `f` (family-specific).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Arch {
    pub sm: u32,
    pub suffix: Option<char>,
}

impl Arch {
    pub const fn new(sm: u32) -> Self {
        Arch { sm, suffix: None }
    }
    pub fn major(&self) -> u32 {
        self.sm / 10
    }
    pub fn minor(&self) -> u32 {
        self.sm % 10
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sm_{}", self.sm)?;
        if let Some(s) = self.suffix {
            write!(f, "{s}")?;
        }
        Ok(())
    }
}

impl Serialize for Arch {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl FromStr for Arch {
    type Err = String;
    /// Accepts `sm_90`, `sm_90a`, `compute_90`, `90`, `9.0`.
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("`{s}` is not a GPU architecture: write it as sm_90, sm_90a or 9.0");
        let t = s.trim();
        let t = t.strip_prefix("sm_").or_else(|| t.strip_prefix("compute_")).unwrap_or(t);
        if let Some((maj, min)) = t.split_once('.') {
            let maj: u32 = maj.parse().map_err(|_| bad())?;
            let min: u32 = min.parse().map_err(|_| bad())?;
            if min > 9 || maj > 99 {
                return Err(bad());
            }
            return Ok(Arch::new(maj * 10 + min));
        }
        let digits: String = t.chars().take_while(|c| c.is_ascii_digit()).collect();
        let rest = &t[digits.len()..];
        let sm: u32 = digits.parse().map_err(|_| bad())?;
        if !(10..=999).contains(&sm) {
            return Err(bad());
        }
        let suffix = match rest {
            "" => None,
            "a" | "f" => rest.chars().next(),
            _ => return Err(bad()),
        };
        Ok(Arch { sm, suffix })
    }
}

/// Which image a device of architecture `device` would load, kern's rule (the driver's, made
/// explicit): a cubin built for exactly this SM (an `sm_90a` image needs the device to be
/// SM 9.0; a plain `sm_90` cubin also runs on it); otherwise the PTX with the newest target not
/// newer than the device, which the driver JIT-compiles. Cubins for other SMs are never chosen:
/// SASS is not compatible across major versions, and kern does not rely on minor-version
/// compatibility.
pub fn select(images: &[Image], device: Arch) -> Option<(usize, &Image)> {
    let all: Vec<usize> = (0..images.len()).collect();
    select_among(images, &all, device).map(|i| (i, &images[i]))
}

/// [`select`] restricted to the images at `candidates` (one container's); returns an index
/// into `images`.
pub fn select_among(images: &[Image], candidates: &[usize], device: Arch) -> Option<usize> {
    let pick = |i: &usize| images.get(*i).map(|im| (*i, im));
    let sass = candidates.iter().filter_map(pick).filter(|(_, im)| im.kind == ImageKind::Cubin);
    // Prefer an arch-specific build (sm_90a) over a generic one (sm_90): it can only be used on
    // the exact SM, and it was built to use that SM's features.
    let exact = sass
        .filter(|(_, im)| im.arch.is_some_and(|a| a.sm == device.sm))
        .max_by_key(|(_, im)| im.arch.and_then(|a| a.suffix).is_some());
    if let Some((i, _)) = exact {
        return Some(i);
    }
    candidates
        .iter()
        .filter_map(pick)
        .filter(|(_, im)| im.kind == ImageKind::Ptx)
        .filter(|(_, im)| match im.arch {
            // Arch-specific PTX (compute_90a) only JITs for that exact SM.
            Some(a) if a.suffix.is_some() => a.sm == device.sm,
            Some(a) => a.sm <= device.sm,
            None => false,
        })
        .max_by_key(|(_, im)| im.arch.map(|a| a.sm))
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints() {
        for (s, want) in [("sm_90", "sm_90"), ("sm_90a", "sm_90a"), ("compute_80", "sm_80"), ("9.0", "sm_90"), ("100f", "sm_100f")] {
            assert_eq!(s.parse::<Arch>().unwrap().to_string(), want);
        }
        for bad in ["", "sm_", "sm_9x", "gfx90a", "sm_90b", "9.10", "sm_5"] {
            assert!(bad.parse::<Arch>().is_err(), "{bad} parsed");
        }
    }

    fn im(kind: ImageKind, arch: &str) -> Image {
        Image {
            kind,
            arch: Some(arch.parse().unwrap()),
            compressed: false,
            compression: crate::Compression::None,
            offset: 0,
            container: 0,
            size: 0,
            name: None,
            toolkit: None,
            ptx_version: None,
            kernels: vec![],
            data: vec![],
        }
    }

    #[test]
    fn selection_rule() {
        use ImageKind::*;
        let ims = vec![im(Cubin, "sm_80"), im(Cubin, "sm_90"), im(Ptx, "sm_80"), im(Ptx, "sm_90"), im(Cubin, "sm_90a")];
        assert_eq!(select(&ims, "sm_90".parse().unwrap()).unwrap().0, 4);
        assert_eq!(select(&ims, "sm_80".parse().unwrap()).unwrap().0, 0);
        // No SASS for sm_100: newest compatible PTX.
        assert_eq!(select(&ims, "sm_100".parse().unwrap()).unwrap().0, 3);
        // sm_86: no exact SASS (sm_80 SASS is not chosen), PTX 80 JITs.
        assert_eq!(select(&ims, "sm_86".parse().unwrap()).unwrap().0, 2);
        // sm_75: nothing fits.
        assert!(select(&ims, "sm_75".parse().unwrap()).is_none());
        let only_a = vec![im(Ptx, "sm_90a")];
        assert!(select(&only_a, "sm_100".parse().unwrap()).is_none());
        assert_eq!(select(&only_a, "sm_90".parse().unwrap()).unwrap().0, 0);
    }
}
