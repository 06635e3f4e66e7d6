//! CUDA `lowbit bench --op w8a8`: the int8 tensor-core GEMMs against cuBLAS fp16 and cuBLASLt int8, same run.
//!
//! Implementations (records' `impl`):
//! - `lowbit`: per-block W8A8 ([`W8a8LinearCuda::block`], asymmetric activations, K blocks of `--group`, default
//!   128; `-1` = one block per row), activation quantization included: what a layer costs per call.
//!   The GEMM is the default kernel: the warp-specialised wgmma kernel on sm_90a where the blocks allow it,
//!   mma.sync elsewhere (see `W8a8LinearCuda`).
//! - `lowbit_gemm`: the same GEMM on activations quantized beforehand (`run_quantized`: q/k/v reuse), for the
//!   quantizer's share.
//! - `lowbit_mma`: `lowbit` with the mma.sync kernel forced, where the default is the wgmma one.
//! - `lowbit_channel`: `lowbit` with a symmetric per-channel weight ([`W8a8LinearCuda::channel_weight`]; the
//!   activations still per K block of `--group`), quantization included: sB leaves the per-block correction.
//! - `lowbit_channel_sym`: `lowbit_channel` with symmetric activations: no offset terms at all (the `_channel_sym`
//!   kernels on sm_90a).
//! - `lowbit_smoothquant`: SmoothQuant (per-token quantization included, per-channel weights).
//! - `lowbit_quantize` / `lowbit_smoothquant_quantize`: the activation quantizer alone, per K block / per token
//!   (`bytes`: x read and the codes written).
//! - `cublas_fp16` / `cublas_bf16` and `cublaslt_fp16` / `cublaslt_bf16`: the dense `x · W^T` in the activation
//!   dtype, fp32 accumulation, through cublasGemmEx (with the device's cuBLAS workspace) and cuBLASLt; ratios take
//!   the faster.
//! - `cublaslt_int8`: cuBLASLt int8 × int8 → int32 ([`CublasLtInt8`]), no scales: the int8 ceiling.
//!
//! Default problem: K × N ∈ {4096 × 4096, 4096 × 14336, 14336 × 4096, 8192 × 28672} × M ∈ {1024, 4096}, f16 unless
//! `--dtype`. Every weight is rotated among as many copies as it takes to exceed 2 × L2 (activations and outputs
//! rotate with it), so each call reads its weight from device memory. Timing as `bench --op linear`: the launchers
//! take turns (`Rounds`), 7 rounds of one ~20 ms batch each after an untimed one, median batch. `bytes`: weight, x and y at their stored sizes.

use super::{BenchArgs, BenchRecord, Rounds, Shape, Sink};
use half::{bf16, f16};
use lowbit::cuda::{CudaDevice, CudaSlice, ValidAsZeroBits};
use lowbit::formats::block::{BlockBits, BlockQuantWeight, BlockShape};
use lowbit::ops::linear::cuda::{CublasLinear, CublasLtLinear, DenseElement};
use lowbit::ops::w8a8::cuda::{CublasLtInt8, GemmKernel, QuantizedActivationsCuda, W8a8LinearCuda, W8a8Scheme};
use lowbit::ops::w8a8::ActivationQuant;
use lowbit::testing::SplitMix64;
use lowbit::{DType, Error, Result};
use std::cell::RefCell;
use std::sync::Arc;

/// The (K, N) shapes of the speed targets.
const SHAPES: [(usize, usize); 4] = [(4096, 4096), (4096, 14336), (14336, 4096), (8192, 28672)];
/// Batch sizes timed per shape (prefill).
const MS: [usize; 2] = [1024, 4096];
/// Records per (shape, M, dtype), besides `lowbit_mma`.
const IMPLS: usize = 9;

/// Benchmarks the CUDA W8A8 kernels on the GPU `args.device` names.
pub fn run(args: &BenchArgs, sink: &mut Sink) -> Result<()> {
    let dev = args.cuda_device()?;
    let problems = args.problems(&SHAPES, &MS)?;
    let dtypes = args.dtypes(&[DType::F16])?;
    let count: usize = problems.iter().map(|(_, ms)| ms.len()).sum();
    sink.expect(count * dtypes.len() * IMPLS);
    for ((k, n), ms) in &problems {
        for &dtype in &dtypes {
            match dtype {
                DType::F16 => bench_shape::<f16>(&dev, args, *k, *n, ms, sink)?,
                DType::Bf16 => bench_shape::<bf16>(&dev, args, *k, *n, ms, sink)?,
                other => return Err(Error::invalid("--dtype", other, "CUDA w8a8 takes f16 or bf16")),
            }
        }
    }
    Ok(())
}

/// How many copies of `bytes` exceed 2 × L2 (at least 2).
fn rotation(dev: &CudaDevice, bytes: usize) -> usize {
    (2 * dev.info().l2_bytes / bytes.max(1) + 1).max(2)
}

fn bench_shape<T: DenseElement + ValidAsZeroBits>(
    dev: &Arc<CudaDevice>,
    args: &BenchArgs,
    k: usize,
    n: usize,
    ms: &[usize],
    sink: &mut Sink,
) -> Result<()> {
    let dtype = T::DTYPE;
    let block = if args.group == -1 { k } else { args.group_for(k)? };
    let stream = dev.stream().clone();
    let name = dev.info().name.clone();
    let mut rng = SplitMix64(0x88A8 ^ (k * 131 + n) as u64);
    sink.status(format!("w8a8 {k}x{n} {dtype}: preparing weights"));
    let dense: Vec<f32> = (0..n * k).map(|_| rng.signed_unit() * 0.05).collect();
    let block_weight = BlockQuantWeight::quantize(&dense, BlockShape::linear(n, k, block), BlockBits::Int8)?;
    let channel_weight = BlockQuantWeight::quantize_per_channel_symmetric(&dense, n, k)?;
    let dense_t: Vec<T> = dense.iter().map(|&v| T::from_f32(v)).collect();
    drop(dense);

    let sets = rotation(dev, n * k);
    let blocks: Vec<W8a8LinearCuda> = (0..sets)
        .map(|_| W8a8LinearCuda::block(dev, &block_weight, None, ActivationQuant::Asymmetric, dtype))
        .collect::<Result<_>>()?;
    let scheme = W8a8Scheme::Block(ActivationQuant::Asymmetric);
    let wgmma_default = blocks[0].gemm_kernel() == GemmKernel::Wgmma;
    let mma: Vec<W8a8LinearCuda> = (0..if wgmma_default { sets } else { 0 })
        .map(|_| W8a8LinearCuda::with_kernel(dev, &block_weight, None, scheme, dtype, GemmKernel::MmaSync))
        .collect::<Result<_>>()?;
    sink.expect(ms.len() * usize::from(wgmma_default));
    let channel: Vec<W8a8LinearCuda> = (0..sets)
        .map(|_| W8a8LinearCuda::channel_weight(dev, &channel_weight, None, block, ActivationQuant::Asymmetric, dtype))
        .collect::<Result<_>>()?;
    let channel_sym: Vec<W8a8LinearCuda> = (0..sets)
        .map(|_| W8a8LinearCuda::channel_weight(dev, &channel_weight, None, block, ActivationQuant::Symmetric, dtype))
        .collect::<Result<_>>()?;
    let smooth: Vec<W8a8LinearCuda> = (0..sets)
        .map(|_| W8a8LinearCuda::smoothquant(dev, &channel_weight, None, dtype))
        .collect::<Result<_>>()?;
    let codes_i8: Vec<CudaSlice<i8>> = (0..sets)
        .map(|_| dev.upload(channel_weight.codes()))
        .collect::<Result<_>>()?;
    let dense_sets = rotation(dev, n * k * 2);
    let dense_w: Vec<CudaSlice<T>> = (0..dense_sets).map(|_| dev.upload(&dense_t)).collect::<Result<_>>()?;
    drop(dense_t);
    let blas = CublasLinear::new(dev, n, k)?;

    for &m in ms {
        let rows = sets.max(dense_sets);
        let x: Vec<T> = (0..m * k).map(|_| T::from_f32(rng.signed_unit() * 2.0)).collect();
        let xs: Vec<CudaSlice<T>> = (0..rows).map(|_| dev.upload(&x)).collect::<Result<_>>()?;
        let x_i8: Vec<i8> = (0..m * k).map(|_| rng.next_u64() as i8).collect();
        let xs_i8: Vec<CudaSlice<i8>> = (0..sets).map(|_| dev.upload(&x_i8)).collect::<Result<_>>()?;
        let mut ys: Vec<CudaSlice<T>> = (0..rows).map(|_| dev.alloc_zeros(m * n)).collect::<Result<_>>()?;
        let mut ws = dev.alloc_zeros::<u8>(blocks[0].workspace_bytes(m))?;
        let shape = Shape { m, k, n };
        let record = |implementation: &str, bytes: usize, group: i64, us: f64| {
            let mut r = BenchRecord::new("w8a8", implementation, &name, dtype, shape, bytes as u64, us);
            r.wbits = Some(8);
            r.group = Some(group);
            r
        };
        let int8_bytes = n * k + (m * k + m * n) * 2;
        let group = BenchArgs::group_field(block, k);

        let (baseline, lt_baseline) = crate::bench::dense_baselines(dtype);
        let mut a = QuantizedActivationsCuda::alloc(dev, m, k, block)?;
        blocks[0].quantizer().run(&stream, &xs[0], m, &mut a)?;
        // The quantizers alone write into codes of their own (the GEMM alone reads `a`).
        let mut a_block = QuantizedActivationsCuda::alloc(dev, m, k, block)?;
        let mut a_token = QuantizedActivationsCuda::alloc(dev, m, k, k)?;
        let mut ws_smooth = dev.alloc_zeros::<u8>(smooth[0].workspace_bytes(m))?;
        let mut lt = CublasLtInt8::new(dev, m, n, k)?;
        let mut dense_lt = CublasLtLinear::<T>::new(dev, m, n, k)?;
        let mut ys_i32: Vec<CudaSlice<i32>> = (0..2).map(|_| dev.alloc_zeros(m * n)).collect::<Result<_>>()?;
        // Every launcher in turn (`Rounds`), so that all run at the same clocks.
        sink.status(format!(
            "w8a8 {m}x{k}x{n} {dtype}: launchers in turn ({})",
            blocks[0].kernel_name()
        ));
        let (ys, ws) = (RefCell::new(&mut ys), RefCell::new(&mut ws));
        let (ys, ws, a, stream) = (&ys, &ws, &a, &stream);
        let mut rounds = Rounds::new();
        let mut timed: Vec<(&str, usize, i64)> = Vec::new(); // (impl, bytes, group) of each launcher, in order
        rounds.add(sets, |i| {
            blocks[i].run(stream, &xs[i], m, &mut ys.borrow_mut()[i], &mut **ws.borrow_mut())
        });
        timed.push(("lowbit", int8_bytes, group));
        rounds.add(sets, |i| blocks[i].run_quantized(stream, a, &mut ys.borrow_mut()[i]));
        timed.push(("lowbit_gemm", int8_bytes, group));
        if !mma.is_empty() {
            rounds.add(sets, |i| {
                mma[i].run(stream, &xs[i], m, &mut ys.borrow_mut()[i], &mut **ws.borrow_mut())
            });
            timed.push(("lowbit_mma", int8_bytes, group));
        }
        rounds.add(sets, |i| {
            channel[i].run(stream, &xs[i], m, &mut ys.borrow_mut()[i], &mut **ws.borrow_mut())
        });
        timed.push(("lowbit_channel", int8_bytes, group));
        rounds.add(sets, |i| {
            channel_sym[i].run(stream, &xs[i], m, &mut ys.borrow_mut()[i], &mut **ws.borrow_mut())
        });
        timed.push(("lowbit_channel_sym", int8_bytes, group));
        rounds.add(sets, |i| {
            smooth[i].run(stream, &xs[i], m, &mut ys.borrow_mut()[i], &mut ws_smooth)
        });
        timed.push(("lowbit_smoothquant", int8_bytes, -1));
        let quantize_bytes = m * k * 3; // x read, codes written
        rounds.add(sets, |i| blocks[i].quantizer().run(stream, &xs[i], m, &mut a_block));
        timed.push(("lowbit_quantize", quantize_bytes, group));
        rounds.add(sets, |i| smooth[i].quantizer().run(stream, &xs[i], m, &mut a_token));
        timed.push(("lowbit_smoothquant_quantize", quantize_bytes, -1));
        rounds.add(dense_sets, |i| {
            blas.run(&dense_w[i], &xs[i], m, &mut ys.borrow_mut()[i])
        });
        timed.push((baseline, (n * k + m * k + m * n) * 2, -1));
        rounds.add(dense_sets, |i| {
            dense_lt.run(stream, &dense_w[i], &xs[i], &mut ys.borrow_mut()[i])
        });
        timed.push((lt_baseline, (n * k + m * k + m * n) * 2, -1));
        rounds.add(sets, |i| lt.run(stream, &codes_i8[i], &xs_i8[i], &mut ys_i32[i % 2]));
        timed.push(("cublaslt_int8", n * k + m * k + 4 * m * n, -1));
        for ((implementation, bytes, group), us) in timed.into_iter().zip(rounds.run(dev, stream)?) {
            sink.push(record(implementation, bytes, group, us))?;
        }
    }
    Ok(())
}
