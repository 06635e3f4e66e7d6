//! W8A8 on the CPU (online per-block activation quantization, per-block W8A8 GEMM, SmoothQuant) against the f64
//! reference computed from the same quantized operands.
//!
//! Tolerances (stated per test): the per-block GEMM combines each block in f32 (four terms that can partly
//! cancel); measured ~2e-7 mean relative, we allow 2e-6 (mean, and max error relative to the largest output) for
//! f32 output; f16 / bf16 outputs add their own rounding (2^-11 / 2^-8 relative): 1e-3 / 8e-3. SmoothQuant rounds
//! once from an exact integer dot: 2e-7. Exact-integer cases require bit equality.

use half::{bf16, f16};
use lowbit::formats::block::{BlockBits, BlockQuantWeight, BlockShape};
use lowbit::ops::w8a8::cpu::{BlockW8a8Cpu, SmoothQuantCpu};
use lowbit::ops::w8a8::{quantize_activations, reference, ActivationQuant, QuantizedActivations};
use lowbit::testing::SplitMix64;
use lowbit::{Float, QuantMatrix};

mod common;
use common::{assert_bits_equal, assert_close, compare, from_f32, invalid_tensor, to_f32, Tolerance};

/// Activation-like rows `[m, k]`: a per-row shift and scale, plus a few outliers (SmoothQuant's motivation).
fn activations(rng: &mut SplitMix64, m: usize, k: usize) -> Vec<f32> {
    let mut x = Vec::with_capacity(m * k);
    for _ in 0..m {
        let (shift, scale) = (rng.uniform(-0.5, 1.0), rng.uniform(0.5, 4.0));
        for _ in 0..k {
            let outlier = if rng.next_u64() % 97 == 0 { 8.0 } else { 1.0 };
            x.push(shift + scale * outlier * rng.uniform(-1.0, 1.0));
        }
    }
    x
}

#[test]
fn quantizer_matches_reference_bit_for_bit() {
    let mut rng = SplitMix64(0xA8A8_0001);
    for &(m, k, block) in &[
        (1, 256, 64),
        (7, 3884, 64),
        (3, 100, 32),
        (5, 64, 64),
        (2, 77, 77),
        (4, 130, 128),
    ] {
        let mut x = activations(&mut rng, m, k);
        // An all-zero block and an all-equal block.
        x[..block.min(k)].fill(0.0);
        if m > 1 {
            x[k..k + block.min(k)].fill(-2.5);
        }
        for mode in [ActivationQuant::Asymmetric, ActivationQuant::Symmetric] {
            let fast = quantize_activations(&x, m, k, block, mode).unwrap();
            let slow = reference::quantize_activations(&x, m, k, block, mode).unwrap();
            assert_eq!(fast, slow, "f32 m {m} k {k} block {block} {mode:?}");
            let xh: Vec<f16> = from_f32(&x);
            assert_eq!(
                quantize_activations(&xh, m, k, block, mode).unwrap(),
                reference::quantize_activations(&xh, m, k, block, mode).unwrap()
            );
            let xb: Vec<bf16> = from_f32(&x);
            assert_eq!(
                quantize_activations(&xb, m, k, block, mode).unwrap(),
                reference::quantize_activations(&xb, m, k, block, mode).unwrap()
            );
        }
    }
}

#[test]
fn quantizer_properties() {
    let mut rng = SplitMix64(0xA8A8_0002);
    let (m, k, block) = (6, 3884, 64);
    let mut x = activations(&mut rng, m, k);
    x[64..128].fill(0.0); // all-zero block
    x[k + 3840..2 * k].fill(0.75); // all-equal partial last block (44 long)
    let q = quantize_activations(&x, m, k, block, ActivationQuant::Asymmetric).unwrap();
    let deq = q.dequantize();
    let blocks = q.blocks();
    assert_eq!(blocks, 61);
    assert!(q.scales().iter().chain(q.offsets()).all(|v| v.is_finite()));
    for r in 0..m {
        for b in 0..blocks {
            let span = r * k + b * block..r * k + ((b + 1) * block).min(k);
            let codes = &q.codes()[span.clone()];
            let (s, o) = (q.scales()[r * blocks + b], q.offsets()[r * blocks + b]);
            let (lo, hi) = x[span.clone()]
                .iter()
                .fold((f32::MAX, f32::MIN), |(l, h), &v| (l.min(v), h.max(v)));
            if lo == hi {
                // The documented rule: scale 1, offset max, codes 0, exact.
                assert_eq!((s, o), (1.0, hi));
                assert!(codes.iter().all(|&c| c == 0));
            } else {
                // max maps to 127 and min to -128.
                assert_eq!(*codes.iter().max().unwrap(), 127);
                assert_eq!(*codes.iter().min().unwrap(), -128);
            }
            assert_eq!(
                q.code_sums()[r * blocks + b],
                codes.iter().map(|&c| c as i32).sum::<i32>()
            );
            for i in span {
                // Half a step plus f32 rounding of the dequantization.
                assert!((deq[i] - x[i]).abs() <= 0.5 * s + 1e-6 * x[i].abs().max(1.0), "{i}");
            }
        }
    }
    let sym = quantize_activations(&x, m, k, block, ActivationQuant::Symmetric).unwrap();
    assert!(sym.is_symmetric());
    assert!(sym.codes().iter().all(|&c| c >= -127));
    assert_eq!(sym.scales()[1], 1.0); // the all-zero block
}

/// One per-block W8A8 case: activations quantized online, weights RTN per block, CPU kernel vs f64 reference.
fn check_block_case<T: Float>(rng: &mut SplitMix64, m: usize, n: usize, k: usize, block: usize, mode: ActivationQuant) {
    let x: Vec<T> = from_f32(&activations(rng, m, k));
    let a = quantize_activations(&x, m, k, block, mode).unwrap();
    let dense = rng.vec(n * k, -0.1, 0.1);
    let weight = BlockQuantWeight::quantize(&dense, BlockShape::linear(n, k, block), BlockBits::Int8).unwrap();
    let bias = rng.vec(n, -1.0, 1.0);
    let bias = (rng.next_u64() % 2 == 0).then_some(&bias[..]);
    let want = reference::block_w8a8(&a, &weight, bias).unwrap();
    let got = to_f32(&BlockW8a8Cpu::new(&weight, bias).unwrap().forward::<T>(&a).unwrap());
    let tol = match T::DTYPE {
        lowbit::DType::F32 => 2e-6,
        lowbit::DType::F16 => 1e-3,
        _ => 8e-3,
    };
    let what = format!(
        "{} m {m} n {n} k {k} block {block} {mode:?} bias {}",
        T::DTYPE,
        bias.is_some()
    );
    assert_close(&what, &got, &want, Tolerance::floored(tol, tol));
}

#[test]
fn block_w8a8_matches_reference() {
    let mut rng = SplitMix64(0xA8A8_0003);
    for m in [1, 7, 33] {
        for n in [128, 576] {
            for (k, block) in [(256, 64), (3884, 64)] {
                for mode in [ActivationQuant::Asymmetric, ActivationQuant::Symmetric] {
                    check_block_case::<f32>(&mut rng, m, n, k, block, mode);
                }
            }
        }
    }
    // Other block sizes, and half-precision activations/outputs.
    check_block_case::<f32>(&mut rng, 5, 40, 300, 32, ActivationQuant::Asymmetric);
    check_block_case::<f32>(&mut rng, 9, 24, 1000, 128, ActivationQuant::Asymmetric);
    // Odd block lengths (packed with a zero pad code) and a last block of one column; N not a multiple of 16.
    check_block_case::<f32>(&mut rng, 6, 19, 231, 77, ActivationQuant::Asymmetric);
    check_block_case::<f32>(&mut rng, 4, 33, 100, 33, ActivationQuant::Symmetric);
    check_block_case::<f16>(&mut rng, 7, 128, 3884, 64, ActivationQuant::Asymmetric);
    check_block_case::<bf16>(&mut rng, 33, 128, 256, 64, ActivationQuant::Symmetric);
}

/// A per-channel weight (one block per row: symmetric, or offset form) with activations in blocks of `block`.
fn check_channel_case(rng: &mut SplitMix64, m: usize, n: usize, k: usize, block: usize, symmetric: bool) {
    let x = activations(rng, m, k);
    let a = quantize_activations(&x, m, k, block, ActivationQuant::Asymmetric).unwrap();
    let dense = rng.vec(n * k, -0.1, 0.1);
    let weight = match symmetric {
        true => BlockQuantWeight::quantize_per_channel_symmetric(&dense, n, k).unwrap(),
        false => BlockQuantWeight::quantize(&dense, BlockShape::linear(n, k, k), BlockBits::Int8).unwrap(),
    };
    assert_eq!(weight.is_symmetric(), symmetric);
    let bias = rng.vec(n, -1.0, 1.0);
    let want = reference::block_w8a8(&a, &weight, Some(&bias)).unwrap();
    let got = BlockW8a8Cpu::channel_weight(&weight, Some(&bias), block)
        .unwrap()
        .forward::<f32>(&a)
        .unwrap();
    let what = format!("m {m} n {n} k {k} block {block} symmetric {symmetric}");
    assert_close(&what, &got, &want, Tolerance::floored(2e-6, 2e-6));
    // The same weight written out per activation block is the same layer.
    let blocks = k.div_ceil(block);
    let repeat = |v: &[f32]| {
        v.iter()
            .flat_map(|&p| std::iter::repeat(p).take(blocks))
            .collect::<Vec<_>>()
    };
    let expanded = BlockQuantWeight::from_parts(
        BlockShape::linear(n, k, block),
        BlockBits::Int8,
        weight.codes().to_vec(),
        repeat(weight.scales()),
        repeat(weight.offsets()),
    )
    .unwrap();
    let per_block = BlockW8a8Cpu::new(&expanded, Some(&bias))
        .unwrap()
        .forward::<f32>(&a)
        .unwrap();
    assert!(
        got.iter().zip(&per_block).all(|(a, b)| a.to_bits() == b.to_bits()),
        "{what}: per block"
    );
}

#[test]
fn channel_weight_matches_reference() {
    let mut rng = SplitMix64(0xA8A8_000C);
    for (m, n, k, block) in [
        (1, 128, 256, 64),
        (7, 576, 3884, 64),
        (33, 40, 1000, 128),
        (5, 24, 300, 32),
    ] {
        for symmetric in [true, false] {
            check_channel_case(&mut rng, m, n, k, block, symmetric);
        }
    }
    // A per-block weight is not a per-channel one.
    let w = BlockQuantWeight::quantize(
        &rng.vec(8 * 256, -1.0, 1.0),
        BlockShape::linear(8, 256, 64),
        BlockBits::Int8,
    )
    .unwrap();
    assert_eq!(invalid_tensor(BlockW8a8Cpu::channel_weight(&w, None, 64)), "weight");
    let w = BlockQuantWeight::quantize_per_channel_symmetric(&rng.vec(8 * 256, -1.0, 1.0), 8, 256).unwrap();
    assert_eq!(invalid_tensor(BlockW8a8Cpu::channel_weight(&w, None, 0)), "block_size");
    assert_eq!(
        invalid_tensor(BlockW8a8Cpu::channel_weight(&w, None, 257)),
        "block_size"
    );
    // Activations in other blocks than the layer's.
    let x = activations(&mut rng, 2, 256);
    let a32 = quantize_activations(&x, 2, 256, 32, ActivationQuant::Asymmetric).unwrap();
    let layer = BlockW8a8Cpu::channel_weight(&w, None, 64).unwrap();
    assert_eq!(invalid_tensor(layer.forward::<f32>(&a32)), "block_size");
}

#[test]
fn all_zero_activation_blocks_give_finite_output() {
    let mut rng = SplitMix64(0xA8A8_0004);
    let (m, n, k, block) = (3, 64, 256, 64);
    let mut x = activations(&mut rng, m, k);
    x[..k].fill(0.0); // a whole zero row
    x[k + 64..k + 128].fill(0.0); // one zero block
    let weight = BlockQuantWeight::quantize(
        &rng.vec(n * k, -1.0, 1.0),
        BlockShape::linear(n, k, block),
        BlockBits::Int8,
    )
    .unwrap();
    for mode in [ActivationQuant::Asymmetric, ActivationQuant::Symmetric] {
        let a = quantize_activations(&x, m, k, block, mode).unwrap();
        let got = BlockW8a8Cpu::new(&weight, None).unwrap().forward::<f32>(&a).unwrap();
        let want = reference::block_w8a8(&a, &weight, None).unwrap();
        assert!(got.iter().all(|v| v.is_finite()));
        // The zero row dequantizes to exactly zero, so its output is exactly zero.
        assert!(got[..n].iter().all(|&v| v == 0.0), "{mode:?}");
        assert_close(&format!("{mode:?}"), &got, &want, Tolerance::floored(2e-6, 2e-6));
    }
}

/// Codes ±127 (and one row/column of all +127, the largest sum) at K = 16384 with power-of-two scales and zero
/// offsets: the int32 block dot must be exact, so the output equals the exact f64 result rounded to f32.
#[test]
fn int32_accumulation_is_exact_at_k_16384() {
    let mut rng = SplitMix64(0xA8A8_0005);
    let (m, n, k) = (3, 8, 16384);
    let mut codes = |rows: usize| -> Vec<i8> {
        let mut c: Vec<i8> = (0..rows * k)
            .map(|_| if rng.next_u64() % 2 == 0 { 127 } else { -127 })
            .collect();
        c[..k].fill(127);
        c
    };
    let (a_codes, w_codes) = (codes(m), codes(n));
    for block in [k, 4096] {
        let blocks = k / block;
        let pow2 = |i: usize| 2f32.powi(i as i32 % 5 - 2);
        let a_scales: Vec<f32> = (0..m * blocks).map(pow2).collect();
        let w_scales: Vec<f32> = (0..n * blocks).map(|i| pow2(i + 1)).collect();
        let a =
            QuantizedActivations::from_parts(m, k, block, a_codes.clone(), a_scales, vec![0.0; m * blocks]).unwrap();
        let shape = BlockShape::linear(n, k, block);
        let w = BlockQuantWeight::from_parts(shape, BlockBits::Int8, w_codes.clone(), w_scales, vec![0.0; n * blocks])
            .unwrap();
        let want = reference::block_w8a8(&a, &w, None).unwrap();
        let got = BlockW8a8Cpu::new(&w, None).unwrap().forward::<f32>(&a).unwrap();
        if block < k {
            // Several blocks: each block dot is exact, but their f32 sum rounds (values reach 2^26).
            // Tolerance: a few f32 roundings of the largest output.
            assert_close("4 blocks of 4096", &got, &want, Tolerance::floored(1e-7, 1e-6));
            continue;
        }
        assert_bits_equal("one block of 16384", &got, &want);
        // Row 0 × column 0 is 16384 · 127², the largest sum.
        assert_eq!(want[0], 16384.0 * 127.0 * 127.0 * 0.25 * 0.5);
        let sq = SmoothQuantCpu::new(&w, None).unwrap().forward::<f32>(&a).unwrap();
        assert_eq!(sq, got);
    }
}

/// Small codes, power-of-two scales, integer offsets: every term of the per-block combination is exact in f32.
#[test]
fn exact_integer_mode_with_offsets_is_bit_exact() {
    let mut rng = SplitMix64(0xA8A8_0006);
    let (m, n, k, block) = (7, 24, 3884usize, 64);
    let blocks = k.div_ceil(block);
    let codes =
        |rng: &mut SplitMix64, rows: usize| -> Vec<i8> { (0..rows * k).map(|_| rng.int(-8, 8) as i8).collect() };
    let pow2 =
        |rng: &mut SplitMix64, count: usize| -> Vec<f32> { (0..count).map(|_| 2f32.powi(rng.int(-2, 1))).collect() };
    let ints = |rng: &mut SplitMix64, count: usize| -> Vec<f32> { (0..count).map(|_| rng.int(-3, 3) as f32).collect() };
    let (ac, asc, aof) = (
        codes(&mut rng, m),
        pow2(&mut rng, m * blocks),
        ints(&mut rng, m * blocks),
    );
    let a = QuantizedActivations::from_parts(m, k, block, ac, asc, aof).unwrap();
    let (wc, wsc, wof) = (
        codes(&mut rng, n),
        pow2(&mut rng, n * blocks),
        ints(&mut rng, n * blocks),
    );
    let w = BlockQuantWeight::from_parts(BlockShape::linear(n, k, block), BlockBits::Int8, wc, wsc, wof).unwrap();
    let bias = ints(&mut rng, n);
    let want = reference::block_w8a8(&a, &w, Some(&bias)).unwrap();
    let got = BlockW8a8Cpu::new(&w, Some(&bias)).unwrap().forward::<f32>(&a).unwrap();
    assert_bits_equal("exact integers", &got, &want);
}

#[test]
fn smoothquant_matches_reference() {
    let mut rng = SplitMix64(0xA8A8_0007);
    for m in [1, 7, 33] {
        for n in [128, 576] {
            let k = 1024;
            let x = activations(&mut rng, m, k);
            let a = quantize_activations(&x, m, k, k, ActivationQuant::Symmetric).unwrap();
            let w = BlockQuantWeight::quantize_per_channel_symmetric(&rng.vec(n * k, -0.2, 0.2), n, k).unwrap();
            let bias = rng.vec(n, -1.0, 1.0);
            let want = reference::smoothquant(&a, &w, Some(&bias)).unwrap();
            let sq = SmoothQuantCpu::new(&w, Some(&bias)).unwrap();
            // Tolerance: one rounding of an exact integer dot (the reference itself rounds per product in f64).
            assert_close(
                &format!("f32 m {m} n {n}"),
                &sq.forward::<f32>(&a).unwrap(),
                &want,
                Tolerance::floored(1e-6, 1e-6),
            );
            assert_close(
                &format!("f16 m {m} n {n}"),
                &to_f32(&sq.forward::<f16>(&a).unwrap()),
                &want,
                Tolerance::floored(1e-3, 1e-3),
            );
            assert_close(
                &format!("bf16 m {m} n {n}"),
                &to_f32(&sq.forward::<bf16>(&a).unwrap()),
                &want,
                Tolerance::floored(8e-3, 8e-3),
            );
            // SmoothQuant is the one-block, zero-offset case of the per-block GEMM.
            let block = BlockW8a8Cpu::new(&w, Some(&bias)).unwrap().forward::<f32>(&a).unwrap();
            assert_close(
                &format!("as block m {m} n {n}"),
                &block,
                &want,
                Tolerance::floored(1e-6, 1e-6),
            );
        }
    }
}

#[test]
fn smoothquant_longer_than_one_int32_chunk() {
    // K = 70000 > 65536: the dot is split into exact int32 chunks summed in int64.
    let mut rng = SplitMix64(0xA8A8_0008);
    let (m, n, k) = (2, 3, 70000);
    // Each row: 66000 codes of 127 (so an int32 sum over the row would overflow), then random ones.
    let mut codes = |rows: usize| -> Vec<i8> {
        (0..rows * k)
            .map(|i| if i % k < 66000 { 127 } else { rng.int(-127, 127) as i8 })
            .collect()
    };
    let (a_codes, w_codes) = (codes(m), codes(n));
    let a = QuantizedActivations::per_token(m, k, a_codes, vec![0.5, 0.25]).unwrap();
    let shape = BlockShape::linear(n, k, k);
    let w = BlockQuantWeight::from_parts(shape, BlockBits::Int8, w_codes, vec![1.0, 2.0, 0.125], vec![0.0; n]).unwrap();
    let want = reference::smoothquant(&a, &w, None).unwrap();
    let got = SmoothQuantCpu::new(&w, None).unwrap().forward::<f32>(&a).unwrap();
    assert_bits_equal("K = 70000", &got, &want);
    // The per-block kernel refuses blocks whose int32 dot could overflow.
    assert_eq!(invalid_tensor(BlockW8a8Cpu::new(&w, None)), "block_size");
}

#[test]
fn activations_are_reused_across_gemms_and_results_are_deterministic() {
    let mut rng = SplitMix64(0xA8A8_0009);
    let (m, k, block) = (33, 512, 64);
    let x = activations(&mut rng, m, k);
    let a = quantize_activations(&x, m, k, block, ActivationQuant::Asymmetric).unwrap();
    let first_row = quantize_activations(&x[..k], 1, k, block, ActivationQuant::Asymmetric).unwrap();
    for n in [64, 128, 192] {
        // q, k, v projections of different widths reading the same quantized input.
        let w = BlockQuantWeight::quantize(
            &rng.vec(n * k, -0.1, 0.1),
            BlockShape::linear(n, k, block),
            BlockBits::Int8,
        )
        .unwrap();
        let gemm = BlockW8a8Cpu::new(&w, None).unwrap();
        let y = gemm.forward::<f32>(&a).unwrap();
        assert_eq!(y, gemm.forward::<f32>(&a).unwrap());
        assert_eq!(&y[..n], &gemm.forward::<f32>(&first_row).unwrap()[..]);
        assert_close(
            "reuse",
            &y,
            &reference::block_w8a8(&a, &w, None).unwrap(),
            Tolerance::floored(2e-6, 2e-6),
        );
    }
}

/// Quantization error against the unquantized f64 product: reported, and bounded loosely (int8 both sides).
#[test]
fn quantization_error_against_dense() {
    let mut rng = SplitMix64(0xA8A8_000A);
    let (m, n, k, block) = (7, 128, 3884, 64);
    let x = activations(&mut rng, m, k);
    let dense = rng.vec(n * k, -0.1, 0.1);
    let exact: Vec<f64> = (0..m * n)
        .map(|i| {
            let (r, c) = (i / n, i % n);
            (0..k).map(|j| x[r * k + j] as f64 * dense[c * k + j] as f64).sum()
        })
        .collect();
    let w = BlockQuantWeight::quantize(&dense, BlockShape::linear(n, k, block), BlockBits::Int8).unwrap();
    let a = quantize_activations(&x, m, k, block, ActivationQuant::Asymmetric).unwrap();
    let got = BlockW8a8Cpu::new(&w, None).unwrap().forward::<f32>(&a).unwrap();
    let err = compare(&got, &exact);
    println!(
        "per-block W8A8 (block 64) vs unquantized: mean rel {:.3e}",
        err.mean_rel
    );
    assert!(err.mean_rel < 2e-2, "mean rel {:.3e}", err.mean_rel);
}

#[test]
fn invalid_inputs_are_typed_errors() {
    let mut rng = SplitMix64(0xA8A8_000B);
    let (m, n, k) = (2, 8, 128);
    let x = activations(&mut rng, m, k);
    let asym = ActivationQuant::Asymmetric;
    let a = quantize_activations(&x, m, k, 64, asym).unwrap();
    let w64 = BlockQuantWeight::quantize(
        &rng.vec(n * k, -1.0, 1.0),
        BlockShape::linear(n, k, 64),
        BlockBits::Int8,
    )
    .unwrap();
    let gemm = BlockW8a8Cpu::new(&w64, None).unwrap();

    // Activations: wrong length, non-finite, impossible block sizes.
    assert_eq!(
        invalid_tensor(quantize_activations(&x[..k], m, k, 64, asym)),
        "activations"
    );
    let mut bad = x.clone();
    bad[200] = f32::NAN;
    assert_eq!(
        invalid_tensor(quantize_activations(&bad, m, k, 64, asym)),
        "activations"
    );
    bad[200] = f32::INFINITY;
    assert_eq!(
        invalid_tensor(reference::quantize_activations(&bad, m, k, 64, asym)),
        "activations"
    );
    bad[200] = f32::MAX;
    bad[201] = -f32::MAX; // max − min overflows
    assert_eq!(
        invalid_tensor(quantize_activations(&bad, m, k, 64, asym)),
        "activations"
    );
    assert_eq!(invalid_tensor(quantize_activations(&x, m, k, 0, asym)), "block_size");
    assert_eq!(
        invalid_tensor(quantize_activations(&x, m, k, k + 1, asym)),
        "block_size"
    );
    assert_eq!(invalid_tensor(quantize_activations(&x, 0, k, 64, asym)), "activations");
    assert_eq!(
        invalid_tensor(QuantizedActivations::from_parts(
            m,
            k,
            64,
            vec![0; m * k],
            vec![f32::NAN; 4],
            vec![0.0; 4]
        )),
        "activation_scales"
    );
    assert_eq!(
        invalid_tensor(QuantizedActivations::per_token(m, k, vec![0; m * k], vec![1.0])),
        "activation_scales"
    );

    // GEMM: block size and K mismatches, wrong bias and output.
    let a32 = quantize_activations(&x, m, k, 32, asym).unwrap();
    assert_eq!(invalid_tensor(gemm.forward::<f32>(&a32)), "block_size");
    let a_short = quantize_activations(&x[..m * 64], m, 64, 64, asym).unwrap();
    assert_eq!(invalid_tensor(gemm.forward::<f32>(&a_short)), "activations");
    assert_eq!(invalid_tensor(reference::block_w8a8(&a_short, &w64, None)), "weight");
    assert_eq!(invalid_tensor(BlockW8a8Cpu::new(&w64, Some(&[0.0; 7]))), "bias");
    assert_eq!(invalid_tensor(gemm.forward_into::<f32>(&a, &mut [0.0; 15])), "output");
    let conv_weight = BlockQuantWeight::quantize(
        &rng.vec(n * 16 * 9, -1.0, 1.0),
        BlockShape::conv(n, 16, (3, 3), 1).unwrap(),
        BlockBits::Int8,
    )
    .unwrap();
    assert_eq!(invalid_tensor(BlockW8a8Cpu::new(&conv_weight, None)), "weight");

    // SmoothQuant: needs per-token symmetric activations and per-channel symmetric weights.
    let w_sym = BlockQuantWeight::quantize_per_channel_symmetric(&rng.vec(n * k, -1.0, 1.0), n, k).unwrap();
    let sq = SmoothQuantCpu::new(&w_sym, None).unwrap();
    assert_eq!(invalid_tensor(sq.forward::<f32>(&a)), "activations"); // 2 blocks per row
    let a_tok_asym = quantize_activations(&x, m, k, k, asym).unwrap();
    assert_eq!(invalid_tensor(sq.forward::<f32>(&a_tok_asym)), "activation_offsets");
    assert_eq!(invalid_tensor(SmoothQuantCpu::new(&w64, None)), "weight");
    let w_asym =
        BlockQuantWeight::quantize(&rng.vec(n * k, -1.0, 1.0), BlockShape::linear(n, k, k), BlockBits::Int8).unwrap();
    assert_eq!(invalid_tensor(SmoothQuantCpu::new(&w_asym, None)), "offsets");
    assert_eq!(
        invalid_tensor(SmoothQuantCpu::new(&w_sym, Some(&[f32::NAN; 8]))),
        "bias"
    );
    let a_tok = quantize_activations(&x[..m * 64], m, 64, 64, ActivationQuant::Symmetric).unwrap();
    assert_eq!(invalid_tensor(sq.forward::<f32>(&a_tok)), "activations");
    assert_eq!(
        invalid_tensor(BlockQuantWeight::quantize_per_channel_symmetric(&[1.0; 7], 2, 4)),
        "weight"
    );
}

/// A checkpoint's weight ([`QuantMatrix`], unsigned codes and zero points) becomes an offset-form weight with the
/// same values: exactly for symmetric weights, to the f32 rounding of the offset otherwise; its groups are the
/// blocks, and act-order is refused.
#[test]
fn checkpoint_weights_convert_to_offset_form() {
    let mut rng = SplitMix64(0xA8A8_000D);
    let (n, k) = (24, 512);
    for (bits, group, zeros) in [(8u8, k, false), (8, 64, true), (4, 128, true), (4, 32, false)] {
        let groups = k / group;
        let q = QuantMatrix {
            n,
            k,
            bits,
            group_size: group,
            codes: (0..n * k).map(|_| (rng.next_u64() % (1 << bits)) as u8).collect(),
            zeros: zeros.then(|| (0..n * groups).map(|_| (rng.next_u64() % (1 << bits)) as u8).collect()),
            scales: (0..n * groups).map(|_| rng.uniform(0.001, 0.05)).collect(),
            scale_dtype: lowbit::DType::F32,
            g_idx: None,
        };
        let w = BlockQuantWeight::from_quant(&q).unwrap();
        assert_eq!(w.shape().block_channels, group);
        assert_eq!(w.is_symmetric(), !zeros);
        let got = w.dequantize();
        for (i, &v) in got.iter().enumerate() {
            let (r, c) = (i / k, i % k);
            let g = r * groups + c / group;
            let want = (q.codes[i] as f64 - q.zero(r, c / group) as f64) * q.scales[g] as f64;
            if zeros {
                assert!((v as f64 - want).abs() <= 1e-6 * 0.05 * 256.0, "bits {bits} [{r}, {c}]");
            } else {
                assert_eq!(v, want as f32, "bits {bits} [{r}, {c}]");
            }
        }
        // It runs as per-block W8A8 with activations in its groups.
        let x = activations(&mut rng, 3, k);
        let a = quantize_activations(&x, 3, k, group, ActivationQuant::Asymmetric).unwrap();
        let got = BlockW8a8Cpu::new(&w, None).unwrap().forward::<f32>(&a).unwrap();
        let want = reference::block_w8a8(&a, &w, None).unwrap();
        assert_close(
            &format!("bits {bits} group {group}"),
            &got,
            &want,
            Tolerance::floored(2e-6, 2e-6),
        );
    }
    let act_order = QuantMatrix {
        n: 2,
        k: 4,
        bits: 8,
        group_size: 2,
        codes: vec![128; 8],
        zeros: None,
        scales: vec![1.0; 4],
        scale_dtype: lowbit::DType::F32,
        g_idx: Some(vec![1, 0, 1, 0]),
    };
    assert_eq!(invalid_tensor(BlockQuantWeight::from_quant(&act_order)), "g_idx");
}
