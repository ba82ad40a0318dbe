//! The example manifests pass `kern check` against the real fixture kernels: the seed's
//! rms_norm op (§7.4, verbatim), VecAdd (§3), a Triton kernel with dynamic shared memory and
//! null scratch pointers, every 4.1 extension, and a module from a (fake) Hugging Face cache.

mod common;

use common::{fixtures, manifests, stage, FIXTURES};
use kern_manifest::{
    check_bytes, load, parse_raw, ArgValue, Binding, CheckOptions, KernelParam, LaunchArg,
    Manifest, PackError, Role, StateSize, Value, WeightSource,
};

fn check(name: &str) -> Manifest {
    let s = stage(&manifests().join(name).join("model.json"));
    load(&s.manifest, &CheckOptions::default())
        .unwrap_or_else(|d| panic!("{name} should pass kern check:\n{d}"))
}

/// Seed `000` §7.4, the rms_norm op exactly as the seed prints it.
const SEED_RMS_NORM: &str = r#""rms_norm": {
  "params": [
   "out buffer<bf16>",
   "in buffer<bf16>",
   "in buffer<bf16>",
   "i32"
  ],
  "impl": {
   "launches": [
    {
     "module": "vllm_layernorm",
     "entry": "_ZN4vllm15rms_norm_kernelIN3c108BFloat16ELi8ELi2ELb1EEEvPT_PKS3_lllllS6_lfii",
     "params": [
      "out buffer<bf16>",
      "in buffer<bf16>",
      "i64", "i64", "i64", "i64", "i64",
      "in buffer<bf16>",
      "i64",
      "f32",
      "i32",
      "i32"
     ],
     "block": [320, 1, 1],
     "grid": ["tokens", 1, 1],
     "args": [
      { "param": 0 },
      { "param": 1 },
      { "i64": 2560 },
      { "i64": 0 },
      { "i64": 0 },
      { "i64": 0 },
      { "i64": 0 },
      { "param": 2 },
      { "i64": 0 },
      { "f32": 9.999999974752427e-07 },
      { "param": 3 },
      { "i32": 2560 }
     ]
    }
   ]
  }
 }"#;

#[test]
fn the_seed_rms_norm_op_is_in_the_test_manifest_verbatim() {
    let text = std::fs::read_to_string(manifests().join("seed_rms_norm/model.json")).unwrap();
    assert!(
        text.contains(SEED_RMS_NORM),
        "tests/manifests/seed_rms_norm/model.json must hold seed §7.4's op verbatim"
    );
}

#[test]
fn seed_rms_norm_passes() {
    let m = check("seed_rms_norm");
    assert!(m.warnings.is_empty(), "{:?}", m.warnings);
    let op = &m.ops[m.op("rms_norm").unwrap().0];
    let l = &op.launches[0];
    // The layout agrees with the image's KPARAM_INFO, which is what was checked.
    let k = l.kernel_in(&m);
    let ours: Vec<(u32, u32)> = l.params.iter().map(|p| (p.offset, p.size)).collect();
    let theirs: Vec<(u32, u32)> = k.params.iter().map(|p| (p.offset, p.size)).collect();
    assert_eq!(ours, theirs);
    assert_eq!(l.param_bytes, 84);
    assert_eq!(l.args[9], LaunchArg::Const(Value::F32(1e-6)));
    assert_eq!(l.grid[0].eval(&m.vars_at_max()), Ok(2048));
    let r = m.report();
    assert_eq!(r.programs, vec![("main".to_string(), 1, 1)]);
    assert_eq!(r.activation_bytes, 2 * 2048 * 2560 * 2 + 2560 * 2);
    let text = r.to_string();
    assert!(
        text.contains("program    main: 1 call, 1 launch per run"),
        "{text}"
    );
    assert!(text.contains("tokens ≤ 2048"), "{text}");
}

#[test]
fn vecadd_passes() {
    let m = check("vecadd");
    assert!(m.warnings.is_empty(), "{:?}", m.warnings);
    let l = &m.ops[0].launches[0];
    assert_eq!(l.entry, "_Z6VecAddPfS_S_");
    assert_eq!(l.block[0].eval(&m.vars_at_max()), Ok(4));
    assert_eq!(m.report().buffer_bytes(), 3 * 4 * 4);
    let call = &m.program("main").unwrap().calls[0];
    assert_eq!(
        call.args,
        vec![
            Binding::Buf(m.buffer("A").unwrap()),
            Binding::Buf(m.buffer("B").unwrap()),
            Binding::Buf(m.buffer("C").unwrap())
        ]
    );
}

#[test]
fn triton_kernel_with_shared_memory_and_null_scratch_passes() {
    let m = check("triton_rmsnorm");
    assert!(m.warnings.is_empty(), "{:?}", m.warnings);
    let l = &m.ops[0].launches[0];
    assert_eq!(l.shared.as_const(), Some(32));
    assert_eq!(l.args[6], LaunchArg::Null);
    assert_eq!(l.args[7], LaunchArg::Null);
    assert_eq!(l.params[7].offset, 48);
    let k = l.kernel_in(&m);
    assert_eq!(k.required_block, Some([256, 1, 1]));
    // Triton's own metadata agrees with what the manifest says.
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixtures().join("triton_rmsnorm.json")).unwrap())
            .unwrap();
    assert_eq!(meta["shared"], 32);
    assert_eq!(
        meta["num_warps"].as_i64().unwrap() * 32,
        l.block[0].as_const().unwrap()
    );
    let r = m.report();
    assert_eq!(
        (r.input_bytes, r.weight_bytes, r.output_bytes),
        (2048 * 4096 * 2, 4096 * 2, 2048 * 4096 * 2)
    );
}

#[test]
fn every_extension_passes() {
    let m = check("extensions");
    assert!(m.warnings.is_empty(), "{:?}", m.warnings);
    let lm = &m.buffers[m.buffer("lm_head.weight").unwrap().0];
    assert_eq!(
        lm.source,
        Some(WeightSource::Alias(
            m.buffer("model.embed_tokens.weight").unwrap()
        ))
    );
    let qkv = &m.buffers[m.buffer("qkv.weight").unwrap().0];
    assert!(
        matches!(&qkv.source, Some(WeightSource::Concat { tensors, axis: 0, .. }) if tensors.len() == 3)
    );
    assert_eq!(
        m.buffers[m.buffer("norm.weight").unwrap().0].source,
        Some(WeightSource::Tensor("model.norm.weight".into()))
    );
    assert_eq!(
        m.buffers[m.buffer("model.embed_tokens.weight").unwrap().0].source,
        Some(WeightSource::Tensor("model.embed_tokens.weight".into()))
    );
    assert_eq!(m.buffers[m.buffer("x").unwrap().0].role, Role::Input);
    assert_eq!(
        m.states[0].size,
        StateSize::PerToken {
            bytes: 147456,
            page_tokens: 16
        }
    );
    assert_eq!(m.states[1].size, StateSize::PerSeq { bytes: 1048576, snapshot: false });

    let by_value = &m.ops[m.op("by_value").unwrap().0].launches[0];
    assert_eq!(
        by_value.params[3].ty,
        KernelParam::Struct { size: 24, align: 8 }
    );
    let layout: Vec<(u32, u32)> = by_value.params.iter().map(|p| (p.offset, p.size)).collect();
    assert_eq!(
        layout,
        [
            (0, 1),
            (2, 2),
            (8, 8),
            (16, 24),
            (48, 16),
            (64, 8),
            (72, 8),
            (80, 8)
        ]
    );
    assert!(matches!(&by_value.args[3], LaunchArg::Struct(f) if f.len() == 4));

    let r = m.report();
    assert_eq!(
        r.programs,
        vec![("main".to_string(), 4, 4), ("decode".to_string(), 2, 2)]
    );
    // The alias takes no memory of its own.
    assert_eq!(r.weight_bytes, 1024 * 64 * 2 + 192 * 64 * 4 + 64 * 4);
    assert_eq!(
        (r.state_bytes_per_token, r.state_bytes_per_seq),
        (147456, 1048576)
    );
    let with_state = &m.program("main").unwrap().calls[3];
    assert_eq!(with_state.args[1], Binding::State(m.state("kv").unwrap()));
    let tiles = &m.buffers[m.buffer("tiles").unwrap().0];
    assert_eq!(
        m.shape(m.buffer("tiles").unwrap(), &m.vars_at_max()),
        Ok(vec![2048, 4])
    );
    assert_eq!(tiles.bytes_at_max, 2048 * 4 * 4);
    assert_eq!(
        m.shape(m.buffer("tiles").unwrap(), &[65, 1]),
        Ok(vec![128, 4])
    );
}

#[test]
fn hugging_face_source_from_the_local_cache() {
    let fx = fixtures();
    let cache = tempfile::tempdir().unwrap();
    let repo = cache.path().join("models--kern-test--vecadd");
    let snap = repo.join("snapshots/0123abcd/build/sm_90");
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), "0123abcd").unwrap();
    std::fs::copy(fx.join("vecadd.sm_90.cubin"), repo.join("blobs/baa44d")).unwrap();
    std::os::unix::fs::symlink(repo.join("blobs/baa44d"), snap.join("vecadd.sm_90.cubin")).unwrap();

    let manifest = manifests().join("hf_vecadd/model.json");
    let opts = CheckOptions {
        hf_cache: Some(cache.path().to_path_buf()),
        ..CheckOptions::default()
    };
    let m = load(&manifest, &opts).unwrap_or_else(|d| panic!("{d}"));
    assert_eq!(m.modules[0].path, snap.join("vecadd.sm_90.cubin"));

    // Not in the cache: the error names the exact path it expected.
    let empty = tempfile::tempdir().unwrap();
    let opts = CheckOptions {
        hf_cache: Some(empty.path().to_path_buf()),
        ..CheckOptions::default()
    };
    let err = load(&manifest, &opts).unwrap_err().to_string();
    let expected = empty
        .path()
        .join("models--kern-test--vecadd/snapshots/<revision>/build/sm_90/vecadd.sm_90.cubin");
    assert!(err.contains(&format!("modules.vecadd.source: hf:kern-test/vecadd/build/sm_90/vecadd.sm_90.cubin is not in the local Hugging Face cache: expected {}", expected.display())), "{err}");
}

#[test]
fn checking_for_an_arch_the_module_lacks_is_an_error() {
    let s = stage(&manifests().join("vecadd/model.json"));
    let opts = CheckOptions {
        arch: "sm_80".parse().unwrap(),
        ..CheckOptions::default()
    };
    let err = load(&s.manifest, &opts).unwrap_err();
    assert_eq!(err.error_count(), 1, "{err}");
    assert!(err.to_string().contains("modules.vecadd.source: module `vecadd` has no image kern can load on sm_80 (it holds: cubin sm_90)"), "{err}");
}

/// Decoding then serializing the raw types gives back the file's JSON: the decoder, the
/// serializer and the JSON Schema (derived from the same types) agree on every field name.
#[test]
fn raw_types_round_trip() {
    for name in [
        "seed_rms_norm",
        "vecadd",
        "triton_rmsnorm",
        "extensions",
        "hf_vecadd",
    ] {
        let path = manifests().join(name).join("model.json");
        let bytes = std::fs::read(&path).unwrap();
        let raw = parse_raw(&bytes, name).unwrap_or_else(|d| panic!("{d}"));
        let again = serde_json::to_value(&raw).unwrap();
        let original: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(again, original, "{name} does not round-trip");
    }
}

#[test]
fn fixtures_are_the_ones_the_manifests_were_written_for() {
    let fx = fixtures();
    for (name, want) in FIXTURES.iter().filter(|(_, h)| *h != "-") {
        let got = sha256(&std::fs::read(fx.join(name)).unwrap());
        assert_eq!(
            &got, want,
            "build/fixtures/{name} changed: update tests/manifests with\n  grep -rl {want} tests/manifests crates/kern-manifest/tests | xargs sed -i s/{want}/{got}/"
        );
    }
}

fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn warnings_do_not_fail_the_check_but_are_kept() {
    // An op parameter no launch uses, and an activation read before the call that writes it.
    let s = stage(&manifests().join("vecadd/model.json"));
    let text = std::fs::read_to_string(&s.manifest).unwrap();
    let text = text
        .replace(r#""params": ["in buffer<f32>", "in buffer<f32>", "out buffer<f32>"],
      "impl""#, r#""params": ["in buffer<f32>", "in buffer<f32>", "out buffer<f32>", "i32"],
      "impl""#)
        .replace(
            r#"{ "label": "add", "op": "vec_add", "args": [{ "buf": "A" }, { "buf": "B" }, { "buf": "C" }] }"#,
            r#"{ "label": "add", "op": "vec_add", "args": [{ "buf": "C" }, { "buf": "B" }, { "buf": "A" }, { "i32": 0 }] },
      { "label": "again", "op": "vec_add", "args": [{ "buf": "A" }, { "buf": "B" }, { "buf": "C" }, { "var": "n" }] }"#,
        );
    let m = check_bytes(text.as_bytes(), &s.manifest, &CheckOptions::default())
        .unwrap_or_else(|d| panic!("{d}"));
    let w: Vec<String> = m.warnings.iter().map(|d| d.to_string()).collect();
    assert_eq!(w.len(), 2, "{w:#?}");
    assert_eq!(
        w[0],
        "ops.vec_add.params[3]: warning: no launch of `vec_add` uses this parameter"
    );
    assert_eq!(w[1], "program.calls[0].args[0]: warning: `C` is read here before calls[1] first writes it: is the program out of order?");
    assert!(m.report().to_string().contains("2 warnings:"));
}

/// The parameter buffer of the by-value kernel, byte for byte (layout from binary-formats.md:
/// (0,1) (2,2) (8,8) (16,24) (48,16) (64,8) (72,8) (80,8)).
#[test]
fn packing_a_launch_with_aggregates() {
    let m = check("extensions");
    let l = &m.ops[m.op("by_value").unwrap().0].launches[0];
    let args = [
        ArgValue::Ptr(0x1111_2222_3333_4444),
        ArgValue::Ptr(0x5555_6666_7777_8888),
        ArgValue::Scalar(Value::I64(-5)),
        ArgValue::Scalar(Value::F32(1.5)),
    ];
    let buf = l.pack(&args).unwrap();
    let mut want = vec![0u8; 88];
    want[0] = 1;
    want[2..4].copy_from_slice(&2i16.to_le_bytes());
    want[8..16].copy_from_slice(&0.5f64.to_le_bytes());
    want[16..24].copy_from_slice(&(-5i64).to_le_bytes());
    want[24..28].copy_from_slice(&3i32.to_le_bytes());
    want[28..32].copy_from_slice(&1.5f32.to_le_bytes());
    want[32..40].copy_from_slice(&4i64.to_le_bytes());
    want[48..52].copy_from_slice(&1.0f32.to_le_bytes());
    want[60..64].copy_from_slice(&4.0f32.to_le_bytes());
    want[64..72].copy_from_slice(&0x1111_2222_3333_4444u64.to_le_bytes());
    want[72..80].copy_from_slice(&0x5555_6666_7777_8888u64.to_le_bytes());
    want[80..88].copy_from_slice(&7u64.to_le_bytes());
    assert_eq!(buf, want);
    // Values of the wrong kind are the caller's bug, reported rather than packed.
    let wrong = [ArgValue::Scalar(Value::I32(1)), args[1], args[2], args[3]];
    assert!(matches!(
        l.pack(&wrong),
        Err(PackError::Kind { param: 5, .. })
    ));
    assert_eq!(l.pack(&args[..2]), Err(PackError::MissingArg(2, 2)));
}

#[test]
fn packing_the_seed_launch() {
    let m = check("seed_rms_norm");
    let l = &m.ops[0].launches[0];
    let buf = l
        .pack(&[
            ArgValue::Ptr(0xa000),
            ArgValue::Ptr(0xb000),
            ArgValue::Ptr(0xc000),
            ArgValue::Scalar(Value::I32(7)),
        ])
        .unwrap();
    assert_eq!(buf.len(), 84);
    assert_eq!(&buf[0..8], &0xa000u64.to_le_bytes());
    assert_eq!(&buf[16..24], &2560i64.to_le_bytes());
    assert_eq!(&buf[56..64], &0xc000u64.to_le_bytes());
    assert_eq!(&buf[72..76], &1e-6f32.to_le_bytes());
    assert_eq!(&buf[76..80], &7i32.to_le_bytes());
    assert_eq!(&buf[80..84], &2560i32.to_le_bytes());
    assert_eq!(
        m.buffer_bytes(m.buffer("x").unwrap(), &[3]),
        Ok(3 * 2560 * 2)
    );
}

#[test]
fn step_abi_binding_passes_and_resolves() {
    let m = check("step");
    let s = m.step.as_ref().expect("the step section is checked");
    assert_eq!(s.abi, 1);
    assert_eq!(m.buffers[s.query_start.0].name, "query_start");
    assert_eq!(m.buffers[s.block_tables.0].name, "block_tables");
    assert_eq!(s.vocab, Some(1000));
    assert!(s.sampling.is_some());
    assert_eq!(m.states[s.kv.expect("kv").0].name, "kv");
    assert_eq!(m.vars[s.pages.0].name, "pages");
}

/// Issue 17: `parallel`, weight shards (the rank in `part`) and collective ops.
#[test]
fn tensor_parallel_declarations() {
    let m = check("parallel");
    assert_eq!(m.tp(), 2);
    assert!(m.has_collectives());
    let w = &m.buffers[m.buffer("W").unwrap().0];
    let Some(WeightSource::Shard { of, shard }) = &w.source else {
        panic!("W is a shard: {:?}", w.source)
    };
    assert_eq!(**of, WeightSource::Tensor("w".into()));
    assert_eq!((shard.dim, shard.parts), (0, 2));
    assert_eq!((shard.part_for(0), shard.part_for(1)), (Ok(0), Ok(1)));
    assert!(shard.part_for(2).is_err(), "rank 2 has no slice of 2 parts");
    let rep = &m.buffers[m.buffer("Wrep").unwrap().0];
    let Some(WeightSource::Shard { shard, .. }) = &rep.source else { panic!() };
    assert_eq!((shard.part_for(0), shard.part_for(1)), (Ok(0), Ok(0)));
    let qk = &m.buffers[m.buffer("WQK").unwrap().0];
    let Some(WeightSource::Shard { of, .. }) = &qk.source else { panic!() };
    assert!(matches!(**of, WeightSource::Concat { axis: 0, .. }));
    let ar = &m.ops[m.op("all_reduce").unwrap().0];
    assert_eq!(ar.collective, Some(kern_manifest::Collective::AllReduceSum));
    assert!(ar.launches.is_empty());
    assert_eq!(m.programs[0].launches(&m), 1, "collectives are not kernel launches");
    let r = m.report();
    assert_eq!((r.tp, r.collective_ops, r.collective_calls), (Some(2), 2, 2));
    assert!(r.to_string().contains("parallel   tp = 2: the manifest is one rank; 2 collective ops, 2 collective calls in the programs"), "{r}");
    // A single-GPU manifest has none of it.
    let one = check("vecadd");
    assert_eq!((one.tp(), one.has_collectives(), one.parallel), (1, false, None));
    assert!(!one.report().to_string().contains("parallel"));
    // The raw types serialize back to what was read.
    let text = std::fs::read_to_string(manifests().join("parallel/model.json")).unwrap();
    let raw = parse_raw(text.as_bytes(), "parallel").unwrap();
    let again = serde_json::to_value(&raw).unwrap();
    let orig: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(again, orig);
}
