//! The Hopper W4A16 prefill GEMM (`ops::linear::cuda::gemm`) against the f64 reference on the same quantized
//! weights.
//!
//! Every case draws a fresh random weight and activations (never zeros) and checks:
//! - accuracy: each weight is round((q - z) · s) in the activation type (as dequantize + cuBLAS), fp32 sums, one
//!   rounding of y; mean |Δ| / mean |ref| must stay under 1e-3 (f16) / 8e-3 (bf16) and max |Δ| under 2e-2 / 8e-2
//!   of max |ref|, no NaN/Inf (y is poisoned with NaN first, so every element must be written);
//! - an exact-integer mode (activations in -2..=2, power-of-two scales): every product and sum is exact, so y must
//!   equal the reference rounded to the activation type bit for bit, with and without split-K;
//! - determinism: a repeated call gives identical bytes; guard words around y and the workspace stay untouched.
//!
//! Needs an sm_90 GPU; elsewhere every test prints `skipped: <reason>` and passes.

mod common;

use common::{assert_close, Tolerance};
use half::{bf16, f16};
use lowbit::cuda::{CudaDevice, DevicePtr, DeviceRepr};
use lowbit::ops::linear::cuda::gemm::{supported, LinearW4A16Gemm};
use lowbit::ops::linear::cuda::{repack, repack_int8, DeviceW4};
use lowbit::ops::linear::{reference, Activation};
use lowbit::testing::SplitMix64 as Rng;
use lowbit::{DType, Float, QuantMatrix};
use std::sync::Arc;

#[derive(Debug, Clone, Copy)]
struct Case {
    bits: u8,
    n: usize,
    k: usize,
    group: usize,
    act: DType,
    zeros: bool,
    act_order: bool,
    bias: bool,
    activation: Activation,
    exact: bool,
    /// An 8-bit weight in the GEMM's own int8 layout (`repack_int8`) instead of two int4 planes.
    int8_layout: bool,
}

const BASE: Case = Case {
    bits: 4,
    n: 512,
    k: 1024,
    group: 128,
    act: DType::F16,
    zeros: true,
    act_order: false,
    bias: false,
    activation: Activation::None,
    exact: false,
    int8_layout: false,
};

fn quant(rng: &mut Rng, c: &Case) -> QuantMatrix {
    let groups = c.k / c.group;
    QuantMatrix {
        n: c.n,
        k: c.k,
        bits: c.bits,
        group_size: c.group,
        codes: (0..c.n * c.k).map(|_| rng.below(1 << c.bits) as u8).collect(),
        zeros: c
            .zeros
            .then(|| (0..c.n * groups).map(|_| rng.below(1 << c.bits) as u8).collect()),
        scales: (0..c.n * groups)
            .map(|_| {
                if c.exact {
                    2f32.powi(-3 - rng.below(3) as i32)
                } else {
                    lowbit::dtype::round_to(c.act, 2f32.powf(rng.uniform(-9.0, -5.0)))
                }
            })
            .collect(),
        scale_dtype: c.act,
        g_idx: c.act_order.then(|| {
            let mut g: Vec<u32> = (0..c.k).map(|i| (i / c.group) as u32).collect();
            for i in (1..c.k).rev() {
                g.swap(i, rng.below(i as u64 + 1) as usize);
            }
            g
        }),
    }
}

fn values(rng: &mut Rng, len: usize, c: &Case) -> Vec<f32> {
    (0..len)
        .map(|_| {
            if c.exact {
                rng.below(5) as f32 - 2.0
            } else {
                lowbit::dtype::round_to(c.act, rng.uniform(-1.0, 1.0))
            }
        })
        .collect()
}

/// The GPU when it is an sm_90 one, or a printed reason to skip.
fn hopper() -> Option<Arc<CudaDevice>> {
    let dev = lowbit::testing::cuda_device()?;
    if dev.info().compute_capability.0 != 9 {
        println!("skipped: the W4A16 GEMM needs an sm_90 GPU ({})", dev.info().name);
        return None;
    }
    Some(dev)
}

const GUARD: usize = 256;

/// Runs `op` on the first `m` rows of `x`; returns y as f32 after checking the guard regions.
fn run<T: Float + DeviceRepr>(
    dev: &CudaDevice,
    op: &LinearW4A16Gemm,
    c: &Case,
    x: &[f32],
    m: usize,
    bias: Option<&[f32]>,
) -> Vec<f32> {
    let to_t = |v: &[f32]| v.iter().map(|&f| T::from_f32(f)).collect::<Vec<T>>();
    let x_dev = dev.upload(&to_t(&x[..m * c.k])).unwrap();
    let b_dev = bias.map(|b| dev.upload(&to_t(b)).unwrap());
    let guard = T::from_f32(-12345.0);
    let mut y_host = vec![guard; m * c.n + 2 * GUARD];
    y_host[GUARD..GUARD + m * c.n].fill(T::from_f32(f32::NAN));
    let mut y = dev.upload(&y_host).unwrap();
    let ws_len = op.workspace_bytes();
    let mut ws = dev.upload(&vec![0xA5u8; ws_len + 2 * GUARD]).unwrap();
    {
        let mut y_view = y.slice_mut(GUARD..GUARD + m * c.n);
        let mut ws_view = ws.slice_mut(GUARD..GUARD + ws_len);
        op.run_strided(
            dev.stream(),
            &x_dev,
            c.k,
            m,
            b_dev.as_ref().map(|b| b as &dyn DevicePtr<T>),
            c.activation,
            &mut y_view,
            c.n,
            &mut ws_view,
        )
        .unwrap();
    }
    dev.synchronize().unwrap();
    let y_host = dev.download(&y).unwrap();
    let ws_host = dev.download(&ws).unwrap();
    assert!(
        y_host[..GUARD]
            .iter()
            .chain(&y_host[GUARD + m * c.n..])
            .all(|&g| g == guard),
        "y guard overwritten"
    );
    assert!(
        ws_host[..GUARD]
            .iter()
            .chain(&ws_host[GUARD + ws_len..])
            .all(|&g| g == 0xA5),
        "workspace guard overwritten"
    );
    y_host[GUARD..GUARD + m * c.n].iter().map(|v| v.to_f32()).collect()
}

/// One weight, several batch sizes, with the default split-K choice and with `splits` forced.
fn check<T: Float + DeviceRepr>(dev: &Arc<CudaDevice>, c: Case, ms: &[usize], splits: &[Option<usize>]) {
    check_with::<T>(dev, c, ms, splits, |_| {});
}

/// [`check`] with each operator adjusted by `setup` first.
fn check_with<T: Float + DeviceRepr>(
    dev: &Arc<CudaDevice>,
    c: Case,
    ms: &[usize],
    splits: &[Option<usize>],
    mut setup: impl FnMut(&mut LinearW4A16Gemm),
) {
    let mut rng = Rng((c.n * 31 + c.k * 7 + c.group) as u64 ^ u64::from(c.exact));
    let w = quant(&mut rng, &c);
    let max_m = *ms.iter().max().unwrap();
    let x = values(&mut rng, max_m * c.k, &c);
    let bias = c.bias.then(|| {
        (0..c.n)
            .map(|_| lowbit::dtype::round_to(c.act, rng.uniform(-1.0, 1.0)))
            .collect::<Vec<f32>>()
    });
    let packed = if c.int8_layout {
        repack_int8(&w, c.act)
    } else {
        repack(&w, c.act)
    };
    let weight = DeviceW4::upload(dev, &packed.unwrap()).unwrap();
    for &forced in splits {
        let mut op = LinearW4A16Gemm::with_weight(dev, weight.clone(), max_m, forced).unwrap();
        setup(&mut op);
        for &m in ms {
            let label = format!("{c:?} M={m} split {:?} ({:?})", op.split_plan(m), op.variant(m));
            let mut want = reference::linear(&x[..m * c.k], m, &w, bias.as_deref());
            want.iter_mut().for_each(|v| *v = c.activation.apply_f64(*v));
            let got = run::<T>(dev, &op, &c, &x, m, bias.as_deref());
            if c.exact {
                for (i, (&g, &r)) in got.iter().zip(&want).enumerate() {
                    let r = lowbit::dtype::round_to(c.act, r as f32);
                    assert_eq!(g.to_bits(), r.to_bits(), "{label}: element {i}: {g} vs {r}");
                }
            } else {
                let tol = if c.act == DType::F16 {
                    Tolerance::relative(1e-3)
                } else {
                    Tolerance::relative(8e-3)
                };
                assert_close(
                    &label,
                    &got,
                    &want,
                    Tolerance {
                        max_rel: tol.mean_rel * 20.0,
                        ..tol
                    },
                );
            }
            let again = run::<T>(dev, &op, &c, &x, m, bias.as_deref());
            assert!(
                got.iter().zip(&again).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{label}: repeat differs"
            );
        }
    }
}

#[test]
fn f16_g128_zeros_token_tails_and_split_k() {
    let Some(dev) = hopper() else { return };
    check::<f16>(&dev, BASE, &[1, 77, 128, 129, 300], &[None, Some(1), Some(3)]);
}

#[test]
fn tiny_batches_on_the_16_token_tile() {
    let Some(dev) = hopper() else { return };
    // Up to 16 rows run the 16-token tile (wgmma m64n16k16): both tile widths, with and without split-K, exact
    // integers bit-equal to the reference; M = 17 is the 64-token tile again.
    let c = Case {
        k: 2048,
        bias: true,
        ..BASE
    };
    let mut seen = Vec::new();
    check_with::<f16>(&dev, c, &[1, 2, 7, 16, 17], &[None, Some(1), Some(4)], |op| {
        seen.extend([1, 16, 17].map(|m| op.variant(m).wg_tokens));
    });
    assert_eq!(&seen[..3], &[16, 16, 64], "{seen:?}");
    check::<f16>(&dev, Case { exact: true, ..c }, &[3, 16], &[None, Some(1), Some(4)]);
    let narrow = Case {
        n: 384,
        act: DType::Bf16,
        ..c
    };
    check::<bf16>(&dev, narrow, &[1, 11], &[None, Some(2)]);
}

#[test]
fn the_96_token_tile() {
    let Some(dev) = hopper() else { return };
    // wgmma m64n96k16: token tails on both sides of 96 and 192, with and without split-K; exact integers bit-equal
    // to the reference; bf16 on a 128-column weight (one column warpgroup, two token warpgroups) with a bias.
    let force = |op: &mut LinearW4A16Gemm| op.force_tile_tokens(Some(96));
    let c = Case { bias: true, ..BASE };
    check_with::<f16>(&dev, c, &[1, 95, 96, 97, 192, 200], &[None, Some(1), Some(3)], force);
    check_with::<f16>(
        &dev,
        Case { exact: true, ..c },
        &[96, 150],
        &[None, Some(1), Some(4)],
        force,
    );
    let narrow = Case {
        n: 384,
        act: DType::Bf16,
        group: 64,
        ..c
    };
    check_with::<bf16>(&dev, narrow, &[33, 191], &[None, Some(2)], force);
    // Unforced, a batch of 192 rows on a layer of 64 tiles of 256 columns takes it: two 96-token tiles cost less
    // than two 128-token ones.
    let wide = Case {
        n: 16384,
        k: 1024,
        ..BASE
    };
    let mut seen = Vec::new();
    check_with::<f16>(&dev, wide, &[192], &[None], |op| seen.push(op.variant(192).wg_tokens));
    assert_eq!(seen, [96]);
}

#[test]
fn bf16_narrow_tiles_k_tail_group_64_bias() {
    let Some(dev) = hopper() else { return };
    // N = 384: 128-column tiles (the token-split variant); K = 4160: a partial last k tile; g64: two groups a unit.
    let c = Case {
        n: 384,
        k: 4160,
        group: 64,
        act: DType::Bf16,
        bias: true,
        ..BASE
    };
    check::<bf16>(&dev, c, &[5, 256, 333], &[None]);
}

#[test]
fn act_order_group_32_and_per_channel() {
    let Some(dev) = hopper() else { return };
    let c = Case {
        n: 256,
        k: 512,
        group: 32,
        act_order: true,
        ..BASE
    };
    check::<f16>(&dev, c, &[16, 130], &[None, Some(1)]);
    let c = Case {
        n: 768,
        k: 2048,
        group: 2048,
        zeros: false,
        act: DType::Bf16,
        ..BASE
    };
    check::<bf16>(&dev, c, &[64, 512], &[None]);
}

#[test]
fn fused_activations_after_bias() {
    let Some(dev) = hopper() else { return };
    for activation in [Activation::Relu, Activation::Relu6, Activation::Gelu, Activation::Silu] {
        let c = Case {
            bias: true,
            activation,
            ..BASE
        };
        check::<f16>(&dev, c, &[9, 200], &[None]);
    }
}

#[test]
fn exact_integers_bit_equal_with_and_without_split_k() {
    let Some(dev) = hopper() else { return };
    let c = Case {
        exact: true,
        bias: true,
        ..BASE
    };
    check::<f16>(&dev, c, &[1, 16, 100, 256], &[Some(1), Some(4)]);
    check::<bf16>(&dev, Case { act: DType::Bf16, ..c }, &[100], &[Some(1), Some(2)]);
    // K = 4096 allows every split count: the odd ones give the epilogue's owners uneven shares of the tile.
    check::<f16>(
        &dev,
        Case { k: 4096, ..c },
        &[100, 200],
        &[Some(3), Some(5), Some(7), Some(8)],
    );
}

#[test]
fn split_tiles_in_several_cluster_groups() {
    let Some(dev) = hopper() else { return };
    // Clusters capped at 2 or 3 CTAs: a tile split 4, 6 or 8 ways is 2-4 clusters that add their shared-memory
    // sums through global memory (what 32 tiles split 4 ways need on an H200). Exact integers: bit-equal to the
    // reference whatever the order; random data: within tolerance and repeatable.
    let c = Case {
        k: 4096,
        exact: true,
        bias: true,
        ..BASE
    };
    for (splits, cluster) in [(4, 2), (6, 3), (8, 2)] {
        let mut seen = Vec::new();
        check_with::<f16>(&dev, c, &[1, 100, 200], &[Some(splits)], |op| {
            op.set_max_cluster(cluster);
            seen.extend([1, 100, 200].map(|m| op.split_plan(m)));
        });
        // Splits the shared memory cannot take as that many groups fall back to fewer.
        assert!(seen.iter().all(|p| p.groups > 1 && p.cluster == cluster), "{seen:?}");
    }
    let c = Case {
        k: 2048,
        bias: true,
        activation: Activation::Silu,
        ..BASE
    };
    check_with::<f16>(&dev, c, &[64, 256], &[Some(4)], |op| op.set_max_cluster(2));
    check_with::<bf16>(&dev, Case { act: DType::Bf16, ..c }, &[130], &[Some(8)], |op| {
        op.set_max_cluster(2)
    });
}

#[test]
fn unsupported_tiles_are_a_typed_error() {
    let Some(dev) = hopper() else { return };
    // N = 192 has 64-column tiles, which only the decode kernel reads.
    let c = Case { n: 192, ..BASE };
    let w = quant(&mut Rng(5), &c);
    let weight = DeviceW4::upload(&dev, &repack(&w, DType::F16).unwrap()).unwrap();
    assert!(!supported(&dev, &weight));
    let err = LinearW4A16Gemm::with_weight(&dev, weight, 64, None).unwrap_err();
    assert!(err.to_string().contains("64-column tiles"), "{err}");
}

#[test]
fn persistent_grid_with_several_tiles_per_cta() {
    let Some(dev) = hopper() else { return };
    // 8 column tiles x 17 token tiles = 136 items for at most 132 CTAs: some CTAs run two tiles back to back (the
    // producer prefetching the second during the first's epilogue); M = 2100 leaves a ragged last token tile.
    let c = Case {
        n: 2048,
        k: 256,
        bias: true,
        activation: Activation::Relu,
        ..BASE
    };
    check::<f16>(&dev, c, &[2100], &[None]);
    check::<f16>(&dev, Case { exact: true, ..c }, &[2100], &[None]);
}

#[test]
fn hybrid_plan_splits_only_the_last_wave() {
    let Some(dev) = hopper() else { return };
    // 8 column tiles x 18 token tiles of 128 = 144 tiles: on 132 SMs, one wave of whole tiles, then 12 tiles split
    // in two (clusters of 2 over the whole grid). M = 2200 leaves a ragged last token tile.
    let c = Case {
        n: 2048,
        k: 2048,
        bias: true,
        activation: Activation::Silu,
        ..BASE
    };
    let probe = {
        let w = quant(&mut Rng(1), &c);
        let weight = DeviceW4::upload(&dev, &repack(&w, c.act).unwrap()).unwrap();
        LinearW4A16Gemm::with_weight(&dev, weight, 2200, None).unwrap()
    };
    let plan = probe.split_plan(2200);
    println!("M=2200: {plan:?} on a grid of {}", probe.hybrid_grid());
    if probe.hybrid_grid() == 132 {
        assert_eq!((plan.whole, plan.splits), (132, 2), "the H100/H200 plan");
    }
    check::<f16>(&dev, c, &[2200], &[None]);
    check::<bf16>(&dev, Case { act: DType::Bf16, ..c }, &[2200], &[None]);
    // Bit for bit without the activation (SiLU in fp32 and the reference's in f64 may round apart).
    let exact = Case {
        exact: true,
        activation: Activation::None,
        ..c
    };
    check::<f16>(&dev, exact, &[2200], &[None]);
}

#[test]
fn strided_rows_leave_the_gaps_alone() {
    let Some(dev) = hopper() else { return };
    // Rows of x and y with gaps between them, both 16-byte aligned (x read in place through its tensor map, y
    // stored 16 bytes per lane): the result equals the contiguous call's bit for bit, and no gap element is
    // written. M = 300 leaves a partial token tile.
    let c = Case {
        n: 384,
        k: 512,
        bias: true,
        ..BASE
    };
    check_strided(&dev, c, (c.k + 64, c.n + 40), |_| {});
    // The 64-token K-split tile the same way, and with K = 1004 (per channel): rows of x 16-byte aligned but K not a
    // multiple of 8, so the tensor map's columns end inside a 16-byte piece, before the gap.
    let k_split = |op: &mut LinearW4A16Gemm| {
        op.force_k_split(true);
        op.force_tile_tokens(Some(64));
    };
    check_strided(&dev, c, (c.k + 64, c.n + 40), k_split);
    let k_tail = Case {
        k: 1004,
        group: 1004,
        ..c
    };
    check_strided(&dev, k_tail, (1008, c.n + 8), k_split);
}

/// [`strided_rows_leave_the_gaps_alone`] for one case and `(x_stride, y_stride)`, the operator adjusted by `setup`.
fn check_strided(
    dev: &Arc<CudaDevice>,
    c: Case,
    (x_stride, y_stride): (usize, usize),
    setup: impl Fn(&mut LinearW4A16Gemm),
) {
    let m = 300;
    let mut rng = Rng(0x57D);
    let w = quant(&mut rng, &c);
    let weight = DeviceW4::upload(dev, &repack(&w, c.act).unwrap()).unwrap();
    let mut op = LinearW4A16Gemm::with_weight(dev, weight, m, None).unwrap();
    setup(&mut op);
    let x = values(&mut rng, m * c.k, &c);
    let bias: Vec<f32> = (0..c.n)
        .map(|_| lowbit::dtype::round_to(c.act, rng.uniform(-1.0, 1.0)))
        .collect();
    let want = run::<f16>(dev, &op, &c, &x, m, Some(&bias));

    let gap = f16::from_f32(-777.0);
    let mut x_rows = vec![gap; m * x_stride];
    for (row, src) in x_rows.chunks_mut(x_stride).zip(x.chunks(c.k)) {
        row[..c.k].iter_mut().zip(src).for_each(|(d, &v)| *d = f16::from_f32(v));
    }
    let x_dev = dev.upload(&x_rows).unwrap();
    let b_dev = dev
        .upload(&bias.iter().map(|&v| f16::from_f32(v)).collect::<Vec<_>>())
        .unwrap();
    let mut y = dev.upload(&vec![gap; m * y_stride]).unwrap();
    let mut ws = dev.alloc_zeros::<u8>(op.workspace_bytes().max(1)).unwrap();
    op.run_strided(
        dev.stream(),
        &x_dev,
        x_stride,
        m,
        Some(&b_dev),
        c.activation,
        &mut y,
        y_stride,
        &mut ws,
    )
    .unwrap();
    let got = dev.download(&y).unwrap();
    let label = format!("{c:?} x_stride {x_stride} ({:?})", op.variant(m));
    for (i, row) in got.chunks(y_stride).enumerate() {
        for (j, (g, w)) in row[..c.n].iter().zip(&want[i * c.n..(i + 1) * c.n]).enumerate() {
            assert_eq!(g.to_f32().to_bits(), w.to_bits(), "{label}: row {i}, column {j}");
        }
        assert!(
            row[c.n..].iter().all(|&v| v == gap),
            "{label}: row {i}: the gap after it was written"
        );
    }
}

#[test]
fn eight_bit_weights_as_two_int4_planes() {
    let Some(dev) = hopper() else { return };
    // W8A16: the same kernels on the two nibble planes (K doubles, x is read twice); exact and random data,
    // symmetric per channel and asymmetric g128 with act-order.
    let c = Case { bits: 8, ..BASE };
    check::<f16>(&dev, Case { exact: true, ..c }, &[1, 100], &[None]);
    check::<f16>(
        &dev,
        Case {
            act_order: true,
            bias: true,
            ..c
        },
        &[64, 300],
        &[None],
    );
    let per_channel = Case {
        bits: 8,
        group: 1024,
        zeros: false,
        act: DType::Bf16,
        ..BASE
    };
    check::<bf16>(&dev, per_channel, &[1, 256], &[None]);
}

#[test]
fn eight_bit_weights_in_the_int8_layout() {
    let Some(dev) = hopper() else { return };
    // W8A16 with one byte per code (the kernel's INT8 CODES): exact data bit-equal with and without split-K, both
    // tiles; random data asymmetric g128 with act-order and bias, symmetric per channel, and groups of 80 (several
    // per k tile) with a K tail.
    let c = Case {
        bits: 8,
        int8_layout: true,
        ..BASE
    };
    check::<f16>(
        &dev,
        Case { exact: true, ..c },
        &[1, 100, 300],
        &[None, Some(1), Some(3)],
    );
    check::<f16>(
        &dev,
        Case {
            act_order: true,
            bias: true,
            activation: Activation::Silu,
            ..c
        },
        &[64, 300],
        &[None],
    );
    check::<f16>(
        &dev,
        Case {
            group: 1024,
            zeros: false,
            ..c
        },
        &[1, 256],
        &[None, Some(2)],
    );
    check::<f16>(
        &dev,
        Case {
            k: 1040,
            group: 80,
            n: 384,
            ..c
        },
        &[77, 129],
        &[None, Some(2)],
    );
    check::<f16>(
        &dev,
        Case {
            k: 1040,
            group: 80,
            n: 384,
            exact: true,
            ..c
        },
        &[129],
        &[None],
    );
}

#[test]
fn back_to_back_launches_see_each_others_writes() {
    let Some(dev) = hopper() else { return };
    // Every launch is the programmatic dependent of the one before (the kernel's DEPENDENT LAUNCH). Two layers
    // read each other's output and overwrite each other's input for six launches with no host sync; each reuses
    // its workspace, and A's tiles split into cluster groups that count arrivals in the operator's counters. The
    // result must be bit-identical to the same chain synchronised after every launch.
    let mut rng = Rng(0xb2b6);
    // A: 2048 -> 1024 in 16 tiles of 64 tokens (at M = 200), whose 4 splits as 2 clusters of 2 are all resident;
    // B: 1024 -> 2048 on the default plan.
    let (a, b) = layer_pair(1024, 2048);
    let m = 200;
    let upload = |w: &QuantMatrix| DeviceW4::upload(&dev, &repack(w, DType::F16).unwrap()).unwrap();
    let mut split = LinearW4A16Gemm::with_weight(&dev, upload(&quant(&mut rng, &a)), m, Some(4)).unwrap();
    split.set_max_cluster(2); // 4 splits as 2 cluster groups of 2
    let ops = [
        split,
        LinearW4A16Gemm::with_weight(&dev, upload(&quant(&mut rng, &b)), m, None).unwrap(),
    ];
    assert!(ops[0].split_plan(m).groups > 1, "{:?}", ops[0].split_plan(m));
    assert_chain_matches_synchronised(&dev, &mut rng, &ops, &a, m);
    println!(
        "ok: 6 chained launches (A: {:?}, B: {:?}), bit-identical to the synchronised chain",
        ops[0].split_plan(m),
        ops[1].split_plan(m)
    );
}

#[test]
fn k_split_tile_over_whole_and_half_units() {
    let Some(dev) = hopper() else { return };
    check_k_split_tile(&dev, 64);
}

#[test]
fn k_split_tile_of_128_tokens() {
    let Some(dev) = hopper() else { return };
    check_k_split_tile(&dev, 128);
}

fn check_k_split_tile(dev: &Arc<CudaDevice>, tokens: usize) {
    // The K-split tile (forced): 128 columns x `tokens`, the two consumer warpgroups on alternate stages of the
    // k range, their partials added in shared memory. N = 512 has 256-column units, so each tile is half a unit;
    // N = 384 has 128-column units. Exact integers bit-equal to the reference, with split-K of 1 to 4 CTAs (4 as
    // two cluster groups of 2), token tails, and a unit with several scale rows (group 32, act-order; group 64
    // and a partial last k tile). Items of one k tile (the second warpgroup adds nothing) and CTAs taking several
    // items of an odd number of k tiles (the warpgroups' stage parity changes from one item to the next).
    let k_split = |op: &mut LinearW4A16Gemm| {
        op.force_k_split(true);
        op.force_tile_tokens(Some(tokens));
    };
    let mut seen = Vec::new();
    let c = Case {
        k: 2048,
        exact: true,
        bias: true,
        ..BASE
    };
    check_with::<f16>(dev, c, &[1, 17, 64, 100, 200], &[None, Some(1), Some(3)], |op| {
        k_split(op);
        seen.extend([1, 100].map(|m| op.variant(m)));
    });
    assert!(
        seen.iter()
            .all(|v| v.ksplit && v.halves() == 2 && v.wg_tokens == tokens),
        "{seen:?}"
    );
    let one_tile = Case { k: 128, ..c };
    check_with::<f16>(dev, one_tile, &[64, 200], &[None], k_split);
    // 32 x 6 = 192 tiles of 3 k tiles at 64 tokens (96 at 128): two items for most CTAs; split in two, items of 1
    // and 2 k tiles.
    let odd = Case { n: 4096, k: 384, ..c };
    check_with::<f16>(dev, odd, &[333], &[None, Some(2)], k_split);
    check_with::<f16>(dev, c, &[64, 130], &[Some(4)], |op| {
        k_split(op);
        op.set_max_cluster(2);
    });
    let group_32 = Case {
        n: 256,
        k: 512,
        group: 32,
        act_order: true,
        ..BASE
    };
    check_with::<f16>(dev, group_32, &[16, 64, 130], &[None, Some(2)], k_split);
    let narrow = Case {
        n: 384,
        k: 4160,
        group: 64,
        act: DType::Bf16,
        bias: true,
        activation: Activation::Silu,
        ..BASE
    };
    let mut seen = Vec::new();
    check_with::<bf16>(dev, narrow, &[5, 64, 333], &[None, Some(3)], |op| {
        k_split(op);
        seen.push(op.variant(64));
    });
    assert!(
        seen.iter()
            .all(|v| v.ksplit && v.halves() == 1 && v.wg_tokens == tokens),
        "{seen:?}"
    );
    // 8-bit codes in the int8 layout.
    let int8 = Case {
        bits: 8,
        int8_layout: true,
        exact: true,
        ..c
    };
    check_with::<f16>(dev, int8, &[33, 64], &[None, Some(2)], k_split);
}

#[test]
fn stream_k_splits_tiles_between_ctas() {
    let Some(dev) = hopper() else { return };
    // STREAM-K (forced): CTA c takes k tiles [c U / G, (c + 1) U / G) of the U = tiles x k tiles, and a tile split
    // between CTAs is summed by its last warp to arrive, in piece order. 5 tiles x 8 k tiles: 40 CTAs of one k
    // tile, every tile in 8 pieces; 14 tiles x 33 k tiles (K = 4160, a partial last k tile; groups of 64): 132
    // CTAs of 3-4 k tiles, pieces starting and ending inside tiles. Both small tiles (16 and 64 tokens), exact
    // integers bit-equal to the reference, random data with bias and SiLU, bf16 on 128-column tiles.
    let stream = |op: &mut LinearW4A16Gemm| op.force_stream_k(true);
    let mut plans = Vec::new();
    let c = Case {
        n: 1280,
        exact: true,
        bias: true,
        ..BASE
    };
    check_with::<f16>(&dev, c, &[1, 7, 16, 17, 64], &[None], |op| {
        stream(op);
        plans.extend([1, 16, 17, 64].map(|m| op.split_plan(m)));
    });
    assert!(plans.iter().all(|p| p.stream && p.splits == 1), "{plans:?}");
    let c = Case {
        n: 3584,
        k: 4160,
        group: 64,
        bias: true,
        activation: Activation::Silu,
        ..BASE
    };
    check_with::<f16>(&dev, c, &[1, 16, 40], &[None], stream);
    check_with::<f16>(
        &dev,
        Case {
            exact: true,
            activation: Activation::None,
            ..c
        },
        &[16, 64],
        &[None],
        stream,
    );
    let narrow = Case {
        n: 384,
        k: 2048,
        act: DType::Bf16,
        bias: true,
        ..BASE
    };
    check_with::<bf16>(&dev, narrow, &[3, 33], &[None], stream);

    // Batch invariance: the partition depends on the shape only, so row 0 of 16 rows is M = 1 bit for bit.
    let c = Case {
        n: 3584,
        k: 4160,
        group: 64,
        ..BASE
    };
    let mut rng = Rng(0x5157);
    let w = quant(&mut rng, &c);
    let weight = DeviceW4::upload(&dev, &repack(&w, c.act).unwrap()).unwrap();
    let mut op = LinearW4A16Gemm::with_weight(&dev, weight, 16, None).unwrap();
    stream(&mut op);
    let x = values(&mut rng, 16 * c.k, &c);
    let one = run::<f16>(&dev, &op, &c, &x, 1, None);
    let sixteen = run::<f16>(&dev, &op, &c, &x, 16, None);
    assert!(
        one.iter().zip(&sixteen[..c.n]).all(|(a, b)| a.to_bits() == b.to_bits()),
        "row 0 of M = 16 differs from M = 1"
    );

    // Back to back (each launch the programmatic dependent of the one before): two layers reuse their slots and
    // counters across six launches with no host sync, bit-identical to the synchronised chain.
    let (a, b) = layer_pair(1280, 2048);
    let m = 16;
    let upload = |w: &QuantMatrix| DeviceW4::upload(&dev, &repack(w, DType::F16).unwrap()).unwrap();
    let mut ops = [
        LinearW4A16Gemm::with_weight(&dev, upload(&quant(&mut rng, &a)), m, None).unwrap(),
        LinearW4A16Gemm::with_weight(&dev, upload(&quant(&mut rng, &b)), m, None).unwrap(),
    ];
    ops.iter_mut().for_each(stream);
    assert_chain_matches_synchronised(&dev, &mut rng, &ops, &a, m);
}

/// Two f16 layers that feed each other: `n` outputs from `k` inputs, then back.
fn layer_pair(n: usize, k: usize) -> (Case, Case) {
    (Case { n, k, ..BASE }, Case { n: k, k: n, ..BASE })
}

/// `ops` (layer `a`, then its reverse) chained six times back to back on `m` rows with no host sync: bit-identical
/// to the same chain synchronised after every launch (`common::assert_back_to_back_matches_synchronised`).
fn assert_chain_matches_synchronised(
    dev: &Arc<CudaDevice>,
    rng: &mut Rng,
    ops: &[LinearW4A16Gemm; 2],
    a: &Case,
    m: usize,
) {
    let x0: Vec<f16> = values(rng, m * a.k, a).iter().map(|&v| f16::from_f32(v)).collect();
    let workspaces = [ops[0].workspace_bytes(), ops[1].workspace_bytes()];
    common::assert_back_to_back_matches_synchronised(dev, &x0, m * a.n, workspaces, |i, x, y, ws| {
        ops[i].run(dev.stream(), x, m, None, y, ws).unwrap()
    });
}

/// More than 2^31 output elements (32-bit index overflow is a known bug class): N = 4096 and one row more than
/// 2^31 / N, plus 71, in exact integers. x's rows cycle through 8 patterns, so each row of y must equal its
/// pattern's reference row bit for bit; the first rows and every row from 40 before element 2^31 to the last are
/// checked. y (4.3 GB) starts zeroed, and every pattern row has non-zero outputs, so a row left unwritten fails.
/// Needs ~5 GiB of GPU memory.
#[test]
fn more_than_2_pow_31_outputs() {
    let Some(dev) = hopper() else { return };
    if dev.info().total_memory < (16usize << 30) {
        println!("skipped: needs a GPU with 16 GiB");
        return;
    }
    let c = Case {
        n: 4096,
        k: 128,
        exact: true,
        ..BASE
    };
    let boundary = (1usize << 31) / c.n; // the row holding output element 2^31
    let m = boundary + 72;
    assert!(m * c.n > 1 << 31);
    let mut rng = Rng(31);
    let w = quant(&mut rng, &c);
    const PATTERNS: usize = 8;
    let patterns = values(&mut rng, PATTERNS * c.k, &c);
    let want: Vec<f16> = reference::linear(&patterns, PATTERNS, &w, None)
        .iter()
        .map(|&r| f16::from_f32(r as f32))
        .collect();
    for row in want.chunks(c.n) {
        assert!(
            row.iter().any(|v| v.to_f32() != 0.0),
            "a pattern row of zeros proves nothing"
        );
    }
    let x: Vec<f16> = (0..m)
        .flat_map(|r| {
            patterns[(r % PATTERNS) * c.k..][..c.k]
                .iter()
                .map(|&v| f16::from_f32(v))
        })
        .collect();
    let weight = DeviceW4::upload(&dev, &repack(&w, c.act).unwrap()).unwrap();
    let op = LinearW4A16Gemm::with_weight(&dev, weight, m, None).unwrap();
    let x_dev = dev.upload(&x).unwrap();
    let mut y = dev.alloc_zeros::<f16>(m * c.n).unwrap();
    let mut ws = dev.alloc_zeros::<u8>(op.workspace_bytes()).unwrap();
    op.run_strided(
        dev.stream(),
        &x_dev,
        c.k,
        m,
        None,
        Activation::None,
        &mut y,
        c.n,
        &mut ws,
    )
    .unwrap();
    dev.synchronize().unwrap();
    for first in [0, boundary - 40] {
        let last = if first == 0 { 16 } else { m };
        let got = dev.download(&y.slice(first * c.n..last * c.n)).unwrap();
        for (i, row) in got.chunks(c.n).enumerate() {
            let r = first + i;
            let expect = &want[(r % PATTERNS) * c.n..][..c.n];
            for (col, (g, e)) in row.iter().zip(expect).enumerate() {
                assert_eq!(g.to_bits(), e.to_bits(), "row {r} col {col}: {g} vs {e}");
            }
        }
    }
}
