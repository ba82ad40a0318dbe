//! RoPE variants as data: a config's `rope_scaling` (or transformers v5's `rope_parameters`)
//! read into [`RopeScaling`], and the fp32 inverse-frequency table and cos/sin factor the
//! manifest hands the RoPE kernel (`qk_norm_rope`'s `inv_freq` and `cos_scale`). The tables
//! follow transformers' `modeling_rope_utils` step by step in fp32 (where transformers computes
//! on fp32 tensors) and in f64 (where it computes on Python floats), so kern's frequencies are
//! transformers' to the ulp in practice; `scripts/gpu/families.py` compares them on the GPU.
//!
//! Supported: `default`, `linear`, `llama3`, `yarn`. Refused by name: `dynamic` (transformers
//! recomputes its frequencies from the longest sequence of each forward call, so a request's
//! result would depend on what else is in its step), `longrope` and anything else.

/// A RoPE scaling kind with its parameters.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE: the kernel computes `theta^(-2i/d)` itself (no table).
    None,
    /// Every inverse frequency divided by `factor` (positions interpolated).
    Linear { factor: f64 },
    /// Llama 3.1's per-band scaling.
    Llama3 { factor: f64, low_freq_factor: f64, high_freq_factor: f64, original_max_position_embeddings: f64 },
    /// YaRN: ramped interpolation and an attention factor on cos/sin.
    Yarn {
        factor: f64,
        original_max_position_embeddings: f64,
        beta_fast: f64,
        beta_slow: f64,
        attention_factor: Option<f64>,
        mscale: Option<f64>,
        mscale_all_dim: Option<f64>,
        truncate: bool,
    },
    /// Per-frequency divisors as a GGUF file stores them (`rope_freqs.weight`, llama.cpp's
    /// `freq_factors`): inv_freq_i = theta^(-2i/d) / divisors_i.
    Divisors(Vec<f32>),
}

/// The RoPE types kern reads, for error messages.
pub const ROPE_TYPES: &str = "default, linear, llama3, yarn";

impl RopeScaling {
    /// Reads a `rope_scaling` object (or a `rope_parameters` one: the same keys plus
    /// `rope_theta`). `max_position_embeddings` is the config's (YaRN's fallback for the
    /// original context). `null`, `{}` and `rope_type: default` are no scaling.
    pub fn from_json(v: &serde_json::Value, max_position_embeddings: Option<u64>) -> Result<RopeScaling, String> {
        if v.is_null() {
            return Ok(RopeScaling::None);
        }
        let o = v.as_object().ok_or_else(|| format!("rope_scaling {v}: expected an object or null"))?;
        let kind = o.get("rope_type").or_else(|| o.get("type")).and_then(|t| t.as_str()).unwrap_or("default");
        let num = |k: &str| -> Result<Option<f64>, String> {
            match o.get(k) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(x) => x.as_f64().map(Some).ok_or_else(|| format!("rope_scaling.{k} is {x}, not a number")),
            }
        };
        let need = |k: &str| -> Result<f64, String> { num(k)?.ok_or_else(|| format!("rope_scaling of type `{kind}` needs `{k}`")) };
        match kind {
            "default" => Ok(RopeScaling::None),
            "linear" => Ok(RopeScaling::Linear { factor: need("factor")? }),
            "llama3" => Ok(RopeScaling::Llama3 {
                factor: need("factor")?,
                low_freq_factor: need("low_freq_factor")?,
                high_freq_factor: need("high_freq_factor")?,
                original_max_position_embeddings: need("original_max_position_embeddings")?,
            }),
            "yarn" => {
                let mut factor = need("factor")?;
                // transformers: with an explicit original context, the factor is the ratio of
                // the config's context to it (DeepSeek-V3 and others change max_position_embeddings).
                let original = match (num("original_max_position_embeddings")?, max_position_embeddings) {
                    (Some(orig), Some(max)) => {
                        factor = max as f64 / orig;
                        orig
                    }
                    (Some(orig), None) => orig,
                    (None, Some(max)) => max as f64,
                    (None, None) => return Err("rope_scaling of type `yarn` needs `original_max_position_embeddings` or the config's `max_position_embeddings`".into()),
                };
                Ok(RopeScaling::Yarn {
                    factor,
                    original_max_position_embeddings: original,
                    beta_fast: num("beta_fast")?.unwrap_or(32.0),
                    beta_slow: num("beta_slow")?.unwrap_or(1.0),
                    attention_factor: num("attention_factor")?,
                    mscale: num("mscale")?,
                    mscale_all_dim: num("mscale_all_dim")?,
                    truncate: o.get("truncate").and_then(|t| t.as_bool()).unwrap_or(true),
                })
            }
            "dynamic" => Err("rope_scaling of type `dynamic` (dynamic NTK) is not supported: transformers recomputes its frequencies from the longest sequence of each forward call, so a request's result would depend on the other requests of its step; kern supports default, linear, llama3 and yarn".into()),
            other => Err(format!("rope_scaling of type `{other}` is not supported; kern supports {ROPE_TYPES}")),
        }
    }

    /// The `rope_scaling` object transformers reads back (`None` for no scaling).
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::json;
        match self {
            RopeScaling::None | RopeScaling::Divisors(_) => serde_json::Value::Null,
            RopeScaling::Linear { factor } => json!({"rope_type": "linear", "factor": factor}),
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } => json!({
                "rope_type": "llama3", "factor": factor, "low_freq_factor": low_freq_factor,
                "high_freq_factor": high_freq_factor, "original_max_position_embeddings": *original_max_position_embeddings as u64}),
            RopeScaling::Yarn { factor, original_max_position_embeddings, beta_fast, beta_slow, attention_factor, mscale, mscale_all_dim, truncate } => {
                let mut v = json!({"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": *original_max_position_embeddings as u64,
                    "beta_fast": beta_fast, "beta_slow": beta_slow, "truncate": truncate});
                for (k, x) in [("attention_factor", attention_factor), ("mscale", mscale), ("mscale_all_dim", mscale_all_dim)] {
                    if let Some(x) = x {
                        v[k] = json!(x);
                    }
                }
                v
            }
        }
    }
}

/// Whether the kernels take `s` at head size `d`.
pub fn check(s: &RopeScaling, d: u64) -> Result<(), String> {
    match s {
        RopeScaling::Divisors(v) if v.len() as u64 != d / 2 => Err(format!("{} RoPE frequency divisors for head_dim {d} (want {})", v.len(), d / 2)),
        RopeScaling::Linear { factor } | RopeScaling::Llama3 { factor, .. } | RopeScaling::Yarn { factor, .. } if !(factor.is_finite() && *factor > 0.0) => {
            Err(format!("rope_scaling factor {factor} must be a positive number"))
        }
        _ => Ok(()),
    }
}

/// transformers' default inverse frequencies in fp32: `1.0 / (base ** (arange(0, d, 2).float() / d))`,
/// the power as the RoPE kernel computes it (the correctly rounded double power, rounded to fp32).
fn default_inv(theta: f64, d: u64) -> Vec<f32> {
    (0..d / 2)
        .map(|i| {
            let e = (2 * i) as f32 / d as f32;
            let p = theta.powf(f64::from(e)) as f32;
            1.0f32 / p
        })
        .collect()
}

/// The inverse-frequency table of a scaled RoPE, or `None` for plain RoPE (the kernel then
/// computes it from theta, exactly [`default_inv`]).
pub fn inv_freq(theta: f64, d: u64, s: &RopeScaling) -> Option<Vec<f32>> {
    let base = default_inv(theta, d);
    match s {
        RopeScaling::None => None,
        // `inv_freq /= factor` on an fp32 tensor.
        RopeScaling::Linear { factor } => Some(base.iter().map(|&x| x / *factor as f32).collect()),
        RopeScaling::Divisors(div) => Some(base.iter().zip(div).map(|(&x, &f)| x / f).collect()),
        RopeScaling::Llama3 { factor, low_freq_factor: low, high_freq_factor: high, original_max_position_embeddings: l0 } => {
            // _compute_llama3_parameters: Python floats for the wavelength bounds; the rest on
            // fp32 tensors (a Python scalar meets an fp32 tensor as fp32).
            let (factor, low, high, l0) = (*factor as f32, *low, *high, *l0);
            let low_wl = (l0 / low) as f32;
            let high_wl = (l0 / high) as f32;
            let two_pi = (2.0 * std::f64::consts::PI) as f32;
            Some(
                base.iter()
                    .map(|&inv| {
                        // `2 * math.pi / inv_freq` is torch's __rtruediv__: reciprocal, then multiply.
                        let wl = (1.0 / inv) * two_pi;
                        let scaled = if wl > low_wl { inv / factor } else { inv };
                        let smooth = ((1.0 / wl) * l0 as f32 - low as f32) / (high as f32 - low as f32);
                        let smoothed = (1.0 - smooth) * scaled / factor + smooth * scaled;
                        // torch: ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen);
                        // the tables hold no NaN, so this is the closed band.
                        let medium = wl >= high_wl && wl <= low_wl;
                        if medium {
                            smoothed
                        } else {
                            scaled
                        }
                    })
                    .collect(),
            )
        }
        RopeScaling::Yarn { factor, original_max_position_embeddings: orig, beta_fast, beta_slow, truncate, .. } => {
            let dim = d as f64;
            let corr = |rot: f64| (dim * (orig / (rot * 2.0 * std::f64::consts::PI)).ln()) / (2.0 * theta.ln());
            let (mut lo, mut hi) = (corr(*beta_fast), corr(*beta_slow));
            if *truncate {
                lo = lo.floor();
                hi = hi.ceil();
            }
            let (lo, mut hi) = (lo.max(0.0), hi.min(dim - 1.0));
            if lo == hi {
                hi += 0.001;
            }
            let (lo32, hi32) = (lo as f32, hi as f32);
            let factor32 = *factor as f32;
            // pos_freqs = base ** (arange(0, d, 2).float() / d); extrapolation 1 / pos_freqs,
            // interpolation 1 / (factor * pos_freqs); ramp over the d/2 frequencies.
            Some(
                (0..d / 2)
                    .map(|i| {
                        let e = (2 * i) as f32 / d as f32;
                        let pos = theta.powf(f64::from(e)) as f32;
                        let extra = 1.0f32 / pos;
                        let inter = 1.0f32 / (factor32 * pos);
                        let ramp = ((i as f32 - lo32) / (hi32 - lo32)).clamp(0.0, 1.0);
                        let extra_factor = 1.0 - ramp;
                        inter * (1.0 - extra_factor) + extra * extra_factor
                    })
                    .collect(),
            )
        }
    }
}

/// The factor cos and sin are multiplied by (YaRN's attention factor; 1 otherwise).
pub fn cos_scale(s: &RopeScaling) -> f32 {
    let RopeScaling::Yarn { factor, attention_factor, mscale, mscale_all_dim, .. } = s else {
        return 1.0;
    };
    let get_mscale = |scale: f64, m: f64| if scale <= 1.0 { 1.0 } else { 0.1 * m * scale.ln() + 1.0 };
    let f = match (attention_factor, mscale, mscale_all_dim) {
        (Some(a), _, _) => *a,
        (None, Some(m), Some(ma)) if *m != 0.0 && *ma != 0.0 => get_mscale(*factor, *m) / get_mscale(*factor, *ma),
        _ => get_mscale(*factor, 1.0),
    };
    f as f32
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_the_kinds_and_refuses_the_rest_by_name() {
        assert_eq!(RopeScaling::from_json(&json!(null), None).unwrap(), RopeScaling::None);
        assert_eq!(RopeScaling::from_json(&json!({"type": "linear", "factor": 8}), None).unwrap(), RopeScaling::Linear { factor: 8.0 });
        let e = RopeScaling::from_json(&json!({"rope_type": "dynamic", "factor": 2}), None).unwrap_err();
        assert!(e.contains("`dynamic`") && e.contains("step"), "{e}");
        let e = RopeScaling::from_json(&json!({"rope_type": "longrope"}), None).unwrap_err();
        assert!(e.contains("`longrope`") && e.contains(ROPE_TYPES), "{e}");
        let e = RopeScaling::from_json(&json!({"rope_type": "llama3", "factor": 8}), None).unwrap_err();
        assert!(e.contains("low_freq_factor"), "{e}");
    }

    /// Llama 3.1's table: high frequencies kept, low ones divided by the factor, a smooth band
    /// between (values from transformers' formula evaluated independently in f64).
    #[test]
    fn llama3_table_has_its_three_bands() {
        let s = RopeScaling::Llama3 { factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position_embeddings: 8192.0 };
        let t = inv_freq(500000.0, 128, &s).unwrap();
        let base = default_inv(500000.0, 128);
        assert_eq!(t[0], base[0], "the highest frequency is kept");
        assert_eq!(t[63], base[63] / 8.0, "the lowest is divided by the factor");
        let mut bands = [0; 3];
        for i in 0..64 {
            let wl = 2.0 * std::f64::consts::PI / f64::from(base[i]);
            let want = if wl < 8192.0 / 4.0 {
                f64::from(base[i])
            } else if wl > 8192.0 {
                f64::from(base[i]) / 8.0
            } else {
                let sm = (8192.0 / wl - 1.0) / 3.0;
                (1.0 - sm) * f64::from(base[i]) / 8.0 + sm * f64::from(base[i])
            };
            bands[if wl < 2048.0 { 0 } else if wl > 8192.0 { 2 } else { 1 }] += 1;
            assert!((f64::from(t[i]) - want).abs() <= want * 1e-6, "{i}: {} vs {want}", t[i]);
        }
        assert!(bands.iter().all(|&n| n > 0), "{bands:?}");
    }

    #[test]
    fn linear_divisors_and_yarn() {
        let base = default_inv(1e6, 256);
        assert_eq!(inv_freq(1e6, 256, &RopeScaling::Linear { factor: 8.0 }).unwrap(), base.iter().map(|x| x / 8.0).collect::<Vec<_>>());
        assert!(inv_freq(1e6, 256, &RopeScaling::None).is_none());
        let div = RopeScaling::Divisors(vec![2.0; 128]);
        assert_eq!(inv_freq(1e6, 256, &div).unwrap()[5], base[5] / 2.0);
        let y = RopeScaling::from_json(&json!({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}), Some(131072)).unwrap();
        let t = inv_freq(1e6, 128, &y).unwrap();
        let b = default_inv(1e6, 128);
        assert_eq!(t[0], b[0], "extrapolated at high frequency");
        assert!((t[63] - b[63] / 4.0).abs() <= b[63] * 1e-6, "interpolated at low frequency");
        assert!((cos_scale(&y) - (0.1 * 4f64.ln() + 1.0) as f32).abs() < 1e-7);
        assert_eq!(cos_scale(&RopeScaling::Linear { factor: 8.0 }), 1.0);
    }
}
