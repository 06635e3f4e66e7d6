//! `LinearCpu` against the f64 reference on the same quantized weights (shared/testing.md, W4A16 matrix slice),
//! plus exact-integer bit equality, batch invariance, determinism and typed errors for bad arguments.

use half::{bf16, f16};
use lowbit::formats::awq::AwqWeight;
use lowbit::ops::linear::{reference, CpuIsa, LinearCpu};
use lowbit::testing::{random_quant, QuantSpec, Scales, SplitMix64, Zeros};
use lowbit::{DType, Float};

mod common;
use common::{assert_close, invalid_tensor, to_f32, Fixture, Tolerance};

/// An `[n, k]` weight with checkpoint-like scales (the exact f16 values of 0.002..0.022), zero codes random or
/// symmetric.
fn weight_spec(n: usize, k: usize, group_size: usize, bits: u8, zeros: bool, act_order: bool) -> QuantSpec {
    QuantSpec {
        zeros: if zeros {
            Zeros::Random(0, ((1u16 << bits) - 1) as u8)
        } else {
            Zeros::Symmetric
        },
        scales: Scales::Uniform { lo: 0.002, hi: 0.022 },
        act_order,
        ..QuantSpec::new(n, k, bits, group_size)
    }
}

/// One run of the kernel: `m` rows of activations (exactly representable in `T`) at `stride`, padding set to NaN
/// so reading it would show; returns the exact f32 activations (for the reference) and the kernel's output.
fn run_kernel<T: Float>(lin: &LinearCpu, x: &[f32], m: usize, stride: usize, bias: Option<&[f32]>) -> Vec<T> {
    let k = lin.k();
    let mut xt = vec![T::from_f32(f32::NAN); (m - 1) * stride + k];
    for row in 0..m {
        for i in 0..k {
            xt[row * stride + i] = T::from_f32(x[row * k + i]);
        }
    }
    let mut y = vec![T::from_f32(f32::NAN); m * lin.n()];
    lin.forward(&xt, m, stride, bias, &mut y).expect("forward");
    y
}

/// Activations rounded to `dtype`, kept as their exact f32 values.
fn activations(rng: &mut SplitMix64, len: usize, scale: f32, dtype: DType) -> Vec<f32> {
    (0..len)
        .map(|_| lowbit::dtype::round_to(dtype, rng.signed_unit() * scale))
        .collect()
}

/// Tolerance on the reference, per output dtype: f32 accumulation over K ≤ 4160 (sum-of-x trick included) stays
/// near 1e-6 relative, so 1e-5; f16 and bf16 add one output rounding (2^-11, 2^-8 relative at most).
fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-5,
        DType::F16 => 1e-3,
        _ => 8e-3,
    }
}

#[derive(Debug, Clone, Copy)]
struct Case {
    m: usize,
    w: QuantSpec,
    dtype: DType,
    bias: bool,
    x_scale: f32,
    stride_pad: usize,
}

fn check_case(rng: &mut SplitMix64, c: Case, isa: CpuIsa) {
    let w = random_quant(rng, &c.w);
    let lin = LinearCpu::with_isa(&w, isa).expect("weight accepted");
    let x = activations(rng, c.m * c.w.k, c.x_scale, c.dtype);
    let bias: Option<Vec<f32>> = c.bias.then(|| (0..c.w.n).map(|_| rng.signed_unit()).collect());
    let want = reference::linear(&x, c.m, &w, bias.as_deref());
    let stride = c.w.k + c.stride_pad;
    let got = match c.dtype {
        DType::F32 => run_kernel::<f32>(&lin, &x, c.m, stride, bias.as_deref()),
        DType::F16 => to_f32(&run_kernel::<f16>(&lin, &x, c.m, stride, bias.as_deref())),
        _ => to_f32(&run_kernel::<bf16>(&lin, &x, c.m, stride, bias.as_deref())),
    };
    let what = format!("{c:?} on {}", isa.name());
    assert_close(&what, &got, &want, Tolerance::relative(tolerance(c.dtype)));
}

/// A slice of the W4A16 matrix: every M, N, (K, G), dtype and option appears, combined by cycling lists of
/// coprime lengths instead of the full product (which would take minutes in a debug build).
fn matrix_cases() -> Vec<Case> {
    const MS: [usize; 14] = [1, 2, 3, 7, 8, 13, 16, 17, 31, 32, 33, 64, 127, 129];
    const NS: [usize; 3] = [64, 192, 576];
    // (K, G): 4160 only with the groups that divide it.
    const KGS: [(usize, usize); 11] = [
        (128, 32),
        (128, 64),
        (128, 128),
        (192, 64),
        (192, 192),
        (384, 32),
        (384, 128),
        (384, 384),
        (4160, 32),
        (4160, 64),
        (4160, 4160),
    ];
    const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::Bf16];
    (0..2 * MS.len() * KGS.len() / 3)
        .map(|i| {
            let (k, group) = KGS[i % KGS.len()];
            let mut m = MS[i % MS.len()];
            if k > 1000 && m > 33 {
                m = m % 33 + 1; // long K only with small batches: the reference is slow unoptimised
            }
            Case {
                m,
                w: weight_spec(
                    NS[i % NS.len()],
                    k,
                    group,
                    if i % 4 == 3 { 8 } else { 4 },
                    i % 2 == 0,
                    i % 5 == 1 && group < k,
                ),
                dtype: DTYPES[i % DTYPES.len()],
                bias: i % 7 < 3,
                x_scale: if i % 5 == 4 { 100.0 } else { 1.0 },
                stride_pad: if i % 3 == 1 { 5 + i % 11 } else { 0 },
            }
        })
        .collect()
}

#[test]
fn matches_reference_across_matrix() {
    let mut rng = SplitMix64(0x11);
    let cases = matrix_cases();
    for c in &cases {
        check_case(&mut rng, *c, CpuIsa::detect());
    }
    // The portable kernels (what a CPU without AVX2 runs) on every third case.
    for c in cases.iter().step_by(3) {
        check_case(&mut rng, *c, CpuIsa::Portable);
    }
}

/// Exact-integer mode: small integer activations, power-of-two scales, integer zeros and bias, K small enough that
/// every partial sum is an exact f32. Any wrong nibble, permutation or scale index changes bits, so require equality.
#[test]
fn exact_integer_mode_is_bit_equal() {
    let mut rng = SplitMix64(0x22);
    for (i, &(m, n, k, group, bits)) in [
        (1, 64, 128, 32, 4),
        (3, 192, 256, 64, 4),
        (8, 48, 384, 128, 4),
        (13, 64, 192, 192, 8),
        (33, 80, 256, 32, 8),
        (70, 24, 128, 64, 4),
        (129, 16, 96, 32, 4),
    ]
    .iter()
    .enumerate()
    {
        let spec = QuantSpec {
            scales: Scales::PowerOfTwo {
                min_exp: -3,
                max_exp: 0,
            },
            ..weight_spec(n, k, group, bits, i % 2 == 0, i % 3 == 1)
        };
        let w = random_quant(&mut rng, &spec);
        let x: Vec<f32> = (0..m * k).map(|_| rng.below(9) as f32 - 4.0).collect();
        let bias: Vec<f32> = (0..n).map(|_| rng.below(17) as f32 - 8.0).collect();
        let bias = (i % 2 == 1).then_some(&bias[..]);
        let want: Vec<f32> = reference::linear(&x, m, &w, bias).iter().map(|&v| v as f32).collect();
        for isa in [CpuIsa::detect(), CpuIsa::Portable] {
            let lin = LinearCpu::with_isa(&w, isa).unwrap();
            let what = format!("{spec:?} m={m} on {}", isa.name());
            let got = run_kernel::<f32>(&lin, &x, m, k, bias);
            assert!(
                got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{what}: f32 not bit-equal"
            );
            // f16/bf16 outputs are the exact result rounded once.
            let got = run_kernel::<f16>(&lin, &x, m, k, bias);
            assert!(
                got.iter().zip(&want).all(|(a, &b)| *a == f16::from_f32(b)),
                "{what}: f16 not bit-equal"
            );
            let got = run_kernel::<bf16>(&lin, &x, m, k, bias);
            assert!(
                got.iter().zip(&want).all(|(a, &b)| *a == bf16::from_f32(b)),
                "{what}: bf16 not bit-equal"
            );
        }
    }
}

/// Each row of an M-row batch equals that row computed alone, bit for bit, on both the decode-as-you-go (small M)
/// and the decoded-tile (large M) paths, whatever the threads do.
#[test]
fn batch_rows_equal_single_row_results() {
    let mut rng = SplitMix64(0x33);
    for (i, &m) in [2usize, 3, 4, 7, 16, 17, 64, 97, 129].iter().enumerate() {
        // N = 200: not a multiple of the 16-column tile.
        let spec = weight_spec(200, 384, 128, if i % 2 == 0 { 4 } else { 8 }, true, i % 3 == 2);
        let w = random_quant(&mut rng, &spec);
        let x = activations(&mut rng, m * spec.k, 3.0, DType::F32);
        let bias: Vec<f32> = (0..spec.n).map(|_| rng.signed_unit()).collect();
        for isa in [CpuIsa::detect(), CpuIsa::Portable] {
            let lin = LinearCpu::with_isa(&w, isa).unwrap();
            let batch = run_kernel::<f32>(&lin, &x, m, spec.k, Some(&bias));
            for row in [0, m / 2, m - 1] {
                let alone = run_kernel::<f32>(&lin, &x[row * spec.k..(row + 1) * spec.k], 1, spec.k, Some(&bias));
                let batch_row = &batch[row * spec.n..(row + 1) * spec.n];
                assert!(
                    batch_row.iter().zip(&alone).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "m={m} row {row} on {}: batch row differs from the single-row result",
                    isa.name()
                );
            }
        }
    }
}

#[test]
fn repeated_runs_are_identical() {
    let mut rng = SplitMix64(0x44);
    let spec = weight_spec(576, 4160, 64, 4, true, true);
    let w = random_quant(&mut rng, &spec);
    let lin = LinearCpu::new(&w).unwrap();
    for m in [1, 40] {
        let x = activations(&mut rng, m * spec.k, 1.0, DType::Bf16);
        let first = run_kernel::<bf16>(&lin, &x, m, spec.k, None);
        for _ in 0..3 {
            assert_eq!(
                first,
                run_kernel::<bf16>(&lin, &x, m, spec.k, None),
                "m={m}: runs differ"
            );
        }
    }
}

/// Activations scaled ×100 into f16 outputs: f32 accumulation must not overflow where fp16 accumulation would.
#[test]
fn large_activations_into_f16() {
    let mut rng = SplitMix64(0x55);
    let case = Case {
        m: 17,
        w: weight_spec(192, 4160, 4160, 4, false, false),
        dtype: DType::F16,
        bias: true,
        x_scale: 100.0,
        stride_pad: 3,
    };
    check_case(&mut rng, case, CpuIsa::detect());
}

#[test]
fn bad_arguments_give_typed_errors() {
    let mut rng = SplitMix64(0x66);
    let (n, k) = (64, 128);
    let w = random_quant(&mut rng, &weight_spec(n, k, 32, 4, true, false));
    let lin = LinearCpu::new(&w).unwrap();
    let x = vec![0.5f32; 3 * k];
    let mut y = vec![0.0f32; 3 * n];
    let bias = vec![1.0f32; n];
    let err = invalid_tensor::<()>;
    // x one element short, and longer than M rows of the stride.
    assert_eq!(err(lin.forward(&x[..3 * k - 1], 3, k, None, &mut y)), "x");
    assert_eq!(err(lin.forward(&x, 2, k, None, &mut y[..2 * n])), "x");
    // y of the wrong length.
    assert_eq!(err(lin.forward(&x, 3, k, None, &mut y[..3 * n - 1])), "y");
    // a stride shorter than K, and one whose rows run past x.
    assert_eq!(err(lin.forward(&x, 3, k - 1, None, &mut y)), "x_row_stride");
    assert_eq!(err(lin.forward(&x, 3, k + 1, None, &mut y)), "x");
    // bias of the wrong length.
    assert_eq!(err(lin.forward(&x, 3, k, Some(&bias[..n - 1]), &mut y)), "bias");
    // Nothing was written by the rejected calls; a valid call still works, tight or padded views alike.
    assert!(y.iter().all(|&v| v == 0.0));
    lin.forward(&x, 3, k, Some(&bias), &mut y).unwrap();
    lin.forward(&x[..k + 7 + k], 2, k + 7, None, &mut y[..2 * n]).unwrap();
    lin.forward::<f32>(&[], 0, k, None, &mut []).unwrap();

    // Weights that break their invariants are rejected when prepared.
    let mut bad = w.clone();
    bad.codes[5] = 16;
    assert_eq!(invalid_tensor(LinearCpu::new(&bad)), "codes");
    let mut bad = w.clone();
    bad.scales[3] = f32::NAN;
    assert_eq!(invalid_tensor(LinearCpu::new(&bad)), "scales");
    let mut bad = w;
    bad.scales.pop();
    assert_eq!(invalid_tensor(LinearCpu::new(&bad)), "scales");
}

/// AutoAWQ's own checkpoint tensors through lowbit's AWQ unpacking and `LinearCpu` (f16 output), against AutoAWQ's
/// `x · dequantize_gemm(...)` (f32 on a GPU). Tolerance 1e-3 (measured ~3e-4): AutoAWQ's dequantized weight carries
/// one fp16 rounding per element that lowbit's exact dequantization does not, and the f16 output one more (each at
/// most 2^-11 relative).
#[test]
fn matches_autoawq_fixture() {
    let fx = Fixture::load();
    for case in [
        "awq_rand_k256_n128_g128",
        "awq_rand_k512_n192_g64",
        "awq_rand_k128_n64_g32",
        "awq_minilm_l0_query_g128",
        "awq_minilm_l2_ffn_up_g128",
    ] {
        let part = |suffix: &str| fx.get(&format!("{case}.{suffix}"));
        let w = AwqWeight::from_tensors(case, &part("qweight"), &part("qzeros"), &part("scales"))
            .expect("AutoAWQ tensors unpack")
            .to_quant();
        let x = part("x").to_f32().unwrap();
        let want: Vec<f64> = part("y").to_f32().unwrap().iter().map(|&v| f64::from(v)).collect();
        let m = x.len() / w.k;
        let lin = LinearCpu::new(&w).unwrap();
        let got = to_f32(&run_kernel::<f16>(&lin, &x, m, w.k, None));
        assert_close(case, &got, &want, Tolerance::relative(1e-3));
    }
}
