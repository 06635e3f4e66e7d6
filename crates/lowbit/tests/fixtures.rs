//! Golden fixtures produced by the reference implementations themselves (AutoAWQ 0.2.9's RTN, packer and
//! `dequantize_gemm`; compressed-tensors 0.20.0's `pack_to_int32`): see tests/fixtures/README.md.
//! Packing, unpacking, dequantization and AutoAWQ-compatible RTN must reproduce them bit for bit.

use half::f16;
use lowbit::formats::awq::{self, AwqWeight};
use lowbit::formats::compressed_tensors::{self as ct, CompressedTensorsWeight};
use lowbit::ops::dequantize::{cpu, reference, Layout};
use lowbit::quantize::{quantize_rtn, RtnArithmetic, RtnConfig};
use lowbit::{DType, QuantMatrix, Tensor};

mod common;
use common::Fixture;

fn awq_cases(fx: &Fixture) -> Vec<(String, usize, usize, usize)> {
    let cases: Vec<_> = fx
        .cases()
        .into_iter()
        .filter(|(_, kind, _)| kind == "awq")
        .map(|(name, _, args)| {
            let (n, k) = (
                args[0][0].as_u64().unwrap() as usize,
                args[0][1].as_u64().unwrap() as usize,
            );
            (name, n, k, args[1].as_u64().unwrap() as usize)
        })
        .collect();
    assert_eq!(cases.len(), 5, "fixture lists five AWQ cases");
    cases
}

fn tensor_of<'a>(tensors: &'a [(String, Tensor)], name: &str) -> &'a Tensor {
    &tensors
        .iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("{name} not written"))
        .1
}

fn read_awq(fx: &Fixture, case: &str) -> AwqWeight {
    let get = |suffix: &str| fx.get(&format!("{case}.{suffix}"));
    AwqWeight::from_tensors(case, &get(awq::QWEIGHT), &get(awq::QZEROS), &get(awq::SCALES)).unwrap()
}

/// Asserts `ours` has exactly the fixture tensor's dtype, shape and bytes.
fn assert_same_tensor(fx: &Fixture, name: &str, ours: &Tensor) {
    let want = fx.get(name);
    assert_eq!(
        (ours.dtype, &ours.shape),
        (want.dtype, &want.shape),
        "{name}: dtype/shape"
    );
    if ours.data != want.data {
        let elem = want.dtype.size();
        let i = (0..want.data.len()).find(|&i| ours.data[i] != want.data[i]).unwrap() / elem;
        panic!("{name}: element {i} differs (of {})", want.numel());
    }
}

#[test]
fn awq_unpack_then_pack_reproduces_autoawq_tensors() {
    let fx = Fixture::load();
    for (case, n, k, g) in awq_cases(&fx) {
        let w = read_awq(&fx, &case);
        assert_eq!((w.n, w.k, w.group_size), (n, k, g), "{case}");
        let repacked = AwqWeight::from_quant(&w.to_quant()).unwrap();
        let tensors = repacked.to_tensors(&case);
        for suffix in [awq::QWEIGHT, awq::QZEROS, awq::SCALES] {
            let name = format!("{case}.{suffix}");
            assert_same_tensor(&fx, &name, tensor_of(&tensors, &name));
        }
    }
}

#[test]
fn awq_dequantize_reproduces_dequantize_gemm() {
    let fx = Fixture::load();
    for (case, n, k, _) in awq_cases(&fx) {
        let q = read_awq(&fx, &case).to_quant();
        let mut ours = vec![f16::ZERO; n * k];
        cpu::dequantize(&q, Layout::Kn, &mut ours).unwrap();
        let want: Vec<f16> = fx
            .get(&format!("{case}.dequantized"))
            .to_f32()
            .unwrap()
            .into_iter()
            .map(f16::from_f32)
            .collect();
        let diff = (0..n * k).filter(|&i| ours[i].to_bits() != want[i].to_bits()).count();
        assert_eq!(diff, 0, "{case}: {diff} of {} dequantized values differ", n * k);
        // The f32 kernel is exact: it equals the f64 reference value for value.
        let mut ours_f32 = vec![0f32; n * k];
        cpu::dequantize(&q, Layout::Nk, &mut ours_f32).unwrap();
        let exact = reference::dequantize(&q);
        assert!(
            ours_f32.iter().zip(&exact).all(|(&a, &b)| a as f64 == b),
            "{case}: f32 != reference"
        );
    }
}

#[test]
fn awq_rtn_in_fp16_reproduces_autoawq_bit_for_bit() {
    let fx = Fixture::load();
    for (case, n, k, g) in awq_cases(&fx) {
        let weight = fx.get(&format!("{case}.weight")).to_f32().unwrap();
        let q = quantize_rtn(&weight, n, k, &RtnConfig::autoawq(g)).unwrap();
        let tensors = AwqWeight::from_quant(&q).unwrap().to_tensors(&case);
        for suffix in [awq::QWEIGHT, awq::QZEROS, awq::SCALES] {
            let name = format!("{case}.{suffix}");
            assert_same_tensor(&fx, &name, tensor_of(&tensors, &name));
        }
    }
}

#[test]
fn awq_rtn_in_f32_agrees_on_most_codes() {
    // The fixture README: f32 RTN agrees with AutoAWQ's fp16 codes on 99.5–99.9% of weights (ties break
    // differently); require >= 99.5%, and never more than 2 steps apart.
    let fx = Fixture::load();
    for (case, n, k, g) in awq_cases(&fx) {
        let weight = fx.get(&format!("{case}.weight")).to_f32().unwrap();
        let cfg = RtnConfig {
            arithmetic: RtnArithmetic::F32,
            ..RtnConfig::autoawq(g)
        };
        let ours = quantize_rtn(&weight, n, k, &cfg).unwrap();
        let theirs = read_awq(&fx, &case).to_quant();
        let same = ours.codes.iter().zip(&theirs.codes).filter(|(a, b)| a == b).count();
        let worst = ours
            .codes
            .iter()
            .zip(&theirs.codes)
            .map(|(&a, &b)| a.abs_diff(b))
            .max()
            .unwrap();
        let agreement = same as f64 / (n * k) as f64;
        println!(
            "{case}: f32 RTN agrees on {:.3}% of codes, worst {worst} steps",
            agreement * 100.0
        );
        assert!(agreement >= 0.995, "{case}: agreement {agreement}");
        assert!(worst <= 2, "{case}: codes {worst} steps apart");
    }
}

#[test]
fn awq_matmul_matches_gpu_output() {
    // y = x · dequantized was computed in f32 on the GPU; ours accumulates in f64. Tolerance: f32 accumulation
    // error is ~sqrt(K)·2^-24·Σ|x·w| (observed <= 9e-8·Σ|x·w|), so allow 1e-6·Σ|x·w|; a bound relative to |y|
    // alone fails at cancellations.
    let fx = Fixture::load();
    for (case, n, k, _) in awq_cases(&fx) {
        // AutoAWQ's dequantized weight is fp16 (each (q - z)·s rounded once), and y was computed from it.
        let mut w = vec![f16::ZERO; n * k];
        cpu::dequantize(&read_awq(&fx, &case).to_quant(), Layout::Nk, &mut w).unwrap();
        let x = fx.get(&format!("{case}.x")).to_f32().unwrap();
        let y = fx.get(&format!("{case}.y")).to_f32().unwrap();
        let m = x.len() / k;
        let mut worst = 0f64;
        for row in 0..m {
            for col in 0..n {
                let terms = (0..k).map(|i| x[row * k + i] as f64 * w[col * k + i].to_f64());
                let (sum, magnitude) = terms.fold((0.0, 0.0), |(s, a), t| (s + t, a + t.abs()));
                let err = (sum - y[row * n + col] as f64).abs() / magnitude.max(f64::MIN_POSITIVE);
                worst = worst.max(err);
            }
        }
        println!("{case}: worst |Δy| / Σ|x·w| = {worst:.2e}");
        assert!(worst <= 1e-6, "{case}: {worst}");
    }
}

fn ct_cases(fx: &Fixture) -> Vec<(String, usize, usize, usize, bool)> {
    let cases: Vec<_> = fx
        .cases()
        .into_iter()
        .filter(|(_, kind, _)| kind == "ct")
        .map(|(name, _, a)| {
            let dim = |i: usize| a[i].as_u64().unwrap() as usize;
            (name, dim(0), dim(1), dim(2), a[3].as_bool().unwrap())
        })
        .collect();
    assert_eq!(cases.len(), 2, "fixture lists two compressed-tensors cases");
    cases
}

fn read_ct(fx: &Fixture, case: &str) -> CompressedTensorsWeight {
    let get = |suffix: &str| fx.get(&format!("{case}.{suffix}"));
    let zp_name = format!("{case}.{}", ct::WEIGHT_ZERO_POINT);
    let zp = fx.has(&zp_name).then(|| fx.get(&zp_name));
    CompressedTensorsWeight::from_tensors(
        case,
        4,
        &get(ct::WEIGHT_PACKED),
        &get(ct::WEIGHT_SCALE),
        zp.as_ref(),
        None,
        None,
    )
    .unwrap()
}

/// Unsigned codes as compressed-tensors' signed int8 values.
fn signed(codes: &[u8]) -> Vec<i8> {
    codes.iter().map(|&c| c as i8 - 8).collect()
}

#[test]
fn ct_unpack_reproduces_codes_and_zero_points() {
    let fx = Fixture::load();
    for (case, n, k, g, symmetric) in ct_cases(&fx) {
        let q = read_ct(&fx, &case).to_quant();
        assert_eq!((q.n, q.k, q.group_size), (n, k, g), "{case}");
        assert_eq!(
            signed(&q.codes),
            fx.get(&format!("{case}.q")).to_i8().unwrap(),
            "{case}.q"
        );
        match (&q.zeros, symmetric) {
            (None, true) => {}
            (Some(z), false) => {
                assert_eq!(
                    signed(z),
                    fx.get(&format!("{case}.zero_point")).to_i8().unwrap(),
                    "{case}.zero_point"
                )
            }
            (z, _) => panic!("{case}: symmetric = {symmetric} but zeros present = {}", z.is_some()),
        }
    }
}

#[test]
fn ct_pack_reproduces_pack_to_int32() {
    let fx = Fixture::load();
    for (case, n, k, g, symmetric) in ct_cases(&fx) {
        // Pack from the fixture's plain int8 codes, not from our own unpacking.
        let to_code = |v: Vec<i8>| v.into_iter().map(|x| (x + 8) as u8).collect::<Vec<u8>>();
        let q = QuantMatrix {
            n,
            k,
            bits: 4,
            group_size: g,
            codes: to_code(fx.get(&format!("{case}.q")).to_i8().unwrap()),
            zeros: (!symmetric).then(|| to_code(fx.get(&format!("{case}.zero_point")).to_i8().unwrap())),
            scales: fx.get(&format!("{case}.{}", ct::WEIGHT_SCALE)).to_f32().unwrap(),
            scale_dtype: DType::F16,
            g_idx: None,
        };
        let tensors = CompressedTensorsWeight::from_quant(&q).unwrap().to_tensors(&case);
        let mut suffixes = vec![ct::WEIGHT_PACKED, ct::WEIGHT_SCALE];
        if !symmetric {
            suffixes.push(ct::WEIGHT_ZERO_POINT);
        }
        for suffix in suffixes {
            let name = format!("{case}.{suffix}");
            assert_same_tensor(&fx, &name, tensor_of(&tensors, &name));
        }
        assert_eq!(
            tensors.iter().any(|(name, _)| name.ends_with(ct::WEIGHT_ZERO_POINT)),
            !symmetric,
            "{case}: zero point written iff asymmetric"
        );
    }
}
