//! Ops and their launches: module and entry references, the kernel's parameter layout, block,
//! grid and shared memory, and each argument against its kernel parameter.

use super::{max_shared_per_block, Checker};
use crate::diag::{did_you_mean, JsonPath};
use crate::expr::Expr;
use crate::kernel;
use crate::manifest::*;
use crate::raw::{Collective, RawConst, RawExpr, RawFieldValue, RawLaunch, RawLaunchArg, RawOp};
use crate::types::{Access, DType, KernelParam, OpParam, Scalar, Value};

/// Element types NCCL reduces and moves (`ncclDataType_t`; fp8 since NCCL 2.24).
pub(crate) fn nccl_dtype(d: DType) -> bool {
    !d.is_block() && !matches!(d, DType::I16 | DType::U16 | DType::Bool)
}

/// CUDA's parameter space since 12.1 on Volta and newer.
const MAX_PARAM_BYTES: u32 = 32_764;

pub(crate) fn value(c: &RawConst) -> Value {
    match *c {
        RawConst::I8(v) => Value::I8(v),
        RawConst::I16(v) => Value::I16(v),
        RawConst::I32(v) => Value::I32(v),
        RawConst::I64(v) => Value::I64(v),
        RawConst::U8(v) => Value::U8(v),
        RawConst::U16(v) => Value::U16(v),
        RawConst::U32(v) => Value::U32(v),
        RawConst::U64(v) => Value::U64(v),
        // The decoder has checked the range; this rounds to the nearest f32.
        RawConst::F32(v) => Value::F32(v as f32),
        RawConst::F64(v) => Value::F64(v),
        RawConst::Bool(v) => Value::Bool(v),
    }
}

fn op_param_size(p: &OpParam) -> u32 {
    match p {
        OpParam::Buffer { .. } | OpParam::Ptr | OpParam::State => 8,
        OpParam::Scalar(s) => s.size(),
    }
}

/// `{"i64": 2560}`-style example for a scalar type.
pub(crate) fn const_example(s: Scalar) -> String {
    match s {
        Scalar::F32 | Scalar::F64 => format!("{{\"{s}\": 1.0}}"),
        Scalar::Bool => "{\"bool\": true}".into(),
        _ => format!("{{\"{s}\": N}}"),
    }
}

impl Checker<'_> {
    pub(super) fn ops(&mut self) {
        let path = self.section("ops");
        for (i, (name, op)) in self.raw.ops.iter().enumerate() {
            let p = path.entry(name, i);
            self.names.ops.insert(name.clone(), self.ops.len());
            let checked = self.op(name, op, &p);
            self.ops.push(checked);
        }
    }

    fn op(&mut self, name: &str, op: &RawOp, p: &JsonPath) -> Op {
        if let Some(c) = op.implementation.collective {
            self.collective(c, op, p);
            return Op {
                name: name.to_string(),
                params: op.params.clone(),
                launches: vec![],
                collective: Some(c),
            };
        }
        for (i, t) in op.params.iter().enumerate() {
            if let OpParam::Buffer { access, dtype } = t {
                if dtype.is_block() && access.writes() {
                    self.sink.error(&p.field("params").index(i), format!("`{t}`: {dtype} is a block dtype, and blocks are only for weights, which programs never write: write \"in buffer<{dtype}>\""));
                }
            }
        }
        let mut used = vec![false; op.params.len()];
        let mut launches = vec![];
        let lp = p.field("impl").field("launches");
        if op.implementation.launches.is_empty() {
            self.sink.error(&lp, "an op needs at least one launch");
        }
        for (i, l) in op.implementation.launches.iter().enumerate() {
            if let Some(launch) = self.launch(l, &op.params, &mut used, &lp.index(i)) {
                launches.push(launch);
            }
        }
        for (i, u) in used.iter().enumerate() {
            if !u {
                self.sink.warn(
                    &p.field("params").index(i),
                    format!("no launch of `{name}` uses this parameter"),
                );
            }
        }
        Op {
            name: name.to_string(),
            params: op.params.clone(),
            launches,
            collective: None,
        }
    }

    /// A collective op: the ranks declared, no launches, and the collective's own signature.
    fn collective(&mut self, c: Collective, op: &RawOp, p: &JsonPath) {
        let ip = p.field("impl");
        if !op.implementation.launches.is_empty() {
            self.sink.error(&ip, "an op's impl has either `launches` or `collective`, not both: remove one");
        }
        if self.parallel.is_none() {
            self.sink.error(&ip.field("collective"), format!("`{}` runs across ranks: declare them with \"parallel\": {{\"tp\": N}} at the top level", c.name()));
        }
        let (want, sig): (&[Access], &str) = match c {
            Collective::AllReduceSum => (&[Access::InOut], "[\"inout buffer<T>\"]"),
            Collective::AllGather => (&[Access::Out, Access::In], "[\"out buffer<T>\", \"in buffer<T>\"]"),
        };
        let pp = p.field("params");
        let shape_ok = op.params.len() == want.len()
            && op.params.iter().zip(want).all(|(t, a)| matches!(t, OpParam::Buffer { access, .. } if access == a));
        if !shape_ok {
            self.sink.error(&pp, format!("`{}` takes {sig} (T one element type), the op declares [{}]", c.name(), op.params.iter().map(|t| format!("\"{t}\"")).collect::<Vec<_>>().join(", ")));
            return;
        }
        let dtypes: Vec<DType> = op
            .params
            .iter()
            .filter_map(|t| match t {
                OpParam::Buffer { dtype, .. } => Some(*dtype),
                _ => None,
            })
            .collect();
        if dtypes.iter().any(|d| *d != dtypes[0]) {
            self.sink.error(&pp, format!("`{}` gathers into a buffer of the same element type: the params are {} and {}", c.name(), dtypes[0], dtypes[1]));
        }
        if !nccl_dtype(dtypes[0]) {
            self.sink.error(&pp.index(0), format!("NCCL has no {} type: collectives take bf16, f16, f32, f64, i8, u8, i32, u32, i64, u64, f8e4m3 or f8e5m2", dtypes[0]));
        }
    }

    fn launch(
        &mut self,
        l: &RawLaunch,
        op_params: &[OpParam],
        used: &mut [bool],
        p: &JsonPath,
    ) -> Option<Launch> {
        let errors_before = self.sink.error_count();
        let module = match self.names.modules.get(&l.module) {
            Some(&m) => {
                self.modules_used[m] = true;
                Some(m)
            }
            None => {
                if !self.broken.modules.contains(&l.module) {
                    let hint = did_you_mean(&l.module, self.raw.modules.keys().map(String::as_str));
                    let declared = if self.raw.modules.is_empty() {
                        " (`modules` declares none)".to_string()
                    } else {
                        String::new()
                    };
                    self.sink.error(
                        &p.field("module"),
                        format!(
                            "`{}` is not a module{hint}{declared}: declare it in `modules`",
                            l.module
                        ),
                    );
                }
                None
            }
        };

        // The manifest's own parameter list: aggregates must make sense before any layout.
        let mut params_ok = true;
        for (i, kp) in l.params.iter().enumerate() {
            if let KernelParam::Struct { size, align } = *kp {
                let sp = p.field("params").index(i).field("struct");
                if size == 0 {
                    self.sink
                        .error(&sp.field("size"), "an aggregate has at least 1 byte");
                    params_ok = false;
                }
                if !align.is_power_of_two() || align > 256 {
                    self.sink.error(
                        &sp.field("align"),
                        format!("`align` is a power of two up to 256, not {align}"),
                    );
                    params_ok = false;
                } else if size % align != 0 {
                    self.sink.error(&sp.field("size"), format!("a C aggregate's size is a multiple of its alignment: {size} is not a multiple of {align}"));
                    params_ok = false;
                }
            }
        }
        let layout = if params_ok {
            kernel::layout(&l.params)
        } else {
            None
        };
        if let Some(lay) = &layout {
            if lay.end > MAX_PARAM_BYTES {
                self.sink.error(
                    &p.field("params"),
                    format!(
                        "the parameters take {} bytes; CUDA allows {MAX_PARAM_BYTES}",
                        lay.end
                    ),
                );
            }
        } else if params_ok {
            self.sink
                .error(&p.field("params"), "the parameters do not fit in 4 GiB");
        }

        // The kernel.
        let arch = self.opts.arch;
        let mut kernel_index = None;
        if let Some(Some(m)) = module.map(|m| &self.modules[m]) {
            let image = m.image();
            let others: Vec<(String, bool)> = m
                .binary
                .images
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != m.image)
                .map(|(_, im)| {
                    (
                        im.arch.map_or("other".into(), |a| a.to_string()),
                        im.kernel(&l.entry).is_some(),
                    )
                })
                .collect();
            match kernel::find_entry(image, &l.entry, &others) {
                Ok(k) => kernel_index = Some(k),
                Err(e) => self.sink.error(
                    &p.field("entry"),
                    format!("{e} (module `{}`, {arch})", l.module),
                ),
            }
        }
        let kernel = match (module, kernel_index) {
            (Some(m), Some(k)) => self.modules[m]
                .as_ref()
                .map(|m| m.image().kernels[k].clone()),
            _ => None,
        };
        if let (Some(k), Some(lay)) = (&kernel, &layout) {
            kernel::check_params(k, &l.params, lay, &p.field("params"), self.sink);
        }

        // Block, grid, shared memory.
        let block = self.dims(&l.block, &p.field("block"), true);
        let grid = self.dims(&l.grid, &p.field("grid"), false);
        if let (Some(k), Some((exprs, at_max))) = (&kernel, &block) {
            kernel::check_block(k, exprs, *at_max, &p.field("block"), self.sink);
        }
        let shared = match &l.shared {
            None => Some(Expr::constant(0)),
            Some(raw) => self.shared(raw, kernel.as_ref(), &p.field("shared")),
        };

        // Arguments.
        let args = self.launch_args(l, op_params, used, &p.field("args"));

        if self.sink.error_count() > errors_before {
            return None;
        }
        let layout = layout?;
        Some(Launch {
            label: l.label.clone(),
            module: ModuleId(module?),
            entry: l.entry.clone(),
            kernel: kernel_index?,
            params: l
                .params
                .iter()
                .zip(&layout.slots)
                .map(|(ty, &(offset, size))| LaunchParam {
                    ty: *ty,
                    offset,
                    size,
                })
                .collect(),
            param_bytes: layout.end,
            block: block?.0,
            grid: grid?.0,
            shared: shared?,
            pdl: l.pdl,
            args: args?,
        })
    }

    /// 1 to 3 dimensions, padded with 1; each at least 1 (a grid: at least 1 at the vars' max,
    /// and never negative) and within CUDA's limits. Returns the expressions and their values
    /// at the vars' max.
    /// Whether `e` is positive for some var values: each var swept over 1..=max (up to 65,536
    /// values) with the others at their max, then at 1.
    fn positive_somewhere(&self, e: &Expr) -> bool {
        for base in [&self.at_max, &self.at_min] {
            for v in 0..self.vars.len() {
                let mut vars = base.clone();
                for x in 1..=self.vars[v].max.min(1 << 16) {
                    vars[v] = x;
                    if e.eval(&vars).is_ok_and(|g| g > 0) {
                        return true;
                    }
                }
            }
        }
        false
    }

    fn dims(
        &mut self,
        raw: &[RawExpr],
        p: &JsonPath,
        is_block: bool,
    ) -> Option<([Expr; 3], [i64; 3])> {
        let what = if is_block { "block" } else { "grid" };
        if raw.is_empty() || raw.len() > 3 {
            self.sink.error(
                p,
                format!(
                    "a {what} has 1 to 3 dimensions (x, y, z), not {}",
                    raw.len()
                ),
            );
            return None;
        }
        let limits: [i64; 3] = if is_block {
            [1024, 1024, 64]
        } else {
            [i32::MAX as i64, 65535, 65535]
        };
        let mut exprs = vec![];
        let mut at_max = [1i64; 3];
        let mut ok = true;
        for (i, r) in raw.iter().enumerate() {
            let dp = p.index(i);
            let Some(e) = self.expr(r, &dp) else {
                ok = false;
                continue;
            };
            match self.eval_corners(&e, &dp) {
                Some((max, min)) => {
                    at_max[i] = max;
                    let axis = ["x", "y", "z"][i];
                    if is_block && (max < 1 || min < 1) {
                        let (v, when) = if max < 1 {
                            (max, "at the vars' max")
                        } else {
                            (min, "when every var is 1")
                        };
                        self.sink.error(
                            &dp,
                            format!(
                                "block {axis} `{e}` is {v} {when}: a block dimension is at least 1"
                            ),
                        );
                        ok = false;
                    } else if !is_block && max < 1 && !self.positive_somewhere(&e) {
                        // A grid of 0 skips the launch: fine for launches that serve a range
                        // of var values (one kernel per M range), an error when no value of
                        // any var makes it run.
                        self.sink.error(&dp, format!("grid {axis} `{e}` is {max} at the vars' max and at every other var value tried, so the launch would never run: a grid dimension is at least 1"));
                        ok = false;
                    } else if !is_block && min < 0 {
                        self.sink.error(&dp, format!("grid {axis} `{e}` is {min} when every var is 1: a grid dimension cannot be negative"));
                        ok = false;
                    } else if max > limits[i] {
                        self.sink.error(&dp, format!("{what} {axis} `{e}` is {max} at the vars' max, above CUDA's limit of {}", limits[i]));
                        ok = false;
                    }
                }
                None => ok = false,
            }
            exprs.push(e);
        }
        if is_block && ok {
            let threads: i64 = at_max.iter().product();
            if threads > 1024 {
                self.sink.error(
                    p,
                    format!("the block has {threads} threads at the vars' max; CUDA allows 1024"),
                );
                ok = false;
            }
        }
        if !ok {
            return None;
        }
        while exprs.len() < 3 {
            exprs.push(Expr::constant(1));
        }
        let exprs: [Expr; 3] = exprs.try_into().ok()?;
        Some((exprs, at_max))
    }

    fn shared(
        &mut self,
        raw: &RawExpr,
        kernel: Option<&kern_binary::Kernel>,
        p: &JsonPath,
    ) -> Option<Expr> {
        let e = self.expr(raw, p)?;
        let (max, min) = self.eval_corners(&e, p)?;
        if max < 0 || min < 0 {
            self.sink
                .error(p, format!("`shared` `{e}` is negative ({})", max.min(min)));
            return None;
        }
        let static_bytes = kernel.and_then(|k| k.shared_bytes).unwrap_or(0);
        if let Some(limit) = max_shared_per_block(self.opts.arch.sm) {
            let total = (max as u64).saturating_add(static_bytes);
            if total > limit {
                self.sink.error(
                    p,
                    format!(
                        "{max} bytes of dynamic shared memory (plus the kernel's {static_bytes} static) is above the {limit} bytes a block may use on {}",
                        self.opts.arch
                    ),
                );
                return None;
            }
        }
        Some(e)
    }

    fn launch_args(
        &mut self,
        l: &RawLaunch,
        op_params: &[OpParam],
        used: &mut [bool],
        p: &JsonPath,
    ) -> Option<Vec<LaunchArg>> {
        if l.args.len() != l.params.len() {
            self.sink.error(
                p,
                format!(
                    "the launch lists {} kernel parameters but {} args: give one arg per parameter",
                    l.params.len(),
                    l.args.len()
                ),
            );
            return None;
        }
        let mut out = Vec::with_capacity(l.args.len());
        let mut ok = true;
        for (i, (arg, kp)) in l.args.iter().zip(&l.params).enumerate() {
            match self.launch_arg(arg, kp, op_params, used, &p.index(i)) {
                Some(a) => out.push(a),
                None => ok = false,
            }
        }
        ok.then_some(out)
    }

    /// The op parameter `{"param": j}` names, marked used.
    fn op_param(
        &mut self,
        j: u32,
        op_params: &[OpParam],
        used: &mut [bool],
        p: &JsonPath,
    ) -> Option<OpParam> {
        let j = j as usize;
        match op_params.get(j) {
            Some(t) => {
                used[j] = true;
                Some(*t)
            }
            None => {
                self.sink.error(
                    p,
                    format!(
                        "the op has {} parameters (0 to {}), there is no parameter {j}",
                        op_params.len(),
                        op_params.len().saturating_sub(1)
                    ),
                );
                None
            }
        }
    }

    fn launch_arg(
        &mut self,
        arg: &RawLaunchArg,
        kp: &KernelParam,
        op_params: &[OpParam],
        used: &mut [bool],
        p: &JsonPath,
    ) -> Option<LaunchArg> {
        match arg {
            RawLaunchArg::Param(j) => {
                let pp = p.field("param");
                let t = self.op_param(*j, op_params, used, &pp)?;
                let msg = match compat(kp, &t) {
                    Ok(()) => return Some(LaunchArg::Param(*j as usize)),
                    Err(m) => m,
                };
                self.sink.error(p, format!("{msg} (op params[{j}])"));
                None
            }
            RawLaunchArg::Const(c) => {
                let v = value(c);
                match kp {
                    KernelParam::Scalar(s) if *s == v.scalar() => Some(LaunchArg::Const(v)),
                    KernelParam::Scalar(s) => {
                        self.sink.error(
                            p,
                            format!(
                                "the kernel parameter is {s} and this constant is {}: write {}",
                                v.scalar(),
                                const_example(*s)
                            ),
                        );
                        None
                    }
                    other => {
                        self.sink.error(p, format!("the kernel parameter is {other}, not a scalar: pass {{\"param\": I}}{}", null_hint(other)));
                        None
                    }
                }
            }
            RawLaunchArg::Null(_) => {
                if kp.is_pointer() {
                    Some(LaunchArg::Null)
                } else {
                    self.sink.error(
                        p,
                        format!("{{\"null\": true}} is for pointer parameters; this one is {kp}"),
                    );
                    None
                }
            }
            RawLaunchArg::Struct(fields) => {
                let KernelParam::Struct { size, .. } = *kp else {
                    self.sink.error(p, format!("the kernel parameter is {kp}, not an aggregate: {{\"struct\": […]}} is for parameters declared {{\"struct\": {{\"size\": N, \"align\": A}}}}"));
                    return None;
                };
                self.fields(fields, size, op_params, used, &p.field("struct"))
                    .map(LaunchArg::Struct)
            }
        }
    }

    fn fields(
        &mut self,
        fields: &[crate::raw::RawField],
        size: u32,
        op_params: &[OpParam],
        used: &mut [bool],
        p: &JsonPath,
    ) -> Option<Vec<Field>> {
        let mut out = vec![];
        let mut spans: Vec<(u32, u32, usize)> = vec![];
        let mut ok = true;
        for (i, f) in fields.iter().enumerate() {
            let fp = p.index(i);
            let (value, width) = match &f.value {
                RawFieldValue::Param(j) => {
                    match self.op_param(*j, op_params, used, &fp.field("param")) {
                        Some(t) => (FieldValue::Param(*j as usize), op_param_size(&t)),
                        None => {
                            ok = false;
                            continue;
                        }
                    }
                }
                RawFieldValue::Const(c) => {
                    let v = value(c);
                    (FieldValue::Const(v), v.scalar().size())
                }
                RawFieldValue::Null(_) => (FieldValue::Null, 8),
            };
            let end = u64::from(f.offset) + u64::from(width);
            if end > u64::from(size) {
                self.sink.error(&fp, format!("this {width}-byte field at offset {} ends at byte {end}, past the aggregate's {size} bytes", f.offset));
                ok = false;
                continue;
            }
            if let Some((_, _, other)) = spans
                .iter()
                .find(|(s, e, _)| f.offset < *e && *s < end as u32)
            {
                self.sink.error(
                    &fp,
                    format!(
                        "this field (bytes {} to {}) overlaps field {other}",
                        f.offset,
                        end - 1
                    ),
                );
                ok = false;
                continue;
            }
            if f.offset % width != 0 {
                self.sink.warn(&fp, format!("this {width}-byte field is at offset {}, not a multiple of its size: C would align it", f.offset));
            }
            spans.push((f.offset, end as u32, i));
            out.push(Field {
                offset: f.offset,
                value,
            });
        }
        ok.then_some(out)
    }
}

fn null_hint(kp: &KernelParam) -> &'static str {
    if kp.is_pointer() {
        " or {\"null\": true}"
    } else {
        ""
    }
}

/// Whether op parameter `op` may be passed to kernel parameter `kp`.
fn compat(kp: &KernelParam, op: &OpParam) -> Result<(), String> {
    match (kp, op) {
        (KernelParam::Buffer { access: ka, dtype: kd }, OpParam::Buffer { access: oa, dtype: od }) => {
            if kd != od {
                return Err(format!("the kernel parameter is `{kp}` but the op's parameter is `{op}`: the dtypes differ"));
            }
            if ka.writes() && !oa.writes() {
                return Err(format!(
                    "the kernel writes this buffer (`{}`) but the op's parameter is `in`: declare the op's parameter `out` or `inout`",
                    ka.name()
                ));
            }
            Ok(())
        }
        (KernelParam::Buffer { .. }, OpParam::Ptr | OpParam::State) => {
            Err(format!("the kernel parameter is `{kp}` but the op's parameter is `{op}`, which has no dtype: declare the op's parameter as a buffer"))
        }
        (KernelParam::Ptr, OpParam::Buffer { .. } | OpParam::Ptr | OpParam::State) => Ok(()),
        (KernelParam::Scalar(s), OpParam::Scalar(t)) if s == t => Ok(()),
        (KernelParam::Scalar(s), OpParam::Scalar(t)) => {
            Err(format!("the kernel parameter is {s} but the op's parameter is {t}: the types must be equal (declare the op's parameter {s})"))
        }
        (KernelParam::Struct { .. }, _) => Err("this parameter is an aggregate: build it with {\"struct\": [{\"offset\": N, \"param\": I}, …]}".into()),
        (kp, op) => Err(format!("the kernel parameter is `{kp}` but the op's parameter is `{op}`")),
    }
}
