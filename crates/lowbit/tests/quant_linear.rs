//! `QuantLinear`, the user-facing layer, against the f64 reference (with bias and every activation) on the CPU and,
//! when a GPU is present, with every kernel it can dispatch to (decode, GEMM, dequantize + cuBLAS) forced and with
//! its own choice, across the dispatch boundaries (M = 64 / 65, and every measured M of the table).
//!
//! Tolerances: f32 activations on the CPU 1e-5 (mean |Δ| / mean |ref|); f16 1e-3, bf16 8e-3, the rounding of each
//! weight and of y to the 16-bit type; max |Δ| 20x those of max |ref|.

mod common;

use common::{assert_close, Tolerance};
use half::{bf16, f16};
use lowbit::cuda::Device;
use lowbit::ops::linear::quant_linear::DispatchEntry;
use lowbit::ops::linear::{reference, Activation, DispatchTable, LinearKernel, QuantLinear};
use lowbit::testing::SplitMix64 as Rng;
use lowbit::{DType, Float, QuantMatrix};

fn weight(rng: &mut Rng, n: usize, k: usize, group: usize, act: DType) -> QuantMatrix {
    let groups = k / group;
    QuantMatrix {
        n,
        k,
        bits: 4,
        group_size: group,
        codes: (0..n * k).map(|_| rng.below(16) as u8).collect(),
        zeros: Some((0..n * groups).map(|_| rng.below(16) as u8).collect()),
        scales: (0..n * groups)
            .map(|_| lowbit::dtype::round_to(act, 2f32.powf(rng.uniform(-9.0, -5.0))))
            .collect(),
        scale_dtype: act,
        g_idx: None,
    }
}

fn expected(w: &QuantMatrix, x: &[f32], m: usize, bias: &[f32], activation: Activation) -> Vec<f64> {
    let mut y = reference::linear(x, m, w, Some(bias));
    y.iter_mut().for_each(|v| *v = activation.apply_f64(*v));
    y
}

fn tolerance(act: DType) -> Tolerance {
    let mean = match act {
        DType::F32 => 1e-5,
        DType::F16 => 1e-3,
        _ => 8e-3,
    };
    Tolerance {
        max_rel: mean * 20.0,
        ..Tolerance::relative(mean)
    }
}

fn check<T: Float>(
    layer: &QuantLinear,
    w: &QuantMatrix,
    bias: &[f32],
    activation: Activation,
    ms: &[usize],
    label: &str,
) {
    let mut rng = Rng(0x9a11 + ms.len() as u64);
    for &m in ms {
        let x: Vec<f32> = (0..m * w.k)
            .map(|_| lowbit::dtype::round_to(T::DTYPE, rng.uniform(-1.0, 1.0)))
            .collect();
        let xt: Vec<T> = x.iter().map(|&v| T::from_f32(v)).collect();
        let got: Vec<f32> = layer.forward(&xt, m).unwrap().iter().map(|v| v.to_f32()).collect();
        let want = expected(w, &x, m, bias, activation);
        let what = format!("{label} {activation:?} M={m} kernel={:?}", layer.kernel_for(m));
        assert_close(&what, &got, &want, tolerance(T::DTYPE));
    }
}

#[test]
fn cpu_layer_with_bias_and_every_activation() {
    let mut rng = Rng(7);
    let w = weight(&mut rng, 96, 256, 64, DType::F32);
    let bias: Vec<f32> = (0..w.n).map(|_| rng.uniform(-1.0, 1.0)).collect();
    for activation in Activation::ALL {
        let layer = QuantLinear::new(&Device::Cpu, &w, Some(&bias), activation, DType::F32, 8).unwrap();
        assert_eq!(layer.kernel_for(3), LinearKernel::Cpu);
        check::<f32>(&layer, &w, &bias, activation, &[1, 5], "cpu f32");
    }
}

#[test]
fn bad_inputs_are_typed_errors() {
    let w = weight(&mut Rng(3), 64, 128, 128, DType::F16);
    let err = QuantLinear::new(&Device::Cpu, &w, Some(&[0.0; 3]), Activation::None, DType::F16, 4).unwrap_err();
    assert!(err.to_string().contains("bias"), "{err}");
    let layer = QuantLinear::new(&Device::Cpu, &w, None, Activation::None, DType::F16, 4).unwrap();
    let err = layer.forward(&[f16::ZERO; 10], 1).unwrap_err();
    assert!(err.to_string().contains("M * K"), "{err}");
}

#[test]
fn dispatch_table_lookup() {
    let e = |k, n, m, kernel| DispatchEntry {
        device: "GPU A".into(),
        wbits: 4,
        k,
        n,
        m,
        kernel,
    };
    let table = DispatchTable {
        entries: vec![
            e(4096, 4096, 1, LinearKernel::Decode),
            e(4096, 4096, 256, LinearKernel::Gemm),
            e(4096, 4096, 4096, LinearKernel::DequantCublas),
            e(8192, 28672, 1, LinearKernel::Decode),
            e(8192, 28672, 64, LinearKernel::Gemm),
        ],
    };
    // Same shape: the largest measured M not above the batch; below all of them, the smallest.
    assert_eq!(table.lookup("GPU A", 4, 4096, 4096, 100), Some(LinearKernel::Decode));
    assert_eq!(table.lookup("GPU A", 4, 4096, 4096, 256), Some(LinearKernel::Gemm));
    assert_eq!(
        table.lookup("GPU A", 4, 4096, 4096, 9999),
        Some(LinearKernel::DequantCublas)
    );
    // Nearest shape by size: 5120 x 5120 is nearer 4096², 8192 x 22016 nearer 8192 x 28672.
    assert_eq!(table.lookup("GPU A", 4, 5120, 5120, 300), Some(LinearKernel::Gemm));
    assert_eq!(table.lookup("GPU A", 4, 8192, 22016, 70), Some(LinearKernel::Gemm));
    // 8-bit weights on a GPU measured for 4-bit only: the 4-bit entries answer.
    assert_eq!(table.lookup("GPU A", 8, 4096, 4096, 256), Some(LinearKernel::Gemm));
    // Another GPU: no answer (the caller's fallback rule applies).
    assert_eq!(table.lookup("GPU B", 4, 4096, 4096, 1), None);
    // The embedded measured tables parse.
    let _ = DispatchTable::measured();
}

#[test]
fn cuda_every_kernel_and_the_dispatch_across_boundaries() {
    let Some(dev) = lowbit::testing::cuda_device() else {
        return;
    };
    let device = Device::Cuda(dev);
    for (act, n, k, group, bits, act_order) in [
        (DType::F16, 512, 1024, 128, 4, false),
        (DType::Bf16, 384, 2048, 64, 4, false),
        (DType::F16, 256, 512, 128, 8, false),
        // 64-column tiles (no GEMM: decode and dequantize + cuBLAS) and a partial last k tile.
        (DType::F16, 192, 4160, 64, 4, false),
        // Act-order without the GEMM: no dequantize + cuBLAS either, so the decode kernel takes every M.
        (DType::F16, 192, 1024, 128, 4, true),
    ] {
        let mut rng = Rng(n as u64);
        let mut w = weight(&mut rng, n, k, group, act);
        if act_order {
            // GPTQ's g_idx: each group's channels scattered over K.
            let mut g: Vec<u32> = (0..k).map(|i| (i / group) as u32).collect();
            for i in (1..k).rev() {
                g.swap(i, rng.below(i as u64 + 1) as usize);
            }
            w.g_idx = Some(g);
        }
        if bits == 8 {
            // W8A16: codes and zeros over the whole byte.
            w.bits = 8;
            w.codes.iter_mut().for_each(|c| *c = rng.below(256) as u8);
            w.zeros.iter_mut().flatten().for_each(|z| *z = rng.below(256) as u8);
        }
        let bias: Vec<f32> = (0..n)
            .map(|_| lowbit::dtype::round_to(act, rng.uniform(-1.0, 1.0)))
            .collect();
        for activation in [Activation::None, Activation::Silu, Activation::Relu6] {
            let mut layer = QuantLinear::new(&device, &w, Some(&bias), activation, act, 300).unwrap();
            let ms = [1, 13, 17, 64, 65, 256, 300];
            let label = format!("cuda {act} W{bits} N={n} K={k} g{group} act_order={act_order}");
            if act_order && !layer.available(300).contains(&LinearKernel::Gemm) {
                assert!(!layer.available(300).contains(&LinearKernel::DequantCublas));
                assert_eq!(layer.kernel_for(300), LinearKernel::Decode, "{label}");
            }
            let kernels = [
                LinearKernel::Decode,
                LinearKernel::Gemm,
                LinearKernel::GemmKSplit,
                LinearKernel::DequantCublas,
            ];
            for kernel in kernels {
                let ms: Vec<usize> = ms
                    .iter()
                    .copied()
                    .filter(|&m| layer.available(m).contains(&kernel))
                    .collect();
                layer.force_kernel(Some(kernel));
                match act {
                    DType::Bf16 => check::<bf16>(&layer, &w, &bias, activation, &ms, &label),
                    _ => check::<f16>(&layer, &w, &bias, activation, &ms, &label),
                }
            }
            layer.force_kernel(None);
            match act {
                DType::Bf16 => check::<bf16>(&layer, &w, &bias, activation, &ms, &label),
                _ => check::<f16>(&layer, &w, &bias, activation, &ms, &label),
            }
        }
    }
}
