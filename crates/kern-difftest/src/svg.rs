//! A small SVG line plot, written by hand (no plotting dependency): precision mode's "how the
//! error grows through the layers" (layer on x, relative error on a log y axis, one line per
//! step kind). Standalone SVG 1.1 that browsers and image viewers open.

use std::fmt::Write as _;

/// One line of the plot.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub name: String,
    /// (x, y) points, in x order; points with a non-finite or (on a log axis) non-positive y
    /// break the line there.
    pub points: Vec<(f64, f64)>,
    pub dashed: bool,
}

/// What to draw.
#[derive(Clone, Debug, PartialEq)]
pub struct Plot {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    /// Tick positions and their labels on x (e.g. "emb", 0, 1, …, "head").
    pub x_ticks: Vec<(f64, String)>,
    pub log_y: bool,
    pub series: Vec<Series>,
}

const W: f64 = 900.0;
const H: f64 = 520.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 190.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 70.0;
const COLORS: [&str; 8] = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

impl Plot {
    fn usable(&self, y: f64) -> bool {
        y.is_finite() && (!self.log_y || y > 0.0)
    }

    /// The SVG document.
    pub fn to_svg(&self) -> String {
        let pts: Vec<(f64, f64)> = self.series.iter().flat_map(|s| s.points.iter().copied()).filter(|&(x, y)| x.is_finite() && self.usable(y)).collect();
        let (mut x0, mut x1) = pts.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| (a.min(p.0), b.max(p.0)));
        for (x, _) in &self.x_ticks {
            x0 = x0.min(*x);
            x1 = x1.max(*x);
        }
        if !x0.is_finite() {
            (x0, x1) = (0.0, 1.0);
        }
        if x1 <= x0 {
            x1 = x0 + 1.0;
        }
        let ty = |y: f64| if self.log_y { y.log10() } else { y };
        let (mut y0, mut y1) = pts.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| (a.min(ty(p.1)), b.max(ty(p.1))));
        if !y0.is_finite() {
            (y0, y1) = (0.0, 1.0);
        }
        if self.log_y {
            (y0, y1) = (y0.floor(), y1.ceil().max(y0.floor() + 1.0));
        } else if y1 <= y0 {
            y1 = y0 + 1.0;
        }
        let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
        let sx = |x: f64| LEFT + (x - x0) / (x1 - x0) * pw;
        let sy = |y: f64| TOP + ph - (ty(y) - y0) / (y1 - y0) * ph;
        let mut o = String::new();
        let _ = writeln!(o, r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#);
        let _ = writeln!(o, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
        let _ = writeln!(o, r#"<text x="{}" y="28" text-anchor="middle" font-size="15">{}</text>"#, LEFT + pw / 2.0, esc(&self.title));
        // Grid and y ticks: decades on a log axis, 5 steps otherwise.
        let yticks: Vec<f64> = if self.log_y { (y0 as i64..=y1 as i64).map(|e| 10f64.powi(e as i32)).collect() } else { (0..=5).map(|i| y0 + (y1 - y0) * i as f64 / 5.0).collect() };
        for y in yticks {
            let py = sy(y);
            let _ = writeln!(o, r##"<line x1="{LEFT}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}" stroke="#ddd"/>"##, LEFT + pw);
            let label = if self.log_y { format!("1e{}", y.log10().round() as i64) } else { format!("{y:.3}") };
            let _ = writeln!(o, r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{label}</text>"#, LEFT - 6.0, py + 4.0);
        }
        // Thin out x tick labels so they never overlap (about 40 px each).
        let every = ((self.x_ticks.len() as f64 * 40.0 / pw).ceil() as usize).max(1);
        for (i, (x, label)) in self.x_ticks.iter().enumerate() {
            let px = sx(*x);
            let _ = writeln!(o, r##"<line x1="{px:.1}" y1="{:.1}" x2="{px:.1}" y2="{:.1}" stroke="#888"/>"##, TOP + ph, TOP + ph + 4.0);
            if i % every == 0 || i + 1 == self.x_ticks.len() {
                let _ = writeln!(o, r#"<text x="{px:.1}" y="{:.1}" text-anchor="middle">{}</text>"#, TOP + ph + 18.0, esc(label));
            }
        }
        let _ = writeln!(o, r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>"##);
        let _ = writeln!(o, r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#, LEFT + pw / 2.0, H - 22.0, esc(&self.x_label));
        let _ = writeln!(o, r#"<text x="22" y="{}" text-anchor="middle" transform="rotate(-90 22 {})">{}</text>"#, TOP + ph / 2.0, TOP + ph / 2.0, esc(&self.y_label));
        for (k, s) in self.series.iter().enumerate() {
            let color = COLORS[k % COLORS.len()];
            let dash = if s.dashed { r#" stroke-dasharray="6 4""# } else { "" };
            // One polyline per unbroken run of usable points.
            let mut runs: Vec<Vec<(f64, f64)>> = vec![vec![]];
            for &(x, y) in &s.points {
                if x.is_finite() && self.usable(y) {
                    runs.last_mut().unwrap().push((sx(x), sy(y)));
                } else if !runs.last().unwrap().is_empty() {
                    runs.push(vec![]);
                }
            }
            for run in runs.iter().filter(|r| !r.is_empty()) {
                let path: Vec<String> = run.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
                let _ = writeln!(o, r#"<polyline fill="none" stroke="{color}" stroke-width="2"{dash} points="{}"/>"#, path.join(" "));
                for (x, y) in run {
                    let _ = writeln!(o, r#"<circle cx="{x:.1}" cy="{y:.1}" r="2.5" fill="{color}"/>"#);
                }
            }
            let ly = TOP + 10.0 + 20.0 * k as f64;
            let lx = LEFT + pw + 14.0;
            let _ = writeln!(o, r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="2"{dash}/>"#, lx + 26.0);
            let _ = writeln!(o, r#"<text x="{}" y="{}">{}</text>"#, lx + 32.0, ly + 4.0, esc(&s.name));
        }
        o.push_str("</svg>\n");
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plot(log_y: bool) -> Plot {
        Plot {
            title: "error <through> the layers".into(),
            x_label: "layer".into(),
            y_label: "relative RMS error".into(),
            x_ticks: (0..4).map(|i| (i as f64, i.to_string())).collect(),
            log_y,
            series: vec![
                Series { name: "prefill".into(), points: vec![(0.0, 1e-3), (1.0, 2e-3), (2.0, f64::NAN), (3.0, 8e-3)], dashed: false },
                Series { name: "decode & co".into(), points: vec![(0.0, 1e-4), (1.0, 0.0), (2.0, 1e-3), (3.0, 1e-2)], dashed: true },
            ],
        }
    }

    #[test]
    fn an_svg_with_axes_lines_and_legend() {
        let s = plot(true).to_svg();
        assert!(s.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\"") && s.ends_with("</svg>\n"));
        assert!(s.contains("error &lt;through&gt; the layers") && s.contains("decode &amp; co"), "text is escaped");
        // Log axis from 1e-4 to 1e-2: three decades' labels.
        for d in ["1e-4", "1e-3", "1e-2"] {
            assert!(s.contains(&format!(">{d}</text>")), "{d}");
        }
        // The NaN and the zero (on a log axis) break their lines: 2 + 2 polylines.
        assert_eq!(s.matches("<polyline").count(), 4, "{s}");
        assert_eq!(s.matches("stroke-dasharray").count(), 3, "the dashed series: 2 runs + its legend line");
        assert_eq!(s.matches("<circle").count(), 6);
        // Every number in a points list is finite.
        assert!(!s.contains("NaN") && !s.contains("inf"));
        // Larger errors are drawn higher (smaller y): the circles in order are prefill 1e-3,
        // 2e-3, 8e-3, then decode 1e-4, 1e-3, 1e-2.
        let cys: Vec<f64> = s.match_indices("cy=\"").map(|(i, _)| s[i + 4..].split('"').next().unwrap().parse().unwrap()).collect();
        assert_eq!(cys.len(), 6);
        assert!(cys[0] > cys[1] && cys[1] > cys[2] && cys[3] > cys[0] && (cys[0] - cys[4]).abs() < 1e-9 && cys[5] < cys[2], "{cys:?}");
    }

    #[test]
    fn a_linear_axis_and_an_empty_plot() {
        let s = plot(false).to_svg();
        assert_eq!(s.matches("<polyline").count(), 3, "only the NaN breaks a line on a linear axis");
        let empty = Plot { series: vec![], x_ticks: vec![], ..plot(true) }.to_svg();
        assert!(empty.contains("</svg>") && !empty.contains("<polyline"));
    }
}
