//! W8A8 on CUDA (`ops::w8a8::cuda`) against the f64 reference on the same quantized operands, plus the accuracy
//! of the whole scheme against the unquantized product (CPU path; also the GPU when one is present).
//!
//! Tolerances (per test): the GPU quantizer must equal the CPU quantizer bit for bit (codes, scales, offsets, code
//! sums). GEMM outputs are f32 combinations rounded once to f16 / bf16, so they are held to the output type's
//! rounding: mean relative 1e-3 (f16) / 8e-3 (bf16), max error 1e-3 / 8e-3 of max(max |ref|, 1) — the CPU suite's
//! bounds for the same outputs. Exact modes (small codes, power-of-two scales, dyadic offsets; or SmoothQuant at
//! K = 16384 with ±127 codes whose partial sums reach 2^27) require every output to be the one rounding of the exact
//! value. GPU tests print `skipped: <reason>` without a GPU.

use half::{bf16, f16};
use lowbit::cuda::{CudaDevice, CudaSlice, DeviceRepr, ValidAsZeroBits};
use lowbit::formats::block::{BlockBits, BlockQuantWeight, BlockShape};
use lowbit::ops::w8a8::cpu::{BlockW8a8Cpu, SmoothQuantCpu};
use lowbit::ops::w8a8::cuda::{GemmKernel, QuantizedActivationsCuda, W8a8LinearCuda, W8a8Scheme};
use lowbit::ops::w8a8::{quantize_activations, reference, ActivationQuant, QuantizedActivations};
use lowbit::testing::{cuda_device, SplitMix64};
use lowbit::{DType, Float};
use std::sync::Arc;

mod common;
use common::{assert_close, compare, from_f32, invalid_tensor, to_f32, Fixture, Tolerance};

/// Activation-like rows `[m, k]`: a per-row shift and scale, and about 1% outliers ×8.
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

/// The output type's rounding bound (see the module docs).
fn tolerance(dtype: DType) -> Tolerance {
    let tol = if dtype == DType::F16 { 1e-3 } else { 8e-3 };
    Tolerance::floored(tol, tol)
}

/// Every GEMM kernel that applies on this GPU to K blocks of `block` over `k`: mma.sync always, wgmma on sm_90a
/// for blocks of 128·j or one block per row.
fn kernels(dev: &CudaDevice, k: usize, block: usize) -> Vec<GemmKernel> {
    let mut v = vec![GemmKernel::MmaSync];
    if dev.info().arch == "sm_90a" && (block >= k || block % 128 == 0) {
        v.push(GemmKernel::Wgmma);
    }
    v
}

fn upload<T: Float + DeviceRepr>(dev: &CudaDevice, x: &[f32]) -> CudaSlice<T> {
    dev.upload(&from_f32::<T>(x)).unwrap()
}

/// `op.run` (quantization + GEMM) on `x [m, K]`; returns y as f32 and the activations the GPU quantized.
fn run_fused<T: Float + DeviceRepr + ValidAsZeroBits>(
    dev: &CudaDevice,
    op: &W8a8LinearCuda,
    x: &[f32],
    m: usize,
) -> (Vec<f32>, QuantizedActivations) {
    let xd = upload::<T>(dev, x);
    let mut y = dev.alloc_zeros::<T>(m * op.n()).unwrap();
    let mut ws = dev.alloc_zeros::<u8>(op.workspace_bytes(m)).unwrap();
    op.run(dev.stream(), &xd, m, &mut y, &mut ws).unwrap();
    // The same quantization on its own, to get the operands the GEMM used.
    let mut a = QuantizedActivationsCuda::alloc(dev, m, op.k(), op.block_size()).unwrap();
    op.quantizer().run(dev.stream(), &xd, m, &mut a).unwrap();
    let (a, _) = a.download(dev).unwrap();
    (to_f32(&dev.download(&y).unwrap()), a)
}

#[test]
fn quantizer_matches_cpu_bit_for_bit() {
    let Some(dev) = cuda_device() else { return };
    let mut rng = SplitMix64(0xC8A8_0001);
    // Block lengths covering every kernel variant: per-lane registers r1 (32), r2 (64), r4 (96, 128), r8 (256);
    // vector loads v2/v4 (K not a multiple of 8), v8 groups of 4/8/16 lanes (32, 64, 128; partial warps and partial
    // last blocks: 72, 136, 264), v8 (256); past 256 the CTA per block (multiples of 8), its values held in
    // registers up to 16384 (400 and 1024 with a partial last block, 1000, 2048, 4096, 5000, 8192 exactly,
    // K = 14336; and many rows: M = 2000, 600, 300) or read twice beyond (20000, 30000), or the two-pass warp loop
    // (1001).
    for &(m, k, block) in &[
        (3, 72, 32),
        (3, 136, 64),
        (3, 264, 128),
        (7, 3884, 64),
        (5, 256, 32),
        (3, 4096, 128),
        (4, 300, 96),
        (3, 1024, 256),
        (2, 1000, 1000),
        (3, 5000, 5000),
        (3, 3000, 1024),
        (2, 14336, 14336),
        (3, 8192, 8192),
        (3, 1000, 400),
        (2, 2048, 2048),
        (3, 4096, 4096),
        (2, 20000, 20000),
        (2000, 4096, 4096),
        (600, 14336, 14336),
        (300, 20000, 20000),
        (2, 30000, 30000),
        (2, 1001, 1001),
    ] {
        let mut x = activations(&mut rng, m, k);
        x[..block].fill(0.0); // an all-zero block
        x[k..k + block].fill(-2.5); // an all-equal block
        for mode in [ActivationQuant::Asymmetric, ActivationQuant::Symmetric] {
            check_quantizer::<f16>(&dev, &x, m, k, block, mode);
            check_quantizer::<bf16>(&dev, &x, m, k, block, mode);
        }
    }
}

fn check_quantizer<T: Float + DeviceRepr + ValidAsZeroBits>(
    dev: &Arc<CudaDevice>,
    x: &[f32],
    m: usize,
    k: usize,
    block: usize,
    mode: ActivationQuant,
) {
    let what = format!("{} m {m} k {k} block {block} {mode:?}", T::DTYPE);
    let xt: Vec<T> = from_f32(x);
    let want = quantize_activations(&xt, m, k, block, mode).unwrap();
    let quantizer = lowbit::ops::w8a8::cuda::QuantizeActivationsCuda::new(dev, k, block, mode, T::DTYPE).unwrap();
    let mut a = QuantizedActivationsCuda::alloc(dev, m, k, block).unwrap();
    quantizer
        .run(dev.stream(), &dev.upload(&xt).unwrap(), m, &mut a)
        .unwrap();
    let (got, sums) = a.download(dev).unwrap();
    assert!(got.scales().iter().all(|s| s.is_finite() && *s > 0.0), "{what}: scales");
    assert_eq!(got, want, "{what}");
    assert_eq!(sums, want.code_sums(), "{what}: device code sums");
    // x one element off its alignment: the scalar kernel instead of the vector one, same result.
    let mut padded = vec![T::default()];
    padded.extend_from_slice(&xt);
    let shifted = dev.upload(&padded).unwrap();
    quantizer.run(dev.stream(), &shifted.slice(1..), m, &mut a).unwrap();
    assert_eq!(a.download(dev).unwrap().0, want, "{what}: unaligned x");
}

/// One per-block case through `run` (GPU quantization + GEMM) against the f64 reference on the GPU's operands.
#[allow(clippy::too_many_arguments)]
fn check_block_case<T: Float + DeviceRepr + ValidAsZeroBits>(
    dev: &CudaDevice,
    rng: &mut SplitMix64,
    m: usize,
    n: usize,
    k: usize,
    block: usize,
    mode: ActivationQuant,
    with_bias: bool,
) {
    let mut x = activations(rng, m, k);
    x[k - 1] = 0.0;
    if m > 1 {
        x[k..k + block].fill(0.0); // an all-zero block must give a finite scale and exact zeros
    }
    let dense = rng.vec(n * k, -0.1, 0.1);
    let weight = BlockQuantWeight::quantize(&dense, BlockShape::linear(n, k, block), BlockBits::Int8).unwrap();
    let bias = rng.vec(n, -1.0, 1.0);
    let bias = with_bias.then_some(&bias[..]);
    let a_cpu = quantize_activations(&from_f32::<T>(&x), m, k, block, mode).unwrap();
    let want = reference::block_w8a8(&a_cpu, &weight, bias).unwrap();
    for kernel in kernels(dev, k, block) {
        let scheme = W8a8Scheme::Block(mode);
        let op = W8a8LinearCuda::with_kernel(dev, &weight, bias, scheme, T::DTYPE, kernel).unwrap();
        let (got, a) = run_fused::<T>(dev, &op, &x, m);
        assert_eq!(a, a_cpu, "the GEMM's operands are the CPU quantizer's");
        let what = format!(
            "{} {kernel:?} m {m} n {n} k {k} block {block} {mode:?} bias {with_bias}",
            T::DTYPE
        );
        assert_close(&what, &got, &want, tolerance(T::DTYPE));
    }
}

#[test]
fn block_w8a8_matches_reference() {
    let Some(dev) = cuda_device() else { return };
    let mut rng = SplitMix64(0xC8A8_0002);
    for m in [1, 7, 33, 222] {
        for n in [128, 576] {
            for (k, block) in [(256, 64), (3884, 64), (1000, 32), (4096, 128), (1280, 256)] {
                for mode in [ActivationQuant::Asymmetric, ActivationQuant::Symmetric] {
                    let bias = rng.next_u64() % 2 == 0;
                    if (m * n * k) % 2 == 0 {
                        check_block_case::<f16>(&dev, &mut rng, m, n, k, block, mode, bias);
                    } else {
                        check_block_case::<bf16>(&dev, &mut rng, m, n, k, block, mode, bias);
                    }
                }
            }
        }
    }
    // Both dtypes on every block size, N not a multiple of the tile, a multiple-of-128 block, one block per row.
    for (n, k, block) in [
        (200, 3884, 32),
        (7168, 512, 128),
        (96, 1024, 256),
        (64, 384, 384),
        (40, 3884, 3884),
    ] {
        check_block_case::<f16>(&dev, &mut rng, 13, n, k, block, ActivationQuant::Asymmetric, true);
        check_block_case::<bf16>(&dev, &mut rng, 13, n, k, block, ActivationQuant::Asymmetric, true);
    }
}

/// M = 4096 (32 row tiles, the raster's partial last group) against the CPU kernel (f32, itself checked against the
/// reference in w8a8_cpu.rs) on the same quantized operands.
#[test]
fn block_w8a8_large_m_matches_cpu_kernel() {
    let Some(dev) = cuda_device() else { return };
    let mut rng = SplitMix64(0xC8A8_0003);
    for (n, k, block) in [(576, 3884, 64), (320, 3884, 128)] {
        let m = 4096;
        let x = activations(&mut rng, m, k);
        let dense = rng.vec(n * k, -0.1, 0.1);
        let weight = BlockQuantWeight::quantize(&dense, BlockShape::linear(n, k, block), BlockBits::Int8).unwrap();
        let bias = rng.vec(n, -1.0, 1.0);
        let cpu = BlockW8a8Cpu::new(&weight, Some(&bias)).unwrap();
        for kernel in kernels(&dev, k, block) {
            let scheme = W8a8Scheme::Block(ActivationQuant::Asymmetric);
            let op = W8a8LinearCuda::with_kernel(&dev, &weight, Some(&bias), scheme, DType::F16, kernel).unwrap();
            let (got, a) = run_fused::<f16>(&dev, &op, &x, m);
            let want: Vec<f64> = cpu.forward::<f32>(&a).unwrap().iter().map(|&v| v as f64).collect();
            let what = format!("{kernel:?} m {m} n {n} k {k} block {block}");
            assert_close(&what, &got, &want, tolerance(DType::F16));
        }
    }
}

#[test]
fn smoothquant_matches_reference() {
    let Some(dev) = cuda_device() else { return };
    let mut rng = SplitMix64(0xC8A8_0004);
    for (m, n, k) in [(1, 128, 256), (33, 576, 3884), (222, 128, 4096), (7, 7168, 1024)] {
        for dtype in [DType::F16, DType::Bf16] {
            let x = activations(&mut rng, m, k);
            let dense = rng.vec(n * k, -0.1, 0.1);
            let weight = BlockQuantWeight::quantize_per_channel_symmetric(&dense, n, k).unwrap();
            let bias = rng.vec(n, -1.0, 1.0);
            for kernel in kernels(&dev, k, k) {
                let scheme = W8a8Scheme::SmoothQuant;
                let op = W8a8LinearCuda::with_kernel(&dev, &weight, Some(&bias), scheme, dtype, kernel).unwrap();
                let (got, a) = match dtype {
                    DType::F16 => run_fused::<f16>(&dev, &op, &x, m),
                    _ => run_fused::<bf16>(&dev, &op, &x, m),
                };
                let want = reference::smoothquant(&a, &weight, Some(&bias)).unwrap();
                let what = format!("smoothquant {kernel:?} {dtype} m {m} n {n} k {k}");
                assert_close(&what, &got, &want, tolerance(dtype));
            }
        }
    }
}

/// Per-channel weights (symmetric and offset form: the Hopper `_channel` kernels on sm_90a, `_channel_sym` when the
/// activations are symmetric too; the per-block path with repeated parameters on mma.sync) with per-block
/// activations of both modes, through `run`, against the f64 reference on the GPU's operands.
#[test]
fn channel_weight_matches_reference() {
    let Some(dev) = cuda_device() else { return };
    let mut rng = SplitMix64(0xC8A8_000A);
    for (m, n, k, block) in [
        (1, 128, 256, 64),
        (7, 576, 3884, 128),
        (33, 200, 1000, 32),
        (222, 128, 4096, 128),
        (13, 7168, 1280, 256),
        (5, 64, 384, 384),
    ] {
        let x = activations(&mut rng, m, k);
        let dense = rng.vec(n * k, -0.1, 0.1);
        let bias = rng.vec(n, -1.0, 1.0);
        for symmetric in [true, false] {
            let weight = match symmetric {
                true => BlockQuantWeight::quantize_per_channel_symmetric(&dense, n, k).unwrap(),
                false => BlockQuantWeight::quantize(&dense, BlockShape::linear(n, k, k), BlockBits::Int8).unwrap(),
            };
            for (dtype, mode) in [
                (DType::F16, ActivationQuant::Asymmetric),
                (DType::Bf16, ActivationQuant::Asymmetric),
                (DType::F16, ActivationQuant::Symmetric),
                (DType::Bf16, ActivationQuant::Symmetric),
            ] {
                for kernel in kernels(&dev, k, block) {
                    let scheme = W8a8Scheme::ChannelWeight {
                        mode,
                        block_size: block,
                    };
                    let op = W8a8LinearCuda::with_kernel(&dev, &weight, Some(&bias), scheme, dtype, kernel).unwrap();
                    let fast = kernel == GemmKernel::Wgmma;
                    assert_eq!(op.kernel_name().contains("channel"), fast, "{}", op.kernel_name());
                    // Symmetric on both sides: no offset terms, the `_channel_sym` kernels.
                    let no_offsets = fast && symmetric && mode == ActivationQuant::Symmetric;
                    assert_eq!(
                        op.kernel_name().contains("channel_sym"),
                        no_offsets,
                        "{}",
                        op.kernel_name()
                    );
                    let (got, a) = match dtype {
                        DType::F16 => run_fused::<f16>(&dev, &op, &x, m),
                        _ => run_fused::<bf16>(&dev, &op, &x, m),
                    };
                    let want = reference::block_w8a8(&a, &weight, Some(&bias)).unwrap();
                    let what = format!(
                        "channel {kernel:?} {dtype} {mode:?} m {m} n {n} k {k} block {block} sym weight {symmetric}"
                    );
                    assert_close(&what, &got, &want, tolerance(dtype));
                }
            }
        }
    }
    // The default kernel on this GPU, and the typed refusals.
    let (n, k) = (64, 512);
    let w = BlockQuantWeight::quantize_per_channel_symmetric(&rng.vec(n * k, -0.1, 0.1), n, k).unwrap();
    let asym = ActivationQuant::Asymmetric;
    let op = W8a8LinearCuda::channel_weight(&dev, &w, None, 128, asym, DType::F16).unwrap();
    assert_eq!(op.block_size(), 128);
    if dev.info().arch == "sm_90a" {
        assert!(
            op.kernel_name().starts_with("w8a8_wgmma_channel_"),
            "{}",
            op.kernel_name()
        );
    }
    let per_block = BlockQuantWeight::quantize(
        &rng.vec(n * k, -0.1, 0.1),
        BlockShape::linear(n, k, 128),
        BlockBits::Int8,
    )
    .unwrap();
    let r = W8a8LinearCuda::channel_weight(&dev, &per_block, None, 128, asym, DType::F16);
    assert_eq!(invalid_tensor(r), "weight");
    for bad in [0, 96, k + 1] {
        let r = W8a8LinearCuda::channel_weight(&dev, &w, None, bad, asym, DType::F16);
        assert_eq!(invalid_tensor(r), "block_size", "block {bad}");
    }
}

/// Small codes, power-of-two scales and dyadic offsets: every f32 step of the combination is exact, so each output
/// must be the single rounding of the exact f64 result (uploaded activations: the GEMM alone).
#[test]
fn exact_integer_mode_is_bit_exact() {
    let Some(dev) = cuda_device() else { return };
    let mut rng = SplitMix64(0xC8A8_0005);
    for (m, n, k, block) in [
        (5usize, 136usize, 256usize, 32usize),
        (17, 128, 3884, 64),
        (3, 256, 512, 128),
        // The wgmma kernel's blocks of two stages, and a partial last block of 128.
        (9, 384, 1280, 256),
        (130, 128, 3884, 128),
    ] {
        let blocks = k.div_ceil(block);
        let pow2 = |rng: &mut SplitMix64| 2f32.powi(rng.int(-2, 2));
        let dyadic = |rng: &mut SplitMix64| rng.int(-8, 8) as f32 / 4.0;
        let codes = (0..m * k).map(|_| rng.int(-7, 7) as i8).collect();
        let a = QuantizedActivations::from_parts(
            m,
            k,
            block,
            codes,
            (0..m * blocks).map(|_| pow2(&mut rng)).collect(),
            (0..m * blocks).map(|_| dyadic(&mut rng)).collect(),
        )
        .unwrap();
        let weight = BlockQuantWeight::from_parts(
            BlockShape::linear(n, k, block),
            BlockBits::Int8,
            (0..n * k).map(|_| rng.int(-7, 7) as i8).collect(),
            (0..n * blocks).map(|_| pow2(&mut rng)).collect(),
            (0..n * blocks).map(|_| dyadic(&mut rng)).collect(),
        )
        .unwrap();
        // And per-channel weights of the same codes, symmetric and in offset form (the `_channel` kernels on
        // sm_90a, which take oB / sB: exact here).
        let channel = |rng: &mut SplitMix64, symmetric: bool| {
            BlockQuantWeight::from_parts(
                BlockShape::linear(n, k, k),
                BlockBits::Int8,
                weight.codes().to_vec(),
                (0..n).map(|_| pow2(rng)).collect(),
                (0..n).map(|_| if symmetric { 0.0 } else { dyadic(rng) }).collect(),
            )
            .unwrap()
        };
        let (channel_sym, channel_offset) = (channel(&mut rng, true), channel(&mut rng, false));
        let bias: Vec<f32> = (0..n).map(|_| dyadic(&mut rng)).collect();
        let ad = QuantizedActivationsCuda::upload(&dev, &a).unwrap();
        let channel_scheme = W8a8Scheme::ChannelWeight {
            mode: ActivationQuant::Asymmetric,
            block_size: block,
        };
        let schemes = [
            (&weight, W8a8Scheme::Block(ActivationQuant::Asymmetric)),
            (&channel_sym, channel_scheme),
            (&channel_offset, channel_scheme),
        ];
        for (weight, scheme) in schemes {
            let want = reference::block_w8a8(&a, weight, Some(&bias)).unwrap();
            for dtype in [DType::F16, DType::Bf16] {
                for kernel in kernels(&dev, k, block) {
                    let op = W8a8LinearCuda::with_kernel(&dev, weight, Some(&bias), scheme, dtype, kernel).unwrap();
                    let got = run_uploaded(&dev, &op, &ad, m, dtype);
                    let rounded = round_all(&want, dtype);
                    assert_eq!(
                        got,
                        rounded,
                        "exact mode {} {dtype} m {m} n {n} k {k} block {block}",
                        op.kernel_name()
                    );
                }
            }
        }
    }
}

/// SmoothQuant at K = 16384 with ±127 codes: int32 accumulation must be exact. Per column, the first 16382 products
/// are ±16129 with equal counts of each sign in a column-dependent order (partial sums up to 2^27, where f32 steps
/// are 16), the last two give ±127·2^e: the exact result has 7 significant bits, representable in f16 and bf16.
#[test]
fn int32_accumulation_is_exact_at_k_16384() {
    let Some(dev) = cuda_device() else { return };
    let mut rng = SplitMix64(0xC8A8_0006);
    let (m, n, k) = (24, 136, 16384);
    let row_sign: Vec<i8> = (0..m).map(|_| if rng.next_u64() % 2 == 0 { 1 } else { -1 }).collect();
    let a_codes: Vec<i8> = (0..m * k).map(|i| 127 * row_sign[i / k]).collect();
    let mut w_codes = vec![0i8; n * k];
    let mut want = vec![0f64; m * n];
    for c in 0..n {
        let row = &mut w_codes[c * k..(c + 1) * k];
        for (i, q) in row[..k - 2].iter_mut().enumerate() {
            *q = if i < (k - 2) / 2 { 127 } else { -127 };
        }
        if c % 2 == 1 {
            rng.shuffle(&mut row[..k - 2]);
        } else if c % 4 == 2 {
            row[..k - 2].reverse();
        }
        let e = (c % 7) as i32;
        (row[k - 2], row[k - 1]) = (1i8 << e.min(6), 0);
        for r in 0..m {
            let dot: i64 = row
                .iter()
                .zip(&a_codes[r * k..(r + 1) * k])
                .map(|(&w, &a)| w as i64 * a as i64)
                .sum();
            want[r * n + c] = dot as f64;
        }
    }
    let a = QuantizedActivations::per_token(m, k, a_codes, vec![1.0; m]).unwrap();
    let weight = BlockQuantWeight::from_parts(
        BlockShape::linear(n, k, k),
        BlockBits::Int8,
        w_codes,
        vec![1.0; n],
        vec![0.0; n],
    )
    .unwrap();
    assert_eq!(reference::smoothquant(&a, &weight, None).unwrap(), want);
    let ad = QuantizedActivationsCuda::upload(&dev, &a).unwrap();
    for dtype in [DType::F16, DType::Bf16] {
        for kernel in kernels(&dev, k, k) {
            let op = W8a8LinearCuda::with_kernel(&dev, &weight, None, W8a8Scheme::SmoothQuant, dtype, kernel).unwrap();
            let got = run_uploaded(&dev, &op, &ad, m, dtype);
            assert_eq!(got, round_all(&want, dtype), "K = 16384 {kernel:?} {dtype}");
        }
    }
}

/// `op.run_quantized` on uploaded activations; y as f32.
fn run_uploaded(
    dev: &CudaDevice,
    op: &W8a8LinearCuda,
    a: &QuantizedActivationsCuda,
    m: usize,
    dtype: DType,
) -> Vec<f32> {
    fn go<T: Float + DeviceRepr + ValidAsZeroBits>(
        dev: &CudaDevice,
        op: &W8a8LinearCuda,
        a: &QuantizedActivationsCuda,
        m: usize,
    ) -> Vec<f32> {
        let mut y = dev.alloc_zeros::<T>(m * op.n()).unwrap();
        op.run_quantized(dev.stream(), a, &mut y).unwrap();
        to_f32(&dev.download(&y).unwrap())
    }
    match dtype {
        DType::F16 => go::<f16>(dev, op, a, m),
        _ => go::<bf16>(dev, op, a, m),
    }
}

/// Each value rounded once to `dtype` (from f64 through f32: exact here, the values fit in f32).
fn round_all(v: &[f64], dtype: DType) -> Vec<f32> {
    v.iter()
        .map(|&x| match dtype {
            DType::F16 => f16::from_f32(x as f32).to_f32(),
            _ => bf16::from_f32(x as f32).to_f32(),
        })
        .collect()
}

/// Rows do not depend on the batch: row 0 of an M = 33 call equals the M = 1 call, bit for bit, and reruns are
/// identical. Quantizing once and running two layers (q/k/v reuse) equals `run`. Default kernels.
#[test]
fn deterministic_batch_invariant_and_reusable() {
    let Some(dev) = cuda_device() else { return };
    let mut rng = SplitMix64(0xC8A8_0007);
    let (m, n, k, block) = (33, 576, 3884, 128);
    let x = activations(&mut rng, m, k);
    let w = |rng: &mut SplitMix64| {
        let dense = rng.vec(n * k, -0.1, 0.1);
        BlockQuantWeight::quantize(&dense, BlockShape::linear(n, k, block), BlockBits::Int8).unwrap()
    };
    let (w1, w2) = (w(&mut rng), w(&mut rng));
    let op1 = W8a8LinearCuda::block(&dev, &w1, None, ActivationQuant::Asymmetric, DType::F16).unwrap();
    let op2 = W8a8LinearCuda::block(&dev, &w2, None, ActivationQuant::Asymmetric, DType::F16).unwrap();
    let (y1, _) = run_fused::<f16>(&dev, &op1, &x, m);
    let (y1_again, _) = run_fused::<f16>(&dev, &op1, &x, m);
    let (y1_row0, _) = run_fused::<f16>(&dev, &op1, &x[..k], 1);
    assert_eq!(y1, y1_again, "rerun");
    assert_eq!(&y1[..n], &y1_row0[..], "row 0 of M = 33 vs M = 1");
    let (y2, _) = run_fused::<f16>(&dev, &op2, &x, m);
    let xd = upload::<f16>(&dev, &x);
    let mut a = QuantizedActivationsCuda::alloc(&dev, m, k, block).unwrap();
    op1.quantizer().run(dev.stream(), &xd, m, &mut a).unwrap();
    for (op, want) in [(&op1, &y1), (&op2, &y2)] {
        let mut y = dev.alloc_zeros::<f16>(m * n).unwrap();
        op.run_quantized(dev.stream(), &a, &mut y).unwrap();
        assert_eq!(&to_f32(&dev.download(&y).unwrap()), want, "quantize once, two GEMMs");
    }
}

/// Layers that load the same kernel with different shared memory (mma.sync with blocks of 64: two parameter slots
/// per stage; of 128: one) both run, in either order of creation: the kernel's allowance is only ever raised.
#[test]
fn layers_sharing_a_kernel_keep_their_shared_memory() {
    let Some(dev) = cuda_device() else { return };
    let mut rng = SplitMix64(0xC8A8_000B);
    let (m, n, k) = (5, 128, 512);
    let x = activations(&mut rng, m, k);
    let dense = rng.vec(n * k, -0.1, 0.1);
    let layer = |block: usize| {
        let w = BlockQuantWeight::quantize(&dense, BlockShape::linear(n, k, block), BlockBits::Int8).unwrap();
        let scheme = W8a8Scheme::Block(ActivationQuant::Asymmetric);
        W8a8LinearCuda::with_kernel(&dev, &w, None, scheme, DType::F16, GemmKernel::MmaSync).unwrap()
    };
    let (wide, narrow) = (layer(64), layer(128));
    assert_eq!(wide.kernel_name(), narrow.kernel_name());
    for op in [&wide, &narrow, &wide] {
        let (got, _) = run_fused::<f16>(&dev, op, &x, m);
        assert!(got.iter().all(|v| v.is_finite()), "{}", op.block_size());
    }
}

/// Guard words: the output has a canary region after M·N elements that must survive; bad inputs are typed errors.
#[test]
fn guard_words_and_bad_input() {
    let Some(dev) = cuda_device() else { return };
    let mut rng = SplitMix64(0xC8A8_0008);
    let (m, n, k, block) = (37, 200, 3884, 64);
    let dense = rng.vec(n * k, -0.1, 0.1);
    let weight = BlockQuantWeight::quantize(&dense, BlockShape::linear(n, k, block), BlockBits::Int8).unwrap();
    let op = W8a8LinearCuda::block(&dev, &weight, None, ActivationQuant::Asymmetric, DType::F16).unwrap();
    const CANARY: u16 = 0x7E01; // a NaN pattern no kernel writes
    let guard = 4096;
    let x = upload::<f16>(&dev, &activations(&mut rng, m, k));
    let mut y = dev.upload(&vec![f16::from_bits(CANARY); m * n + guard]).unwrap();
    let mut ws = dev.alloc_zeros::<u8>(op.workspace_bytes(m)).unwrap();
    op.run(dev.stream(), &x, m, &mut y, &mut ws).unwrap();
    let out = dev.download(&y).unwrap();
    assert!(
        out[..m * n].iter().all(|v| v.to_f32().is_finite()),
        "every output written"
    );
    assert!(
        out[m * n..].iter().all(|v| v.to_bits() == CANARY),
        "nothing written past M·N"
    );

    let mut short = dev.alloc_zeros::<f16>(m * n - 1).unwrap();
    assert_eq!(invalid_tensor(op.run(dev.stream(), &x, m, &mut short, &mut ws)), "y");
    let mut small_ws = dev.alloc_zeros::<u8>(op.workspace_bytes(m) - 1).unwrap();
    assert_eq!(
        invalid_tensor(op.run(dev.stream(), &x, m, &mut y, &mut small_ws)),
        "workspace"
    );
    let mut y_bf16 = dev.alloc_zeros::<bf16>(m * n).unwrap();
    let x_bf16 = dev.alloc_zeros::<bf16>(m * k).unwrap();
    assert_eq!(
        invalid_tensor(op.run(dev.stream(), &x_bf16, m, &mut y_bf16, &mut ws)),
        "y"
    );
    assert_eq!(
        invalid_tensor(op.run(dev.stream(), &x, m + 1, &mut y, &mut ws)),
        "workspace"
    );
    let odd = BlockQuantWeight::quantize(&dense, BlockShape::linear(n, k, 96), BlockBits::Int8).unwrap();
    let r = W8a8LinearCuda::block(&dev, &odd, None, ActivationQuant::Asymmetric, DType::F16);
    assert_eq!(invalid_tensor(r), "block_size");
    let r = W8a8LinearCuda::block(&dev, &weight, None, ActivationQuant::Asymmetric, DType::F32);
    assert_eq!(invalid_tensor(r), "dtype");
    assert_eq!(
        invalid_tensor(W8a8LinearCuda::smoothquant(&dev, &weight, None, DType::F16)),
        "weight"
    );
    let other_block = QuantizedActivationsCuda::alloc(&dev, m, k, 32).unwrap();
    assert_eq!(
        invalid_tensor(op.run_quantized(dev.stream(), &other_block, &mut y)),
        "block_size"
    );
    dev.synchronize().unwrap();
}

// ---- Accuracy of the scheme against the unquantized product ------------------------------------------------------

/// ‖got − want‖ / ‖want‖ (Frobenius).
fn rel_rms(got: &[f32], want: &[f64]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (&g, &w) in got.iter().zip(want) {
        num += (g as f64 - w).powi(2);
        den += w * w;
    }
    (num / den).sqrt()
}

/// `x [m, k] · w [n, k]^T` in f64.
fn dense_product(x: &[f32], w: &[f32], k: usize) -> Vec<f64> {
    x.chunks_exact(k)
        .flat_map(|xr| {
            w.chunks_exact(k)
                .map(move |wr| xr.iter().zip(wr).map(|(&a, &b)| a as f64 * b as f64).sum())
        })
        .collect()
}

/// The error of every scheme against the unquantized f64 product `x · W^T`, per block size: the MiniLM weights of
/// the golden fixture, with the fixture's activations and with activations that have outlier channels (1 in 64
/// channels ×30, the LLM pattern SmoothQuant addresses), printed as a table (copied to docs/notes/w8a8.md).
/// Computed with the CPU kernels (f32 output; the GPU kernels compute the same combination); bounds are loose
/// sanity checks, the table is the result.
#[test]
fn scheme_accuracy_on_minilm_and_outliers() {
    let fixture = Fixture::load();
    let mut rng = SplitMix64(0xC8A8_0009);
    println!("| weight | activations | scheme | block | rel. RMS error | mean rel. error |");
    println!("|---|---|---|---|---|---|");
    for case in ["awq_minilm_l0_query_g128", "awq_minilm_l2_ffn_up_g128"] {
        let w_dense = fixture.get(&format!("{case}.weight")).to_f32().unwrap();
        let x_fixture = fixture.get(&format!("{case}.x")).to_f32().unwrap();
        let k = 384;
        let n = w_dense.len() / k;
        let m = 64;
        let mut x_outliers: Vec<f32> = (0..m * k).map(|_| rng.signed_unit() + rng.signed_unit()).collect();
        for c in (0..k).step_by(64) {
            for r in 0..m {
                x_outliers[r * k + c + 5] *= 30.0;
            }
        }
        for (x_name, x, m) in [("fixture x", &x_fixture, 5), ("outlier channels", &x_outliers, m)] {
            let want = dense_product(x, &w_dense, k);
            let report = |scheme: &str, block: String, got: Vec<f32>, bound: f64| {
                let err = rel_rms(&got, &want);
                let mean = compare(&got, &want).mean_rel;
                println!("| {case} | {x_name} | {scheme} | {block} | {err:.2e} | {mean:.2e} |");
                assert!(err < bound, "{case} {x_name} {scheme} {block}: {err} >= {bound}");
            };
            for block in [32, 64, 128, k] {
                let shape = BlockShape::linear(n, k, block);
                let weight = BlockQuantWeight::quantize(&w_dense, shape, BlockBits::Int8).unwrap();
                let gemm = BlockW8a8Cpu::new(&weight, None).unwrap();
                for (name, mode) in [
                    ("per-block asym", ActivationQuant::Asymmetric),
                    ("per-block sym", ActivationQuant::Symmetric),
                ] {
                    let a = quantize_activations(x, m, k, block, mode).unwrap();
                    let label = if block == k { "K".to_string() } else { block.to_string() };
                    report(name, label, gemm.forward::<f32>(&a).unwrap(), 0.05);
                }
            }
            // SmoothQuant: per-token × per-channel, without and with migration (α = 0.5: s_j = sqrt(max|X_j| /
            // max|W_j|), X / s and W · s; the product is unchanged).
            for (name, alpha) in [("SmoothQuant", None), ("SmoothQuant α=0.5", Some(0.5f32))] {
                let (mut xs, mut ws) = (x.to_vec(), w_dense.clone());
                if let Some(alpha) = alpha {
                    for j in 0..k {
                        let xm = (0..m).fold(0f32, |a, r| a.max(x[r * k + j].abs()));
                        let wm = (0..n).fold(0f32, |a, r| a.max(w_dense[r * k + j].abs()));
                        let s = (xm.powf(alpha) / wm.powf(1.0 - alpha)).max(1e-5);
                        (0..m).for_each(|r| xs[r * k + j] /= s);
                        (0..n).for_each(|r| ws[r * k + j] *= s);
                    }
                }
                let weight = BlockQuantWeight::quantize_per_channel_symmetric(&ws, n, k).unwrap();
                let a = quantize_activations(&xs, m, k, k, ActivationQuant::Symmetric).unwrap();
                let got = SmoothQuantCpu::new(&weight, None).unwrap().forward::<f32>(&a).unwrap();
                report(name, "K".into(), got, 0.2);
            }
        }
    }
}

#[test]
fn back_to_back_calls_see_each_others_writes() {
    let Some(dev) = cuda_device() else { return };
    // Two layers chained three times with no host sync, each call's quantizer writing the codes its GEMM reads
    // and each GEMM the next layer's input: the chain must end bit-identical to the synchronised one, for per-block
    // W8A8 (blocks of 128) and SmoothQuant. M = 300 leaves a partial tile.
    let (m, k, n) = (300, 1024, 2048);
    let mut rng = SplitMix64(0xB2B_0A8);
    let layer = |rng: &mut SplitMix64, rows: usize, cols: usize, smooth: bool| {
        let dense: Vec<f32> = (0..rows * cols).map(|_| rng.signed_unit() * 0.03).collect();
        if smooth {
            let w = BlockQuantWeight::quantize_per_channel_symmetric(&dense, rows, cols).unwrap();
            W8a8LinearCuda::smoothquant(&dev, &w, None, DType::F16).unwrap()
        } else {
            let w = BlockQuantWeight::quantize(&dense, BlockShape::linear(rows, cols, 128), BlockBits::Int8).unwrap();
            W8a8LinearCuda::block(&dev, &w, None, ActivationQuant::Asymmetric, DType::F16).unwrap()
        }
    };
    for smooth in [false, true] {
        let layers = [layer(&mut rng, n, k, smooth), layer(&mut rng, k, n, smooth)];
        let x0: Vec<f16> = (0..m * k).map(|_| f16::from_f32(rng.signed_unit())).collect();
        let workspaces = [layers[0].workspace_bytes(m), layers[1].workspace_bytes(m)];
        common::assert_back_to_back_matches_synchronised(&dev, &x0, m * n, workspaces, |l, x, y, ws| {
            layers[l].run(dev.stream(), x, m, y, ws).unwrap();
        });
    }
}
