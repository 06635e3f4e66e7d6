//! Per-block quantized convolution on the CPU against the f64 reference, on the same quantized weights.
//!
//! Tolerances (stated per test): f32 activations/outputs accumulate in f32 over at most a few thousand taps, so
//! the mean relative error is ~1e-7 and we allow 1e-5; f16/bf16 outputs carry their own rounding (2^-11 / 2^-8
//! relative), so we allow 1e-3 / 8e-3 mean relative. The exact-integer mode requires bit equality.

use half::{bf16, f16};
use lowbit::formats::block::{BlockBits, BlockQuantWeight, BlockShape};
use lowbit::ops::conv::cpu::Conv2dCpu;
use lowbit::ops::conv::{reference, same_padding, Activation, Conv2dParams};
use lowbit::testing::SplitMix64;
use lowbit::{Error, Float};

mod common;
use common::{assert_bits_equal, assert_close, from_f32, invalid_tensor, to_f32, Tolerance};

/// One convolution configuration.
#[derive(Debug, Clone, Copy)]
struct Case {
    batch: usize,
    ci: usize,
    co: usize,
    hw: (usize, usize),
    kernel: (usize, usize),
    blocks: usize,
    bits: BlockBits,
    params: Conv2dParams,
}

impl Case {
    /// The input shape `[batch, ci, h, w]`.
    fn input(&self) -> [usize; 4] {
        [self.batch, self.ci, self.hw.0, self.hw.1]
    }

    /// Whether `weight` and the input fit this configuration (a kernel larger than the padded input does not);
    /// the CPU kernel's answer.
    fn fits(&self, weight: &BlockQuantWeight) -> lowbit::Result<()> {
        Conv2dCpu::new(weight, None, self.params).and_then(|c| c.output_shape(self.input()).map(drop))
    }
}

fn make_weight(rng: &mut SplitMix64, case: &Case) -> BlockQuantWeight {
    let shape = BlockShape::conv(case.co, case.ci / case.params.groups, case.kernel, case.blocks).unwrap();
    let dense = rng.vec(shape.rows * shape.cols(), -0.5, 0.5);
    BlockQuantWeight::quantize(&dense, shape, case.bits).unwrap()
}

/// Runs `case` with activations of type `T` and checks the CPU kernel against the reference with tolerance
/// `mean_rel_tol` (mean |Δ| / mean |ref|) and `max_rel_tol` (max |Δ| relative to max |ref|, floored at 1).
fn check_case<T: Float>(rng: &mut SplitMix64, case: &Case, mean_rel_tol: f64, max_rel_tol: f64) {
    let weight = make_weight(rng, case);
    let bias = rng.vec(case.co, -1.0, 1.0);
    let input = case.input();
    let x: Vec<T> = from_f32(&rng.vec(input.iter().product(), -1.0, 1.0));
    let want = reference::conv2d(&to_f32(&x), input, &weight, Some(&bias), &case.params).unwrap();
    let conv = Conv2dCpu::new(&weight, Some(&bias), case.params).unwrap();
    let got = to_f32(&conv.forward(&x, input).unwrap());
    let what = format!("{case:?} {}", T::DTYPE);
    assert_close(&what, &got, &want, Tolerance::floored(mean_rel_tol, max_rel_tol));
}

/// Divisors of `n`.
fn divisors(n: usize) -> Vec<usize> {
    (1..=n).filter(|d| n % d == 0).collect()
}

/// A random configuration from testing.md's convolution matrix (the small end of it, for debug-build speed):
/// batch {1, 2}, channels {1, 3, 10, 17, 64}, spatial {1, 7, 9}, kernels {1×1, 3×3, 5×5, 1×7, 7×1}, stride {1, 2},
/// dilation {1, 2}, padding {0, 1, same}, groups {1, depthwise, a common divisor}, int4/int8, none/relu/relu6.
fn random_case(rng: &mut SplitMix64) -> Case {
    let channels = [1, 3, 10, 17, 64];
    let kernel = rng.pick(&[(1, 1), (3, 3), (5, 5), (1, 7), (7, 1)]);
    let dilation = rng.pick(&[(1, 1), (2, 2), (1, 2)]);
    let padding = match rng.int(0, 2) {
        0 => (0, 0),
        1 => (1, 1),
        _ => same_padding(kernel, dilation),
    };
    let ci = rng.pick(&channels);
    let (co, groups) = match rng.int(0, 2) {
        0 => (rng.pick(&channels), 1),
        // Depthwise, channel multiplier 1 or 2.
        1 => {
            let mult = rng.int(1, 2) as usize;
            (ci * mult, ci)
        }
        _ => {
            let co = rng.pick(&channels);
            let common: Vec<usize> = divisors(ci).into_iter().filter(|d| co % d == 0).collect();
            (co, rng.pick(&common))
        }
    };
    let stride = rng.pick(&[(1, 1), (2, 2), (2, 1)]);
    let side = rng.pick(&[1, 7, 9]);
    Case {
        batch: rng.int(1, 2) as usize,
        ci,
        co,
        hw: (side, rng.pick(&[side, 7])),
        kernel,
        blocks: rng.pick(&divisors(ci / groups)),
        bits: rng.pick(&[BlockBits::Int4, BlockBits::Int8]),
        params: Conv2dParams {
            stride,
            padding,
            dilation,
            groups,
            activation: rng.pick(&[Activation::None, Activation::Relu, Activation::Relu6]),
        },
    }
}

#[test]
fn matches_reference_over_matrix_slice() {
    let mut rng = SplitMix64(0x5EED_0001);
    let (mut ran, mut rejected) = (0, 0);
    for _ in 0..160 {
        let case = random_case(&mut rng);
        let weight = make_weight(&mut rng, &case);
        let input = case.input();
        // Configurations whose kernel does not fit must be rejected the same way by both.
        if let Err(e) = case.fits(&weight) {
            assert!(matches!(e, Error::Invalid { .. }), "{case:?}: {e}");
            let x = vec![1.0f32; input.iter().product()];
            assert!(reference::conv2d(&x, input, &weight, None, &case.params).is_err());
            rejected += 1;
            continue;
        }
        // Tolerance: f32 accumulation over ≤ 64·25 taps, see the file header.
        check_case::<f32>(&mut rng, &case, 1e-5, 1e-5);
        ran += 1;
    }
    println!("ran {ran} configurations, {rejected} rejected as impossible");
    assert!(ran >= 100, "too few runnable cases: {ran}");
}

#[test]
fn half_precision_activations() {
    let mut rng = SplitMix64(0x5EED_0002);
    let mut ran = 0;
    while ran < 24 {
        let case = random_case(&mut rng);
        if case.fits(&make_weight(&mut rng, &case)).is_err() {
            continue;
        }
        // Tolerance: output rounding of f16 (2^-11) and bf16 (2^-8) dominates; max is one rounding step of the
        // largest output.
        check_case::<f16>(&mut rng, &case, 1e-3, 1e-3);
        check_case::<bf16>(&mut rng, &case, 8e-3, 8e-3);
        ran += 1;
    }
}

#[test]
fn larger_shapes() {
    use Activation::{Relu, Relu6};
    use BlockBits::{Int4, Int8};
    let mut rng = SplitMix64(0x5EED_0003);
    let base = Conv2dParams::default();
    #[rustfmt::skip]
    let cases = [
        // (batch, ci, co, hw, kernel, blocks, bits, params)
        // 3×3 same, 64 → 64 on 28×28: several pixel tiles and channel panels.
        (1, 64, 64, (28, 28), (3, 3), 4, Int4, Conv2dParams { padding: (1, 1), activation: Relu, ..base }),
        // Pointwise (the plain-GEMM path), batch 2, blocks of 16 channels.
        (2, 64, 40, (14, 14), (1, 1), 4, Int8, base),
        // Pointwise GEMV: one pixel, many output channels (channel chunks split across threads).
        (1, 256, 256, (1, 1), (1, 1), 8, Int4, base),
        // Depthwise 5×5 stride 2 relu6.
        (2, 32, 32, (28, 28), (5, 5), 1, Int8,
         Conv2dParams { stride: (2, 2), padding: (2, 2), groups: 32, activation: Relu6, ..base }),
        // K = 40·25 = 1000 in chunks of 256 columns, blocks of 200 columns straddling the chunks.
        (2, 40, 20, (12, 11), (5, 5), 5, Int4,
         Conv2dParams { stride: (2, 1), padding: (2, 3), dilation: (1, 2), ..base }),
        // Depthwise with channel multiplier 3, dilated, "same" padding (the direct path).
        (1, 8, 24, (13, 10), (3, 3), 1, Int8,
         Conv2dParams { padding: same_padding((3, 3), (2, 2)), dilation: (2, 2), groups: 8, ..base }),
    ];
    for (batch, ci, co, hw, kernel, blocks, bits, params) in cases {
        let case = Case {
            batch,
            ci,
            co,
            hw,
            kernel,
            blocks,
            bits,
            params,
        };
        // Tolerance: f32 accumulation over ≤ 1000 taps.
        check_case::<f32>(&mut rng, &case, 1e-5, 1e-5);
    }
}

/// Small integer activations, power-of-two scales and integer/half-integer offsets: every product and partial sum
/// is exact in f32, so the CPU kernel must equal the reference bit for bit.
#[test]
fn exact_integer_mode_is_bit_exact() {
    let mut rng = SplitMix64(0x5EED_0004);
    let mut ran = 0;
    while ran < 40 {
        let case = random_case(&mut rng);
        let shape = BlockShape::conv(case.co, case.ci / case.params.groups, case.kernel, case.blocks).unwrap();
        let (lo, hi) = (case.bits.q_min(), case.bits.q_max());
        let codes = (0..shape.rows * shape.cols()).map(|_| rng.int(lo, hi) as i8).collect();
        let params = shape.rows * shape.blocks();
        let scales = (0..params).map(|_| rng.pick(&[0.25, 0.5, 1.0, 2.0])).collect();
        let offsets = (0..params).map(|_| rng.int(-8, 8) as f32 * 0.5).collect();
        let weight = BlockQuantWeight::from_parts(shape, case.bits, codes, scales, offsets).unwrap();
        if case.fits(&weight).is_err() {
            continue;
        }
        let input = case.input();
        let bias: Vec<f32> = (0..case.co).map(|_| rng.int(-4, 4) as f32).collect();
        let conv = Conv2dCpu::new(&weight, Some(&bias), case.params).unwrap();
        let x: Vec<f32> = (0..input.iter().product()).map(|_| rng.int(-3, 3) as f32).collect();
        let want = reference::conv2d(&x, input, &weight, Some(&bias), &case.params).unwrap();
        let got = conv.forward(&x, input).unwrap();
        assert_bits_equal(&format!("{case:?}"), &got, &want);
        ran += 1;
    }
}

/// Hand-computed: the block parameter of (co, ci) is `co · blocks + ci / ci_per_block`, shared by all taps.
#[test]
fn block_parameters_index_input_channels_and_are_shared_by_taps() {
    // Co = 2, Ci = 4, kernel 1×2, 2 blocks of 2 channels.
    let shape = BlockShape::conv(2, 4, (1, 2), 2).unwrap();
    let codes: Vec<i8> = (0..16).map(|v| v as i8 - 8).collect(); // [co][ci][tap]
    let scales = vec![1.0, 10.0, 2.0, 20.0];
    let offsets = vec![0.0, 100.0, -1.0, 0.5];
    let weight = BlockQuantWeight::from_parts(shape, BlockBits::Int4, codes.clone(), scales, offsets).unwrap();
    // Input 1×4×1×2 of ones, no padding: out[co] = Σ over all (ci, tap) of w.
    let x = vec![1.0f32; 8];
    let params = Conv2dParams::default();
    let want: Vec<f64> = (0..2)
        .map(|co| {
            (0..8)
                .map(|i| {
                    let ci = i / 2;
                    let p = co * 2 + ci / 2;
                    let (s, o) = ([1.0, 10.0, 2.0, 20.0][p], [0.0, 100.0, -1.0, 0.5][p]);
                    codes[co * 8 + i] as f64 * s + o
                })
                .sum()
        })
        .collect();
    // co 0: (−8−7−6−5)·1 + 0 + (−4−3−2−1)·10 + 4·100 = 274; co 1: (0+1+2+3)·2 − 4 + (4+5+6+7)·20 + 4·0.5 = 450.
    assert_eq!(want, vec![274.0, 450.0]);
    let got_ref = reference::conv2d(&x, [1, 4, 1, 2], &weight, None, &params).unwrap();
    assert_eq!(got_ref, want);
    let got = Conv2dCpu::new(&weight, None, params)
        .unwrap()
        .forward(&x, [1, 4, 1, 2])
        .unwrap();
    assert_eq!(got, want.iter().map(|&v| v as f32).collect::<Vec<_>>());
}

#[test]
fn mnn_int4_byte_order_round_trips() {
    // Even input channel in the high nibble, stored as q + 8.
    let shape = BlockShape::conv(1, 4, (1, 1), 1).unwrap();
    let bytes = [0x0F, 0xB7];
    let w = BlockQuantWeight::from_mnn_int4_bytes(shape, &bytes, vec![1.0], vec![0.0]).unwrap();
    assert_eq!(w.codes(), &[-8, 7, 3, -1]);
    assert_eq!(w.to_mnn_int4_bytes().unwrap(), bytes);

    // Random shapes with taps and odd channel counts: bytes [Co, Kh, Kw, ⌈Ci/2⌉] round-trip; the odd padding
    // nibble is written as 8.
    let mut rng = SplitMix64(0x5EED_0005);
    for &(co, ci, kernel, blocks) in &[
        (3, 6, (3, 3), 3),
        (2, 5, (1, 7), 1),
        (4, 17, (7, 1), 17),
        (1, 1, (1, 1), 1),
    ] {
        let shape = BlockShape::conv(co, ci, kernel, blocks).unwrap();
        let taps = kernel.0 * kernel.1;
        let pairs = ci.div_ceil(2);
        let mut bytes: Vec<u8> = (0..co * taps * pairs).map(|_| rng.next_u64() as u8).collect();
        if ci % 2 == 1 {
            for b in bytes.iter_mut().skip(pairs - 1).step_by(pairs) {
                *b = (*b & 0xF0) | 8;
            }
        }
        let params = co * blocks;
        let w =
            BlockQuantWeight::from_mnn_int4_bytes(shape, &bytes, rng.vec(params, 0.1, 1.0), rng.vec(params, -1.0, 1.0))
                .unwrap();
        assert_eq!(
            w.to_mnn_int4_bytes().unwrap(),
            bytes,
            "co {co} ci {ci} kernel {kernel:?}"
        );
        // The code of (co, ci, tap) is the nibble of byte [co, tap, ci/2], high for even ci.
        for r in 0..co {
            for c in 0..ci {
                for t in 0..taps {
                    let b = bytes[(r * taps + t) * pairs + c / 2];
                    let nibble = if c % 2 == 0 { b >> 4 } else { b & 15 };
                    assert_eq!(w.codes()[(r * ci + c) * taps + t], nibble as i8 - 8);
                }
            }
        }
    }
}

#[test]
fn quantize_round_trip_error_within_half_step() {
    let mut rng = SplitMix64(0x5EED_0006);
    for bits in [BlockBits::Int4, BlockBits::Int8] {
        let shape = BlockShape::conv(8, 12, (3, 3), 3).unwrap();
        let dense = rng.vec(shape.rows * shape.cols(), -2.0, 2.0);
        let w = BlockQuantWeight::quantize(&dense, shape, bits).unwrap();
        let deq = w.dequantize();
        for (i, (&a, &b)) in dense.iter().zip(&deq).enumerate() {
            let (row, ci) = (i / shape.cols(), i % shape.cols() / 9);
            let step = w.scales()[w.param_index(row, ci)];
            // Half a step, plus f32 rounding of q·scale + offset.
            assert!(
                (a - b).abs() <= 0.5 * step * (1.0 + 1e-5) + 1e-6,
                "{bits:?} {i}: {a} vs {b}"
            );
        }
    }
}

#[test]
fn deterministic_and_batch_independent() {
    let mut rng = SplitMix64(0x5EED_0007);
    let case = Case {
        batch: 3,
        ci: 10,
        co: 17,
        hw: (9, 7),
        kernel: (3, 3),
        blocks: 5,
        bits: BlockBits::Int4,
        params: Conv2dParams {
            padding: (1, 1),
            ..Conv2dParams::default()
        },
    };
    let weight = make_weight(&mut rng, &case);
    let conv = Conv2dCpu::new(&weight, None, case.params).unwrap();
    let x = rng.vec(3 * 10 * 9 * 7, -1.0, 1.0);
    let a = conv.forward(&x, [3, 10, 9, 7]).unwrap();
    let b = conv.forward(&x, [3, 10, 9, 7]).unwrap();
    assert_eq!(a, b);
    let first = conv.forward(&x[..10 * 9 * 7], [1, 10, 9, 7]).unwrap();
    assert_eq!(&a[..first.len()], &first[..]);
}

#[test]
fn impossible_configurations_are_typed_errors() {
    let shape = BlockShape::conv(4, 3, (3, 3), 1).unwrap();
    let w = BlockQuantWeight::quantize(&vec![0.5; 4 * 3 * 9], shape, BlockBits::Int8).unwrap();
    let ok = Conv2dParams::default();
    let x = vec![0.5f32; 3 * 5 * 5];
    let conv = |params: Conv2dParams| Conv2dCpu::new(&w, None, params);

    assert_eq!(invalid_tensor(conv(Conv2dParams { stride: (0, 1), ..ok })), "stride");
    assert_eq!(
        invalid_tensor(conv(Conv2dParams { dilation: (1, 0), ..ok })),
        "dilation"
    );
    assert_eq!(invalid_tensor(conv(Conv2dParams { groups: 0, ..ok })), "groups");
    // Co = 4 not divisible by 3 groups.
    assert_eq!(invalid_tensor(conv(Conv2dParams { groups: 3, ..ok })), "groups");
    let c = conv(ok).unwrap();
    // Kernel 3 larger than a 2×2 input without padding; fits with padding 1.
    assert_eq!(invalid_tensor(c.forward(&x[..12], [1, 3, 2, 2])), "input");
    assert!(conv(Conv2dParams { padding: (1, 1), ..ok })
        .unwrap()
        .forward(&x[..12], [1, 3, 2, 2])
        .is_ok());
    // Dilation 3 spans 7 > 5.
    assert_eq!(
        invalid_tensor(
            conv(Conv2dParams { dilation: (3, 3), ..ok })
                .unwrap()
                .output_shape([1, 3, 5, 5])
        ),
        "input"
    );
    // Wrong input channel count for the weight; Ci not divisible by groups.
    assert_eq!(invalid_tensor(c.forward(&x, [1, 5, 5, 3])), "weight");
    let w2 = BlockQuantWeight::quantize(
        &vec![0.5; 4 * 3 * 9],
        BlockShape::conv(4, 3, (3, 3), 1).unwrap(),
        BlockBits::Int4,
    )
    .unwrap();
    let grouped = Conv2dCpu::new(&w2, None, Conv2dParams { groups: 2, ..ok }).unwrap();
    assert_eq!(invalid_tensor(grouped.output_shape([1, 5, 5, 5])), "groups");
    // Wrong buffer lengths and bias.
    assert_eq!(invalid_tensor(c.forward(&x[..74], [1, 3, 5, 5])), "input");
    assert_eq!(
        invalid_tensor(c.forward_into(&x, [1, 3, 5, 5], &mut [0f32; 35])),
        "output"
    );
    assert_eq!(invalid_tensor(Conv2dCpu::new(&w, Some(&[1.0; 3]), ok)), "bias");
    assert_eq!(
        invalid_tensor(Conv2dCpu::new(&w, Some(&[1.0, f32::NAN, 0.0, 0.0]), ok)),
        "bias"
    );
    assert_eq!(invalid_tensor(c.forward(&x, [0, 3, 5, 5])), "input");
    assert_eq!(
        invalid_tensor(reference::conv2d(&x, [1, 3, 5, 5], &w, Some(&[0.0]), &ok)),
        "bias"
    );
}

#[test]
fn invalid_weights_are_typed_errors() {
    let shape = BlockShape::conv(2, 4, (1, 1), 2).unwrap();
    let parts = |codes: Vec<i8>, scales: Vec<f32>, offsets: Vec<f32>, bits| {
        BlockQuantWeight::from_parts(shape, bits, codes, scales, offsets)
    };
    let good = || (vec![1i8; 8], vec![1.0f32; 4], vec![0.0f32; 4]);
    let (c, s, o) = good();
    assert!(parts(c, s, o, BlockBits::Int4).is_ok());
    let (mut c, s, o) = good();
    c[3] = 8; // out of int4 range
    assert_eq!(invalid_tensor(parts(c, s, o, BlockBits::Int4)), "codes");
    let (c, s, o) = good();
    assert_eq!(invalid_tensor(parts(c[..7].to_vec(), s, o, BlockBits::Int8)), "codes");
    let (c, mut s, o) = good();
    s[1] = f32::INFINITY;
    assert_eq!(invalid_tensor(parts(c, s, o, BlockBits::Int8)), "scales");
    let (c, s, o) = good();
    assert_eq!(invalid_tensor(parts(c, s, o[..3].to_vec(), BlockBits::Int8)), "offsets");
    // Blocks must divide the input channels (MNN: ci_per_block = Ci / blocks).
    assert_eq!(invalid_tensor(BlockShape::conv(2, 10, (3, 3), 3)), "blocks");
    assert_eq!(invalid_tensor(BlockShape::conv(0, 10, (3, 3), 1)), "weight");
    // MNN bytes: wrong length; int8 weights have no MNN int4 layout.
    assert_eq!(
        invalid_tensor(BlockQuantWeight::from_mnn_int4_bytes(
            shape,
            &[0u8; 3],
            vec![1.0; 4],
            vec![0.0; 4]
        )),
        "mnn_int4_weight"
    );
    let (c, s, o) = good();
    assert_eq!(
        invalid_tensor(parts(c, s, o, BlockBits::Int8).unwrap().to_mnn_int4_bytes()),
        "bits"
    );
    // Dense weights: NaN, wrong length.
    let mut dense = vec![0.5f32; 8];
    dense[5] = f32::NAN;
    assert_eq!(
        invalid_tensor(BlockQuantWeight::quantize(&dense, shape, BlockBits::Int8)),
        "weight"
    );
    assert_eq!(
        invalid_tensor(BlockQuantWeight::quantize(&dense[..4], shape, BlockBits::Int8)),
        "weight"
    );
}
