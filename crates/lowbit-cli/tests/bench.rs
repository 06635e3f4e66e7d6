//! `lowbit bench --device cpu`: every CPU op emits its records, baseline first, in the bench-format fields.

use std::process::Command;

#[test]
fn cpu_bench_emits_records_for_every_op() {
    for (op, impls) in [
        ("linear", &["dense_f32", "lowbit"][..]),
        ("dequant", &["memcpy", "lowbit", "lowbit_kn"][..]),
        ("w8a8", &["dense_f32", "lowbit", "lowbit_smoothquant"][..]),
        ("conv", &["dense_f32", "lowbit"][..]),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_lowbit"))
            .args(["bench", "--device", "cpu", "--op", op, "--shape", "3x256x128", "--json"])
            .args(["--conv", "2x17x9x9,k3s2p1,co24"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{op}: {}", String::from_utf8_lossy(&out.stderr));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let records: Vec<serde_json::Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        let got: Vec<&str> = records.iter().map(|r| r["impl"].as_str().unwrap()).collect();
        assert_eq!(got, impls, "{op}");
        for r in &records {
            assert_eq!(r["op"], op);
            if op == "conv" {
                assert_eq!(r["conv"], "2x17x9x9,k3s2p1");
                assert_eq!(
                    (r["M"].as_u64(), r["K"].as_u64(), r["N"].as_u64()),
                    (Some(2 * 5 * 5), Some(17 * 9), Some(24))
                );
            }
            assert!(r["us"].as_f64().unwrap() > 0.0);
            for field in ["device", "dtype", "M", "K", "N", "bytes", "source_commit"] {
                assert!(!r[field].is_null(), "{op}: {field} missing in {r}");
            }
        }
    }
}

#[test]
fn unknown_op_is_a_one_line_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_lowbit"))
        .args(["bench", "--device", "cpu", "--op", "pool"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--op") && err.contains("pool") && err.trim().lines().count() == 1,
        "{err}"
    );
}
