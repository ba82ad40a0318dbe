//! Which loaded module a launched kernel comes from.
//!
//! CUPTI reports a module load (`MODULE_LOADED`: a module id and the image bytes) but not the
//! `CUmodule` handle, while a launch gives a `CUfunction` whose `CUmodule` (`cuFuncGetModule`)
//! is all the driver says about its origin. This table binds the two:
//!
//! 1. **Observed**: a load that happens inside a traced call returning or using a handle (the
//!    `CUmodule*` of `cuModuleLoadData`, the function of a launch or of `cuFuncSetAttribute`
//!    that triggered a lazy load) binds that handle to the loaded module, if exactly one loaded
//!    module fits (and, for a function, defines its name).
//! 2. **Deduced**: an unbound handle whose kernel name is defined by exactly one unbound module
//!    of the same context must be that module (handles and loads are one to one, and every load
//!    of the process was observed, so no other module can hold the kernel); it is bound too.
//! 3. Otherwise the kernel name is looked up in every live module: one image (by sha256) →
//!    `symbol_unique`, several → `ambiguous` with the candidates, none → `unknown`.
//!
//! Pure bookkeeping, no driver calls: the callbacks do those and pass the results in.

use std::collections::HashMap;
use std::sync::Arc;

use kern_dump::format::Attribution;

/// Where a launch was attributed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    pub attribution: Attribution,
    pub module_id: Option<u32>,
    pub sha256: Option<Arc<str>>,
    /// For `Ambiguous`: the candidate images, sorted.
    pub candidates: Vec<Arc<str>>,
}

/// The launchable symbol names of one image.
pub type Names = Arc<[Box<str>]>;

#[derive(Clone, Debug)]
struct Module {
    ctx: u64,
    sha256: Arc<str>,
    /// False for images whose symbols could not be read (not an ELF cubin).
    symbols_known: bool,
    handle: Option<u64>,
}

#[derive(Debug, Default)]
pub struct ModuleTable {
    modules: HashMap<u32, Module>,
    by_handle: HashMap<u64, u32>,
    /// Kernel name → live modules defining it.
    by_name: HashMap<Box<str>, Vec<u32>>,
    /// Launchable names per image, so a second load of the same image is not parsed again.
    names_by_sha: HashMap<Arc<str>, Option<Names>>,
}

impl ModuleTable {
    pub fn new() -> Self {
        Self::default()
    }

    /// The names of an already seen image: `Some(None)` if it was seen and has no symbol table.
    pub fn known_names(&self, sha256: &str) -> Option<Option<Names>> {
        self.names_by_sha.get(sha256).cloned()
    }

    /// Records a load. `names`: the image's launchable symbols, `None` if unknown.
    pub fn loaded(&mut self, id: u32, ctx: u64, sha256: Arc<str>, names: Option<Names>) {
        if self.modules.contains_key(&id) {
            self.unloaded(id);
        }
        if let Some(names) = &names {
            for n in names.iter() {
                self.by_name.entry(n.clone()).or_default().push(id);
            }
        }
        self.names_by_sha
            .entry(sha256.clone())
            .or_insert_with(|| names.clone());
        self.modules.insert(
            id,
            Module {
                ctx,
                sha256,
                symbols_known: names.is_some(),
                handle: None,
            },
        );
    }

    pub fn unloaded(&mut self, id: u32) {
        let Some(m) = self.modules.remove(&id) else {
            return;
        };
        if let Some(h) = m.handle {
            self.by_handle.remove(&h);
        }
        if let Some(Some(names)) = self.names_by_sha.get(&m.sha256) {
            for n in names.iter() {
                if let Some(ids) = self.by_name.get_mut(n) {
                    ids.retain(|&x| x != id);
                    if ids.is_empty() {
                        self.by_name.remove(n);
                    }
                }
            }
        }
    }

    pub fn sha256(&self, id: u32) -> Option<Arc<str>> {
        self.modules.get(&id).map(|m| m.sha256.clone())
    }

    fn defines(&self, id: u32, name: &str) -> bool {
        match self.modules.get(&id) {
            Some(m) if !m.symbols_known => true,
            Some(_) => self.by_name.get(name).is_some_and(|ids| ids.contains(&id)),
            None => false,
        }
    }

    /// Binds `handle` to the one module among `loaded` (the loads observed during the call
    /// that produced or used `handle`) that fits: if `name` is given, the one defining it.
    /// Returns whether a binding was made.
    pub fn bind_observed(&mut self, handle: u64, loaded: &[u32], name: Option<&str>) -> bool {
        if handle == 0 {
            return false;
        }
        let mut fitting = loaded.iter().copied().filter(|&id| match name {
            Some(n) => self.defines(id, n),
            None => self.modules.contains_key(&id),
        });
        let (Some(id), None) = (fitting.next(), fitting.next()) else {
            return false;
        };
        self.bind(handle, id);
        true
    }

    fn bind(&mut self, handle: u64, id: u32) {
        if let Some(old) = self.by_handle.insert(handle, id) {
            if old != id {
                if let Some(m) = self.modules.get_mut(&old) {
                    m.handle = None;
                }
            }
        }
        if let Some(m) = self.modules.get_mut(&id) {
            if let Some(prev) = m.handle.replace(handle) {
                if prev != handle {
                    self.by_handle.remove(&prev);
                }
            }
        }
    }

    /// Attributes a launch of `name` in context `ctx` whose function lives in `handle`
    /// (`None` when `cuFuncGetModule` failed).
    pub fn attribute(&mut self, ctx: u64, handle: Option<u64>, name: &str) -> Resolved {
        if let Some(h) = handle {
            if let Some(&id) = self.by_handle.get(&h) {
                if self.defines(id, name) {
                    return self.exact(id);
                }
            }
        }
        let candidates: Vec<u32> = self.by_name.get(name).cloned().unwrap_or_default();

        if let Some(h) = handle.filter(|&h| h != 0 && !self.by_handle.contains_key(&h)) {
            let same_ctx = |m: &Module| m.ctx == ctx || m.ctx == 0 || ctx == 0;
            // An unbound module of this context without a symbol table could be the one too.
            let opaque_unbound = self
                .modules
                .values()
                .any(|m| m.handle.is_none() && !m.symbols_known && same_ctx(m));
            let mut unbound = candidates.iter().copied().filter(|id| {
                self.modules
                    .get(id)
                    .is_some_and(|m| m.handle.is_none() && same_ctx(m))
            });
            if let (false, Some(id), None) = (opaque_unbound, unbound.next(), unbound.next()) {
                self.bind(h, id);
                return self.exact(id);
            }
        }

        let mut shas: Vec<Arc<str>> = candidates
            .iter()
            .filter_map(|id| self.sha256(*id))
            .collect();
        shas.sort();
        shas.dedup();
        match shas.len() {
            0 => Resolved {
                attribution: Attribution::Unknown,
                module_id: None,
                sha256: None,
                candidates: vec![],
            },
            1 => {
                // Prefer a load in this context as the representative module id.
                let id = candidates
                    .iter()
                    .copied()
                    .find(|id| self.modules.get(id).is_some_and(|m| m.ctx == ctx))
                    .unwrap_or(candidates[0]);
                Resolved {
                    attribution: Attribution::SymbolUnique,
                    module_id: Some(id),
                    sha256: shas.pop(),
                    candidates: vec![],
                }
            }
            _ => Resolved {
                attribution: Attribution::Ambiguous,
                module_id: None,
                sha256: None,
                candidates: shas,
            },
        }
    }

    fn exact(&self, id: u32) -> Resolved {
        Resolved {
            attribution: Attribution::FunctionModule,
            module_id: Some(id),
            sha256: self.sha256(id),
            candidates: vec![],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: &[&str]) -> Option<Names> {
        Some(n.iter().map(|s| Box::from(*s)).collect())
    }

    fn sha(s: &str) -> Arc<str> {
        Arc::from(s)
    }

    #[test]
    fn observed_load_during_a_launch_binds_the_handle() {
        let mut t = ModuleTable::new();
        t.loaded(21, 1, sha("A"), names(&["VecAdd", "Scale"]));
        assert!(t.bind_observed(0x100, &[21], Some("VecAdd")));
        let r = t.attribute(1, Some(0x100), "VecAdd");
        assert_eq!(
            (r.attribution, r.module_id, r.sha256.as_deref()),
            (Attribution::FunctionModule, Some(21), Some("A"))
        );
        // Another kernel of the same module, through the same handle.
        assert_eq!(
            t.attribute(1, Some(0x100), "Scale").attribution,
            Attribution::FunctionModule
        );
    }

    #[test]
    fn observed_binding_needs_the_name() {
        let mut t = ModuleTable::new();
        t.loaded(1, 1, sha("A"), names(&["VecAdd"]));
        t.loaded(2, 1, sha("B"), names(&["Other"]));
        assert!(
            !t.bind_observed(0x100, &[1, 2], None),
            "two loads, no name: cannot tell"
        );
        assert!(
            !t.bind_observed(0x100, &[2], Some("VecAdd")),
            "the loaded module lacks the kernel"
        );
        assert!(t.bind_observed(0x100, &[1, 2], Some("VecAdd")));
        assert!(
            !t.bind_observed(0, &[1], None),
            "a null handle binds nothing"
        );
    }

    #[test]
    fn deduction_binds_the_only_unbound_candidate() {
        let mut t = ModuleTable::new();
        t.loaded(1, 1, sha("A"), names(&["VecAdd"]));
        t.loaded(2, 1, sha("B"), names(&["VecAdd"]));
        assert!(t.bind_observed(0x200, &[2], Some("VecAdd")));
        // Module 2 is bound to 0x200, so an unknown handle with VecAdd can only be module 1.
        let r = t.attribute(1, Some(0x100), "VecAdd");
        assert_eq!(
            (r.attribution, r.module_id),
            (Attribution::FunctionModule, Some(1))
        );
        assert_eq!(t.attribute(1, Some(0x200), "VecAdd").module_id, Some(2));
    }

    #[test]
    fn same_name_in_two_images_is_ambiguous_without_a_handle() {
        let mut t = ModuleTable::new();
        t.loaded(1, 1, sha("B"), names(&["VecAdd"]));
        t.loaded(2, 1, sha("A"), names(&["VecAdd"]));
        let r = t.attribute(1, None, "VecAdd");
        assert_eq!(r.attribution, Attribution::Ambiguous);
        assert_eq!(r.candidates, [sha("A"), sha("B")]);
        assert_eq!(r.sha256, None);
        // With a handle but two unbound candidates: still ambiguous, and nothing gets bound.
        assert_eq!(
            t.attribute(1, Some(0x100), "VecAdd").attribution,
            Attribution::Ambiguous
        );
        assert_eq!(
            t.attribute(1, Some(0x100), "VecAdd").attribution,
            Attribution::Ambiguous
        );
    }

    #[test]
    fn one_image_loaded_twice_is_symbol_unique() {
        let mut t = ModuleTable::new();
        t.loaded(1, 1, sha("A"), names(&["VecAdd"]));
        t.loaded(2, 2, sha("A"), names(&["VecAdd"]));
        let r = t.attribute(2, None, "VecAdd");
        assert_eq!(
            (r.attribution, r.module_id, r.sha256.as_deref()),
            (Attribution::SymbolUnique, Some(2), Some("A"))
        );
    }

    #[test]
    fn unknown_names_and_opaque_modules() {
        let mut t = ModuleTable::new();
        t.loaded(1, 1, sha("A"), names(&["VecAdd"]));
        assert_eq!(
            t.attribute(1, Some(0x100), "triton_x").attribution,
            Attribution::Unknown
        );
        // An unbound module without symbols could hold VecAdd too: no deduction.
        t.loaded(2, 1, sha("P"), None);
        let r = t.attribute(1, Some(0x100), "VecAdd");
        assert_eq!(r.attribution, Attribution::SymbolUnique);
        // Observed binding to the opaque module is trusted.
        assert!(t.bind_observed(0x300, &[2], Some("ptx_kernel")));
        assert_eq!(
            t.attribute(1, Some(0x300), "ptx_kernel").attribution,
            Attribution::FunctionModule
        );
    }

    #[test]
    fn unload_forgets_bindings_and_names() {
        let mut t = ModuleTable::new();
        t.loaded(1, 1, sha("A"), names(&["VecAdd"]));
        assert!(t.bind_observed(0x100, &[1], Some("VecAdd")));
        t.unloaded(1);
        assert_eq!(
            t.attribute(1, Some(0x100), "VecAdd").attribution,
            Attribution::Unknown
        );
        // The image's names stay cached for a reload.
        assert!(t.known_names("A").is_some());
        t.loaded(3, 1, sha("A"), t.known_names("A").unwrap());
        assert_eq!(t.attribute(1, Some(0x100), "VecAdd").module_id, Some(3));
    }

    #[test]
    fn a_stale_binding_that_lacks_the_name_is_not_trusted() {
        let mut t = ModuleTable::new();
        t.loaded(1, 1, sha("A"), names(&["VecAdd"]));
        t.loaded(2, 1, sha("B"), names(&["Fill"]));
        assert!(t.bind_observed(0x100, &[1], None));
        // The handle says module 1, but module 1 has no Fill: fall back to the name alone.
        let r = t.attribute(1, Some(0x100), "Fill");
        assert_eq!(
            (r.attribution, r.module_id),
            (Attribution::SymbolUnique, Some(2))
        );
    }
}
