//! Checkpoint formats: round trips through `QuantMatrix` and through checkpoint tensors, conversions between
//! formats, the errors for what a format cannot hold or a checkpoint gets wrong, and dequantization checked
//! against decoders written straight from shared/formats.md (not from lowbit's packing code).

use half::{bf16, f16};
use lowbit::dtype::Float;
use lowbit::formats::awq::{self, AwqWeight};
use lowbit::formats::compressed_tensors::{self as ct, CompressedTensorsWeight};
use lowbit::formats::gptq::{self, GptqVersion, GptqWeight};
use lowbit::formats::int8::{self, Int8Weight};
use lowbit::formats::Format;
use lowbit::ops::dequantize::{cpu, reference, Layout};
use lowbit::testing::{random_quant, QuantSpec, Scales, SplitMix64, Zeros};
use lowbit::{DType, Error, QuantMatrix, Result, Tensor, TensorRef};

mod common;
use common::assert_invalid;

// ---- Test data ---------------------------------------------------------------------------------------------------

/// The largest code of `bits`.
fn max_code(bits: u8) -> u8 {
    ((1u16 << bits) - 1) as u8
}

/// `±2^e`, e in -10..=2: every dequantized value is exact in f16, bf16 and f32.
const POWER_OF_TWO_SCALES: Scales = Scales::PowerOfTwo {
    min_exp: -10,
    max_exp: 2,
};

/// An `[n, k]` weight with zero codes in `1..=max` (storable by every format, GPTQ v1 included) and random scales
/// over decades.
fn spec(n: usize, k: usize, bits: u8, group_size: usize) -> QuantSpec {
    QuantSpec {
        zeros: Zeros::Random(1, max_code(bits)),
        ..QuantSpec::new(n, k, bits, group_size)
    }
}

const LAYER: &str = "model.layers.0.mlp.up_proj";

fn name(suffix: &str) -> String {
    format!("{LAYER}.{suffix}")
}

/// Looks a written tensor up by suffix, as a `TensorRef` named the way a checkpoint reader would name it.
fn find<'a>(tensors: &'a [(String, Tensor)], suffix: &str) -> Option<TensorRef<'a>> {
    let full = name(suffix);
    tensors.iter().find(|(n, _)| *n == full).map(|(n, t)| t.view(n.clone()))
}

fn get<'a>(tensors: &'a [(String, Tensor)], suffix: &str) -> TensorRef<'a> {
    find(tensors, suffix).unwrap_or_else(|| panic!("{suffix} not written"))
}

fn reread_awq(t: &[(String, Tensor)]) -> Result<AwqWeight> {
    AwqWeight::from_tensors(LAYER, &get(t, awq::QWEIGHT), &get(t, awq::QZEROS), &get(t, awq::SCALES))
}

fn reread_gptq(t: &[(String, Tensor)], bits: u8, version: GptqVersion) -> Result<GptqWeight> {
    let g_idx = find(t, gptq::G_IDX);
    GptqWeight::from_tensors(
        LAYER,
        bits,
        version,
        &get(t, gptq::QWEIGHT),
        &get(t, gptq::QZEROS),
        &get(t, gptq::SCALES),
        g_idx.as_ref(),
    )
}

fn reread_ct(t: &[(String, Tensor)], bits: u8) -> Result<CompressedTensorsWeight> {
    let (zp, shape, g_idx) = (
        find(t, ct::WEIGHT_ZERO_POINT),
        find(t, ct::WEIGHT_SHAPE),
        find(t, ct::WEIGHT_G_IDX),
    );
    CompressedTensorsWeight::from_tensors(
        LAYER,
        bits,
        &get(t, ct::WEIGHT_PACKED),
        &get(t, ct::WEIGHT_SCALE),
        zp.as_ref(),
        shape.as_ref(),
        g_idx.as_ref(),
    )
}

fn reread_int8(t: &[(String, Tensor)]) -> Result<Int8Weight> {
    let zp = find(t, int8::WEIGHT_ZERO_POINT);
    Int8Weight::from_tensors(LAYER, &get(t, int8::WEIGHT), &get(t, int8::WEIGHT_SCALE), zp.as_ref())
}

/// `q` with zeros materialised (what AWQ and GPTQ store for a symmetric weight).
fn with_zeros(q: &QuantMatrix) -> QuantMatrix {
    let mut q = q.clone();
    q.zeros.get_or_insert_with(|| vec![1 << (q.bits - 1); q.scales.len()]);
    q
}

// ---- Spec decoders: formats.md, transcribed independently of lowbit's packers ---------------------------------

/// Field `i` (width `bits`) of an int32 word.
fn field(word: i32, i: usize, bits: u8) -> i64 {
    ((word as u32 >> (bits as usize * i)) & ((1u32 << bits) - 1)) as i64
}

/// AWQ GEMM: column `8c + j` of W^T sits in nibble `INV[j]` of word `c`.
fn decode_awq(w: &AwqWeight) -> Vec<f64> {
    const INV: [usize; 8] = [0, 4, 1, 5, 2, 6, 3, 7];
    let (n_words, mut out) = (w.n / 8, vec![0.0; w.n * w.k]);
    for k in 0..w.k {
        let g = k / w.group_size;
        for n in 0..w.n {
            let q = field(w.qweight[k * n_words + n / 8], INV[n % 8], 4);
            let z = field(w.qzeros[g * n_words + n / 8], INV[n % 8], 4);
            out[n * w.k + k] = (q - z) as f64 * w.scales[g * w.n + n] as f64;
        }
    }
    out
}

/// GPTQ: element k at qweight row k/P, field k%P; zeros along N, natural order; v1 adds 1.
fn decode_gptq(w: &GptqWeight) -> Vec<f64> {
    let per = 32 / w.bits as usize;
    let offset = if w.version == GptqVersion::V1 { 1 } else { 0 };
    let mut out = vec![0.0; w.n * w.k];
    for k in 0..w.k {
        let g = w.g_idx.as_ref().map_or(k / w.group_size, |g| g[k] as usize);
        for n in 0..w.n {
            let q = field(w.qweight[(k / per) * w.n + n], k % per, w.bits);
            let z = field(w.qzeros[g * (w.n / per) + n / per], n % per, w.bits) + offset;
            out[n * w.k + k] = (q - z) as f64 * w.scales[g * w.n + n] as f64;
        }
    }
    out
}

/// compressed-tensors: signed q + 2^(bits-1) along K; zero points (same offset) packed along N; absent = 0.
fn decode_ct(w: &CompressedTensorsWeight) -> Vec<f64> {
    let per = 32 / w.bits as usize;
    let half = 1i64 << (w.bits - 1);
    let groups = w.weight_scale.len() / w.n;
    let mut out = vec![0.0; w.n * w.k];
    for n in 0..w.n {
        for k in 0..w.k {
            let g = w.g_idx.as_ref().map_or(k / w.group_size, |g| g[k] as usize);
            let q = field(w.weight_packed[n * (w.k / per) + k / per], k % per, w.bits) - half;
            let zp = w
                .weight_zero_point
                .as_ref()
                .map_or(0, |zp| field(zp[(n / per) * groups + g], n % per, w.bits) - half);
            out[n * w.k + k] = (q - zp) as f64 * w.weight_scale[n * groups + g] as f64;
        }
    }
    out
}

/// int8: `(q - zp) * s` on plain signed bytes.
fn decode_int8(w: &Int8Weight) -> Vec<f64> {
    let groups = w.weight_scale.len() / w.n;
    let mut out = vec![0.0; w.n * w.k];
    for n in 0..w.n {
        for k in 0..w.k {
            let g = k / w.group_size;
            let zp = w.weight_zero_point.as_ref().map_or(0, |z| z[n * groups + g] as i64);
            out[n * w.k + k] = (w.weight[n * w.k + k] as i64 - zp) as f64 * w.weight_scale[n * groups + g] as f64;
        }
    }
    out
}

// ---- Round trips ---------------------------------------------------------------------------------------------------

#[test]
fn awq_round_trips_through_quant_matrix_and_tensors() {
    let mut rng = SplitMix64(1);
    for (n, k, g, zeros, scale_dtype) in [
        (64, 128, 32, Zeros::Random(0, 15), DType::F16),
        (24, 256, 256, Zeros::All(15), DType::Bf16),
        (8, 64, 64, Zeros::All(0), DType::F32),
    ] {
        let q = random_quant(
            &mut rng,
            &QuantSpec {
                zeros,
                scale_dtype,
                ..spec(n, k, 4, g)
            },
        );
        let w = AwqWeight::from_quant(&q).unwrap();
        assert_eq!(w.to_quant(), q);
        let reread = reread_awq(&w.to_tensors(LAYER)).unwrap();
        assert_eq!(reread, w);
        assert_eq!(decode_awq(&w), reference::dequantize(&q), "AWQ layout");
    }
    // A symmetric weight is stored with zeros 8 and comes back with them; dropping them restores it.
    let sym = random_quant(
        &mut rng,
        &QuantSpec {
            zeros: Zeros::Symmetric,
            ..spec(16, 64, 4, 32)
        },
    );
    let mut back = AwqWeight::from_quant(&sym).unwrap().to_quant();
    assert_eq!(back, with_zeros(&sym));
    back.drop_symmetric_zeros();
    assert_eq!(back, sym);
}

#[test]
fn gptq_round_trips_every_version_width_and_g_idx() {
    let mut rng = SplitMix64(2);
    for version in [GptqVersion::V1, GptqVersion::V2] {
        for bits in [4u8, 8] {
            for act_order in [false, true] {
                let lo = version.zero_offset();
                let spec = QuantSpec {
                    zeros: Zeros::Random(lo, max_code(bits)),
                    act_order,
                    scale_dtype: if bits == 8 { DType::Bf16 } else { DType::F16 },
                    ..spec(32, 128, bits, 32)
                };
                let q = random_quant(&mut rng, &spec);
                let w = GptqWeight::from_quant(&q, version).unwrap();
                assert_eq!(w.to_quant(), q, "{version:?} int{bits} act_order={act_order}");
                let tensors = w.to_tensors(LAYER);
                assert!(find(&tensors, gptq::G_IDX).is_some(), "g_idx is always written");
                let reread = reread_gptq(&tensors, bits, version).unwrap();
                assert_eq!(reread.to_quant(), q);
                assert_eq!(decode_gptq(&w), reference::dequantize(&q), "GPTQ layout");
            }
        }
    }
}

#[test]
fn compressed_tensors_round_trips_symmetric_asymmetric_and_act_order() {
    let mut rng = SplitMix64(3);
    for bits in [4u8, 8] {
        for zeros in [Zeros::Symmetric, Zeros::Random(0, max_code(bits))] {
            for act_order in [false, true] {
                let spec = QuantSpec {
                    zeros,
                    act_order,
                    ..spec(16, 64, bits, 16)
                };
                let q = random_quant(&mut rng, &spec);
                let w = CompressedTensorsWeight::from_quant(&q).unwrap();
                assert_eq!(w.to_quant(), q, "int{bits} {zeros:?} act_order={act_order}");
                let tensors = w.to_tensors(LAYER);
                assert_eq!(find(&tensors, ct::WEIGHT_ZERO_POINT).is_some(), q.zeros.is_some());
                assert_eq!(find(&tensors, ct::WEIGHT_G_IDX).is_some(), act_order);
                assert_eq!(reread_ct(&tensors, bits).unwrap(), w);
                assert_eq!(decode_ct(&w), reference::dequantize(&q), "compressed-tensors layout");
            }
        }
    }
}

#[test]
fn int8_round_trips_per_channel_and_per_group() {
    let mut rng = SplitMix64(4);
    for (group_size, zeros) in [
        (96, Zeros::Symmetric),
        (32, Zeros::Symmetric),
        (32, Zeros::Random(0, 255)),
    ] {
        let q = random_quant(
            &mut rng,
            &QuantSpec {
                zeros,
                ..spec(8, 96, 8, group_size)
            },
        );
        let w = Int8Weight::from_quant(&q).unwrap();
        assert_eq!(w.to_quant(), q);
        assert_eq!(reread_int8(&w.to_tensors(LAYER)).unwrap(), w);
        assert_eq!(decode_int8(&w), reference::dequantize(&q), "int8 layout");
    }
    // A per-tensor scale (shape [] or [1]) reads as one scale per row.
    let weight = Tensor::from_i8(vec![2, 4], &[-128, -1, 0, 127, 5, 6, 7, 8]);
    for shape in [vec![], vec![1]] {
        let scale = Tensor::from_f32(shape, &[0.5], DType::F16);
        let w = Int8Weight::from_tensors(LAYER, &weight.view("w"), &scale.view("s"), None).unwrap();
        assert_eq!((w.group_size, w.weight_scale.clone()), (4, vec![0.5, 0.5]));
        assert_eq!(reference::dequantize(&w.to_quant())[..4], [-64.0, -0.5, 0.0, 63.5]);
    }
}

// ---- Conversions ---------------------------------------------------------------------------------------------------

#[test]
fn awq_gptq_compressed_tensors_convert_losslessly() {
    let mut rng = SplitMix64(5);
    let q = random_quant(
        &mut rng,
        &QuantSpec {
            zeros: Zeros::Random(1, 15),
            ..spec(48, 256, 4, 64)
        },
    );
    let awq = AwqWeight::from_quant(&q).unwrap();
    let v2 = GptqWeight::from_quant(&awq.to_quant(), GptqVersion::V2).unwrap();
    let v1 = v2.to_version(GptqVersion::V1).unwrap();
    let ct = CompressedTensorsWeight::from_quant(&v1.to_quant()).unwrap();
    let back = AwqWeight::from_quant(&ct.to_quant()).unwrap();
    assert_eq!(back, awq);
    assert_eq!(v1.to_version(GptqVersion::V2).unwrap(), v2);
    // Same weights, same dequantized values, in every layout.
    let want = reference::dequantize(&q);
    assert_eq!(decode_gptq(&v1), want);
    assert_eq!(decode_gptq(&v2), want);
    assert_eq!(decode_ct(&ct), want);
}

#[test]
fn symmetric_words_match_the_documented_constants() {
    let mut rng = SplitMix64(6);
    for (bits, v1_word, v2_word) in [(4u8, 0x7777_7777u32, 0x8888_8888u32), (8, 0x7f7f_7f7f, 0x8080_8080)] {
        let q = random_quant(
            &mut rng,
            &QuantSpec {
                zeros: Zeros::Symmetric,
                ..spec(16, 64, bits, 32)
            },
        );
        let v1 = GptqWeight::from_quant(&q, GptqVersion::V1).unwrap();
        let v2 = GptqWeight::from_quant(&q, GptqVersion::V2).unwrap();
        assert!(v1.qzeros.iter().all(|&w| w as u32 == v1_word), "int{bits} v1 zeros");
        assert!(v2.qzeros.iter().all(|&w| w as u32 == v2_word), "int{bits} v2 zeros");
        // Symmetric compressed-tensors weight_packed [N, K/P], transposed, is GPTQ v2 qweight [K/P, N].
        let ct = CompressedTensorsWeight::from_quant(&q).unwrap();
        let per = 32 / bits as usize;
        for r in 0..q.k / per {
            for n in 0..q.n {
                assert_eq!(ct.weight_packed[n * (q.k / per) + r], v2.qweight[r * q.n + n]);
            }
        }
    }
}

fn assert_conversion_error<T: std::fmt::Debug>(r: Result<T>, to: &str, reason: &str) {
    match r {
        Err(Error::Conversion { to: t, reason: why, .. }) if t.contains(to) && why.contains(reason) => {}
        other => panic!("expected a conversion error to {to} mentioning {reason:?}, got {other:?}"),
    }
}

#[test]
fn conversions_fail_where_the_target_cannot_hold_the_weight() {
    let mut rng = SplitMix64(7);
    let act_order = random_quant(
        &mut rng,
        &QuantSpec {
            act_order: true,
            ..spec(16, 64, 4, 16)
        },
    );
    assert_conversion_error(AwqWeight::from_quant(&act_order), "AWQ", "g_idx");
    let act_order8 = random_quant(
        &mut rng,
        &QuantSpec {
            act_order: true,
            ..spec(16, 64, 8, 16)
        },
    );
    assert_conversion_error(Int8Weight::from_quant(&act_order8), "int8", "g_idx");

    let int8 = random_quant(&mut rng, &spec(16, 64, 8, 64));
    assert_conversion_error(AwqWeight::from_quant(&int8), "AWQ", "4-bit");
    let int4 = random_quant(&mut rng, &spec(16, 64, 4, 64));
    assert_conversion_error(Int8Weight::from_quant(&int4), "int8", "8-bit");

    let zero_code_0 = random_quant(
        &mut rng,
        &QuantSpec {
            zeros: Zeros::All(0),
            ..spec(16, 64, 4, 64)
        },
    );
    assert_conversion_error(GptqWeight::from_quant(&zero_code_0, GptqVersion::V1), "gptq", "z - 1");
    let v2 = GptqWeight::from_quant(&zero_code_0, GptqVersion::V2).unwrap();
    assert_conversion_error(v2.to_version(GptqVersion::V1), "gptq", "z - 1");

    let n12 = random_quant(&mut rng, &spec(12, 64, 4, 64));
    assert_conversion_error(AwqWeight::from_quant(&n12), "AWQ", "N = 12");
    assert_conversion_error(GptqWeight::from_quant(&n12, GptqVersion::V2), "gptq", "N = 12");
    assert_conversion_error(
        CompressedTensorsWeight::from_quant(&n12),
        "compressed-tensors",
        "N = 12",
    );
    // Without zero points compressed-tensors packs only along K, so N = 12 is fine.
    let n12_sym = random_quant(
        &mut rng,
        &QuantSpec {
            zeros: Zeros::Symmetric,
            ..spec(12, 64, 4, 64)
        },
    );
    assert!(CompressedTensorsWeight::from_quant(&n12_sym).is_ok());
    let k12 = random_quant(
        &mut rng,
        &QuantSpec {
            zeros: Zeros::Symmetric,
            ..spec(8, 12, 4, 12)
        },
    );
    assert_conversion_error(
        CompressedTensorsWeight::from_quant(&k12),
        "compressed-tensors",
        "K = 12",
    );

    // Scales that their declared dtype cannot hold exactly are refused rather than rounded a second time.
    let mut inexact = random_quant(&mut rng, &spec(8, 32, 4, 32));
    inexact.scales[3] = 0.1;
    assert_invalid(AwqWeight::from_quant(&inexact), "scales", "0.1");
}

// ---- Checkpoint errors ---------------------------------------------------------------------------------------------

/// `tensors` with `suffix` replaced by `t`.
fn replace(tensors: &[(String, Tensor)], suffix: &str, t: Tensor) -> Vec<(String, Tensor)> {
    let full = name(suffix);
    tensors
        .iter()
        .map(|(n, old)| (n.clone(), if *n == full { t.clone() } else { old.clone() }))
        .collect()
}

fn f16_tensor(shape: Vec<usize>, v: f32) -> Tensor {
    Tensor::from_f32(shape.clone(), &vec![v; shape.iter().product()], DType::F16)
}

#[test]
fn awq_checkpoint_errors_name_the_tensor() {
    let mut rng = SplitMix64(8);
    let good = AwqWeight::from_quant(&random_quant(&mut rng, &spec(16, 256, 4, 128)))
        .unwrap()
        .to_tensors(LAYER);
    assert!(reread_awq(&good).is_ok());
    let (qweight, qzeros, scales) = (name(awq::QWEIGHT), name(awq::QZEROS), name(awq::SCALES));

    let wrong_shape = replace(&good, awq::QZEROS, Tensor::from_i32(vec![2, 3], &[0; 6]));
    assert_invalid(reread_awq(&wrong_shape), &qzeros, "[2, 3]");
    // K = 256 with 3 groups: G would not divide K.
    let k_not_multiple = replace(&good, awq::SCALES, f16_tensor(vec![3, 16], 1.0));
    assert_invalid(reread_awq(&k_not_multiple), &scales, "[3, 16]");
    let wrong_dtype = replace(
        &good,
        awq::QWEIGHT,
        Tensor::from_f32(vec![256, 2], &[0.0; 512], DType::F32),
    );
    assert_invalid(reread_awq(&wrong_dtype), &qweight, "f32");
    let one_d = replace(&good, awq::QWEIGHT, Tensor::from_i32(vec![512], &[0; 512]));
    assert_invalid(reread_awq(&one_d), &qweight, "[512]");
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let nonfinite = replace(&good, awq::SCALES, f16_tensor(vec![2, 16], bad));
        assert_invalid(reread_awq(&nonfinite), &scales, &format!("{bad}"));
    }
    // A hand-built view whose bytes stop short of its shape.
    let t = &good[0].1;
    let truncated = TensorRef {
        name: "anything".into(),
        dtype: t.dtype,
        shape: t.shape.clone(),
        data: &t.data[..t.data.len() - 4],
    };
    let r = AwqWeight::from_tensors(LAYER, &truncated, &get(&good, awq::QZEROS), &get(&good, awq::SCALES));
    assert_invalid(r, &qweight, "2044 bytes");
}

#[test]
fn gptq_checkpoint_errors_name_the_tensor() {
    let mut rng = SplitMix64(9);
    let good = GptqWeight::from_quant(&random_quant(&mut rng, &spec(16, 64, 4, 32)), GptqVersion::V1)
        .unwrap()
        .to_tensors(LAYER);
    assert!(reread_gptq(&good, 4, GptqVersion::V1).is_ok());

    // N = 12 cannot be packed 8 per qzeros word.
    let n12 = replace(&good, gptq::QWEIGHT, Tensor::from_i32(vec![8, 12], &[0; 96]));
    assert_invalid(reread_gptq(&n12, 4, GptqVersion::V1), &name(gptq::QWEIGHT), "[8, 12]");
    // v1 stores z - 1: a field of 15 would be z = 16.
    let v1_overflow = replace(
        &good,
        gptq::QZEROS,
        Tensor::from_i32(vec![2, 2], &[0x7777_7777, 0x77f7_7777u32 as i32, 0, 0]),
    );
    assert_invalid(
        reread_gptq(&v1_overflow, 4, GptqVersion::V1),
        &name(gptq::QZEROS),
        "field 5",
    );
    assert!(
        reread_gptq(&v1_overflow, 4, GptqVersion::V2).is_ok(),
        "v2 stores z itself"
    );
    let mut g_idx: Vec<i32> = (0..64).map(|k| k / 32).collect();
    g_idx[5] = 2;
    let g_out_of_range = replace(&good, gptq::G_IDX, Tensor::from_i32(vec![64], &g_idx));
    assert_invalid(
        reread_gptq(&g_out_of_range, 4, GptqVersion::V1),
        &name(gptq::G_IDX),
        "2 at index 5",
    );
    let g_short = replace(&good, gptq::G_IDX, Tensor::from_i32(vec![63], &g_idx[..63]));
    assert_invalid(reread_gptq(&g_short, 4, GptqVersion::V1), &name(gptq::G_IDX), "[63]");
    assert_invalid(reread_gptq(&good, 3, GptqVersion::V1), "bits", "3");
    let bad_scales = replace(&good, gptq::SCALES, f16_tensor(vec![2, 16], f32::NAN));
    assert_invalid(reread_gptq(&bad_scales, 4, GptqVersion::V1), &name(gptq::SCALES), "NaN");
}

#[test]
fn compressed_tensors_and_int8_checkpoint_errors_name_the_tensor() {
    let mut rng = SplitMix64(10);
    let good = CompressedTensorsWeight::from_quant(&random_quant(&mut rng, &spec(16, 64, 4, 32)))
        .unwrap()
        .to_tensors(LAYER);
    assert!(reread_ct(&good, 4).is_ok());
    let zp_shape = replace(&good, ct::WEIGHT_ZERO_POINT, Tensor::from_i32(vec![1, 2], &[0; 2]));
    assert_invalid(reread_ct(&zp_shape, 4), &name(ct::WEIGHT_ZERO_POINT), "[1, 2]");
    let padded = replace(&good, ct::WEIGHT_SHAPE, Tensor::from_i32(vec![2], &[16, 60]));
    assert_invalid(reread_ct(&padded, 4), &name(ct::WEIGHT_SHAPE), "[16, 60]");
    let scale_dtype = replace(&good, ct::WEIGHT_SCALE, Tensor::from_i32(vec![16, 2], &[1; 32]));
    assert_invalid(reread_ct(&scale_dtype, 4), &name(ct::WEIGHT_SCALE), "i32");
    let inf_scale = replace(&good, ct::WEIGHT_SCALE, f16_tensor(vec![16, 2], f32::INFINITY));
    assert_invalid(reread_ct(&inf_scale, 4), &name(ct::WEIGHT_SCALE), "inf");
    // 12 rows: zero points cannot be packed 8 per word along N.
    let n12 = vec![
        (name(ct::WEIGHT_PACKED), Tensor::from_i32(vec![12, 8], &[0; 96])),
        (name(ct::WEIGHT_SCALE), f16_tensor(vec![12, 2], 1.0)),
        (name(ct::WEIGHT_ZERO_POINT), Tensor::from_i32(vec![2, 2], &[0; 4])),
    ];
    assert_invalid(reread_ct(&n12, 4), &name(ct::WEIGHT_ZERO_POINT), "N = 12");

    let good8 = Int8Weight::from_quant(&random_quant(&mut rng, &spec(8, 64, 8, 32)))
        .unwrap()
        .to_tensors(LAYER);
    assert!(reread_int8(&good8).is_ok());
    let weight_dtype = replace(&good8, int8::WEIGHT, Tensor::from_i32(vec![8, 64], &[0; 512]));
    assert_invalid(reread_int8(&weight_dtype), &name(int8::WEIGHT), "i32");
    let k_not_multiple = replace(&good8, int8::WEIGHT_SCALE, f16_tensor(vec![8, 3], 1.0));
    assert_invalid(reread_int8(&k_not_multiple), &name(int8::WEIGHT_SCALE), "[8, 3]");
    let zp_shape = replace(&good8, int8::WEIGHT_ZERO_POINT, Tensor::from_i8(vec![8, 1], &[0; 8]));
    assert_invalid(reread_int8(&zp_shape), &name(int8::WEIGHT_ZERO_POINT), "[8, 1]");
}

#[test]
fn format_names_parse() {
    for f in Format::ALL {
        assert_eq!(f.name().parse::<Format>().unwrap(), f);
    }
    assert_eq!(
        "compressed_tensors".parse::<Format>().unwrap(),
        Format::CompressedTensors
    );
    assert_invalid("gguf".parse::<Format>(), "format", "gguf");
    assert_eq!(GptqVersion::parse("gptq_v2").unwrap(), GptqVersion::V2);
    assert_invalid(GptqVersion::parse("gptq_v3"), "checkpoint_format", "gptq_v3");
}

// ---- Dequantization ------------------------------------------------------------------------------------------------

/// `cpu::dequantize` into `T` in both layouts; each value must be the single rounding of the exact value.
fn check_dequantize<T: Float>(q: &QuantMatrix, exact: &[f64], round: impl Fn(f64) -> T, what: &str) {
    let (n, k) = (q.n, q.k);
    let mut nk = vec![T::default(); n * k];
    let mut kn = vec![T::default(); n * k];
    cpu::dequantize(q, Layout::Nk, &mut nk).unwrap();
    cpu::dequantize(q, Layout::Kn, &mut kn).unwrap();
    for i in 0..n * k {
        let want = round(exact[i]);
        let (row, col) = (i / k, i % k);
        assert!(
            nk[i] == want && kn[col * n + row] == want,
            "{what}: [{row}, {col}] NK {:?} KN {:?} want {want:?} (exact {})",
            nk[i],
            kn[col * n + row],
            exact[i]
        );
    }
}

#[test]
fn dequantize_is_exact_across_the_matrix() {
    // A slice of testing.md's dequant matrix (K, N, G, scale dtype, zero points 0/8/15/random words), with
    // power-of-two scales so every value is exact in f32, f16 and bf16: any layout error shows as a mismatch.
    // Each case goes through every format that can hold it and is decoded from its packed words by the spec
    // decoders above, so packing, unpacking and dequantization are checked against formats.md.
    let mut rng = SplitMix64(11);
    let zero_kinds = [Zeros::All(0), Zeros::All(8), Zeros::All(15), Zeros::Random(0, 15)];
    let mut case = 0;
    for k in [32usize, 128, 384, 3584] {
        for n in [8usize, 24, 128, 576] {
            if k * n > 600_000 {
                continue; // the 3584 x 576 corner is covered by dequantize_large_matches_reference
            }
            for g in [32usize, 64, 128, k] {
                if g > k {
                    continue;
                }
                case += 1;
                let spec = QuantSpec {
                    zeros: zero_kinds[case % zero_kinds.len()],
                    scales: POWER_OF_TWO_SCALES,
                    scale_dtype: if case % 2 == 0 { DType::F16 } else { DType::Bf16 },
                    ..spec(n, k, 4, g)
                };
                let q = random_quant(&mut rng, &spec);
                let exact = reference::dequantize(&q);
                let what = format!("K={k} N={n} G={g} {:?} {:?}", spec.zeros, spec.scale_dtype);
                check_dequantize::<f32>(&q, &exact, |v| v as f32, &what);
                check_dequantize::<f16>(&q, &exact, f16::from_f64, &what);
                check_dequantize::<bf16>(&q, &exact, bf16::from_f64, &what);

                assert_eq!(decode_awq(&AwqWeight::from_quant(&q).unwrap()), exact, "AWQ {what}");
                assert_eq!(
                    decode_ct(&CompressedTensorsWeight::from_quant(&q).unwrap()),
                    exact,
                    "CT {what}"
                );
                assert_eq!(
                    decode_gptq(&GptqWeight::from_quant(&q, GptqVersion::V2).unwrap()),
                    exact,
                    "GPTQ {what}"
                );
            }
        }
    }
    assert!(case >= 40, "{case} cases");
}

#[test]
fn dequantize_rounds_once_for_any_scale() {
    // Random f16/bf16 scales: (q - z)·s is exact in f32, so the kernel's output is the single rounding of the
    // exact value, bit for bit. Covers int8, act-order g_idx and symmetric weights.
    let mut rng = SplitMix64(12);
    for (bits, zeros, act_order, dtype) in [
        (4, Zeros::Random(0, 15), true, DType::F16),
        (4, Zeros::Symmetric, false, DType::Bf16),
        (8, Zeros::Random(0, 255), false, DType::F16),
        (8, Zeros::Symmetric, true, DType::Bf16),
    ] {
        let spec = QuantSpec {
            zeros,
            act_order,
            scale_dtype: dtype,
            ..spec(40, 192, bits, 64)
        };
        let q = random_quant(&mut rng, &spec);
        let exact = reference::dequantize(&q);
        let what = format!("int{bits} {zeros:?} act_order={act_order} {dtype:?}");
        check_dequantize::<f32>(&q, &exact, |v| v as f32, &what);
        check_dequantize::<f16>(&q, &exact, f16::from_f64, &what);
        check_dequantize::<bf16>(&q, &exact, bf16::from_f64, &what);
    }
}

#[test]
fn dequantize_large_matches_reference() {
    // One large case (K = 3584, N = 576, G = 128) in the KN layout AutoAWQ uses; exact power-of-two scales.
    let mut rng = SplitMix64(13);
    let spec = QuantSpec {
        scales: POWER_OF_TWO_SCALES,
        zeros: Zeros::Random(0, 15),
        ..spec(576, 3584, 4, 128)
    };
    let q = random_quant(&mut rng, &spec);
    let exact = reference::dequantize(&q);
    let mut kn = vec![f16::ZERO; q.n * q.k];
    cpu::dequantize(&q, Layout::Kn, &mut kn).unwrap();
    let bad = (0..q.n * q.k)
        .filter(|&i| kn[(i % q.k) * q.n + i / q.k].to_f64() != exact[i])
        .count();
    assert_eq!(bad, 0);
}

#[test]
fn dequantize_rejects_bad_output_and_weights() {
    let mut rng = SplitMix64(14);
    let q = random_quant(&mut rng, &spec(8, 32, 4, 32));
    let mut short = vec![0f32; 8 * 32 - 1];
    assert_invalid(cpu::dequantize(&q, Layout::Nk, &mut short), "out", "255 elements");
    let mut nan = q.clone();
    nan.scales[0] = f32::NAN;
    let mut out = vec![0f32; 8 * 32];
    assert_invalid(cpu::dequantize(&nan, Layout::Kn, &mut out), "scales", "NaN");
    let mut big_code = q.clone();
    big_code.codes[7] = 16;
    assert_invalid(
        cpu::dequantize(&big_code, Layout::Nk, &mut out),
        "codes",
        "16 at index 7",
    );
    let t = lowbit::ops::dequantize::dequantize_to_tensor(&q, Layout::Kn, DType::Bf16).unwrap();
    assert_eq!(
        (t.dtype, t.shape.clone(), t.data.len()),
        (DType::Bf16, vec![32, 8], 8 * 32 * 2)
    );
    assert_invalid(
        lowbit::ops::dequantize::dequantize_to_tensor(&q, Layout::Nk, DType::I8),
        "dtype",
        "i8",
    );
}

// ---- Round-to-nearest quantization ---------------------------------------------------------------------------------
// (AutoAWQ's fp16 arithmetic is checked bit for bit against its own output in tests/fixtures.rs.)

use lowbit::quantize::{quantize_rtn, RtnArithmetic, RtnConfig};

/// A dense `[n, k]` weight with a spread of magnitudes per row, never all zero.
fn random_weight(rng: &mut SplitMix64, n: usize, k: usize) -> Vec<f32> {
    (0..n * k)
        .map(|i| (rng.unit() - 0.5) * (1.0 + (i % 7) as f32))
        .collect()
}

#[test]
fn rtn_error_is_bounded_by_the_scale() {
    // Every dequantized value lies within s/2 of the weight where the grid covers it, within s otherwise
    // (asymmetric: the top of the range may sit up to s/2 past the last code, then clamping adds up to s/2;
    // every group here holds weights of both signs, so the zero code is never clamped). AutoAWQ's fp16
    // arithmetic adds the weight's own fp16 rounding (|w|·2^-11) and that of w/s (< 0.05 s at 8 bits), and a
    // scale rounded to f16/bf16 stretches the grid.
    // All combinations of bits, zero point, arithmetic and scale dtype.
    let mut rng = SplitMix64(20);
    let (n, k, g) = (24, 256, 64);
    let w = random_weight(&mut rng, n, k);
    for bits in [4u8, 8] {
        for zero_point in [true, false] {
            for (arithmetic, scale_dtype) in [
                (RtnArithmetic::F32, DType::F32),
                (RtnArithmetic::F32, DType::Bf16),
                (RtnArithmetic::AutoAwqF16, DType::F16),
            ] {
                let cfg = RtnConfig {
                    bits,
                    group_size: g,
                    zero_point,
                    arithmetic,
                    scale_dtype,
                };
                let q = quantize_rtn(&w, n, k, &cfg).unwrap();
                q.validate().unwrap();
                assert_eq!((q.zeros.is_some(), q.scale_dtype), (zero_point, scale_dtype));
                let deq = reference::dequantize(&q);
                // Rounding s to its dtype (unit roundoff u) moves the code-c grid point by up to c·u·s.
                let u = match scale_dtype {
                    DType::Bf16 => 2f64.powi(-8),
                    DType::F16 => 2f64.powi(-11),
                    _ => 0.0,
                };
                let grid_stretch = (1u32 << bits) as f64 * u;
                for i in 0..n * k {
                    let s = q.scales[(i / k) * (k / g) + (i % k) / g] as f64;
                    let fp16_slack = match arithmetic {
                        RtnArithmetic::AutoAwqF16 => 0.05 * s + (w[i] as f64).abs() / 2048.0,
                        RtnArithmetic::F32 => 1e-6 * s,
                    };
                    let bound = if zero_point { 1.0 } else { 0.5 } * s + fp16_slack + grid_stretch * s;
                    let err = (deq[i] - w[i] as f64).abs();
                    assert!(err <= bound, "{cfg:?}: [{}] w {} deq {} s {s}", i, w[i], deq[i]);
                }
                // Asymmetric codes span the whole range in each group: min maps to ~0, max to ~2^bits-1.
                if zero_point {
                    let top = q.codes.iter().max().copied().unwrap();
                    assert!(top as u32 >= (1u32 << bits) - 2, "{cfg:?}: top code {top}");
                }
            }
        }
    }
}

#[test]
fn rtn_rounds_half_to_even_and_handles_flat_groups() {
    // Symmetric int4 per channel: absmax 7 gives s = 1 exactly, so w = 2.5 and 3.5 are ties: 2 and 4.
    let w = [7.0f32, 2.5, 3.5, -2.5, -8.0, 0.0, 1.0, -7.0];
    let cfg = RtnConfig {
        bits: 4,
        group_size: 8,
        zero_point: false,
        arithmetic: RtnArithmetic::F32,
        scale_dtype: DType::F32,
    };
    let q = quantize_rtn(&w, 1, 8, &cfg).unwrap();
    assert_eq!(q.scales, vec![8.0 / 7.0]); // absmax is 8
    let cfg7 = RtnConfig { group_size: 4, ..cfg };
    let q = quantize_rtn(&[7.0, 2.5, 3.5, -2.5], 1, 4, &cfg7).unwrap();
    assert_eq!(q.scales, vec![1.0]);
    let signed: Vec<i32> = q.codes.iter().map(|&c| c as i32 - 8).collect();
    assert_eq!(signed, vec![7, 2, 4, -2]);
    // A constant group: the range floor 1e-5 keeps the scale positive and the values exact.
    for arithmetic in [RtnArithmetic::F32, RtnArithmetic::AutoAwqF16] {
        let cfg = RtnConfig {
            arithmetic,
            ..RtnConfig::autoawq(8)
        };
        let cfg = RtnConfig {
            scale_dtype: DType::F16,
            ..cfg
        };
        let q = quantize_rtn(&[0.0; 8], 1, 8, &cfg).unwrap();
        assert!(
            q.scales[0] > 0.0 && reference::dequantize(&q).iter().all(|&v| v == 0.0),
            "{arithmetic:?}"
        );
    }
}

#[test]
fn rtn_rejects_bad_input() {
    let cfg = RtnConfig::autoawq(32);
    let w = vec![0.5f32; 4 * 64];
    assert_invalid(quantize_rtn(&w[1..], 4, 64, &cfg), "weight", "255 elements");
    assert_invalid(
        quantize_rtn(&w, 4, 64, &RtnConfig { group_size: 48, ..cfg }),
        "group_size",
        "48",
    );
    assert_invalid(quantize_rtn(&w, 4, 64, &RtnConfig { bits: 3, ..cfg }), "bits", "3");
    assert_invalid(
        quantize_rtn(
            &w,
            4,
            64,
            &RtnConfig {
                scale_dtype: DType::Bf16,
                ..cfg
            },
        ),
        "scale_dtype",
        "bf16",
    );
    let mut nan = w.clone();
    nan[70] = f32::NAN;
    assert_invalid(quantize_rtn(&nan, 4, 64, &cfg), "weight", "[1, 6]");
    // 1e5 is finite in f32 but not in fp16, where AutoAWQ computes.
    let mut big = w.clone();
    big[3] = 1e5;
    assert_invalid(quantize_rtn(&big, 4, 64, &cfg), "weight", "fp16");
    let f32_cfg = RtnConfig {
        arithmetic: RtnArithmetic::F32,
        scale_dtype: DType::F32,
        ..cfg
    };
    assert!(quantize_rtn(&big, 4, 64, &f32_cfg).is_ok());
}

#[test]
fn dequantize_ragged_shapes_in_both_layouts() {
    // N and K that are not multiples of the CPU kernel's tiles (8, 16, 64, 128, 256), per group and act-order, so
    // every edge of the tiled [K, N] path is taken. Power-of-two scales: every value exact in each dtype.
    let mut rng = SplitMix64(15);
    for (n, k, g, act_order) in [
        (13, 20, 20, false),
        (1, 12, 4, false),
        (37, 300, 60, true),
        (130, 520, 40, false),
    ] {
        for bits in [4u8, 8] {
            let spec = QuantSpec {
                scales: POWER_OF_TWO_SCALES,
                act_order,
                ..spec(n, k, bits, g)
            };
            let q = random_quant(&mut rng, &spec);
            let exact = reference::dequantize(&q);
            let what = format!("N={n} K={k} G={g} int{bits} act_order={act_order}");
            check_dequantize::<f32>(&q, &exact, |v| v as f32, &what);
            check_dequantize::<f16>(&q, &exact, f16::from_f64, &what);
            check_dequantize::<bf16>(&q, &exact, bf16::from_f64, &what);
        }
    }
}
