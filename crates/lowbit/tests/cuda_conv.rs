//! The CUDA per-block quantized convolution against the f64 reference on the same quantized weights, over the
//! convolution matrix of shared/testing.md: batch {1, 2, 8}, channels {1, 3, 10, 17, 64, 256}, spatial
//! {1, 7, 9, 28, 56}, kernels {1×1, 3×3, 5×5, 1×7, 7×1}, stride {1, 2}, dilation {1, 2}, padding {0, 1, same},
//! groups (dense, depthwise, others), int4 and int8, none/relu/relu6, f16 and f32 activations.
//!
//! Tolerances (mean |Δ| / mean |ref|, and max |Δ| relative to max(max |ref|, 1)):
//! - tensor-core path (input channels per group a multiple of 32): each weight is rounded once to f16
//!   (2^-11 relative) and f32 input is rounded to f16 too, products and sums are f32; with f16 output the result
//!   is rounded once more. Mean 2e-3, max 1e-2 (about 4x the f16 rounding a dense f16 convolution shows).
//! - direct path (every other shape): f32 arithmetic throughout, so f32 output is held to the CPU kernel's 1e-5
//!   and f16 output to one f16 rounding, 1e-3.
//! - exact-integer mode (small integer activations, power-of-two scales, half-integer offsets): every weight,
//!   product and sum is exact on both paths, so the output must equal the reference bit for bit.
//!
//! Every output buffer is poisoned with NaN and followed by guard elements: every output must be written (no NaN
//! is accepted) and nothing past it. Without a GPU every test prints `skipped: <reason>` and passes.

use half::f16;
use lowbit::cuda::{CudaDevice, DeviceRepr, ValidAsZeroBits};
use lowbit::formats::block::{BlockBits, BlockQuantWeight, BlockShape};
use lowbit::ops::conv::cuda::{Conv2dCuda, Tile, Tuning};
use lowbit::ops::conv::{reference, same_padding, Activation, Conv2dParams};
use lowbit::testing::cuda_device as device;
use lowbit::testing::SplitMix64;
use lowbit::{DType, Error, Float};

mod common;
use common::{assert_close, from_f32, to_f32, Tolerance};

/// Elements after the output that must stay untouched.
const GUARD: usize = 64;
/// The reference is a single-threaded f64 loop: random cases are drawn below this many multiply-adds.
const MAX_MACS: usize = 40_000_000;

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
    fn input(&self) -> [usize; 4] {
        [self.batch, self.ci, self.hw.0, self.hw.1]
    }

    fn shape(&self) -> BlockShape {
        BlockShape::conv(self.co, self.ci / self.params.groups, self.kernel, self.blocks).unwrap()
    }
}

/// How a case's numbers are drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Data {
    /// Weights quantized from uniform ±0.5, activations uniform ±1, bias uniform ±1.
    Random,
    /// Codes, power-of-two scales, half-integer offsets, activations in -3..=3, integer bias.
    ExactInteger,
}

fn make_weight(rng: &mut SplitMix64, case: &Case, data: Data) -> BlockQuantWeight {
    let shape = case.shape();
    match data {
        Data::Random => {
            BlockQuantWeight::quantize(&rng.vec(shape.rows * shape.cols(), -0.5, 0.5), shape, case.bits).unwrap()
        }
        Data::ExactInteger => {
            let (lo, hi) = (case.bits.q_min(), case.bits.q_max());
            let codes = (0..shape.rows * shape.cols()).map(|_| rng.int(lo, hi) as i8).collect();
            let n = shape.rows * shape.blocks();
            let scales = (0..n).map(|_| rng.pick(&[0.25, 0.5, 1.0, 2.0])).collect();
            let offsets = (0..n).map(|_| rng.int(-8, 8) as f32 * 0.5).collect();
            BlockQuantWeight::from_parts(shape, case.bits, codes, scales, offsets).unwrap()
        }
    }
}

/// Runs `conv` on `x` (values exact in `T`) and returns the output; checks the NaN poison is gone and the guard
/// elements are untouched.
fn run_on_gpu<T: Float + DeviceRepr + ValidAsZeroBits>(
    dev: &CudaDevice,
    conv: &Conv2dCuda,
    x: &[f32],
    input: [usize; 4],
) -> lowbit::Result<Vec<f32>> {
    let out_len: usize = conv.output_shape(input)?.iter().product();
    let x_dev = dev.upload(&from_f32::<T>(x))?;
    let poison = T::from_f32(f32::NAN);
    let mut y = dev.upload(&vec![poison; out_len + GUARD])?;
    let mut ws = dev.alloc_zeros::<u8>(conv.workspace_bytes(input)?.max(1))?;
    conv.run(dev.stream(), &x_dev, input, &mut y, &mut ws)?;
    let y = to_f32(&dev.download(&y)?);
    assert!(
        y[out_len..].iter().all(|v| v.is_nan()),
        "a guard element after the output was written"
    );
    Ok(y[..out_len].to_vec())
}

/// The tolerance of `conv` with activations `dtype` (see the header).
fn tolerance(conv: &Conv2dCuda, dtype: DType) -> Tolerance {
    match (conv.uses_tensor_cores(), dtype) {
        (true, _) => Tolerance::floored(2e-3, 1e-2),
        (false, DType::F32) => Tolerance::floored(1e-5, 1e-5),
        (false, _) => Tolerance::floored(1e-3, 1e-3),
    }
}

/// Checks `case` with f16 and f32 activations against the reference; returns whether it used the tensor cores.
fn check_case(dev: &CudaDevice, rng: &mut SplitMix64, case: &Case, tuning: Tuning) -> bool {
    let weight = make_weight(rng, case, Data::Random);
    let bias = rng.vec(case.co, -1.0, 1.0);
    let input = case.input();
    let conv = Conv2dCuda::with_tuning(dev, &weight, Some(&bias), case.params, tuning).unwrap();
    // Activations exact in f16, so both dtypes convolve the same numbers.
    let x = f16_activations(rng, input);
    let want = reference::conv2d(&x, input, &weight, Some(&bias), &case.params).unwrap();
    let tile = conv.tile_for(input).unwrap();
    for dtype in [DType::F16, DType::F32] {
        let got = match dtype {
            DType::F16 => run_on_gpu::<f16>(dev, &conv, &x, input),
            _ => run_on_gpu::<f32>(dev, &conv, &x, input),
        }
        .unwrap();
        let what = format!("{case:?} {dtype} tile {tile:?}");
        assert_close(&what, &got, &want, tolerance(&conv, dtype));
    }
    conv.uses_tensor_cores()
}

/// Activations of shape `input`, uniform in ±1 and exact in f16 (so f16 and f32 runs convolve the same numbers).
fn f16_activations(rng: &mut SplitMix64, input: [usize; 4]) -> Vec<f32> {
    rng.vec(input.iter().product(), -1.0, 1.0)
        .into_iter()
        .map(|v| f16::from_f32(v).to_f32())
        .collect()
}

/// `case` in the exact-integer mode with f16 activations: the output must be the exact result rounded once.
fn check_exact_integers(dev: &CudaDevice, rng: &mut SplitMix64, case: &Case) {
    let input = case.input();
    let weight = make_weight(rng, case, Data::ExactInteger);
    let bias: Vec<f32> = (0..case.co).map(|_| rng.int(-4, 4) as f32).collect();
    let x: Vec<f32> = (0..input.iter().product()).map(|_| rng.int(-3, 3) as f32).collect();
    let want = reference::conv2d(&x, input, &weight, Some(&bias), &case.params).unwrap();
    let conv = Conv2dCuda::new(dev, &weight, Some(&bias), case.params).unwrap();
    let got = run_on_gpu::<f16>(dev, &conv, &x, input).unwrap();
    assert_rounded_once(&format!("{case:?} exact integers"), &got, &want);
}

/// `got` and `want` are the same bits (`what` names the comparison).
fn assert_same_bits(what: &str, got: &[f32], want: &[f32]) {
    assert!(
        got.len() <= want.len() && got.iter().zip(want).all(|(a, b)| a.to_bits() == b.to_bits()),
        "{what}: different bits"
    );
}

/// f16 output `got` equals the exact result `want` rounded once to f16, bit for bit.
fn assert_rounded_once(what: &str, got: &[f32], want: &[f64]) {
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert_eq!(
            g.to_bits(),
            f16::from_f64(w).to_f32().to_bits(),
            "{what}: element {i}: {g} vs {w}"
        );
    }
}

fn divisors(n: usize) -> Vec<usize> {
    (1..=n).filter(|d| n % d == 0).collect()
}

/// A random configuration of the testing.md matrix under `MAX_MACS`; half of them have 64 or 256 input channels
/// in dense or 2/4-group layouts (the tensor-core path), blocks then a multiple of 16 channels.
fn random_case(rng: &mut SplitMix64) -> Case {
    loop {
        let kernel = rng.pick(&[(1, 1), (3, 3), (5, 5), (1, 7), (7, 1)]);
        let dilation = rng.pick(&[(1, 1), (2, 2), (1, 2)]);
        let padding = match rng.int(0, 2) {
            0 => (0, 0),
            1 => (1, 1),
            _ => same_padding(kernel, dilation),
        };
        let gemm = rng.int(0, 1) == 1;
        let (ci, co, groups) = if gemm {
            let ci = rng.pick(&[64, 256]);
            let groups = rng.pick(&[1, 1, 2, 4].map(|g| g.min(ci / 32)));
            (ci, rng.pick(&[64usize, 256, 40, 136]).next_multiple_of(groups), groups)
        } else {
            let channels = [1, 3, 10, 17, 64];
            let ci = rng.pick(&channels);
            match rng.int(0, 2) {
                0 => (ci, rng.pick(&channels), 1),
                1 => (ci, ci * rng.int(1, 2) as usize, ci),
                _ => {
                    let co = rng.pick(&channels);
                    let common: Vec<usize> = divisors(ci).into_iter().filter(|d| co % d == 0).collect();
                    (ci, co, rng.pick(&common))
                }
            }
        };
        let cg = ci / groups;
        let blocks = if gemm {
            rng.pick(&divisors(cg / 16))
        } else {
            rng.pick(&divisors(cg))
        };
        let side = rng.pick(&[1, 7, 9, 28, 56]);
        let case = Case {
            batch: rng.pick(&[1, 2, 8]),
            ci,
            co,
            hw: (side, rng.pick(&[side, 7, 9])),
            kernel,
            blocks,
            bits: rng.pick(&[BlockBits::Int4, BlockBits::Int8]),
            params: Conv2dParams {
                stride: rng.pick(&[(1, 1), (2, 2), (2, 1)]),
                padding,
                dilation,
                groups,
                activation: rng.pick(&[Activation::None, Activation::Relu, Activation::Relu6]),
            },
        };
        let Ok(out) = lowbit::ops::conv::ConvGeometry::new(case.input(), &case.shape(), &case.params) else {
            continue; // the dilated kernel does not fit: covered by the CPU tests' rejection checks
        };
        let macs = out.output.iter().product::<usize>() * cg * kernel.0 * kernel.1;
        if macs <= MAX_MACS {
            return case;
        }
    }
}

#[test]
fn matches_reference_over_matrix() {
    let Some(dev) = device() else { return };
    let mut rng = SplitMix64(0xC0DA_0001);
    let (mut gemm, mut direct) = (0, 0);
    for _ in 0..60 {
        let case = random_case(&mut rng);
        if check_case(&dev, &mut rng, &case, Tuning::default()) {
            gemm += 1;
        } else {
            direct += 1;
        }
    }
    println!("{gemm} cases on the tensor cores, {direct} direct");
    assert!(
        gemm >= 20 && direct >= 20,
        "matrix slice too lopsided: {gemm} / {direct}"
    );
}

#[test]
fn larger_shapes_and_edges() {
    let Some(dev) = device() else { return };
    use Activation::{None as Linear, Relu, Relu6};
    use BlockBits::{Int4, Int8};
    let mut rng = SplitMix64(0xC0DA_0002);
    let base = Conv2dParams::default();
    let p1 = Conv2dParams {
        padding: (1, 1),
        ..base
    };
    #[rustfmt::skip]
    let cases = [
        // (batch, ci, co, hw, kernel, blocks, bits, params)
        // The anchors' 3x3 layer at reduced spatial size: several K chunks, all four panels.
        (2, 256, 256, (14, 14), (3, 3), 1, Int4, Conv2dParams { activation: Relu, ..p1 }),
        (1, 256, 256, (28, 28), (3, 3), 8, Int8, p1),
        // Pointwise 1024 -> 2048 (the 1x1 anchor at batch 1), blocks of 64 channels.
        (1, 1024, 2048, (14, 14), (1, 1), 16, Int4, base),
        // Odd output plane (7x7 = 49 pixels: single-element stores), Co not a multiple of 64.
        (3, 64, 96, (7, 7), (3, 3), 4, Int8, Conv2dParams { activation: Relu6, ..p1 }),
        // Stride 2, 7x7, padding 3 (a stem on 64 channels), Co < 64.
        (2, 64, 40, (30, 30), (7, 7), 2, Int4, Conv2dParams { stride: (2, 2), padding: (3, 3), ..base }),
        // Dilated 3x3, asymmetric stride, grouped (2 groups of 32 channels).
        (2, 64, 64, (17, 19), (3, 3), 2, Int4,
         Conv2dParams { stride: (2, 1), padding: (2, 2), dilation: (2, 2), groups: 2, ..base }),
        // 1x7 and 7x1 with "same" padding, blocks of 16.
        (1, 64, 128, (20, 20), (1, 7), 4, Int8, Conv2dParams { padding: same_padding((1, 7), (1, 1)), ..base }),
        (1, 64, 128, (20, 20), (7, 1), 4, Int4, Conv2dParams { padding: same_padding((7, 1), (1, 1)), ..base }),
        // Depthwise 3x3 on 256 channels (direct path), relu6.
        (2, 256, 256, (28, 28), (3, 3), 1, Int8, Conv2dParams { groups: 256, activation: Relu6, ..p1 }),
        // Direct path with many channels: 3 input channels (an RGB stem).
        (2, 3, 64, (56, 56), (3, 3), 1, Int4, Conv2dParams { stride: (2, 2), ..p1 }),
        (1, 17, 10, (9, 9), (5, 5), 17, Int8, Conv2dParams { activation: Linear, ..p1 }),
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
        check_case(&dev, &mut rng, &case, Tuning::default());
    }
}

#[test]
fn every_tile_and_the_forced_direct_path() {
    let Some(dev) = device() else { return };
    let mut rng = SplitMix64(0xC0DA_0003);
    // 150 output channels (three panels, one partial), 2 x 11 x 13 = 286 pixels (a partial pixel tile for every
    // tile width), 3 x 3 stride 1.
    for bits in [BlockBits::Int4, BlockBits::Int8] {
        let case = Case {
            batch: 2,
            ci: 96,
            co: 150,
            hw: (11, 13),
            kernel: (3, 3),
            blocks: 2,
            bits,
            params: Conv2dParams {
                padding: (1, 1),
                activation: Activation::Relu,
                ..Conv2dParams::default()
            },
        };
        for tile in Tile::ALL {
            let tuning = Tuning {
                tile: Some(tile),
                ..Tuning::default()
            };
            assert!(check_case(&dev, &mut rng, &case, tuning));
        }
        let direct = Tuning {
            direct: true,
            ..Tuning::default()
        };
        assert!(!check_case(&dev, &mut rng, &case, direct));
    }
}

/// Small integers, power-of-two scales, half-integer offsets: exact on both paths, f16 and f32, every tile.
#[test]
fn exact_integer_mode_is_bit_exact() {
    let Some(dev) = device() else { return };
    let mut rng = SplitMix64(0xC0DA_0004);
    let mut ran = 0;
    while ran < 16 {
        let mut case = random_case(&mut rng);
        // |q·s + o| <= 260 in steps of 1/4 (exact in f16 after the row's 2^e), |x| <= 3: every product and
        // partial sum is a multiple of 1/4 far below 2^22, exact in f32.
        case.bits = rng.pick(&[BlockBits::Int4, BlockBits::Int8]);
        let weight = make_weight(&mut rng, &case, Data::ExactInteger);
        let bias: Vec<f32> = (0..case.co).map(|_| rng.int(-4, 4) as f32).collect();
        let input = case.input();
        let x: Vec<f32> = (0..input.iter().product()).map(|_| rng.int(-3, 3) as f32).collect();
        let want = reference::conv2d(&x, input, &weight, Some(&bias), &case.params).unwrap();
        let tuning = Tuning {
            tile: Some(rng.pick(&Tile::ALL)),
            ..Tuning::default()
        };
        let conv = Conv2dCuda::with_tuning(&dev, &weight, Some(&bias), case.params, tuning).unwrap();
        let got = run_on_gpu::<f32>(&dev, &conv, &x, input).unwrap();
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g.to_bits(),
                (w as f32).to_bits(),
                "{case:?} f32 element {i}: {g} vs {w}"
            );
        }
        // f16 output: the exact f32 result rounded once, as the reference rounded once.
        let got = run_on_gpu::<f16>(&dev, &conv, &x, input).unwrap();
        assert_rounded_once(&format!("{case:?} f16"), &got, &want);
        ran += 1;
    }
}

/// The Hopper wgmma path (sm_90; f16 activations, int4 or int8 (one byte per code), one group, stride 1,
/// `Ci % 64 == 0`): 3×3/5×5/1×1, with and without padding, dilation 2, 128- and 256-column weight tiles, split-K and
/// multi-tile grids, every clamp; random data within the tensor-core tolerance, then exact-integer data bit for bit.
/// On other GPUs the same cases run on the older kernels.
#[test]
fn hopper_path_matches_reference() {
    let Some(dev) = device() else { return };
    let mut rng = SplitMix64(0xC0DA_0090);
    let sm90 = dev.info().compute_capability.0 == 9;
    let base = Case {
        batch: 2,
        ci: 64,
        co: 128,
        hw: (11, 13),
        kernel: (3, 3),
        blocks: 2,
        bits: BlockBits::Int4,
        params: Conv2dParams {
            padding: (1, 1),
            ..Conv2dParams::default()
        },
    };
    let cases = [
        base,
        Case {
            batch: 1,
            ci: 128,
            co: 256,
            hw: (9, 9),
            kernel: (1, 1),
            blocks: 1,
            params: Conv2dParams::default(),
            ..base
        },
        Case {
            ci: 192,
            co: 384,
            hw: (12, 10),
            kernel: (5, 5),
            blocks: 3,
            params: Conv2dParams {
                padding: (2, 2),
                activation: Activation::Relu6,
                ..Conv2dParams::default()
            },
            ..base
        },
        Case {
            batch: 3,
            hw: (14, 14),
            params: Conv2dParams {
                padding: (2, 2),
                dilation: (2, 2),
                activation: Activation::Relu,
                ..Conv2dParams::default()
            },
            ..base
        },
        // 4 x 30 x 30 positions: more tiles than SMs, no split-K.
        Case {
            batch: 4,
            ci: 64,
            co: 256,
            hw: (28, 28),
            blocks: 4,
            ..base
        },
        // Asymmetric padding bands (no padding on a 3 x 3: the output is smaller than the grid).
        Case {
            batch: 2,
            hw: (7, 9),
            params: Conv2dParams::default(),
            ..base
        },
    ];
    let both_widths = cases.iter().flat_map(|c| {
        [
            *c,
            Case {
                bits: BlockBits::Int8,
                ..*c
            },
        ]
    });
    for case in &both_widths.collect::<Vec<_>>() {
        let weight = make_weight(&mut rng, case, Data::Random);
        let bias = rng.vec(case.co, -1.0, 1.0);
        let conv = Conv2dCuda::new(&dev, &weight, Some(&bias), case.params).unwrap();
        assert_eq!(conv.uses_hopper(), sm90, "{case:?}");
        let input = case.input();
        let x = f16_activations(&mut rng, input);
        let want = reference::conv2d(&x, input, &weight, Some(&bias), &case.params).unwrap();
        let got = run_on_gpu::<f16>(&dev, &conv, &x, input).unwrap();
        assert_close(
            &format!("{case:?} hopper={sm90}"),
            &got,
            &want,
            tolerance(&conv, DType::F16),
        );
        // Repeated runs are byte-identical (deterministic split-K).
        let again = run_on_gpu::<f16>(&dev, &conv, &x, input).unwrap();
        assert_same_bits(&format!("{case:?}: a repeated run"), &again, &got);

        check_exact_integers(&dev, &mut rng, case);
    }
    if !sm90 {
        println!("note: not an sm_90 GPU, the Hopper path was not exercised (the older kernels ran these cases)");
    }
}

/// 1×1 convolutions of 1×1 maps at batches up to 16 run on the decode (GEMV) kernel with the weight's offsets:
/// pooled features at batch 1, 3 and 16, a partial k tile, 64-column tiles, blocks of 32/64/128; exact integers
/// bit for bit; batch invariance over images. Small maps, strides and narrow blocks stay on the other kernels.
#[test]
fn one_by_one_at_few_positions_runs_on_the_decode_kernel() {
    let Some(dev) = device() else { return };
    let mut rng = SplitMix64(0xC0DA_0001);
    let gemv_capable = dev.info().compute_capability.0 >= 8;
    let one_by_one = |batch, ci, co, hw, blocks, activation| Case {
        batch,
        ci,
        co,
        hw,
        kernel: (1, 1),
        blocks,
        bits: BlockBits::Int4,
        params: Conv2dParams {
            activation,
            ..Conv2dParams::default()
        },
    };
    let cases = [
        one_by_one(1, 2048, 1000, (1, 1), 16, Activation::None), // a classifier on pooled features
        one_by_one(16, 512, 128, (1, 1), 8, Activation::Relu6),
        one_by_one(1, 256, 192, (1, 1), 4, Activation::Relu), // 64-column tiles, blocks of 64
        one_by_one(3, 96, 320, (1, 1), 3, Activation::None),  // K = 96: a partial k tile
        one_by_one(1, 4096, 512, (1, 1), 64, Activation::Relu),
    ];
    for case in cases.iter().flat_map(|c| {
        [
            *c,
            Case {
                bits: BlockBits::Int8,
                ..*c
            },
        ]
    }) {
        let input = case.input();
        let weight = make_weight(&mut rng, &case, Data::Random);
        let bias = rng.vec(case.co, -1.0, 1.0);
        let conv = Conv2dCuda::new(&dev, &weight, Some(&bias), case.params).unwrap();
        assert_eq!(conv.uses_gemv(input).unwrap(), gemv_capable, "{case:?}");
        let x = f16_activations(&mut rng, input);
        let want = reference::conv2d(&x, input, &weight, Some(&bias), &case.params).unwrap();
        // Scales and offsets are rounded to f16 once; products and sums are f32.
        let got = run_on_gpu::<f16>(&dev, &conv, &x, input).unwrap();
        assert_close(&format!("{case:?} gemv"), &got, &want, Tolerance::floored(2e-3, 1e-2));
        let again = run_on_gpu::<f16>(&dev, &conv, &x, input).unwrap();
        assert_same_bits(&format!("{case:?}: a repeated run"), &again, &got);
        // f32 activations take the other kernels.
        let got32 = run_on_gpu::<f32>(&dev, &conv, &x, input).unwrap();
        assert_close(&format!("{case:?} f32"), &got32, &want, tolerance(&conv, DType::F32));
        // Image 0 of the batch alone gives the same bits.
        if case.batch > 1 {
            let first = [1, case.ci, case.hw.0, case.hw.1];
            let alone = run_on_gpu::<f16>(&dev, &conv, &x[..first.iter().product()], first).unwrap();
            assert_same_bits(&format!("{case:?}: image 0 alone"), &alone, &got);
        }

        check_exact_integers(&dev, &mut rng, &case);
    }
    // A batch of 17, a 4x4 map, a strided 1x1, blocks of 8 channels: not this route.
    let not_routed = [
        (one_by_one(17, 64, 64, (1, 1), 1, Activation::None), "batch 17"),
        (one_by_one(1, 256, 192, (4, 4), 8, Activation::Relu), "a 4x4 map"),
        (
            Case {
                params: Conv2dParams {
                    stride: (2, 2),
                    ..Conv2dParams::default()
                },
                ..one_by_one(1, 64, 64, (4, 4), 1, Activation::None)
            },
            "stride 2",
        ),
        (
            one_by_one(1, 64, 64, (1, 1), 8, Activation::None),
            "blocks of 8 channels",
        ),
    ];
    for (case, why) in not_routed {
        let weight = make_weight(&mut rng, &case, Data::Random);
        let conv = Conv2dCuda::new(&dev, &weight, None, case.params).unwrap();
        assert!(!conv.uses_gemv(case.input()).unwrap(), "{why}");
        let x = f16_activations(&mut rng, case.input());
        let want = reference::conv2d(&x, case.input(), &weight, None, &case.params).unwrap();
        let got = run_on_gpu::<f16>(&dev, &conv, &x, case.input()).unwrap();
        assert_close(why, &got, &want, tolerance(&conv, DType::F16));
    }
    if !gemv_capable {
        println!("note: GPU older than sm_80, the decode route was not exercised");
    }
}

/// MNN's int4 byte layout (`[Co, Kh, Kw, Ci/2]`, even channel in the high nibble) goes through the same operator.
#[test]
fn mnn_int4_bytes_are_accepted() {
    let Some(dev) = device() else { return };
    let mut rng = SplitMix64(0xC0DA_0005);
    let shape = BlockShape::conv(64, 64, (3, 3), 2).unwrap();
    let bytes: Vec<u8> = (0..64 * 9 * 32).map(|_| rng.next_u64() as u8).collect();
    let weight =
        BlockQuantWeight::from_mnn_int4_bytes(shape, &bytes, rng.vec(128, 0.01, 0.1), rng.vec(128, -0.2, 0.2)).unwrap();
    let params = Conv2dParams {
        padding: (1, 1),
        ..Conv2dParams::default()
    };
    let input = [1, 64, 12, 12];
    let x: Vec<f32> = rng
        .vec(64 * 144, -1.0, 1.0)
        .into_iter()
        .map(|v| f16::from_f32(v).to_f32())
        .collect();
    let want = reference::conv2d(&x, input, &weight, None, &params).unwrap();
    let conv = Conv2dCuda::new(&dev, &weight, None, params).unwrap();
    let got = run_on_gpu::<f16>(&dev, &conv, &x, input).unwrap();
    assert_close("mnn int4", &got, &want, tolerance(&conv, DType::F16));
}

#[test]
fn bad_arguments_are_named() {
    let Some(dev) = device() else { return };
    let shape = BlockShape::conv(64, 64, (3, 3), 1).unwrap();
    let weight = BlockQuantWeight::quantize(&vec![0.25; 64 * 64 * 9], shape, BlockBits::Int4).unwrap();
    let params = Conv2dParams::default();
    let name = |r: lowbit::Result<()>| match r {
        Err(Error::Invalid { tensor, .. }) => tensor,
        other => panic!("expected Error::Invalid, got {other:?}"),
    };
    assert_eq!(
        name(Conv2dCuda::new(&dev, &weight, Some(&[0.0; 3]), params).map(drop)),
        "bias"
    );
    let conv = Conv2dCuda::new(&dev, &weight, None, params).unwrap();
    let input = [1, 64, 8, 8];
    let out: usize = conv.output_shape(input).unwrap().iter().product();
    let x = dev.alloc_zeros::<f16>(64 * 64).unwrap();
    let mut y = dev.alloc_zeros::<f16>(out).unwrap();
    let mut ws = dev.alloc_zeros::<u8>(conv.workspace_bytes(input).unwrap()).unwrap();
    let stream = dev.stream();
    assert_eq!(name(conv.run(stream, &x, [1, 64, 8, 9], &mut y, &mut ws)), "x");
    let mut short_y = dev.alloc_zeros::<f16>(out - 1).unwrap();
    assert_eq!(name(conv.run(stream, &x, input, &mut short_y, &mut ws)), "y");
    let mut short_ws = dev.alloc_zeros::<u8>(16).unwrap();
    assert_eq!(name(conv.run(stream, &x, input, &mut y, &mut short_ws)), "workspace");
    assert_eq!(name(conv.run(stream, &x, [1, 32, 8, 8], &mut y, &mut ws)), "weight");
    let xb = dev.alloc_zeros::<half::bf16>(64 * 64).unwrap();
    let mut yb = dev.alloc_zeros::<half::bf16>(out).unwrap();
    assert_eq!(name(conv.run(stream, &xb, input, &mut yb, &mut ws)), "x");
    dev.synchronize().unwrap();
}
