//! Checkpoint reading, writing and layer detection on small files made here (random bytes; shapes are what matter).

use super::*;
use crate::formats::{Format, QuantMatrix};
use crate::testing::{SplitMix64, TempDir};
use std::borrow::Cow;

/// Deterministic non-zero test bytes.
fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = SplitMix64(seed);
    (0..len).map(|_| rng.next_u64() as u8).collect()
}

fn t(dtype: StDtype, shape: &[usize], seed: u64) -> OutTensor<'static> {
    let len = shape.iter().product::<usize>() * dtype.bitsize() / 8;
    OutTensor {
        dtype,
        shape: shape.to_vec(),
        data: TensorData::Bytes(Cow::Owned(bytes(seed, len))),
    }
}

fn sample() -> Vec<(String, OutTensor<'static>)> {
    vec![
        ("a.weight".into(), t(StDtype::F16, &[8, 16], 1)),
        ("a.bias".into(), t(StDtype::F32, &[8], 2)),
        ("pos_ids".into(), t(StDtype::I64, &[1, 5], 3)),
        ("b.qweight".into(), t(StDtype::I32, &[16, 1], 4)),
    ]
}

#[test]
fn file_round_trip_keeps_every_byte_and_dtype() {
    let dir = TempDir::new("roundtrip");
    let path = dir.path("x.safetensors");
    let meta: HashMap<String, String> = [("format".to_string(), "pt".to_string())].into();
    let tensors = sample();
    write_safetensors(&path, &tensors, Some(&meta), false).unwrap();
    assert_eq!(dir.entries(), ["x.safetensors"], "no temporary left behind");

    let ckpt = Checkpoint::open(&path).unwrap();
    assert!(!ckpt.is_dir());
    assert_eq!(ckpt.metadata().get("format").map(String::as_str), Some("pt"));
    assert_eq!(
        ckpt.names().collect::<Vec<_>>(),
        ["a.bias", "a.weight", "b.qweight", "pos_ids"]
    );
    for (name, want) in &tensors {
        let raw = ckpt.raw(name).unwrap();
        assert_eq!(
            (raw.dtype, raw.shape, raw.data),
            (want.dtype, &want.shape[..], want.bytes().unwrap()),
            "{name}"
        );
    }
    let w = ckpt.tensor("a.weight").unwrap();
    assert_eq!((w.dtype, w.shape.as_slice()), (DType::F16, &[8usize, 16][..]));
    // I64 is copied through but not computed with.
    let e = ckpt.tensor("pos_ids").unwrap_err().to_string();
    assert!(e.contains("pos_ids") && e.contains("I64"), "{e}");
    // The safetensors crate reads what we wrote.
    let data = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&data).unwrap();
    assert_eq!(st.tensor("a.bias").unwrap().data(), tensors[1].1.bytes().unwrap());
}

#[test]
fn refuses_to_overwrite_without_force_and_replaces_with_it() {
    let dir = TempDir::new("force");
    let path = dir.path("x.safetensors");
    write_safetensors(&path, &sample(), None, false).unwrap();
    let before = std::fs::read(&path).unwrap();
    let other = vec![("z".to_string(), t(StDtype::U8, &[3], 9))];
    let e = write_safetensors(&path, &other, None, false).unwrap_err();
    assert!(matches!(e, Error::OutputExists { .. }), "{e}");
    assert_eq!(std::fs::read(&path).unwrap(), before, "unchanged");
    write_safetensors(&path, &other, None, true).unwrap();
    assert_eq!(Checkpoint::open(&path).unwrap().names().collect::<Vec<_>>(), ["z"]);
    assert_eq!(dir.entries(), ["x.safetensors"]);
}

#[test]
fn failed_write_leaves_nothing() {
    let dir = TempDir::new("fail");
    let path = dir.path("x.safetensors");
    let mut bad = sample();
    bad[1].1.data = TensorData::Bytes(Cow::Owned(vec![0; 3])); // 3 bytes for 8 f32s
    let e = write_safetensors(&path, &bad, None, false).unwrap_err().to_string();
    assert!(e.contains("a.bias") && e.contains("3 bytes"), "{e}");
    let dup = vec![
        ("a".to_string(), t(StDtype::U8, &[1], 1)),
        ("a".to_string(), t(StDtype::U8, &[1], 2)),
    ];
    assert!(write_safetensors(&path, &dup, None, false).is_err());
    let e = write_model_dir(&dir.path("m"), &bad, None, &Value::Null, None, false).unwrap_err();
    assert!(e.to_string().contains("a.bias"), "{e}");
    assert!(dir.entries().is_empty(), "left behind: {:?}", dir.entries());
}

#[test]
fn damaged_files_are_typed_errors_naming_the_path() {
    let dir = TempDir::new("damaged");
    let good = dir.path("good.safetensors");
    write_safetensors(&good, &sample(), None, false).unwrap();
    let data = std::fs::read(&good).unwrap();
    let header_len = u64::from_le_bytes(data[..8].try_into().unwrap()) as usize;

    let mut cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty", vec![], "truncated"),
        ("short", data[..5].to_vec(), "truncated"),
        ("cut_header", data[..8 + header_len / 2].to_vec(), "beyond the end"),
        ("cut_data", data[..data.len() - 3].to_vec(), "truncated"),
        ("trailing", [&data[..], &[0u8; 8]].concat(), "trailing"),
    ];
    let mut huge = data.clone();
    huge[..8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    cases.push(("huge_header", huge, "beyond the end"));
    let mut garbage = data.clone();
    garbage[8] = b'[';
    cases.push(("not_json", garbage, "corrupt"));
    let mut offsets = data.clone();
    let text = String::from_utf8(offsets[8..8 + header_len].to_vec()).unwrap();
    let shifted = text.replacen("\"data_offsets\":[0,", "\"data_offsets\":[1,", 1);
    offsets[8..8 + header_len].copy_from_slice(shifted.as_bytes());
    cases.push(("bad_offsets", offsets, "corrupt"));

    for (name, bytes, want) in cases {
        let path = dir.path(format!("{name}.safetensors"));
        std::fs::write(&path, &bytes).unwrap();
        let e = Checkpoint::open(&path).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, Error::Parse { .. }), "{name}: {msg}");
        assert!(
            msg.contains(&path.display().to_string()) && msg.contains(want),
            "{name}: {msg}"
        );
    }
    let missing = dir.path("nope.safetensors");
    let e = Checkpoint::open(&missing).unwrap_err();
    assert!(
        matches!(e, Error::Io { .. }) && e.to_string().contains("nope.safetensors"),
        "{e}"
    );
    let ckpt = Checkpoint::open(&good).unwrap();
    let e = ckpt.tensor("absent.weight").unwrap_err();
    assert!(
        matches!(e, Error::MissingTensor { .. }) && e.to_string().contains("absent.weight"),
        "{e}"
    );
}

#[test]
fn model_dir_round_trip_with_config_and_extra_files() {
    let dir = TempDir::new("modeldir");
    let src = dir.path("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("tokenizer.json"), b"{\"tok\": 1}").unwrap();
    std::fs::write(src.join("pytorch_model.bin"), b"old weights").unwrap();
    let base = serde_json::json!({"architectures": ["BertModel"], "hidden_size": 384});
    let qc = QuantConfig::awq_json(4, 64, true, None);
    let config = config_with_quantization(Some(&base), Some(qc.clone()));
    let out = dir.path("out");
    write_model_dir(&out, &sample(), None, &config, Some(&src), false).unwrap();
    assert_eq!(dir.entries(), ["out", "src"]);

    let mut files: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    assert_eq!(files, ["config.json", "model.safetensors", "tokenizer.json"]);
    let ckpt = Checkpoint::open(&out).unwrap();
    assert!(ckpt.is_dir());
    assert_eq!(ckpt.config().unwrap()["hidden_size"], 384);
    assert_eq!(ckpt.config().unwrap()["quantization_config"], qc);
    let q = ckpt.quant_config().unwrap();
    assert_eq!(
        (q.method.clone(), q.bits, q.group_size),
        (QuantMethod::Awq, 4, Some(64))
    );
    assert_eq!(ckpt.len(), 4);

    let e = write_model_dir(&out, &sample(), None, &config, None, false).unwrap_err();
    assert!(matches!(e, Error::OutputExists { .. }));
    let plain = config_with_quantization(Some(&config), None);
    assert!(plain.get("quantization_config").is_none() && plain["hidden_size"] == 384);
    write_model_dir(&out, &sample()[..1], None, &plain, None, true).unwrap();
    let ckpt = Checkpoint::open(&out).unwrap();
    assert!(ckpt.quant_config().is_none() && ckpt.len() == 1);
    assert_eq!(dir.entries(), ["out", "src"], "no temporaries or old copies left");
}

#[test]
fn sharded_directory_via_index() {
    let dir = TempDir::new("sharded");
    let all = sample();
    write_safetensors(&dir.path("model-00001-of-00002.safetensors"), &all[..2], None, false).unwrap();
    write_safetensors(&dir.path("model-00002-of-00002.safetensors"), &all[2..], None, false).unwrap();
    let mut weight_map = serde_json::Map::new();
    for (i, (name, _)) in all.iter().enumerate() {
        let file = if i < 2 {
            "model-00001-of-00002.safetensors"
        } else {
            "model-00002-of-00002.safetensors"
        };
        weight_map.insert(name.clone(), file.into());
    }
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
    std::fs::write(dir.path(INDEX_FILE), index.to_string()).unwrap();
    let ckpt = Checkpoint::open(dir.dir()).unwrap();
    assert_eq!(ckpt.files().len(), 2);
    for (name, want) in &all {
        assert_eq!(ckpt.raw(name).unwrap().data, want.bytes().unwrap(), "{name}");
    }

    weight_map.insert("ghost".into(), "model-00001-of-00002.safetensors".into());
    let index = serde_json::json!({"weight_map": weight_map});
    std::fs::write(dir.path(INDEX_FILE), index.to_string()).unwrap();
    let e = Checkpoint::open(dir.dir()).unwrap_err();
    assert!(
        matches!(e, Error::MissingTensor { .. }) && e.to_string().contains("ghost"),
        "{e}"
    );
}

#[test]
fn output_checks() {
    let dir = TempDir::new("outcheck");
    let input = dir.path("in.safetensors");
    write_safetensors(&input, &sample(), None, false).unwrap();
    assert!(
        check_output(&input, &input, true).is_err(),
        "never the input, even with --force"
    );
    assert!(matches!(
        check_output(&input, &dir.path("other"), false),
        Err(Error::OutputExists { .. })
    ));
    assert!(check_output(&dir.path("new.safetensors"), &input, false).is_ok());
    assert!(check_output(&dir.path("no/such/dir.safetensors"), &input, false).is_err());
    assert!(
        check_output(&dir.path("inside"), dir.dir(), true).is_err(),
        "not inside an input directory"
    );
}

/// Writes `tensors` (name, dtype, shape) and an optional config.json into a fresh model directory.
fn model(dir: &TempDir, tensors: &[(&str, StDtype, &[usize])], qc: Option<Value>) -> Checkpoint {
    let out: Vec<_> = tensors
        .iter()
        .enumerate()
        .map(|(i, (n, d, s))| (n.to_string(), t(*d, s, i as u64)))
        .collect();
    let path = dir.path("m");
    let config = config_with_quantization(None, qc);
    write_model_dir(&path, &out, None, &config, None, true).unwrap();
    Checkpoint::open(&path).unwrap()
}

#[test]
fn detects_awq_gptq_and_compressed_tensors_layers() {
    use StDtype::*;
    let dir = TempDir::new("detect");
    // AWQ: K=256, N=64, G=64, no config: the shapes say AWQ.
    let awq: &[(&str, StDtype, &[usize])] = &[
        ("l.qweight", I32, &[256, 8]),
        ("l.qzeros", I32, &[4, 8]),
        ("l.scales", F16, &[4, 64]),
        ("l.bias", F16, &[64]),
    ];
    let layers = model(&dir, awq, None).quantized_layers().unwrap();
    assert_eq!(layers.len(), 1);
    let l = &layers[0];
    assert_eq!(
        (l.format, l.n, l.k, l.group_size, l.bits, l.zero_point),
        (Format::Awq, 64, 256, 64, 4, true)
    );
    assert_eq!(l.tensors, ["l.qweight", "l.qzeros", "l.scales"]);
    assert_eq!(
        (l.fp16_bytes(), l.stored_bytes(&model(&dir, awq, None))),
        (64 * 256 * 2, 256 * 8 * 4 + 4 * 8 * 4 + 4 * 64 * 2)
    );

    // A config group size that disagrees with the shapes is an error naming the scales.
    let e = model(&dir, awq, Some(QuantConfig::awq_json(4, 128, true, None)))
        .quantized_layers()
        .unwrap_err();
    assert!(
        e.to_string().contains("l.scales") && e.to_string().contains("128"),
        "{e}"
    );

    // GPTQ: K=256 (qweight [32, 64]), N=64, G=128, with g_idx.
    let gptq: &[(&str, StDtype, &[usize])] = &[
        ("l.qweight", I32, &[32, 64]),
        ("l.qzeros", I32, &[2, 8]),
        ("l.scales", F16, &[2, 64]),
        ("l.g_idx", I32, &[256]),
    ];
    let l = &model(&dir, gptq, None).quantized_layers().unwrap()[0];
    assert_eq!(
        (l.format, l.n, l.k, l.group_size, l.bits, l.has_g_idx),
        (Format::Gptq, 64, 256, 128, 4, true)
    );
    // 8-bit GPTQ from config: qweight [K/4, N].
    let gptq8: &[(&str, StDtype, &[usize])] = &[
        ("l.qweight", I32, &[64, 64]),
        ("l.qzeros", I32, &[1, 16]),
        ("l.scales", F16, &[1, 64]),
    ];
    let l = &model(&dir, gptq8, Some(QuantConfig::gptq_json(8, None, true, "gptq")))
        .quantized_layers()
        .unwrap()[0];
    assert_eq!(
        (l.format, l.k, l.group_size, l.bits, l.zero_point),
        (Format::Gptq, 256, 256, 8, false)
    );

    // compressed-tensors with a zero point and an i64 weight_shape.
    let ct: &[(&str, StDtype, &[usize])] = &[
        ("l.weight_packed", I32, &[64, 32]),
        ("l.weight_scale", F16, &[64, 4]),
        ("l.weight_zero_point", I32, &[8, 4]),
        ("l.weight_shape", I64, &[2]),
    ];
    let mut out: Vec<_> = ct.iter().map(|(n, d, s)| (n.to_string(), t(*d, s, 7))).collect();
    out[3].1.data = TensorData::Bytes(Cow::Owned([64i64, 256].iter().flat_map(|v| v.to_le_bytes()).collect()));
    let path = dir.path("ct.safetensors");
    write_safetensors(&path, &out, None, false).unwrap();
    let l = &Checkpoint::open(&path).unwrap().quantized_layers().unwrap()[0];
    assert_eq!(
        (l.format, l.n, l.k, l.group_size, l.zero_point),
        (Format::CompressedTensors, 64, 256, 64, true)
    );
    assert_eq!(l.tensors.len(), 4);

    // Incomplete or inconsistent layers are errors naming the tensor.
    let e = model(&dir, &awq[..2], None).quantized_layers().unwrap_err();
    assert!(
        matches!(e, Error::MissingTensor { .. }) && e.to_string().contains("l.scales"),
        "{e}"
    );
    let bad: &[(&str, StDtype, &[usize])] = &[
        ("l.qweight", I32, &[256, 8]),
        ("l.qzeros", I32, &[3, 8]),
        ("l.scales", F16, &[3, 64]),
    ];
    let e = model(&dir, bad, None).quantized_layers().unwrap_err();
    assert!(
        e.to_string().contains("l.scales") && e.to_string().contains("3 groups"),
        "{e}"
    );
    let e = model(&dir, awq, Some(QuantConfig::gptq_json(4, Some(64), true, "gptq")))
        .quantized_layers()
        .unwrap_err();
    assert!(e.to_string().contains("l.qweight"), "{e}");
}

#[test]
fn opens_fixture() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/golden_public.safetensors"
    );
    let ckpt = Checkpoint::open(path).unwrap();
    assert!(ckpt.metadata().contains_key("cases"));
    let layers = ckpt.quantized_layers().unwrap();
    let awq: Vec<_> = layers.iter().filter(|l| l.format == Format::Awq).collect();
    assert_eq!(awq.len(), 5);
    let l = awq.iter().find(|l| l.prefix == "awq_rand_k512_n192_g64").unwrap();
    assert_eq!((l.n, l.k, l.group_size), (192, 512, 64));
    let ct: Vec<_> = layers
        .iter()
        .filter(|l| l.format == Format::CompressedTensors)
        .collect();
    assert_eq!(ct.len(), 2);
    let l = ct.iter().find(|l| l.prefix == "ct_asym_n128_k256_g64").unwrap();
    assert_eq!((l.n, l.k, l.group_size, l.zero_point), (128, 256, 64, true));
}

#[test]
fn load_layer_reads_fixture_layers_exactly() {
    use crate::ops::dequantize::{dequantize_to_tensor, Layout};
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/golden_public.safetensors"
    );
    let ckpt = Checkpoint::open(path).unwrap();
    for layer in ckpt.quantized_layers().unwrap() {
        let q = ckpt.load_layer(&layer).unwrap();
        assert_eq!(
            (q.n, q.k, q.group_size, q.bits),
            (layer.n, layer.k, layer.group_size, layer.bits)
        );
        if layer.format == Format::Awq {
            // AutoAWQ's own dequantization, [K, N] fp16: bit for bit.
            let want = ckpt.tensor(&layer.tensor_name("dequantized")).unwrap();
            let got = dequantize_to_tensor(&q, Layout::Kn, DType::F16).unwrap();
            assert_eq!(got.data, want.data, "{}", layer.prefix);
        }
    }
}

#[test]
fn int8_layers_round_trip_through_a_file() {
    use crate::formats::int8::Int8Weight;
    let dir = TempDir::new("int8");
    let (n, k, g) = (16, 64, 32);
    let codes = bytes(11, n * k);
    let zeros = bytes(12, n * k / g);
    let scales: Vec<f32> = bytes(13, n * k / g).iter().map(|&b| (b as f32 + 1.0) / 512.0).collect();
    let q = QuantMatrix {
        n,
        k,
        bits: 8,
        group_size: g,
        codes,
        zeros: Some(zeros),
        scales: scales.iter().map(|&s| crate::dtype::round_to(DType::F16, s)).collect(),
        scale_dtype: DType::F16,
        g_idx: None,
    };
    let out: Vec<_> = Int8Weight::from_quant(&q)
        .unwrap()
        .to_tensors("lin")
        .into_iter()
        .map(|(name, t)| (name, OutTensor::from(t)))
        .collect();
    let path = dir.path("int8.safetensors");
    write_safetensors(&path, &out, None, false).unwrap();
    let ckpt = Checkpoint::open(&path).unwrap();
    let layers = ckpt.quantized_layers().unwrap();
    assert_eq!(layers.len(), 1);
    assert_eq!(
        (layers[0].format, layers[0].group_size, layers[0].zero_point),
        (Format::Int8, g, true)
    );
    assert_eq!(ckpt.load_layer(&layers[0]).unwrap(), q);
}

#[test]
fn deferred_tensors_stream_and_their_errors_leave_nothing() {
    let dir = TempDir::new("deferred");
    let path = dir.path("d.safetensors");
    let produced = std::cell::Cell::new(0);
    let lazy = |seed: u64| {
        let produced = &produced;
        OutTensor::deferred(StDtype::F16, vec![4, 8], move || {
            produced.set(produced.get() + 1);
            Ok(bytes(seed, 64))
        })
    };
    let tensors = vec![
        ("x".to_string(), lazy(1)),
        ("y".to_string(), t(StDtype::U8, &[3], 2)),
        ("z".to_string(), lazy(3)),
    ];
    write_safetensors(&path, &tensors, None, false).unwrap();
    assert_eq!(produced.get(), 2);
    let ckpt = Checkpoint::open(&path).unwrap();
    assert_eq!(ckpt.raw("z").unwrap().data, &bytes(3, 64)[..]);

    // A producer that fails, or returns the wrong length, aborts the write: no output, no temporary.
    let failing = OutTensor::deferred(StDtype::F16, vec![4], || {
        Err(Error::invalid("w.scales", "NaN", "finite"))
    });
    let short = OutTensor::deferred(StDtype::F16, vec![4], || Ok(vec![0; 6]));
    for (bad, want) in [(failing, "w.scales"), (short, "6 bytes")] {
        let out = dir.path("bad.safetensors");
        let tensors = vec![("a".to_string(), t(StDtype::U8, &[3], 2)), ("b".to_string(), bad)];
        let e = write_safetensors(&out, &tensors, None, false).unwrap_err().to_string();
        assert!(e.contains(want), "{e}");
        assert_eq!(dir.entries(), ["d.safetensors"]);
    }
}

#[test]
fn single_file_carries_its_quantization_config_in_metadata() {
    let dir = TempDir::new("metaqc");
    let path = dir.path("q.safetensors");
    let qc = QuantConfig::gptq_json(4, Some(64), false, "gptq_v2");
    let meta: HashMap<String, String> = [(METADATA_QUANT_KEY.to_string(), qc.to_string())].into();
    let tensors: Vec<(String, OutTensor<'static>)> = vec![
        ("l.qweight".into(), t(StDtype::I32, &[32, 64], 1)),
        ("l.qzeros".into(), t(StDtype::I32, &[4, 8], 2)),
        ("l.scales".into(), t(StDtype::F16, &[4, 64], 3)),
    ];
    write_safetensors(&path, &tensors, Some(&meta), false).unwrap();
    let ckpt = Checkpoint::open(&path).unwrap();
    let q = ckpt.quant_config().unwrap();
    assert_eq!(
        (q.method.clone(), q.checkpoint_format.as_deref(), q.zero_point),
        (QuantMethod::Gptq, Some("gptq_v2"), true)
    );
    assert_eq!(ckpt.gptq_version().unwrap(), crate::formats::gptq::GptqVersion::V2);
    let bad: HashMap<String, String> = [(METADATA_QUANT_KEY.to_string(), "{not json".to_string())].into();
    write_safetensors(&path, &tensors, Some(&bad), true).unwrap();
    let e = Checkpoint::open(&path).unwrap_err().to_string();
    assert!(e.contains("q.safetensors") && e.contains("quantization_config"), "{e}");
}
