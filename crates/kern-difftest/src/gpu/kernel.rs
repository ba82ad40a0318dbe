//! The kernel diff: every op both manifests declare alike, run alone on each side on identical
//! inputs drawn from several distributions, at several step shapes.

use super::*;

impl Session<'_> {
    pub(super) fn kernel_diff(&mut self) -> Result<Vec<OpDiff>, String> {
        let shapes = self.kernel_shapes();
        let mut out = Vec::new();
        let pairs = self.an.ops.clone();
        let mut cache: HashMap<(usize, u8, DistKey), Vec<u8>> = HashMap::new();
        let mut cache_bytes = 0usize;
        for sh in &shapes {
            self.upload(sh)?;
            for pair in &pairs {
                if !out.iter().any(|d: &OpDiff| d.op == pair.name) {
                    out.push(OpDiff { op: pair.name.clone(), same_impl: pair.same_impl, a_call: String::new(), b_call: String::new(), checks: 0, failures: 0, first_failure: None, worst: None, skipped: None });
                }
                let d = out.iter_mut().find(|d| d.op == pair.name).unwrap();
                if d.skipped.is_some() {
                    continue;
                }
                let (ma, mb) = (&self.a.manifest, &self.b.manifest);
                let calls_a = &ma.programs[0].calls;
                let calls_b = &mb.programs[0].calls;
                let Some(ia) = calls_a.iter().position(|c| c.op == pair.a) else {
                    d.skipped = Some("A's program does not call it".into());
                    continue;
                };
                let ib = calls_b.iter().position(|c| c.op == pair.b && c.label == calls_a[ia].label).or_else(|| calls_b.iter().position(|c| c.op == pair.b));
                let Some(ib) = ib else {
                    d.skipped = Some("B's program does not call it".into());
                    continue;
                };
                d.a_call = calls_a[ia].label.clone();
                d.b_call = calls_b[ib].label.clone();
                let op = &ma.ops[pair.a.0];
                if let Some(why) = bindings_differ(ma, mb, &calls_a[ia].args, &calls_b[ib].args, &sh.va, &sh.vb) {
                    d.skipped = Some(why);
                    continue;
                }
                let uses_state = calls_a[ia].args.iter().any(|b| matches!(b, Binding::State(_)));
                for (di, dist) in Dist::ALL.iter().enumerate() {
                    // Inputs: every float buffer the call reads (not the step ABI's arrays,
                    // which index memory), the same bytes on both sides; outputs poisoned
                    // (0xff: NaN) on both.
                    for (j, p) in op.params.iter().enumerate() {
                        let (Binding::Buf(xa), Binding::Buf(xb)) = (&calls_a[ia].args[j], &calls_b[ib].args[j]) else { continue };
                        let buf = &ma.buffers[xa.0];
                        let reads = match p {
                            OpParam::Buffer { access, .. } => access.reads(),
                            OpParam::Ptr => true,
                            _ => false,
                        };
                        if reads && !is_step_input(ma, *xa) && numeric::is_float(buf.dtype) {
                            let n = (ma.buffer_bytes(*xa, &sh.va).map_err(|e| e.to_string())? / buf.dtype.size()) as usize;
                            // Drawn once per (size, dtype, distribution, parameter) and kept
                            // (weights keep their size across shapes), up to 4 GiB.
                            let key = (n, buf.dtype.size() as u8, DistKey(di, j, buf.dtype.name()));
                            if !cache.contains_key(&key) {
                                if cache_bytes > 4 << 30 {
                                    cache.clear();
                                    cache_bytes = 0;
                                }
                                let seed = self.opts.seed ^ ((di as u64) << 32) ^ (j as u64) << 48;
                                let bytes = tiled(*dist, n, buf.dtype, seed)?;
                                cache_bytes += bytes.len();
                                cache.insert(key.clone(), bytes);
                            }
                            let bytes = &cache[&key];
                            self.a.write_buffer(*xa, bytes).map_err(|e| rt_err("A", e))?;
                            self.b.write_buffer(*xb, bytes).map_err(|e| rt_err("B", e))?;
                        } else if let OpParam::Buffer { access: kern_manifest::Access::Out, .. } = p {
                            self.a.fill_buffer(*xa, 0xff).map_err(|e| rt_err("A", e))?;
                            self.b.fill_buffer(*xb, 0xff).map_err(|e| rt_err("B", e))?;
                        }
                    }
                    if uses_state {
                        for &(sa, sb) in &self.states {
                            self.b.copy_state_from(sb, &self.a, sa).map_err(|e| rt_err("B", e))?;
                        }
                    }
                    self.a.run_calls(0, &sh.va, ia..ia + 1, true).map_err(|e| format!("kernel diff of op `{}` ({}, {}): A: {e}", pair.name, sh.name, dist.name()))?;
                    self.b.run_calls(0, &sh.vb, ib..ib + 1, true).map_err(|e| format!("kernel diff of op `{}` ({}, {}): B: {e}", pair.name, sh.name, dist.name()))?;
                    for (j, p) in op.params.iter().enumerate() {
                        let OpParam::Buffer { access, dtype } = p else { continue };
                        if !access.writes() {
                            continue;
                        }
                        let (Binding::Buf(xa), Binding::Buf(xb)) = (&calls_a[ia].args[j], &calls_b[ib].args[j]) else { continue };
                        let len = ma.buffer_bytes(*xa, &sh.va).map_err(|e| e.to_string())? as usize;
                        let ra = self.a.read_buffer(*xa, len).map_err(|e| rt_err("A", e))?;
                        let rb = self.b.read_buffer(*xb, len).map_err(|e| rt_err("B", e))?;
                        // The bias gate judges the in-range distributions only: at the edges of
                        // the range (near max: overflow; near the smallest normal: denormals
                        // flushed or not) correct kernels legitimately differ in one direction.
                        let gate = !matches!(dist, Dist::Zeros | Dist::Large | Dist::Tiny);
                        let stats = numeric::compare_rows(&ra, &rb, *dtype, &Tolerance::default_for(*dtype), row_len(ma, *xa, &sh.va), gate);
                        let check = Check { shape: sh.name.clone(), dist: dist.name().into(), output: format!("#{j} `{}`", ma.buffers[xa.0].name), stats };
                        d.checks += 1;
                        if !check.stats.ok() {
                            d.failures += 1;
                            if d.first_failure.is_none() {
                                d.first_failure = Some(check.clone());
                            }
                        }
                        if check.stats.max_ulp > 0 && d.worst.as_ref().is_none_or(|w| check.stats.max_rel > w.stats.max_rel) {
                            d.worst = Some(check);
                        }
                    }
                }
            }
        }
        Ok(out)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct DistKey(usize, usize, &'static str);

/// `n` elements of `dist` as `dtype` bytes; above 2^20 elements a block of 2^20 values is
/// repeated (weights of a vocabulary-sized table would otherwise take minutes to draw).
fn tiled(dist: Dist, n: usize, dtype: kern_manifest::DType, seed: u64) -> Result<Vec<u8>, String> {
    const BLOCK: usize = 1 << 20;
    let m = n.min(BLOCK);
    let block = encode(&Values::F64(dist.values(m, dtype, seed)), dtype)?;
    if m == n {
        return Ok(block);
    }
    let mut out = Vec::with_capacity(n * dtype.size() as usize);
    while out.len() + block.len() <= n * dtype.size() as usize {
        out.extend_from_slice(&block);
    }
    let rest = n * dtype.size() as usize - out.len();
    out.extend_from_slice(&block[..rest]);
    Ok(out)
}

/// Why the two calls cannot run on identical inputs (None: they can).
fn bindings_differ(ma: &Manifest, mb: &Manifest, a: &[Binding], b: &[Binding], va: &[i64], vb: &[i64]) -> Option<String> {
    for (j, (x, y)) in a.iter().zip(b).enumerate() {
        let ok = match (x, y) {
            (Binding::Buf(p), Binding::Buf(q)) => {
                let (sa, sb) = (ma.buffer_bytes(*p, va).ok(), mb.buffer_bytes(*q, vb).ok());
                if sa != sb || sa.is_none() {
                    return Some(format!("parameter {j}: A binds `{}` ({sa:?} bytes), B `{}` ({sb:?} bytes)", ma.buffers[p.0].name, mb.buffers[q.0].name));
                }
                true
            }
            (Binding::Var(p), Binding::Var(q)) => ma.vars[p.0].name == mb.vars[q.0].name,
            (Binding::Const(p), Binding::Const(q)) => p == q,
            (Binding::State(p), Binding::State(q)) => ma.states[p.0].name == mb.states[q.0].name,
            (Binding::Null, Binding::Null) => true,
            _ => false,
        };
        if !ok {
            return Some(format!("parameter {j}: A's call binds {x:?}, B's {y:?}"));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use kern_manifest::DType;

    #[test]
    fn tiled_inputs_repeat_one_block_to_any_length() {
        let small = tiled(Dist::Normal, 1000, DType::Bf16, 3).unwrap();
        assert_eq!(small.len(), 2000);
        let n = (1 << 20) * 2 + 7;
        let big = tiled(Dist::Normal, n, DType::F32, 3).unwrap();
        assert_eq!(big.len(), n * 4);
        assert_eq!(big[..16], big[(1 << 20) * 4..(1 << 20) * 4 + 16]);
        assert_eq!(big[n * 4 - 28..], big[..28], "the tail is the block's start");
        assert_ne!(tiled(Dist::Normal, 64, DType::F32, 3).unwrap(), tiled(Dist::Normal, 64, DType::F32, 4).unwrap());
    }
}
