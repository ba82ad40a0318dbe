//! `kern selftest`: the GPU suite. Runs on a machine with an NVIDIA GPU, from a release build,
//! against the fixtures `scripts/build-fixtures.sh` compiles and the checked-in examples; prints
//! one line per check and a table, and exits non-zero when any check fails. CI has no GPU and
//! does not run it (its test script says so).
//!
//! Each check generates its manifest (kernels copied next to it, sha256 computed) in a scratch
//! directory, then goes through the same `kern_manifest::load` → `Runtime` path as `kern run`.

use anyhow::{anyhow, bail, Context as _, Result};
use kern_cuda::{Context, LaunchConfig, PackedArgs};
use kern_runtime::{plan, Mode, Runtime};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

/// Run the GPU suite (needs an NVIDIA GPU; see README "GPU tests").
#[derive(clap::Args)]
pub struct Args {
    /// Fixtures built by scripts/build-fixtures.sh.
    #[arg(long, default_value = "build/fixtures")]
    fixtures: PathBuf,
    /// The repository's examples directory.
    #[arg(long, default_value = "examples")]
    examples: PathBuf,
    /// Scratch directory for generated manifests.
    #[arg(long, default_value = "build/selftest")]
    scratch: PathBuf,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    device: usize,
}

struct Suite {
    ctx: Context,
    arch: kern_binary::Arch,
    args: Args,
    rows: Vec<(String, bool, String)>,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let ctx = Context::new(args.device)?;
    let p = ctx.props();
    let arch = kern_binary::Arch::new(p.cc_major * 10 + p.cc_minor);
    eprintln!("kern selftest on {} ({arch}, {} SMs, driver {})", p.name, p.sm_count, ctx.driver_version());
    std::fs::create_dir_all(&args.scratch).with_context(|| format!("cannot create {}", args.scratch.display()))?;
    let mut s = Suite { ctx, arch, args, rows: Vec::new() };
    type Check = fn(&mut Suite) -> Result<String>;
    let checks: Vec<(&str, Check)> = vec![
        ("vecadd example (seed §3/§6)", Suite::vecadd),
        ("kernel extracted from a host .so", Suite::so_extract),
        ("Triton kernel, hidden scratch params = null", Suite::triton),
        ("by-value structs + mixed scalar widths", Suite::echo),
        ("graph replay == eager (at and below bucket)", Suite::graph_vs_eager),
        ("step path: pinned upload, queued run, one readback", Suite::step_path),
        ("PDL chain (\"pdl\": true), eager and graph", Suite::pdl_chain),
        ("out-of-bounds kernel reported with its label", Suite::oob),
        ("launch cost: 1,000-launch graph, eager", Suite::launch_cost),
    ];
    for (name, f) in checks {
        let t = Instant::now();
        let r = f(&mut s);
        let (ok, detail) = match r {
            Ok(d) => (true, d),
            Err(e) => (false, format!("{e:#}")),
        };
        eprintln!("[{}] {name} ({:.2} s): {detail}", if ok { "PASS" } else { "FAIL" }, t.elapsed().as_secs_f64());
        s.rows.push((name.to_string(), ok, detail));
    }
    println!("\n{:<48} {:<6} detail", "check", "result");
    for (n, ok, d) in &s.rows {
        println!("{n:<48} {:<6} {}", if *ok { "PASS" } else { "FAIL" }, d.lines().next().unwrap_or(""));
    }
    let failed = s.rows.iter().filter(|r| !r.1).count();
    println!("{} passed, {failed} failed", s.rows.len() - failed);
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

fn sha256(b: &[u8]) -> String {
    Sha256::digest(b).iter().map(|x| format!("{x:02x}")).collect()
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn bytes_f32(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

impl Suite {
    /// Writes `module` (named `file`) and the manifest into a fresh scratch dir; returns the
    /// manifest path.
    fn write(&self, name: &str, modules: &[(&str, &[u8])], mut manifest: Value) -> Result<PathBuf> {
        let dir = self.args.scratch.join(name);
        std::fs::create_dir_all(&dir)?;
        for (file, bytes) in modules {
            std::fs::write(dir.join(file), bytes)?;
            let key = Path::new(file).file_stem().and_then(|s| s.to_str()).unwrap_or(file).split('.').next().unwrap_or(file).to_string();
            manifest["modules"][key] = json!({"source": file, "sha256": sha256(bytes)});
        }
        let path = dir.join("model.json");
        std::fs::write(&path, serde_json::to_string_pretty(&manifest)?)?;
        Ok(path)
    }

    fn runtime(&self, manifest: &Path) -> Result<Runtime> {
        let m = crate::check::load(manifest, self.arch)?;
        let p = plan::plan(&m, &plan::PlanOptions { budget: None, reserve: 0, max_pages: None })?;
        Ok(Runtime::new(&self.ctx, m, p)?)
    }

    fn fixture(&self, name: &str) -> Result<Vec<u8>> {
        let p = self.args.fixtures.join(name);
        std::fs::read(&p).with_context(|| format!("{}: fixture missing (run scripts/build-fixtures.sh here, or pass --fixtures)", p.display()))
    }

    fn vecadd(&mut self) -> Result<String> {
        let path = self.args.examples.join("vecadd/model.json");
        let mut rt = self.runtime(&path)?;
        let (a, b) = (rt.manifest.buffer("A").ok_or_else(|| anyhow!("no buffer A"))?, rt.manifest.buffer("B").ok_or_else(|| anyhow!("no buffer B"))?);
        let c = rt.manifest.buffer("C").ok_or_else(|| anyhow!("no buffer C"))?;
        rt.write_buffer(a, &bytes_f32(&[1.0, 2.0, 3.0, 4.0]))?;
        rt.write_buffer(b, &bytes_f32(&[10.0, 20.0, 30.0, 40.0]))?;
        let vars = rt.manifest.vars_at_max();
        rt.run(0, &vars, Mode::Eager { sync_each: true })?;
        let got = f32s(&rt.read_buffer(c, 16)?);
        if got != [11.0, 22.0, 33.0, 44.0] {
            bail!("C = {got:?}, expected [11, 22, 33, 44]");
        }
        Ok(format!("C = {got:?}"))
    }

    fn add_manifest(&self, entry: &str, n: i64, block: i64, extra_null: usize, shared: i64, per_block: i64) -> Value {
        let mut params = vec!["in buffer<f32>", "in buffer<f32>", "out buffer<f32>", "i32"];
        let mut args = vec![json!({"param": 0}), json!({"param": 1}), json!({"param": 2}), json!({"param": 3})];
        for _ in 0..extra_null {
            params.push("ptr");
            args.push(json!({"null": true}));
        }
        json!({
            "schema_version": "4.1",
            "model": "selftest-add",
            "vars": {"n": {"max": n}},
            "buffers": {
                "A": {"dtype": "f32", "shape": ["n"], "role": "input"},
                "B": {"dtype": "f32", "shape": ["n"], "role": "input"},
                "C": {"dtype": "f32", "shape": ["n"], "role": "output"}
            },
            "modules": {},
            "ops": {"add": {"params": ["in buffer<f32>", "in buffer<f32>", "out buffer<f32>", "i32"], "impl": {"launches": [{
                "module": "MODULE", "entry": entry, "params": params,
                "block": [block], "grid": [format!("ceil(n/{per_block})")],
                "shared": shared, "args": args
            }]}}},
            "program": {"calls": [{"label": "add", "op": "add", "args": [{"buf": "A"}, {"buf": "B"}, {"buf": "C"}, {"var": "n"}]}]}
        })
    }

    fn run_add(&mut self, path: &Path, n: usize) -> Result<String> {
        let mut rt = self.runtime(path)?;
        let a: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
        let b: Vec<f32> = (0..n).map(|i| 1000.0 - i as f32).collect();
        let ids = ["A", "B", "C"].map(|x| rt.manifest.buffer(x).expect("declared"));
        rt.write_buffer(ids[0], &bytes_f32(&a))?;
        rt.write_buffer(ids[1], &bytes_f32(&b))?;
        let vars = rt.manifest.vars_at_max();
        rt.run(0, &vars, Mode::Eager { sync_each: true })?;
        let got = f32s(&rt.read_buffer(ids[2], n * 4)?);
        let bad = (0..n).find(|&i| got[i] != a[i] + b[i]);
        if let Some(i) = bad {
            bail!("C[{i}] = {}, expected {}", got[i], a[i] + b[i]);
        }
        Ok(format!("{n} elements exact"))
    }

    fn so_extract(&mut self) -> Result<String> {
        let so = self.fixture("libvecadd.so")?;
        let bin = kern_binary::read(&so, "libvecadd.so")?;
        let (_, im, _) = bin.find_kernel(self.arch, "_Z6VecAddPfS_S_").ok_or_else(|| anyhow!("libvecadd.so has no VecAdd image for {}", self.arch))?;
        // VecAdd takes its size from blockDim: one block of n threads.
        let mut m = self.add_manifest("_Z6VecAddPfS_S_", 256, 256, 0, 0, 256);
        m["ops"]["add"]["params"] = json!(["in buffer<f32>", "in buffer<f32>", "out buffer<f32>"]);
        let l = &mut m["ops"]["add"]["impl"]["launches"][0];
        l["module"] = json!("vecadd_from_so");
        l["params"] = json!(["in buffer<f32>", "in buffer<f32>", "out buffer<f32>"]);
        l["args"] = json!([{"param": 0}, {"param": 1}, {"param": 2}]);
        l["block"] = json!(["n"]);
        l["grid"] = json!([1]);
        m["program"]["calls"][0]["args"] = json!([{"buf": "A"}, {"buf": "B"}, {"buf": "C"}]);
        let path = self.write("so_extract", &[("vecadd_from_so.cubin", &im.data)], m)?;
        self.run_add(&path, 256)
    }

    fn triton(&mut self) -> Result<String> {
        let cubin = self.fixture("triton_add.cubin")?;
        let meta: Value = serde_json::from_slice(&self.fixture("triton_add.json")?)?;
        let warps = meta["num_warps"].as_i64().ok_or_else(|| anyhow!("triton_add.json: no num_warps"))?;
        let shared = meta["shared"].as_i64().unwrap_or(0);
        let name = meta["name"].as_str().unwrap_or("add_kernel").to_string();
        let per_block = meta["constexprs"]["BLOCK"].as_i64().ok_or_else(|| anyhow!("triton_add.json: no constexprs.BLOCK"))?;
        let mut m = self.add_manifest(&name, 3000, 32 * warps, 2, shared, per_block);
        m["ops"]["add"]["impl"]["launches"][0]["module"] = json!("triton_add");
        let path = self.write("triton", &[("triton_add.cubin", &cubin)], m)?;
        self.run_add(&path, 3000).map(|s| format!("{s}, block {} from num_warps {warps}", 32 * warps))
    }

    fn echo(&mut self) -> Result<String> {
        let cubin = self.fixture("selftest.sm_90.cubin")?;
        let m = json!({
            "schema_version": "4.1",
            "model": "selftest-echo",
            "buffers": {"out": {"dtype": "u64", "shape": [17], "role": "output"},
                        "p": {"dtype": "f32", "shape": [4], "role": "input"}},
            "ops": {"echo": {"params": ["in buffer<f32>", "out buffer<u64>", "i64"], "impl": {"launches": [{
                "module": "selftest", "entry": "echo_params",
                "params": ["i8", "i16", "f64", {"struct": {"size": 24, "align": 8}}, {"struct": {"size": 16, "align": 16}},
                           "in buffer<f32>", "u64", "i8", "u16", "f32", "bool", "out buffer<u64>"],
                "block": [32], "grid": [1],
                "args": [{"i8": -5}, {"i16": -300}, {"f64": 3.25},
                         {"struct": [{"offset": 0, "param": 2}, {"offset": 8, "i32": -7}, {"offset": 12, "f32": 1.5}, {"offset": 16, "i64": 1234567890123i64}]},
                         {"struct": [{"offset": 0, "f32": 1.0}, {"offset": 4, "f32": 2.0}, {"offset": 8, "f32": 3.0}, {"offset": 12, "f32": 4.0}]},
                         {"param": 0}, {"u64": 18446744073709551615u64}, {"i8": 127}, {"u16": 65535}, {"f32": -0.125}, {"bool": true}, {"param": 1}]
            }]}}},
            "program": {"calls": [{"label": "echo", "op": "echo", "args": [{"buf": "p"}, {"buf": "out"}, {"i64": -42}]}]}
        });
        let path = self.write("echo", &[("selftest.cubin", &cubin)], m)?;
        let mut rt = self.runtime(&path)?;
        let p_ptr = rt.buffer_ptr(rt.manifest.buffer("p").expect("declared"));
        rt.run(0, &[], Mode::Eager { sync_each: true })?;
        let out = rt.read_buffer(rt.manifest.buffer("out").expect("declared"), 17 * 8)?;
        let got: Vec<u64> = out.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect();
        let f = |x: f32| u64::from(x.to_bits());
        let want: Vec<u64> = vec![
            (-5i64) as u64, (-300i64) as u64, 3.25f64.to_bits(), (-42i64) as u64, (-7i64) as u64, f(1.5), 1234567890123,
            f(1.0), f(2.0), f(3.0), f(4.0), p_ptr, u64::MAX, 127, 65535, f(-0.125), 1,
        ];
        let names = ["char", "short", "double", "S1.a (op param)", "S1.b", "S1.c", "S1.d", "S2.x", "S2.y", "S2.z", "S2.w", "ptr", "u64", "i8", "u16", "f32", "bool"];
        let wrong: Vec<String> = (0..17).filter(|&i| got[i] != want[i]).map(|i| format!("{}: got {:#x}, want {:#x}", names[i], got[i], want[i])).collect();
        if !wrong.is_empty() {
            bail!("{}", wrong.join("; "));
        }
        Ok("17 fields exact (12 params, 104 bytes)".into())
    }

    fn axpb_manifest(&self) -> Value {
        json!({
            "schema_version": "4.1",
            "model": "selftest-axpb",
            "vars": {"n": {"max": 64}},
            "buffers": {"x": {"dtype": "f32", "shape": ["n"], "role": "input"}},
            "ops": {"axpb": {"params": ["inout buffer<f32>", "i32"], "impl": {"launches": [{
                "module": "selftest", "entry": "axpb", "params": ["inout buffer<f32>", "i32", "f32", "f32"],
                "block": [32], "grid": ["ceil(n/32)"],
                "args": [{"param": 0}, {"param": 1}, {"f32": 2.0}, {"f32": 0.5}]
            }]}}},
            "program": {"calls": [
                {"label": "first", "op": "axpb", "args": [{"buf": "x"}, {"var": "n"}]},
                {"label": "second", "op": "axpb", "args": [{"buf": "x"}, {"var": "n"}]}
            ]}
        })
    }

    /// The engine's step path (issue 15): `upload` (one pinned staging buffer, asynchronous
    /// copies on the stream), `enqueue_run` (no wait) and `read_into` (the one wait) give what
    /// the blocking path gives, eager and graph, at sizes at and below the buckets — and stay
    /// ordered on the stream: an upload queued right after a run lands after it, and a second
    /// upload while the first's bytes may still be in flight does not corrupt them.
    fn step_path(&mut self) -> Result<String> {
        let cubin = self.fixture("selftest.sm_90.cubin")?;
        let path = self.write("axpb-step", &[("selftest.cubin", &cubin)], self.axpb_manifest())?;
        let mut rt = self.runtime(&path)?;
        let x = rt.manifest.buffer("x").expect("declared");
        let f = |v: f32| (v * 2.0 + 0.5) * 2.0 + 0.5;
        let poison = vec![0xffu8; 64 * 4];
        let mut checked = 0;
        for i in 0..300usize {
            let n = 1 + (i * 37) % 64;
            let mode = if i % 2 == 0 { Mode::Graph } else { Mode::Eager { sync_each: false } };
            let first: Vec<f32> = (0..n).map(|j| (i * 7 + j) as f32 * 0.25).collect();
            let second: Vec<f32> = (0..n).map(|j| (i + j) as f32 - 1.0).collect();
            // Poison then data in one upload: the later write wins.
            rt.upload(&[(x, &poison), (x, &bytes_f32(&first))])?;
            rt.enqueue_run(0, &[n as i64], mode)?;
            // Queued behind the run without waiting: it must not overtake it.
            rt.upload(&[(x, &bytes_f32(&second))])?;
            rt.enqueue_run(0, &[n as i64], mode)?;
            let mut got = vec![0u8; n * 4];
            rt.read_into(x, &mut got)?;
            let got = f32s(&got);
            let want: Vec<f32> = second.iter().map(|&v| f(v)).collect();
            if got != want {
                bail!("iteration {i} (n={n}, {mode:?}): x = {:?}…, expected {:?}…", &got[..4.min(n)], &want[..4.min(n)]);
            }
            if rt.last_gpu_ms()?.is_none() {
                bail!("iteration {i}: no GPU time recorded for the queued run");
            }
            // The blocking path on the same input agrees.
            rt.write_buffer(x, &bytes_f32(&second))?;
            rt.run(0, &[n as i64], mode)?;
            let blocking = f32s(&rt.read_buffer(x, n * 4)?);
            if blocking != got {
                bail!("iteration {i} (n={n}, {mode:?}): the blocking path gives {:?}…, the step path {:?}…", &blocking[..4.min(n)], &got[..4.min(n)]);
            }
            checked += 1;
        }
        Ok(format!("{checked} steps (upload → run → upload → run → read) equal to the blocking path"))
    }

    /// Programmatic Dependent Launch from the manifest (issue 15): 1,000 chained increments
    /// ping-ponging between two buffers, each launch `"pdl": true` on a kernel that waits for its
    /// predecessor — exact results eager and replayed from a graph (a launch that overtook its
    /// predecessor would read a stale buffer), and the graph's time beside the same chain
    /// without PDL.
    fn pdl_chain(&mut self) -> Result<String> {
        const N: usize = 1000;
        let cubin = self.fixture("selftest.sm_90.cubin")?;
        let manifest = |entry: &str, pdl: bool| {
            let calls: Vec<Value> = (0..N)
                .map(|i| {
                    let (src, dst) = if i % 2 == 0 { ("a", "b") } else { ("b", "a") };
                    json!({"label": format!("inc{i}"), "op": "inc", "args": [{"buf": dst}, {"buf": src}]})
                })
                .collect();
            json!({
                "schema_version": "4.1",
                "model": "selftest-pdl",
                "buffers": {"a": {"dtype": "f32", "shape": [4096], "role": "input"}, "b": {"dtype": "f32", "shape": [4096]}},
                "ops": {"inc": {"params": ["out buffer<f32>", "in buffer<f32>"], "impl": {"launches": [{
                    "module": "selftest", "entry": entry, "params": ["out buffer<f32>", "in buffer<f32>", "i32"],
                    "block": [128], "grid": [32], "pdl": pdl, "args": [{"param": 0}, {"param": 1}, {"i32": 4096}]}]}}},
                "program": {"calls": calls}
            })
        };
        let mut times = Vec::new();
        for (name, entry, pdl) in [("pdl", "inc_pdl", true), ("plain", "inc", false)] {
            let path = self.write(&format!("pdl_chain_{name}"), &[("selftest.cubin", &cubin)], manifest(entry, pdl))?;
            let mut rt = self.runtime(&path)?;
            let a = rt.manifest.buffer("a").expect("declared");
            let start: Vec<f32> = (0..4096).map(|i| i as f32).collect();
            let check = |rt: &Runtime, runs: usize, what: &str| -> Result<()> {
                let got = f32s(&rt.read_buffer(a, 4096 * 4)?);
                if let Some(i) = (0..4096).find(|&i| got[i] != start[i] + (runs * N) as f32) {
                    bail!("{name} {what}: a[{i}] = {} after {runs} × {N} increments, expected {}", got[i], start[i] + (runs * N) as f32);
                }
                Ok(())
            };
            rt.write_buffer(a, &bytes_f32(&start))?;
            rt.run(0, &[], Mode::Eager { sync_each: false })?;
            check(&rt, 1, "eager")?;
            rt.write_buffer(a, &bytes_f32(&start))?;
            let mut ms = Vec::new();
            for _ in 0..11 {
                ms.push(rt.run(0, &[], Mode::Graph)?.gpu_ms);
            }
            check(&rt, 11, "graph")?;
            ms.sort_by(f32::total_cmp);
            times.push((name, ms[5]));
        }
        Ok(format!("exact eager and graph; graph of {N} launches: {:.3} ms with PDL, {:.3} ms without (median of 11)", times[0].1, times[1].1))
    }

    fn graph_vs_eager(&mut self) -> Result<String> {
        let cubin = self.fixture("selftest.sm_90.cubin")?;
        let path = self.write("axpb", &[("selftest.cubin", &cubin)], self.axpb_manifest())?;
        let mut rt = self.runtime(&path)?;
        let x = rt.manifest.buffer("x").expect("declared");
        let mut out = Vec::new();
        for n in [37usize, 64, 5] {
            let input: Vec<f32> = (0..n).map(|i| i as f32 - 3.0).collect();
            let expect: Vec<f32> = input.iter().map(|v| (v * 2.0 + 0.5) * 2.0 + 0.5).collect();
            let mut results = Vec::new();
            for mode in [Mode::Eager { sync_each: false }, Mode::Graph] {
                rt.write_buffer(x, &vec![0xffu8; 64 * 4])?; // poison the whole buffer
                rt.write_buffer(x, &bytes_f32(&input))?;
                let st = rt.run(0, &[n as i64], mode)?;
                let got = f32s(&rt.read_buffer(x, 64 * 4)?);
                if got[..n] != expect[..] {
                    bail!("n={n} {mode:?}: x[..{n}] = {:?}…, expected {:?}…", &got[..4.min(n)], &expect[..4.min(n)]);
                }
                if mode == Mode::Graph {
                    let b = st.vars_used[0] as usize;
                    // Padded rows were zeroed, then computed: (0*2+.5)*2+.5 = 1.5.
                    if let Some(i) = (n..b).find(|&i| got[i] != 1.5) {
                        bail!("n={n} graph (bucket {b}): padded row {i} = {}, expected 1.5 (zeroed input)", got[i]);
                    }
                    out.push(format!("n={n}: bucket {b}"));
                }
                results.push(got[..n].to_vec());
            }
            if results[0] != results[1] {
                bail!("n={n}: graph and eager differ");
            }
        }
        Ok(format!("identical; {}", out.join(", ")))
    }

    fn oob(&mut self) -> Result<String> {
        let cubin = self.fixture("selftest.sm_90.cubin")?;
        let m = json!({
            "schema_version": "4.1",
            "model": "selftest-oob",
            "buffers": {"x": {"dtype": "f32", "shape": [4], "role": "input"}},
            "ops": {
                "fine": {"params": ["inout buffer<f32>"], "impl": {"launches": [{
                    "module": "selftest", "entry": "axpb", "params": ["inout buffer<f32>", "i32", "f32", "f32"],
                    "block": [32], "grid": [1], "args": [{"param": 0}, {"i32": 4}, {"f32": 1.0}, {"f32": 1.0}]}]}},
                "boom": {"params": ["inout buffer<f32>"], "impl": {"launches": [{
                    "module": "selftest", "entry": "oob_write", "params": ["inout buffer<f32>", "i64"],
                    "block": [32], "grid": [1], "args": [{"param": 0}, {"i64": 1i64 << 40}]}]}}
            },
            "program": {"calls": [
                {"label": "layer0.fine", "op": "fine", "args": [{"buf": "x"}]},
                {"label": "layer1.out_of_bounds", "op": "boom", "args": [{"buf": "x"}]},
                {"label": "layer2.never", "op": "fine", "args": [{"buf": "x"}]}
            ]}
        });
        let path = self.write("oob", &[("selftest.cubin", &cubin)], m)?;
        // A faulting kernel leaves the CUDA context unusable, so run it in a child process:
        // that is also what a user sees (`kern run --sync-each`).
        let exe = std::env::current_exe()?;
        let out = std::process::Command::new(exe).args(["run", "--sync-each", "--output", "x"]).arg(&path).arg("--out-dir").arg(path.parent().expect("dir")).output()?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        let code = out.status.code();
        if code != Some(1) {
            bail!("kern run exited with {code:?}, expected 1; stderr: {stderr}");
        }
        if !stderr.contains("layer1.out_of_bounds") || !stderr.contains("oob_write") {
            bail!("the error does not name the call and kernel: {stderr}");
        }
        if stderr.contains("panicked") {
            bail!("kern panicked: {stderr}");
        }
        Ok(stderr.lines().find(|l| l.contains("layer1")).unwrap_or("").trim().to_string())
    }

    fn launch_cost(&mut self) -> Result<String> {
        const N: usize = 1000;
        let cubin = self.fixture("selftest.sm_90.cubin")?;
        let calls: Vec<Value> = (0..N)
            .map(|i| {
                let (src, dst) = if i % 2 == 0 { ("a", "b") } else { ("b", "a") };
                json!({"label": format!("inc{i}"), "op": "inc", "args": [{"buf": dst}, {"buf": src}]})
            })
            .collect();
        let m = json!({
            "schema_version": "4.1",
            "model": "selftest-launch-cost",
            "buffers": {"a": {"dtype": "f32", "shape": [128], "role": "input"}, "b": {"dtype": "f32", "shape": [128]}},
            "ops": {"inc": {"params": ["out buffer<f32>", "in buffer<f32>"], "impl": {"launches": [{
                "module": "selftest", "entry": "inc", "params": ["out buffer<f32>", "in buffer<f32>", "i32"],
                "block": [128], "grid": [1], "args": [{"param": 0}, {"param": 1}, {"i32": 128}]}]}}},
            "program": {"calls": calls}
        });
        let path = self.write("launch_cost", &[("selftest.cubin", &cubin)], m)?;
        let mut rt = self.runtime(&path)?;
        let a = rt.manifest.buffer("a").expect("declared");
        rt.write_buffer(a, &bytes_f32(&[0.0; 128]))?;
        // kern: graph replays (first run captures).
        rt.run(0, &[], Mode::Graph)?;
        let mut kern_graph = Vec::new();
        for _ in 0..30 {
            kern_graph.push(rt.run(0, &[], Mode::Graph)?.gpu_ms);
        }
        let got = f32s(&rt.read_buffer(a, 4)?)[0];
        if got != (31 * N) as f32 {
            bail!("after 31 runs of 1,000 increments a[0] = {got}, expected {}", 31 * N);
        }
        let mut kern_eager = Vec::new();
        for _ in 0..10 {
            kern_eager.push(rt.run(0, &[], Mode::Eager { sync_each: false })?.gpu_ms);
        }
        // The driver alone: the same 1,000 launches captured and replayed with kern-cuda only.
        let module = self.ctx.load_module(&cubin)?;
        let f = module.function("inc")?;
        let (x, y) = (self.ctx.alloc_zeroed(512)?, self.ctx.alloc_zeroed(512)?);
        let stream = self.ctx.stream()?;
        let mut args_xy = PackedArgs::for_function(&f)?;
        args_xy.set_scalar(0, y.ptr())?;
        args_xy.set_scalar(1, x.ptr())?;
        args_xy.set_scalar(2, 128i32)?;
        let mut args_yx = PackedArgs::for_function(&f)?;
        args_yx.set_scalar(0, x.ptr())?;
        args_yx.set_scalar(1, y.ptr())?;
        args_yx.set_scalar(2, 128i32)?;
        let cfg = LaunchConfig::new([1, 1, 1], [128, 1, 1], 0);
        let graph = stream.capture(|s| {
            for i in 0..N {
                let args = if i % 2 == 0 { &mut args_xy } else { &mut args_yx };
                // SAFETY: x and y hold 128 floats each, as `inc` with n = 128 reads and writes.
                unsafe { f.launch_packed(cfg, s, args)? };
            }
            Ok(())
        })?;
        let exec = graph.instantiate()?;
        let (e0, e1) = (self.ctx.event()?, self.ctx.event()?);
        let mut raw_graph = Vec::new();
        for i in 0..31 {
            e0.record(&stream)?;
            // SAFETY: the graph uses x, y and the module, all alive here.
            unsafe { exec.launch(&stream)? };
            e1.record(&stream)?;
            stream.synchronize()?;
            if i > 0 {
                raw_graph.push(kern_cuda::Event::elapsed_ms(&e0, &e1)?);
            }
        }
        let med = |v: &mut Vec<f32>| {
            v.sort_by(f32::total_cmp);
            v[v.len() / 2] as f64 * 1000.0 / N as f64
        };
        let (kg, ke, rg) = (med(&mut kern_graph), med(&mut kern_eager), med(&mut raw_graph));
        Ok(format!("per launch: kern graph {kg:.3} µs, driver-only graph {rg:.3} µs (kern adds {:+.3} µs), kern eager {ke:.3} µs", kg - rg))
    }
}
