//! `lowbit plot`: records in, one SVG out; bad records are a one-line error and leave no file.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lowbit-plot-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn record(implementation: &str, m: usize, us: f64) -> String {
    format!(
        r#"{{"op":"linear","impl":"{implementation}","device":"cpu","dtype":"f32","wbits":4,"group":128,"M":{m},"K":4096,"N":4096,"bytes":0,"us":{us},"source_commit":"test"}}"#
    )
}

/// Runs `lowbit plot INPUT -o SVG`.
fn plot(input: &Path, svg: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lowbit"))
        .arg("plot")
        .arg(input)
        .arg("-o")
        .arg(svg)
        .output()
        .unwrap()
}

#[test]
fn plots_speedup_against_the_baseline_of_the_same_shape() {
    let dir = temp_dir("ok");
    let input = dir.join("bench.jsonl");
    let lines = [
        record("dense_f32", 1, 100.0),
        record("lowbit", 1, 25.0),
        record("dense_f32", 64, 100.0),
        record("lowbit", 64, 50.0),
    ];
    std::fs::write(&input, lines.join("\n")).unwrap();
    let svg = dir.join("bench.svg");
    let out = plot(&input, &svg);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg") && text.trim_end().ends_with("</svg>"));
    assert!(text.contains("linear f32 w4 g128, K=4096 N=4096"));
    assert!(
        text.contains("lowbit 4.00×") && text.contains("lowbit 2.00×"),
        "speed-ups 100/25 and 100/50"
    );
    // Existing output without --force: refused.
    let again = plot(&input, &svg);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("output exists"));
}

#[test]
fn a_corrupt_record_is_an_error_naming_the_line() {
    let dir = temp_dir("bad");
    let input = dir.join("bench.jsonl");
    std::fs::write(&input, format!("{}\n{{not json\n", record("lowbit", 1, 1.0))).unwrap();
    let svg = dir.join("bench.svg");
    let out = plot(&input, &svg);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 2") && err.lines().count() == 1, "{err}");
    assert!(!svg.exists());
}
