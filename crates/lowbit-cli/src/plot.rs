//! `lowbit plot`: bench records (JSON lines) to an SVG of speed-ups, one panel per op, dtype and shape.
//!
//! Each panel plots, for every non-baseline implementation, `baseline µs / µs` against the batch size M (against
//! the shape `K×N` for ops timed without a batch, like dequant; against the case for convolutions), where the
//! baseline is the record of a baseline implementation (`bench::BASELINES`) at the same op, dtype, shape and M from
//! the same file (the faster of `cublas_fp16` and `cublaslt_fp16` where both were timed). `_graph` and `_sustained`
//! implementations are compared with the baseline timed the same way (a graph replay with the baseline timed in turn
//! where the file has no graph record of it). A dashed line marks 1× (as fast as the baseline). No plotting
//! dependency: the SVG is a few dozen elements written by hand.

use crate::bench::{baseline_family, baseline_stem, timing_mode, BenchRecord};
use lowbit::{Error, Result};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct PlotArgs {
    /// Bench records: JSON-lines files written by `lowbit bench --json`.
    #[arg(required = true)]
    pub input: Vec<PathBuf>,
    #[command(flatten)]
    pub out: crate::OutputArgs,
}

const PANEL_W: f64 = 460.0;
const PANEL_H: f64 = 300.0;
const MARGIN: (f64, f64, f64, f64) = (56.0, 20.0, 40.0, 48.0); // left, right, top, bottom
const COLUMNS: usize = 2;
const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf",
];

/// One panel: the x categories in order and, per implementation, the speed-up at each category it was measured.
struct Panel {
    title: String,
    x_label: &'static str,
    categories: Vec<String>,
    series: BTreeMap<String, Vec<(usize, f64)>>,
}

pub fn run(args: PlotArgs) -> Result<()> {
    let mut records = Vec::new();
    for path in &args.input {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        for (line_no, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            let record: BenchRecord = serde_json::from_str(line)
                .map_err(|e| Error::parse(path, format!("line {}: not a bench record: {e}", line_no + 1)))?;
            records.push(record);
        }
    }
    let panels = panels(&records);
    if panels.is_empty() {
        return Err(Error::invalid(
            "input",
            format!("{} records", records.len()),
            "needs at least one implementation measured beside a baseline (same op, dtype, shape and M)",
        ));
    }
    let svg = render(&panels);
    lowbit::checkpoint::write_file_atomic(&args.out.output, svg.as_bytes(), args.out.force)?;
    eprintln!("wrote {} ({} panels)", args.out.output.display(), panels.len());
    Ok(())
}

/// A panel's x categories by sort key (M, K, N), and its points as (implementation, category, speed-up).
type PanelPoints = (BTreeMap<(usize, usize, usize), String>, Vec<(String, String, f64)>);

fn panels(records: &[BenchRecord]) -> Vec<Panel> {
    // A record's panel, x category (with its sort key) and the baseline it is compared with. Batched ops get one
    // panel per shape with M along x; unbatched ones (M = 0) one panel per op and dtype with the shapes along x;
    // convolutions one panel per op, dtype and weight format with the cases along x. W8A8 puts its schemes
    // (per-block, SmoothQuant: the impl names say which) in one panel. The baseline key leaves out the weight
    // format: cuDNN's and cuBLAS's records have none.
    let key = |r: &BenchRecord| {
        let bits = r.wbits.map(|b| format!(" w{b}")).unwrap_or_default();
        let group = match r.group {
            _ if r.op == "w8a8" => String::new(),
            Some(-1) => " per-channel".to_string(),
            Some(g) => format!(" g{g}"),
            None => String::new(),
        };
        let op = format!("{} {}", r.op, r.dtype);
        if let Some(case) = &r.conv {
            let title = format!("{op}{bits}{group}");
            (title, (r.m, r.k, r.n), case.clone(), format!("{op} {case}"))
        } else if r.m == 0 {
            let x = format!("{}×{}", r.k, r.n);
            (
                format!("{op}{bits}{group}"),
                (0, r.k, r.n),
                x.clone(),
                format!("{op} {x}"),
            )
        } else {
            let shape = format!("K={} N={}", r.k, r.n);
            let title = format!("{op}{bits}{group}, {shape}");
            (title, (r.m, 0, 0), r.m.to_string(), format!("{op} {shape} M={}", r.m))
        }
    };
    // Baselines by key and by how they were timed (`timing_mode`): a `_graph` or `_sustained` implementation is
    // compared with the baseline timed the same way, a graph replay with the baseline in turn where the file has no
    // graph record of it. Within a key, the first baseline or the fastest of its family (cuBLAS and cuBLASLt).
    let mut baselines: BTreeMap<(String, &str), (&str, f64)> = BTreeMap::new();
    for r in records.iter().filter(|r| r.us > 0.0) {
        if let Some(stem) = baseline_stem(&r.implementation) {
            let family = baseline_family(stem);
            let entry = baselines
                .entry((key(r).3, timing_mode(&r.implementation)))
                .or_insert((family, r.us));
            if entry.0 == family {
                entry.1 = entry.1.min(r.us);
            }
        }
    }
    let mut panels: BTreeMap<String, PanelPoints> = BTreeMap::new();
    for r in records
        .iter()
        .filter(|r| baseline_stem(&r.implementation).is_none() && r.us > 0.0)
    {
        let (title, order, x, base_key) = key(r);
        let mode = timing_mode(&r.implementation);
        let base = baselines
            .get(&(base_key.clone(), mode))
            .or_else(|| (mode == "_graph").then(|| baselines.get(&(base_key, ""))).flatten());
        if let Some(&(_, base)) = base {
            let panel = panels.entry(title).or_default();
            panel.0.insert(order, x.clone());
            panel.1.push((r.implementation.clone(), x, base / r.us));
        }
    }
    panels
        .into_iter()
        .map(|(title, (cats, points))| {
            let categories: Vec<String> = cats.into_values().collect();
            let mut series: BTreeMap<String, Vec<(usize, f64)>> = BTreeMap::new();
            for (imp, x, speedup) in points {
                let i = categories
                    .iter()
                    .position(|c| *c == x)
                    .expect("category collected above");
                series.entry(imp).or_default().push((i, speedup));
            }
            series.values_mut().for_each(|s| s.sort_by_key(|p| p.0));
            let x_label = if title.contains("K=") || title.contains(",k") {
                "M"
            } else {
                "K×N"
            };
            Panel {
                title,
                x_label,
                categories,
                series,
            }
        })
        .collect()
}

fn render(panels: &[Panel]) -> String {
    let rows = panels.len().div_ceil(COLUMNS);
    let (width, height) = (PANEL_W * COLUMNS.min(panels.len()) as f64, PANEL_H * rows as f64);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    for (i, panel) in panels.iter().enumerate() {
        let (ox, oy) = ((i % COLUMNS) as f64 * PANEL_W, (i / COLUMNS) as f64 * PANEL_H);
        render_panel(&mut s, panel, ox, oy);
    }
    s.push_str("</svg>\n");
    s
}

fn render_panel(s: &mut String, p: &Panel, ox: f64, oy: f64) {
    let (ml, mr, mt, mb) = MARGIN;
    let (x0, x1, y0, y1) = (ox + ml, ox + PANEL_W - mr, oy + PANEL_H - mb, oy + mt);
    let y_max = p.series.values().flatten().map(|&(_, v)| v).fold(1.0f64, f64::max) * 1.15;
    let n = p.categories.len().max(1);
    let x_at = |i: usize| x0 + (x1 - x0) * (i as f64 + 0.5) / n as f64;
    let y_at = |v: f64| y0 - (y0 - y1) * v / y_max;
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle" font-weight="bold">{}</text>"#,
        (x0 + x1) / 2.0,
        oy + 18.0,
        escape(&p.title)
    );
    let _ = writeln!(
        s,
        r##"<rect x="{x0}" y="{y1}" width="{}" height="{}" fill="none" stroke="#999"/>"##,
        x1 - x0,
        y0 - y1
    );
    // y grid: about five steps of 1, 2 or 5 × 10^k.
    let raw = y_max / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|&st| st >= raw)
        .unwrap_or(raw);
    let mut v = 0.0;
    while v <= y_max {
        let y = y_at(v);
        let _ = writeln!(
            s,
            r##"<line x1="{x0}" y1="{y}" x2="{x1}" y2="{y}" stroke="#eee"/><text x="{}" y="{}" text-anchor="end">{v:.*}</text>"##,
            x0 - 4.0,
            y + 4.0,
            // Enough decimals to tell the ticks apart, no more.
            if step < 1.0 { 1 } else { 0 }
        );
        v += step;
    }
    let one = y_at(1.0);
    let _ = writeln!(
        s,
        r##"<line x1="{x0}" y1="{one}" x2="{x1}" y2="{one}" stroke="#555" stroke-dasharray="4 3"/>"##
    );
    for (i, c) in p.categories.iter().enumerate() {
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            x_at(i),
            y0 + 14.0,
            escape(c)
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        (x0 + x1) / 2.0,
        y0 + 30.0,
        p.x_label
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle" transform="rotate(-90 {} {})">speed-up over baseline (×)</text>"#,
        ox + 14.0,
        (y0 + y1) / 2.0,
        ox + 14.0,
        (y0 + y1) / 2.0
    );
    for (j, (imp, points)) in p.series.iter().enumerate() {
        let color = COLORS[j % COLORS.len()];
        let path: Vec<String> = points
            .iter()
            .map(|&(i, v)| format!("{:.1},{:.1}", x_at(i), y_at(v)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="1.5"/>"#,
            path.join(" ")
        );
        for &(i, v) in points {
            let _ = writeln!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="2.5" fill="{color}"><title>{} {:.2}×</title></circle>"#,
                x_at(i),
                y_at(v),
                escape(imp),
                v
            );
        }
    }
    // The legend last, over the lines, on a translucent box.
    let longest = p.series.keys().map(|k| k.chars().count()).max().unwrap_or(0) as f64;
    let _ = writeln!(
        s,
        r#"<rect x="{}" y="{}" width="{}" height="{}" fill="white" fill-opacity="0.8"/>"#,
        x0 + 2.0,
        y1 + 2.0,
        longest * 6.5 + 8.0,
        13.0 * p.series.len() as f64 + 4.0
    );
    for (j, imp) in p.series.keys().enumerate() {
        let ly = y1 + 12.0 + 13.0 * j as f64;
        let color = COLORS[j % COLORS.len()];
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{ly}" fill="{color}">{}</text>"#,
            x0 + 6.0,
            escape(imp)
        );
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}
