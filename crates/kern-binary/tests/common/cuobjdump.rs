//! A parser for the text `cuobjdump` (13.x) prints, used as the reference kern-binary is compared
//! against. It reads three outputs:
//!
//! * `cuobjdump -elf FILE`: for a cubin one ELF; for a fatbin or host ELF a `Fatbin elf code:` /
//!   `Fatbin ptx code:` header per entry, each ELF entry followed by its dump. Per ELF: the header
//!   line (`64-bit ELF: type=ET_EXEC, ABI=8, sm=90, toolkit=13.0, flags=0x6005a04`, or for ABI 7
//!   cubins from older ptxas `64bit elf: type=2, abi=7, sm=90a, toolkit=128, flags = 0x5a0d5a`),
//!   the section table, the `.symtab` listing, and every `.nv.info*` / `.nv.compat` section as
//!   `<0xN>` records with `Attribute:`, `Format:`, `Value:` lines (KPARAM_INFO's value continues
//!   on a second line indented by two tabs).
//! * `cuobjdump -res-usage FILE`: `Function NAME:` / `REG:12 STACK:0 SHARED:0 ...` per ELF.
//! * `cuobjdump -lelf -lptx FILE`: `ELF file    1: name.1.sm_90.cubin` / `PTX file    1: ...`.
//!
//! Everything in the section table and the symbol table is hexadecimal (with or without `0x`);
//! `register count: N` and the `-res-usage` numbers are decimal. The `<0xN>` record counters are
//! not reliable numbers (cuobjdump prints `<0x9>` then `<0x10>`) and are ignored.

use std::collections::BTreeMap;

/// What the text could not be parsed as: the line number (1-based) and why.
#[derive(Debug)]
pub struct ParseError {
    pub line: usize,
    pub msg: String,
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}", self.line, self.msg)
    }
}

fn perr<T>(line: usize, msg: impl Into<String>) -> Result<T, ParseError> {
    Err(ParseError { line, msg: msg.into() })
}

/// Parses a number written as `0x1f` (hex) or `31` (decimal).
pub fn num(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// Parses a hexadecimal number with or without `0x` (section and symbol tables).
pub fn hex(s: &str) -> Option<u64> {
    let s = s.trim();
    let h = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")).unwrap_or(s);
    u64::from_str_radix(h, 16).ok()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    Elf,
    Ptx,
}

/// A `Fatbin elf code:` / `Fatbin ptx code:` header.
#[derive(Debug, Clone)]
pub struct FatbinEntry {
    pub kind: EntryKind,
    /// `sm_90`, `sm_90a`.
    pub arch: String,
    pub code_version: String,
    pub compressed: bool,
    /// For ELF entries: the index into [`Dump::elfs`].
    pub elf: Option<usize>,
}

#[derive(Debug, Clone)]
pub struct Section {
    pub index: u32,
    pub offset: u64,
    pub size: u64,
    pub typ: String,
    pub flags: u64,
    pub link: u32,
    pub info: u32,
    pub name: String,
}

#[derive(Debug, Clone)]
pub struct Symbol {
    pub index: u32,
    pub value: u64,
    pub size: u64,
    pub info: u8,
    pub other: u8,
    pub shndx: u32,
    pub name: String,
}

impl Symbol {
    pub fn is_func(&self) -> bool {
        self.info & 0xf == 2
    }
    /// STB_GLOBAL (1) or STB_WEAK (2).
    pub fn is_global_or_weak(&self) -> bool {
        matches!(self.info >> 4, 1 | 2)
    }
    /// STT_FUNC, STB_GLOBAL or STB_WEAK, STO_ENTRY (0x10). Relocatable cubins (`-rdc=true`)
    /// make template instantiations STB_WEAK entries (info 0x22); cuobjdump -symbols lists
    /// them as `STT_FUNC STB_WEAK STO_ENTRY`. Compiler helpers such as
    /// `$__internal_0_$__cuda_sm3x_div_rn_noftz_f32_slowpath` are weak too, but lack STO_ENTRY.
    pub fn is_entry(&self) -> bool {
        self.is_func() && self.is_global_or_weak() && self.other & 0x10 != 0
    }
}

/// One `.nv.info` record as cuobjdump prints it.
#[derive(Debug, Clone, Default)]
pub struct Record {
    pub attr: String,
    pub format: String,
    /// The `Value:` text; continuation lines are appended after a `\t`.
    pub value: String,
}

impl Record {
    /// All numbers in the value (`0x100 0x1 0x1` → [256, 1, 1]).
    pub fn numbers(&self) -> Vec<u64> {
        self.value.split_whitespace().filter_map(num).collect()
    }
    /// `key : value` pairs (KPARAM_INFO: `Ordinal : 0x2`, `Offset  : 0x10`, ...).
    pub fn fields(&self) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        for part in self.value.split('\t') {
            if let Some((k, v)) = part.split_once(':') {
                m.insert(k.trim().to_string(), v.trim().to_string());
            }
        }
        m
    }
    /// `function: NAME(0xIDX)\t<what>: VALUE` (module `.nv.info` records) → (NAME, IDX, VALUE).
    /// `register count` is decimal, `frame size` hex: [`num`] handles both.
    pub fn function_value(&self) -> Option<(String, u32, u64)> {
        let rest = self.value.strip_prefix("function:")?.trim_start();
        let (func, tail) = rest.split_once('\t')?;
        let open = func.rfind('(')?;
        let name = func[..open].to_string();
        let idx = num(func[open + 1..].strip_suffix(')')?)? as u32;
        let (_, v) = tail.rsplit_once(':')?;
        Some((name, idx, num(v)?))
    }
}

/// One ELF as `cuobjdump -elf` prints it.
#[derive(Debug, Clone, Default)]
pub struct ElfDump {
    /// 1-based line of the header in the dump.
    pub line: usize,
    pub header: String,
    /// `ET_EXEC`, `ET_REL`, or the number for the ABI 7 format (`2`).
    pub elf_type: String,
    pub abi: u32,
    /// `sm_90`, `sm_90a`.
    pub arch: String,
    /// `13.0`; the ABI 7 format's `128` is normalized to `12.8`.
    pub toolkit: String,
    pub flags: u64,
    pub sections: Vec<Section>,
    pub symbols: Vec<Symbol>,
    /// Records per CUDA_INFO / CUDA_COMPAT_INFO section name (`.nv.info`, `.nv.info.K`, `.nv.compat`).
    pub info: BTreeMap<String, Vec<Record>>,
}

/// What cuobjdump says about one kernel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExpectedKernel {
    pub name: String,
    pub sym_index: u32,
    /// (ordinal, offset, size), sorted by ordinal.
    pub params: Vec<(u32, u32, u32)>,
    /// CBANK_PARAM_SIZE, or 0 when the kernel has no parameter bank records.
    pub param_bytes: u32,
    /// The size half of PARAM_CBANK (`0x9 0x180210`: size 0x18 at offset 0x210).
    pub param_cbank_size: Option<u32>,
    pub registers: Option<u32>,
    pub frame_bytes: Option<u32>,
    pub max_threads: Option<[u32; 3]>,
    pub required_block: Option<[u32; 3]>,
    pub max_registers: Option<u32>,
    /// Size of `.nv.shared.<kernel>`, where the section exists.
    pub shared_bytes: Option<u64>,
}

fn xyz(r: &Record) -> Option<[u32; 3]> {
    match r.numbers()[..] {
        [x, y, z] => Some([x as u32, y as u32, z as u32]),
        _ => None,
    }
}

impl ElfDump {
    pub fn section(&self, name: &str) -> Option<&Section> {
        self.sections.iter().find(|s| s.name == name)
    }

    pub fn entry_symbols(&self) -> impl Iterator<Item = &Symbol> {
        self.symbols.iter().filter(|s| s.is_entry())
    }

    /// The kernels (STO_ENTRY functions) with everything `.nv.info` says about them.
    pub fn kernels(&self) -> Result<Vec<ExpectedKernel>, String> {
        let module = self.info.get(".nv.info").map(Vec::as_slice).unwrap_or(&[]);
        let mut out = Vec::new();
        for sym in self.entry_symbols() {
            let mut k = ExpectedKernel { name: sym.name.clone(), sym_index: sym.index, ..Default::default() };
            for r in module {
                let Some((name, idx, v)) = r.function_value() else { continue };
                if idx != sym.index {
                    continue;
                }
                if name != sym.name {
                    return Err(format!("{}: .nv.info names symbol {idx} {name}, symtab says {}", r.attr, sym.name));
                }
                match r.attr.as_str() {
                    "EIATTR_REGCOUNT" => k.registers = Some(v as u32),
                    "EIATTR_FRAME_SIZE" => k.frame_bytes = Some(v as u32),
                    _ => {}
                }
            }
            let info_name = format!(".nv.info.{}", sym.name);
            let recs = self.info.get(&info_name).map(Vec::as_slice).unwrap_or(&[]);
            // The per-kernel .nv.info section's sh_info is the kernel's .text section.
            if let Some(s) = self.section(&info_name) {
                if s.info != sym.shndx {
                    return Err(format!(
                        "{info_name}: sh_info {:#x} but the symbol is in section {:#x}",
                        s.info, sym.shndx
                    ));
                }
            }
            let mut cbank_param_size = None;
            for r in recs {
                let bad = || format!("{info_name}: cannot read {} value `{}`", r.attr, r.value);
                match r.attr.as_str() {
                    "EIATTR_KPARAM_INFO" => {
                        let f = r.fields();
                        let get = |key: &str| f.get(key).and_then(|v| num(v)).map(|v| v as u32).ok_or_else(bad);
                        k.params.push((get("Ordinal")?, get("Offset")?, get("Size")?));
                    }
                    "EIATTR_CBANK_PARAM_SIZE" => cbank_param_size = Some(num(&r.value).ok_or_else(bad)? as u32),
                    "EIATTR_PARAM_CBANK" => match r.numbers()[..] {
                        [_sym, packed] => k.param_cbank_size = Some((packed >> 16) as u32),
                        _ => return Err(bad()),
                    },
                    "EIATTR_MAX_THREADS" => k.max_threads = Some(xyz(r).ok_or_else(bad)?),
                    "EIATTR_REQNTID" => k.required_block = Some(xyz(r).ok_or_else(bad)?),
                    "EIATTR_MAXREG_COUNT" => k.max_registers = Some(num(&r.value).ok_or_else(bad)? as u32),
                    _ => {}
                }
            }
            k.params.sort();
            k.param_bytes = cbank_param_size.unwrap_or(0);
            k.shared_bytes = self.section(&format!(".nv.shared.{}", sym.name)).map(|s| s.size);
            out.push(k);
        }
        Ok(out)
    }

    /// `.nv.compat` EICOMPAT_ATTR_CUDA_ACCELERATOR_TARGET, where present (1 for sm_XXa builds).
    pub fn accelerator_target(&self) -> Option<u64> {
        self.info
            .get(".nv.compat")?
            .iter()
            .find(|r| r.attr == "EICOMPAT_ATTR_CUDA_ACCELERATOR_TARGET")
            .and_then(|r| num(&r.value))
    }
}

/// A whole `cuobjdump -elf` output.
#[derive(Debug, Clone, Default)]
pub struct Dump {
    /// Fatbin entry headers in file order (empty for a bare cubin).
    pub entries: Vec<FatbinEntry>,
    /// The ELFs in file order.
    pub elfs: Vec<ElfDump>,
}

fn parse_header(line: &str, lineno: usize) -> Result<ElfDump, ParseError> {
    let (_, rest) = line.split_once(':').ok_or(ParseError { line: lineno, msg: "ELF header without ':'".into() })?;
    let mut kv = BTreeMap::new();
    for part in rest.split(',') {
        if let Some((k, v)) = part.split_once('=') {
            kv.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let get = |k: &str| {
        kv.get(k).cloned().ok_or(ParseError { line: lineno, msg: format!("ELF header lacks `{k}=`: {line}") })
    };
    let sm = get("sm")?;
    let toolkit = get("toolkit")?;
    let toolkit = if toolkit.contains('.') {
        toolkit
    } else {
        // ABI 7 format prints the version ×10: 128 → 12.8.
        let v: u32 =
            toolkit.parse().map_err(|_| ParseError { line: lineno, msg: format!("bad toolkit `{toolkit}`") })?;
        format!("{}.{}", v / 10, v % 10)
    };
    Ok(ElfDump {
        line: lineno,
        header: line.to_string(),
        elf_type: get("type")?,
        abi: get("abi")?.parse().map_err(|_| ParseError { line: lineno, msg: "bad ABI".into() })?,
        arch: format!("sm_{sm}"),
        toolkit,
        flags: num(&get("flags")?).ok_or(ParseError { line: lineno, msg: "bad flags".into() })?,
        ..Default::default()
    })
}

fn is_elf_header(line: &str) -> bool {
    let l = line.to_ascii_lowercase();
    l.starts_with("64-bit elf:") || l.starts_with("64bit elf:")
}

#[derive(PartialEq)]
enum Mode {
    None,
    Sections,
    Symtab,
    Info(String),
    EntryHeader,
}

/// Parses `cuobjdump -elf` output.
pub fn parse_elf_dump(text: &str) -> Result<Dump, ParseError> {
    let mut dump = Dump::default();
    let mut cur: Option<ElfDump> = None;
    let mut mode = Mode::None;
    let mut pending: Option<FatbinEntry> = None;
    let mut rec: Option<Record> = None;

    fn flush_rec(cur: &mut Option<ElfDump>, mode: &Mode, rec: &mut Option<Record>) {
        if let (Some(r), Some(elf), Mode::Info(sec)) = (rec.take(), cur.as_mut(), mode) {
            elf.info.entry(sec.clone()).or_default().push(r);
        }
    }

    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let line = raw.trim_end_matches('\r');

        // Entry headers of fatbins / host ELFs.
        if line == "Fatbin elf code:" || line == "Fatbin ptx code:" {
            flush_rec(&mut cur, &mode, &mut rec);
            if let Some(e) = cur.take() {
                dump.elfs.push(e);
            }
            if let Some(p) = pending.take() {
                dump.entries.push(p);
            }
            let kind = if line.contains("elf") { EntryKind::Elf } else { EntryKind::Ptx };
            pending = Some(FatbinEntry {
                kind,
                arch: String::new(),
                code_version: String::new(),
                compressed: false,
                elf: None,
            });
            mode = Mode::EntryHeader;
            continue;
        }
        if mode == Mode::EntryHeader {
            let p = pending.as_mut().expect("entry header mode without an entry");
            if let Some(v) = line.strip_prefix("arch = ") {
                p.arch = v.trim().to_string();
            } else if let Some(v) = line.strip_prefix("code version = ") {
                p.code_version = v.trim().to_string();
            } else if line.trim() == "compressed" {
                p.compressed = true;
            }
            if !is_elf_header(line) {
                continue;
            }
        }

        if is_elf_header(line) {
            flush_rec(&mut cur, &mode, &mut rec);
            if let Some(e) = cur.take() {
                dump.elfs.push(e);
            }
            cur = Some(parse_header(line, n)?);
            if let Some(mut p) = pending.take() {
                if p.kind != EntryKind::Elf {
                    return perr(n, "ELF dump follows a PTX entry header");
                }
                p.elf = Some(dump.elfs.len());
                dump.entries.push(p);
            }
            mode = Mode::None;
            continue;
        }
        let Some(elf) = cur.as_mut() else {
            // Text before the first ELF (blank lines, PTX entry headers already handled).
            continue;
        };

        match &mode {
            Mode::Sections => {
                if line.trim().is_empty() {
                    mode = Mode::None;
                    continue;
                }
                if line.trim_start().starts_with("Index") {
                    continue;
                }
                let f: Vec<&str> = line.split_whitespace().collect();
                if f.len() < 9 {
                    return perr(n, format!("section row has {} fields: {line}", f.len()));
                }
                let h = |j: usize| {
                    hex(f[j]).ok_or(ParseError { line: n, msg: format!("bad hex `{}` in section row", f[j]) })
                };
                elf.sections.push(Section {
                    index: h(0)? as u32,
                    offset: h(1)?,
                    size: h(2)?,
                    typ: f[5].to_string(),
                    flags: h(6)?,
                    link: h(7)? as u32,
                    info: h(8)? as u32,
                    name: f[9..].join(" "),
                });
                continue;
            }
            Mode::Symtab => {
                if line.trim().is_empty() {
                    mode = Mode::None;
                    continue;
                }
                if line.trim_start().starts_with("index") {
                    continue;
                }
                let f: Vec<&str> = line.split_whitespace().collect();
                if f.len() < 6 {
                    return perr(n, format!("symbol row has {} fields: {line}", f.len()));
                }
                let h = |j: usize| {
                    hex(f[j]).ok_or(ParseError { line: n, msg: format!("bad hex `{}` in symbol row", f[j]) })
                };
                let name = f[6..].join(" ");
                elf.symbols.push(Symbol {
                    index: h(0)? as u32,
                    value: h(1)?,
                    size: h(2)?,
                    info: h(3)? as u8,
                    other: h(4)? as u8,
                    shndx: h(5)? as u32,
                    name: if name == "(null)" { String::new() } else { name },
                });
                continue;
            }
            Mode::Info(_) => {
                if let Some(rest) = line.strip_prefix("\t\t") {
                    if let Some(r) = rec.as_mut() {
                        r.value.push('\t');
                        r.value.push_str(rest.trim_end());
                    }
                    continue;
                }
                if let Some(rest) = line.strip_prefix('\t') {
                    if rest.starts_with('<') {
                        flush_rec(&mut cur, &mode, &mut rec);
                        rec = Some(Record::default());
                    } else if let Some(v) = rest.strip_prefix("Attribute:") {
                        rec.get_or_insert_with(Record::default).attr = v.trim().to_string();
                    } else if let Some(v) = rest.strip_prefix("Format:") {
                        rec.get_or_insert_with(Record::default).format = v.trim().to_string();
                    } else if let Some(v) = rest.strip_prefix("Value:") {
                        rec.get_or_insert_with(Record::default).value = v.trim().to_string();
                    }
                    continue;
                }
                if line.trim().is_empty() {
                    continue;
                }
                // Any other unindented line ends the section.
                flush_rec(&mut cur, &mode, &mut rec);
                mode = Mode::None;
            }
            Mode::None | Mode::EntryHeader => {}
        }

        let elf = cur.as_mut().expect("checked above");
        if line == "Sections:" {
            mode = Mode::Sections;
        } else if line == ".section .symtab" {
            mode = Mode::Symtab;
        } else if !line.starts_with(char::is_whitespace) && !line.is_empty() {
            let is_info =
                elf.sections.iter().any(|s| s.name == line && (s.typ == "CUDA_INFO" || s.typ == "CUDA_COMPAT_INFO"));
            if is_info {
                mode = Mode::Info(line.to_string());
                elf.info.entry(line.to_string()).or_default();
            }
        }
    }
    flush_rec(&mut cur, &mode, &mut rec);
    if let Some(e) = cur.take() {
        dump.elfs.push(e);
    }
    if let Some(p) = pending.take() {
        dump.entries.push(p);
    }
    Ok(dump)
}

/// Per-function numbers from `cuobjdump -res-usage`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResUsage {
    pub reg: u64,
    pub stack: u64,
    pub shared: u64,
    pub local: u64,
}

/// Parses `cuobjdump -res-usage` output: one map per ELF (per `Resource usage:` block), in order.
pub fn parse_res_usage(text: &str) -> Result<Vec<BTreeMap<String, ResUsage>>, ParseError> {
    let mut out: Vec<BTreeMap<String, ResUsage>> = Vec::new();
    let mut func: Option<String> = None;
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        if line.trim() == "Resource usage:" {
            out.push(BTreeMap::new());
            func = None;
            continue;
        }
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("Function ") {
            func = Some(rest.strip_suffix(':').unwrap_or(rest).to_string());
            continue;
        }
        if let Some(name) = func.take() {
            let mut ru = ResUsage::default();
            for tok in t.split_whitespace() {
                let Some((k, v)) = tok.split_once(':') else { continue };
                let v: u64 = match v.parse() {
                    Ok(v) => v,
                    Err(_) => return perr(n, format!("bad number in `{tok}`")),
                };
                match k {
                    "REG" => ru.reg = v,
                    "STACK" => ru.stack = v,
                    "SHARED" => ru.shared = v,
                    "LOCAL" => ru.local = v,
                    _ => {}
                }
            }
            match out.last_mut() {
                Some(m) => {
                    m.insert(name, ru);
                }
                None => return perr(n, "function before `Resource usage:`"),
            }
        }
    }
    Ok(out)
}

/// Parses `cuobjdump -symbols` output: per ELF (per `symbols:` block), in order, the names
/// listed as `STT_FUNC <binding> STO_ENTRY NAME`.
pub fn parse_symbols_entries(text: &str) -> Vec<Vec<String>> {
    let mut out: Vec<Vec<String>> = Vec::new();
    for line in text.lines() {
        if line.trim() == "symbols:" {
            out.push(Vec::new());
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() >= 4 && f[0] == "STT_FUNC" && f[2] == "STO_ENTRY" {
            if let Some(v) = out.last_mut() {
                v.push(f[3..].join(" "));
            }
        }
    }
    out
}

/// One line of `cuobjdump -lelf -lptx`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListEntry {
    pub kind: EntryKind,
    /// `sm_90`, `sm_90a`, from the suggested file name (`vecadd.1.sm_90a.cubin`).
    pub arch: String,
    pub file: String,
}

/// Parses `cuobjdump -lelf -lptx` output.
pub fn parse_list(text: &str) -> Result<Vec<ListEntry>, ParseError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let t = line.trim();
        if t.is_empty() {
            continue;
        }
        let kind = if t.starts_with("ELF file") {
            EntryKind::Elf
        } else if t.starts_with("PTX file") {
            EntryKind::Ptx
        } else {
            return perr(n, format!("unexpected line `{t}`"));
        };
        let (_, file) = t.split_once(": ").ok_or(ParseError { line: n, msg: format!("no `: ` in `{t}`") })?;
        let file = file.trim().to_string();
        let stem = file.rsplit_once('.').map(|(s, _)| s).unwrap_or(&file);
        let arch = stem.rsplit_once('.').map(|(_, a)| a).unwrap_or("");
        if !arch.starts_with("sm_") {
            return perr(n, format!("no sm_XX in file name `{file}`"));
        }
        out.push(ListEntry { kind, arch: arch.to_string(), file });
    }
    Ok(out)
}
