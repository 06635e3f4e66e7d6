//! The `lowbit` binary end to end, against the golden fixture made by AutoAWQ and compressed-tensors themselves.
//!
//! Every comparison here is bit for bit (no tolerances): RTN with `--compat autoawq`, packing, dequantization and
//! format conversion are all exact operations. Failure tests check the CLI contract: a non-zero exit, exactly one
//! stderr line `lowbit: error: ...` naming the problem, and nothing left behind in the output directory.

use lowbit::checkpoint::{write_safetensors, Checkpoint, OutTensor, StDtype, TensorData};
use lowbit::testing::TempDir;
use serde_json::{json, Value};
use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/fixtures/golden_public.safetensors"
);

/// The fixture's AWQ cases: (name, group size).
const AWQ_CASES: [(&str, usize); 5] = [
    ("awq_rand_k256_n128_g128", 128),
    ("awq_rand_k512_n192_g64", 64),
    ("awq_rand_k128_n64_g32", 32),
    ("awq_minilm_l0_query_g128", 128),
    ("awq_minilm_l2_ffn_up_g128", 128),
];
const AWQ_SUFFIXES: [&str; 3] = ["qweight", "qzeros", "scales"];

fn lowbit(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lowbit"))
        .args(args.iter().map(|a| a.as_ref()))
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[track_caller]
fn assert_ok(o: &Output) {
    assert!(
        o.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status,
        stdout(o),
        stderr(o)
    );
}

/// Non-zero exit, exactly one stderr line `lowbit: error: ...` containing every `needle`.
#[track_caller]
fn assert_fails(o: &Output, needles: &[&str]) {
    let err = stderr(o);
    assert!(
        !o.status.success(),
        "expected failure, got success\nstdout: {}\nstderr: {err}",
        stdout(o)
    );
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "want one stderr line, got: {err}");
    assert!(lines[0].starts_with("lowbit: error: "), "{err}");
    for needle in needles {
        assert!(lines[0].contains(needle), "{needle:?} not in: {err}");
    }
}

/// Copies tensors `names` of the fixture into a new safetensors file, renamed by `rename`.
fn extract(dir: &TempDir, file: &str, names: &[String], rename: impl Fn(&str) -> String) -> PathBuf {
    let fixture = Checkpoint::open(FIXTURE).unwrap();
    let tensors: Vec<(String, OutTensor<'_>)> = names
        .iter()
        .map(|n| (rename(n), fixture.raw(n).unwrap().into()))
        .collect();
    let path = dir.path(file);
    write_safetensors(&path, &tensors, None, false).unwrap();
    path
}

fn names(case: &str, suffixes: &[&str]) -> Vec<String> {
    suffixes.iter().map(|s| format!("{case}.{s}")).collect()
}

/// `[rows, cols]` fp16 bytes transposed to `[cols, rows]`.
fn transpose_f16(data: &[u8], rows: usize, cols: usize) -> Vec<u8> {
    let mut out = vec![0u8; data.len()];
    for r in 0..rows {
        for c in 0..cols {
            let (src, dst) = (2 * (r * cols + c), 2 * (c * rows + r));
            out[dst..dst + 2].copy_from_slice(&data[src..src + 2]);
        }
    }
    out
}

#[track_caller]
fn assert_same_tensor(got: &Checkpoint, got_name: &str, want: &Checkpoint, want_name: &str) {
    let (g, w) = (got.raw(got_name).unwrap(), want.raw(want_name).unwrap());
    assert_eq!((g.dtype, g.shape), (w.dtype, w.shape), "{got_name} vs {want_name}");
    assert!(g.data == w.data, "{got_name} differs from {want_name}");
}

#[test]
fn quantize_compat_autoawq_reproduces_autoawq_bit_for_bit() {
    let dir = TempDir::new("quantize");
    let fixture = Checkpoint::open(FIXTURE).unwrap();
    for (case, group) in AWQ_CASES {
        let input = extract(
            &dir,
            &format!("{case}.in.safetensors"),
            &names(case, &["weight"]),
            str::to_string,
        );
        let output = dir.path(format!("{case}.awq.safetensors"));
        let g = group.to_string();
        let o = lowbit(&[
            &"quantize",
            &input,
            &"-o",
            &output,
            &"--group-size",
            &g,
            &"--compat",
            &"autoawq",
        ]);
        assert_ok(&o);
        assert!(stdout(&o).contains("1 layers quantized"), "{}", stdout(&o));
        let out = Checkpoint::open(&output).unwrap();
        assert_eq!(out.len(), 3, "{case}: only the three AWQ tensors");
        for suffix in AWQ_SUFFIXES {
            let name = format!("{case}.{suffix}");
            assert_same_tensor(&out, &name, &fixture, &name);
        }
        let qc = out.quant_config().expect("the file records its quantization_config");
        assert_eq!((qc.bits, qc.group_size, qc.zero_point), (4, Some(group), true));
    }
}

#[test]
fn dequantize_reproduces_autoawq_dequantization_bit_for_bit() {
    let dir = TempDir::new("dequantize");
    let fixture = Checkpoint::open(FIXTURE).unwrap();
    for (case, _) in AWQ_CASES {
        let mut tensors = names(case, &AWQ_SUFFIXES);
        tensors.push(format!("{case}.x")); // an unrelated tensor, copied through
        let input = extract(&dir, &format!("{case}.awq.safetensors"), &tensors, str::to_string);
        let output = dir.path(format!("{case}.dense.safetensors"));
        assert_ok(&lowbit(&[&"dequantize", &input, &"-o", &output]));
        let out = Checkpoint::open(&output).unwrap();
        assert_eq!(
            out.names().collect::<Vec<_>>(),
            [format!("{case}.weight"), format!("{case}.x")]
        );
        assert_same_tensor(&out, &format!("{case}.x"), &fixture, &format!("{case}.x"));
        let want = fixture.raw(&format!("{case}.dequantized")).unwrap(); // [K, N]
        let got = out.raw(&format!("{case}.weight")).unwrap(); // [N, K]
        let (k, n) = (want.shape[0], want.shape[1]);
        assert_eq!((got.dtype, got.shape), (StDtype::F16, &[n, k][..]));
        assert!(
            got.data == transpose_f16(want.data, k, n),
            "{case}: dequantized weight differs"
        );
    }
}

/// Runs `convert --to <to>` on `input`, returning the output path.
fn convert(dir: &TempDir, input: &Path, to: &str, extra: &[&str]) -> PathBuf {
    let output = dir.path(format!(
        "{}.{to}{}.safetensors",
        input.file_stem().unwrap().to_string_lossy(),
        extra.join("")
    ));
    let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"convert", &input, &"-o", &output, &"--to", &to];
    args.extend(extra.iter().map(|e| e as &dyn AsRef<std::ffi::OsStr>));
    assert_ok(&lowbit(&args));
    output
}

#[test]
fn convert_round_trips_awq_gptq_compressed_tensors_awq_bit_for_bit() {
    let dir = TempDir::new("convert");
    let fixture = Checkpoint::open(FIXTURE).unwrap();
    for (case, group) in AWQ_CASES {
        let awq = extract(
            &dir,
            &format!("{case}.safetensors"),
            &names(case, &AWQ_SUFFIXES),
            str::to_string,
        );
        for gptq_format in [[].as_slice(), &["--gptq-format", "v2"]] {
            let gptq = convert(&dir, &awq, "gptq", gptq_format);
            let g = Checkpoint::open(&gptq).unwrap();
            let qc = g.quant_config().unwrap();
            assert_eq!(
                (qc.bits, qc.group_size, qc.zero_point),
                (4, Some(group), true),
                "{case}"
            );
            let version = if gptq_format.is_empty() { "gptq" } else { "gptq_v2" };
            assert_eq!(qc.checkpoint_format.as_deref(), Some(version));
            let ct = convert(&dir, &gptq, "compressed-tensors", &[]);
            let c = Checkpoint::open(&ct).unwrap();
            assert!(
                c.contains(&format!("{case}.weight_zero_point")),
                "{case}: asymmetric keeps zero points"
            );
            let back = Checkpoint::open(convert(&dir, &ct, "awq", &[])).unwrap();
            for suffix in AWQ_SUFFIXES {
                assert_same_tensor(
                    &back,
                    &format!("{case}.{suffix}"),
                    &fixture,
                    &format!("{case}.{suffix}"),
                );
            }
        }
    }
}

#[test]
fn convert_round_trips_compressed_tensors_fixture_cases() {
    let dir = TempDir::new("convert-ct");
    let fixture = Checkpoint::open(FIXTURE).unwrap();
    for (case, suffixes) in [
        (
            "ct_asym_n128_k256_g64",
            &["weight_packed", "weight_scale", "weight_zero_point"][..],
        ),
        ("ct_sym_n64_k256_g128", &["weight_packed", "weight_scale"][..]),
    ] {
        let ct = extract(
            &dir,
            &format!("{case}.safetensors"),
            &names(case, suffixes),
            str::to_string,
        );
        // Symmetric: GPTQ sym (zeros 8, stored 7 in v1) and back without zero points; asymmetric via AWQ.
        let via = if suffixes.len() == 2 { "gptq" } else { "awq" };
        let back = Checkpoint::open(convert(&dir, &convert(&dir, &ct, via, &[]), "compressed-tensors", &[])).unwrap();
        let mut got: Vec<_> = back.names().map(str::to_string).collect();
        got.retain(|n| !n.ends_with("weight_shape"));
        assert_eq!(got, names(case, suffixes), "{case}");
        for name in names(case, suffixes) {
            assert_same_tensor(&back, &name, &fixture, &name);
        }
    }
}

#[test]
fn inspect_reports_format_group_size_and_bytes() {
    let dir = TempDir::new("inspect");
    let case = "awq_rand_k512_n192_g64";
    let file = extract(&dir, "awq.safetensors", &names(case, &AWQ_SUFFIXES), str::to_string);
    let o = lowbit(&[&"inspect", &file]);
    assert_ok(&o);
    let text = stdout(&o);
    for needle in [
        "format: awq",
        "group size: 64",
        "bits: 4",
        "layers: 1",
        "[out 192, in 512]",
        "as fp16",
    ] {
        assert!(text.contains(needle), "{needle:?} not in:\n{text}");
    }
    let o = lowbit(&[&"inspect", &FIXTURE]);
    assert_ok(&o);
    let text = stdout(&o);
    for needle in [
        "awq (5 layers)",
        "compressed-tensors (2 layers)",
        "group size: 32, 64, 128",
    ] {
        assert!(text.contains(needle), "{needle:?} not in:\n{text}");
    }
}

/// An fp16 tensor of small non-zero deterministic values.
fn dense_f16(shape: Vec<usize>, seed: usize) -> OutTensor<'static> {
    let numel = shape.iter().product::<usize>();
    let values: Vec<f32> = (0..numel)
        .map(|i| ((i * 37 + seed) % 101) as f32 / 997.0 - 0.05)
        .collect();
    lowbit::Tensor::from_f32(shape, &values, lowbit::DType::F16).into()
}

/// A model directory: config.json, model.safetensors with three linear layers of group 128, a bias, an embedding
/// and a LayerNorm weight, and a tokenizer file.
fn model_dir(dir: &TempDir) -> PathBuf {
    let fixture = Checkpoint::open(FIXTURE).unwrap();
    let model = dir.path("model");
    std::fs::create_dir(&model).unwrap();
    let mut tensors: Vec<(String, OutTensor<'_>)> = ["awq_rand_k256_n128_g128", "awq_minilm_l0_query_g128"]
        .iter()
        .map(|case| {
            (
                format!("layers.{case}.weight"),
                fixture.raw(&format!("{case}.weight")).unwrap().into(),
            )
        })
        .collect();
    tensors.push(("layers.awq_rand_k256_n128_g128.bias".into(), dense_f16(vec![128], 3)));
    tensors.push(("embeddings.word_embeddings.weight".into(), dense_f16(vec![64, 384], 5)));
    tensors.push(("layers.norm.weight".into(), dense_f16(vec![384], 7)));
    write_safetensors(&model.join("model.safetensors"), &tensors, None, false).unwrap();
    let config = json!({"architectures": ["BertModel"], "hidden_size": 384, "torch_dtype": "float16"});
    std::fs::write(
        model.join("config.json"),
        serde_json::to_string_pretty(&config).unwrap(),
    )
    .unwrap();
    std::fs::write(model.join("tokenizer.json"), b"{\"version\": \"1.0\"}").unwrap();
    model
}

#[test]
fn model_directory_quantize_inspect_dequantize() {
    let dir = TempDir::new("modeldir");
    let model = model_dir(&dir);
    let before: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(&model)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            let bytes = std::fs::read(&p).unwrap();
            (p, bytes)
        })
        .collect();
    let quantized = dir.path("model-awq");
    let o = lowbit(&[&"quantize", &model, &"-o", &quantized, &"--compat", &"autoawq"]);
    assert_ok(&o);
    for (path, bytes) in &before {
        assert_eq!(
            &std::fs::read(path).unwrap(),
            bytes,
            "input {} modified",
            path.display()
        );
    }

    let config: Value = serde_json::from_slice(&std::fs::read(quantized.join("config.json")).unwrap()).unwrap();
    assert_eq!(
        config["quantization_config"],
        json!({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": true, "version": "gemm",
               "modules_to_not_convert": null}),
        "AutoAWQ's config, key for key"
    );
    assert_eq!(
        (config["hidden_size"].clone(), config["architectures"].clone()),
        (json!(384), json!(["BertModel"]))
    );
    assert_eq!(
        std::fs::read(quantized.join("tokenizer.json")).unwrap(),
        b"{\"version\": \"1.0\"}"
    );

    let out = Checkpoint::open(&quantized).unwrap();
    let fixture = Checkpoint::open(FIXTURE).unwrap();
    for case in ["awq_rand_k256_n128_g128", "awq_minilm_l0_query_g128"] {
        assert!(!out.contains(&format!("layers.{case}.weight")));
        for suffix in AWQ_SUFFIXES {
            assert_same_tensor(
                &out,
                &format!("layers.{case}.{suffix}"),
                &fixture,
                &format!("{case}.{suffix}"),
            );
        }
    }
    let input = Checkpoint::open(&model).unwrap();
    for copied in [
        "embeddings.word_embeddings.weight",
        "layers.norm.weight",
        "layers.awq_rand_k256_n128_g128.bias",
    ] {
        assert_same_tensor(&out, copied, &input, copied);
    }

    let o = lowbit(&[&"inspect", &quantized]);
    assert_ok(&o);
    let text = stdout(&o);
    for needle in [
        "model directory",
        "quant_method awq",
        "format: awq (2 layers)",
        "group size: 128",
    ] {
        assert!(text.contains(needle), "{needle:?} not in:\n{text}");
    }

    let dense = dir.path("model-dense");
    assert_ok(&lowbit(&[&"dequantize", &quantized, &"-o", &dense]));
    let config: Value = serde_json::from_slice(&std::fs::read(dense.join("config.json")).unwrap()).unwrap();
    assert!(config.get("quantization_config").is_none() && config["hidden_size"] == 384);
    let d = Checkpoint::open(&dense).unwrap();
    assert_eq!(d.len(), input.len());
    assert_eq!(
        d.shape("layers.awq_minilm_l0_query_g128.weight"),
        Some(&[384usize, 384][..])
    );
    assert_eq!(
        dir.entries(),
        ["model", "model-awq", "model-dense"],
        "no temporaries left"
    );
}

// ---- failures: non-zero exit, one line naming the problem, no output left behind -------------------------------

/// Runs `args`, expects the failure described by `needles`, and checks `dir` holds only `expected` afterwards.
#[track_caller]
fn fails_cleanly(dir: &TempDir, args: &[&dyn AsRef<std::ffi::OsStr>], needles: &[&str], expected: &[&str]) {
    let o = lowbit(args);
    assert_fails(&o, needles);
    assert_eq!(dir.entries(), expected, "left behind after: {}", stderr(&o));
}

#[test]
fn damaged_inputs_fail_cleanly() {
    let dir = TempDir::new("damaged");
    let case = "awq_rand_k128_n64_g32";
    let good = extract(&dir, "good.safetensors", &names(case, &AWQ_SUFFIXES), str::to_string);
    let bytes = std::fs::read(&good).unwrap();
    let out = dir.path("out.safetensors");

    std::fs::write(dir.path("truncated.safetensors"), &bytes[..bytes.len() - 100]).unwrap();
    let mut corrupt = bytes.clone();
    corrupt[8..12].copy_from_slice(b"[[[[");
    std::fs::write(dir.path("corrupt.safetensors"), &corrupt).unwrap();
    let mut beyond = bytes.clone();
    beyond[..8].copy_from_slice(&(1u64 << 32).to_le_bytes());
    std::fs::write(dir.path("beyond.safetensors"), &beyond).unwrap();
    let files = [
        "beyond.safetensors",
        "corrupt.safetensors",
        "good.safetensors",
        "truncated.safetensors",
    ];

    for (file, needle) in [
        ("truncated.safetensors", "truncated"),
        ("corrupt.safetensors", "corrupt"),
        ("beyond.safetensors", "beyond the end"),
    ] {
        let input = dir.path(file);
        for cmd in ["dequantize", "inspect"] {
            let args: Vec<&dyn AsRef<std::ffi::OsStr>> = if cmd == "inspect" {
                vec![&cmd, &input]
            } else {
                vec![&cmd, &input, &"-o", &out]
            };
            fails_cleanly(&dir, &args, &[file, needle], &files);
        }
        fails_cleanly(
            &dir,
            &[&"convert", &input, &"-o", &out, &"--to", &"gptq"],
            &[file, needle],
            &files,
        );
    }

    let missing = dir.path("nope.safetensors");
    fails_cleanly(
        &dir,
        &[&"dequantize", &missing, &"-o", &out],
        &["nope.safetensors", "No such file"],
        &files,
    );
    let empty_dir = dir.path("empty");
    std::fs::create_dir(&empty_dir).unwrap();
    let files_and_dir = [
        "beyond.safetensors",
        "corrupt.safetensors",
        "empty",
        "good.safetensors",
        "truncated.safetensors",
    ];
    fails_cleanly(
        &dir,
        &[&"quantize", &empty_dir, &"-o", &out],
        &["empty", "no model.safetensors"],
        &files_and_dir,
    );
}

#[test]
fn bad_layers_fail_cleanly_and_leave_no_partial_output() {
    let dir = TempDir::new("badlayers");
    let fixture = Checkpoint::open(FIXTURE).unwrap();
    let out = dir.path("out.safetensors");
    let good = "awq_rand_k256_n128_g128";
    let bad = "awq_minilm_l0_query_g128"; // same group size, so the two layers can share one config

    // A missing tensor: the second layer has no scales.
    let mut list = names(good, &AWQ_SUFFIXES);
    list.extend(names(bad, &["qweight", "qzeros"]));
    extract(&dir, "missing.safetensors", &list, str::to_string);
    let input = dir.path("missing.safetensors");
    fails_cleanly(
        &dir,
        &[&"dequantize", &input, &"-o", &out],
        &["missing tensor", &format!("{bad}.scales")],
        &["missing.safetensors"],
    );
    std::fs::remove_file(&input).unwrap();

    // NaN scales in the second of two layers: the first converts fine, yet no output file appears.
    let mut tensors: Vec<(String, OutTensor<'_>)> = names(good, &AWQ_SUFFIXES)
        .iter()
        .chain(&names(bad, &AWQ_SUFFIXES))
        .map(|n| (n.clone(), fixture.raw(n).unwrap().into()))
        .collect();
    let scales = &mut tensors[5].1;
    let mut data = scales.bytes().unwrap().to_vec();
    data[6..8].copy_from_slice(&half::f16::NAN.to_le_bytes());
    scales.data = TensorData::Bytes(Cow::Owned(data));
    let input = dir.path("nan.safetensors");
    write_safetensors(&input, &tensors, None, false).unwrap();
    for args in [
        vec![&"dequantize" as &dyn AsRef<std::ffi::OsStr>, &input, &"-o", &out],
        vec![&"convert", &input, &"-o", &out, &"--to", &"compressed-tensors"],
    ] {
        fails_cleanly(
            &dir,
            &args,
            &[&format!("{bad}.scales"), "NaN", "finite"],
            &["nan.safetensors"],
        );
    }
}

#[test]
fn quantize_shape_rules_fail_cleanly() {
    let dir = TempDir::new("shapes");
    let out = dir.path("out.safetensors");
    let f16 = |n: usize, k: usize| dense_f16(vec![n, k], 11);
    write_safetensors(
        &dir.path("k100.safetensors"),
        &[("proj.weight".to_string(), f16(64, 100))],
        None,
        false,
    )
    .unwrap();
    write_safetensors(
        &dir.path("n60.safetensors"),
        &[("proj.weight".to_string(), f16(60, 128))],
        None,
        false,
    )
    .unwrap();
    let files = ["k100.safetensors", "n60.safetensors"];
    let (k100, n60) = (dir.path("k100.safetensors"), dir.path("n60.safetensors"));
    fails_cleanly(
        &dir,
        &[&"quantize", &k100, &"-o", &out, &"--group-size", &"64"],
        &["proj.weight", "[64, 100]", "multiple of the group size 64"],
        &files,
    );
    fails_cleanly(
        &dir,
        &[&"quantize", &n60, &"-o", &out],
        &["proj.weight", "[60, 128]", "N = 60", "multiple of 8"],
        &files,
    );

    // In a model with other layers, a misfit is left in float with a warning and listed in modules_to_not_convert.
    let mixed = dir.path("mixed.safetensors");
    write_safetensors(
        &mixed,
        &[
            ("a.weight".to_string(), f16(64, 128)),
            ("b.weight".to_string(), f16(60, 128)),
        ],
        None,
        false,
    )
    .unwrap();
    let o = lowbit(&[&"quantize", &mixed, &"-o", &out]);
    assert_ok(&o);
    assert!(stderr(&o).contains("lowbit: warning: b.weight"), "{}", stderr(&o));
    let q = Checkpoint::open(&out).unwrap();
    assert_eq!(
        q.names().collect::<Vec<_>>(),
        ["a.qweight", "a.qzeros", "a.scales", "b.weight"]
    );
    assert_eq!(q.quant_config().unwrap().modules_to_not_convert, ["b"]);
}

#[test]
fn usage_errors_fail_cleanly() {
    let dir = TempDir::new("usage");
    let case = "awq_rand_k128_n64_g32";
    let input = extract(&dir, "in.safetensors", &names(case, &AWQ_SUFFIXES), str::to_string);
    let out = dir.path("out.safetensors");
    let only = ["in.safetensors"];
    fails_cleanly(
        &dir,
        &[&"convert", &input, &"-o", &out, &"--to", &"gguf"],
        &["--to", "gguf", "awq, gptq"],
        &only,
    );
    fails_cleanly(&dir, &[&"convert", &input, &"-o", &out], &["--to"], &only);
    fails_cleanly(
        &dir,
        &[&"quantize", &input, &"-o", &out, &"--bits", &"3"],
        &["--bits", "3"],
        &only,
    );
    fails_cleanly(
        &dir,
        &[&"quantize", &input, &"-o", &out, &"--compat", &"gptq"],
        &["--compat", "gptq"],
        &only,
    );
    fails_cleanly(
        &dir,
        &[&"quantize", &input, &"-o", &out],
        &["awq", "unquantized"],
        &only,
    );
    fails_cleanly(
        &dir,
        &[&"dequantize", &input, &"-o", &input, &"--force"],
        &["--output", "input"],
        &only,
    );
}

#[test]
fn existing_output_is_kept_without_force_and_replaced_with_it() {
    let dir = TempDir::new("force");
    let case = "awq_rand_k128_n64_g32";
    let input = extract(&dir, "in.safetensors", &names(case, &AWQ_SUFFIXES), str::to_string);
    let out = dir.path("out.safetensors");
    std::fs::write(&out, b"precious").unwrap();
    fails_cleanly(
        &dir,
        &[&"dequantize", &input, &"-o", &out],
        &["out.safetensors", "exists", "--force"],
        &["in.safetensors", "out.safetensors"],
    );
    assert_eq!(std::fs::read(&out).unwrap(), b"precious");
    assert_ok(&lowbit(&[&"dequantize", &input, &"-o", &out, &"--force"]));
    assert!(Checkpoint::open(&out).unwrap().contains(&format!("{case}.weight")));
    assert_eq!(dir.entries(), ["in.safetensors", "out.safetensors"]);

    // The same for a model directory output.
    let model = model_dir(&dir);
    let out_dir = dir.path("quantized");
    std::fs::create_dir(&out_dir).unwrap();
    std::fs::write(out_dir.join("keep"), b"mine").unwrap();
    let o = lowbit(&[&"quantize", &model, &"-o", &out_dir]);
    assert_fails(&o, &["quantized", "exists"]);
    assert_eq!(std::fs::read(out_dir.join("keep")).unwrap(), b"mine");
    assert_ok(&lowbit(&[&"quantize", &model, &"-o", &out_dir, &"--force"]));
    assert!(!out_dir.join("keep").exists() && out_dir.join("config.json").exists());
    assert_eq!(
        dir.entries(),
        ["in.safetensors", "model", "out.safetensors", "quantized"]
    );
}

#[test]
fn demo_runs_small_on_cpu() {
    let o = lowbit(&[&"demo", &"--device", &"cpu", &"--shape", &"256x512", &"--batch", &"1,3"]);
    assert_ok(&o);
    let text = stdout(&o);
    for needle in ["round trip exact: yes", "err vs exact", "cuda: skipped"] {
        assert!(text.contains(needle), "{needle:?} not in:\n{text}");
    }
}

/// The README's Rust API examples, verbatim in substance: they must keep compiling and running.
#[test]
fn readme_api_examples_run() {
    use lowbit::formats::awq::AwqWeight;
    use lowbit::ops::linear::LinearCpu;
    use lowbit::quantize::{quantize_rtn, RtnConfig};

    fn example() -> lowbit::Result<Vec<f32>> {
        let (n, k) = (256, 512);
        let weight: Vec<f32> = (0..n * k).map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 5e4).collect();
        let q = quantize_rtn(&weight, n, k, &RtnConfig::autoawq(128))?;
        let awq_tensors = AwqWeight::from_quant(&q)?.to_tensors("layer");
        assert_eq!(awq_tensors.len(), 3);
        let linear = LinearCpu::new(&q)?;
        let m = 2;
        let x = vec![0.5f32; m * k];
        let mut y = vec![0f32; m * n];
        linear.forward(&x, m, k, None, &mut y)?;
        Ok(y)
    }
    fn load(path: &str) -> lowbit::Result<Vec<(String, LinearCpu)>> {
        let ckpt = Checkpoint::open(path)?;
        let mut layers = Vec::new();
        for layer in ckpt.quantized_layers()? {
            let q = ckpt.load_layer(&layer)?;
            layers.push((layer.prefix.clone(), LinearCpu::new(&q)?));
        }
        Ok(layers)
    }
    let y = example().unwrap();
    assert!(y.iter().all(|v| v.is_finite()) && y.iter().any(|&v| v != 0.0));
    assert_eq!(load(FIXTURE).unwrap().len(), 7);
}

/// Quantizing the same weight into every format (f32 RTN) stores the same codes, so dequantizing gives the same
/// dense weight bit for bit; the configs say what each format needs.
#[test]
fn quantize_into_every_format_agrees_after_dequantize() {
    let dir = TempDir::new("formats");
    let input = dir.path("dense.safetensors");
    let tensors = vec![
        ("blk.proj.weight".to_string(), dense_f16(vec![64, 256], 5)),
        ("blk.proj.bias".to_string(), dense_f16(vec![64], 9)),
    ];
    write_safetensors(&input, &tensors, None, false).unwrap();

    // Group size 64 unless the arguments give one.
    let run = |tag: &str, args: &[&str]| -> (Checkpoint, Vec<u8>) {
        let q = dir.path(format!("{tag}.safetensors"));
        let mut all: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"quantize", &input, &"-o", &q];
        if !args.contains(&"--group-size") {
            all.extend([&"--group-size" as &dyn AsRef<std::ffi::OsStr>, &"64"]);
        }
        all.extend(args.iter().map(|a| a as &dyn AsRef<std::ffi::OsStr>));
        assert_ok(&lowbit(&all));
        let d = dir.path(format!("{tag}.dense.safetensors"));
        assert_ok(&lowbit(&[&"dequantize", &q, &"-o", &d]));
        let dense = Checkpoint::open(&d)
            .unwrap()
            .raw("blk.proj.weight")
            .unwrap()
            .data
            .to_vec();
        (Checkpoint::open(&q).unwrap(), dense)
    };

    let (awq, asym) = run("awq", &[]);
    assert!(awq.contains("blk.proj.qweight") && awq.contains("blk.proj.bias"));
    for (tag, args, method) in [
        ("gptq", &["--format", "gptq"][..], "gptq"),
        ("gptq2", &["--format", "gptq", "--gptq-format", "v2"][..], "gptq"),
        ("ct", &["--format", "compressed-tensors"][..], "compressed-tensors"),
    ] {
        let (ckpt, dense) = run(tag, args);
        assert!(dense == asym, "{tag}: dequantized weight differs from AWQ's");
        let qc = ckpt.quant_config().unwrap();
        assert_eq!(
            (qc.method.name(), qc.zero_point, qc.group_size),
            (method, true, Some(64)),
            "{tag}"
        );
    }

    let (gptq_sym, sym) = run("gptq_sym", &["--format", "gptq", "--symmetric"]);
    assert!(!gptq_sym.quant_config().unwrap().zero_point);
    let (ct_sym, ct_dense) = run("ct_sym", &["--format", "compressed-tensors", "--symmetric"]);
    assert!(ct_dense == sym && !ct_sym.contains("blk.proj.weight_zero_point"));

    let (int8, _) = run("int8", &["--format", "int8", "--group-size", "-1"]);
    let layers = int8.quantized_layers().unwrap();
    assert_eq!((layers[0].bits, layers[0].group_size), (8, 256));
    let o = lowbit(&[&"inspect", &dir.path("int8.safetensors")]);
    assert!(stdout(&o).contains("group size: per-channel"), "{}", stdout(&o));
}

#[test]
fn inspect_elides_long_layer_lists() {
    let dir = TempDir::new("elide");
    let input = dir.path("many.safetensors");
    let tensors: Vec<(String, OutTensor<'static>)> = (0..30)
        .map(|i| (format!("layers.{i:02}.proj.weight"), dense_f16(vec![16, 128], i)))
        .collect();
    write_safetensors(&input, &tensors, None, false).unwrap();
    let q = dir.path("many.awq.safetensors");
    assert_ok(&lowbit(&[&"quantize", &input, &"-o", &q]));
    let text = stdout(&lowbit(&[&"inspect", &q]));
    assert!(
        text.contains("layers: 30") && text.contains("... 20 more (--all lists them) ..."),
        "{text}"
    );
    assert!(text.contains("layers.00.proj") && text.contains("layers.29.proj") && !text.contains("layers.15.proj"));
    assert!(stdout(&lowbit(&[&"inspect", &q, &"--all"])).contains("layers.15.proj"));
}
