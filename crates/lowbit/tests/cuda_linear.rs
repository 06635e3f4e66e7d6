//! The CUDA W4A16 linear layer against the f64 reference on the same quantized weights.
//!
//! Every case draws a fresh random weight and activations (never zeros) and checks:
//! - accuracy against `ops::linear::reference::linear`: the kernel multiplies x by the exact integers (q - z) on
//!   the tensor cores (fp32 sums), scales each group's sum once in fp32 and rounds the output once, which is at
//!   least as accurate as rounding each dequantized weight to the activation type (2^-12 / 2^-9 relative for
//!   f16 / bf16); mean |Δ| / mean |ref| must stay under 1e-3 (f16) and 8e-3 (bf16), the tolerances of that
//!   weaker scheme, and no output may be NaN/Inf;
//! - batch invariance: rows of an M-row call equal the same rows of the 64-row call bit for bit (row 0 equals
//!   M = 1), because the split of K never depends on M;
//! - determinism: a repeated call gives identical bytes;
//! - guard words around y and the workspace stay untouched, and every output element is written (y is poisoned
//!   with NaN first).
//!
//! An exact-integer mode (small integer activations, power-of-two scales) requires bit equality with the
//! reference rounded to the activation type. Without a GPU every test prints `skipped: <reason>` and passes.

mod common;

use half::{bf16, f16};
use lowbit::cuda::{CudaDevice, CudaSlice, DevicePtr, DeviceRepr};
use lowbit::ops::linear::cuda::{repack, repack_int8, LinearW4A16Cuda, Tuning};
use lowbit::ops::linear::{reference, Activation};
use lowbit::testing::SplitMix64 as Rng;
use lowbit::{DType, Error, Float, QuantMatrix};
// One device for the whole test binary (kernels compile once), or a printed reason to skip.
use lowbit::testing::cuda_device as device;

/// How a case's numbers are drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Data {
    /// Activations uniform in ±`scale`, scales 2^-9..2^-5.
    Random { x_scale: f32 },
    /// Activations in -2..=2, scales 2^-5..2^-3: every sum is exact in fp32.
    ExactInteger,
}

#[derive(Clone, Copy)]
struct Case {
    n: usize,
    k: usize,
    group: usize,
    act: DType,
    zeros: bool,
    act_order: bool,
    bias: bool,
    data: Data,
    /// Grid override (CTAs per SM); `None` = the per-shape default (one CTA per SM for every shape here).
    ctas_per_sm: Option<usize>,
    /// Pipeline depth override; `None` = the variant's default.
    stages: Option<usize>,
    /// Grid size override (CTAs); `None` = `ctas_per_sm` times the SM count.
    ctas: Option<usize>,
    /// Cluster split-K's split count override (1 = stream-K); `None` = the per-shape default.
    splits: Option<usize>,
    /// wgmma (true) or mma.sync (false) forced where a variant can take either; `None` = the default.
    wgmma: Option<bool>,
    /// GATHERED TILES forced on or off; `None` = the per-shape default.
    gather: Option<bool>,
    /// With gathered tiles, both splits in one CTA (true) or in a cluster (false); `None` = the default (one CTA).
    paired: Option<bool>,
}

impl Case {
    /// An `n x k` case with groups of `group`: zero points, random data, no bias, no act-order, every launch
    /// setting at its default.
    fn new(n: usize, k: usize, group: usize, act: DType) -> Case {
        Case {
            n,
            k,
            group,
            act,
            zeros: true,
            act_order: false,
            bias: false,
            data: Data::Random { x_scale: 1.0 },
            ctas_per_sm: None,
            stages: None,
            ctas: None,
            splits: None,
            wgmma: None,
            gather: None,
            paired: None,
        }
    }
}

/// A random weight of `bits`-bit codes (and zeros) for case `c`.
fn quant(rng: &mut Rng, c: &Case, bits: u8) -> QuantMatrix {
    let groups = c.k / c.group;
    let codes = (0..c.n * c.k).map(|_| rng.below(1 << bits) as u8).collect();
    let scales = (0..c.n * groups)
        .map(|_| match c.data {
            Data::Random { .. } => lowbit::dtype::round_to(c.act, 2f32.powf(rng.uniform(-9.0, -5.0))),
            Data::ExactInteger => 2f32.powi(-3 - rng.below(3) as i32),
        })
        .collect();
    let zeros = c
        .zeros
        .then(|| (0..c.n * groups).map(|_| rng.below(1 << bits) as u8).collect());
    let g_idx = c.act_order.then(|| {
        let mut g: Vec<u32> = (0..c.k).map(|i| (i / c.group) as u32).collect();
        for i in (1..c.k).rev() {
            g.swap(i, rng.below(i as u64 + 1) as usize);
        }
        g
    });
    QuantMatrix {
        n: c.n,
        k: c.k,
        bits,
        group_size: c.group,
        codes,
        zeros,
        scales,
        scale_dtype: c.act,
        g_idx,
    }
}

/// Values of `len` activations (already representable in `act`).
fn activations(rng: &mut Rng, len: usize, act: DType, data: Data) -> Vec<f32> {
    (0..len)
        .map(|_| match data {
            Data::Random { x_scale } => lowbit::dtype::round_to(act, rng.uniform(-x_scale, x_scale)),
            Data::ExactInteger => rng.below(5) as f32 - 2.0,
        })
        .collect()
}

const GUARD: usize = 64;

/// A device buffer of `len` elements between two guard regions of known bits; `fill` is the inside's value.
struct Guarded<T: DeviceRepr> {
    buf: CudaSlice<T>,
    len: usize,
}

impl<T: Float + DeviceRepr> Guarded<T> {
    fn new(dev: &CudaDevice, len: usize, fill: T, guard: T) -> Self {
        let mut host = vec![guard; len + 2 * GUARD];
        host[GUARD..GUARD + len].fill(fill);
        Guarded {
            buf: dev.upload(&host).unwrap(),
            len,
        }
    }
    /// The inside, after checking the guards.
    fn read(&self, dev: &CudaDevice, guard: T) -> Vec<T> {
        let host = dev.download(&self.buf).unwrap();
        assert!(
            host[..GUARD].iter().all(|&g| g == guard),
            "guard before the buffer was overwritten"
        );
        assert!(
            host[GUARD + self.len..].iter().all(|&g| g == guard),
            "guard after the buffer was overwritten"
        );
        host[GUARD..GUARD + self.len].to_vec()
    }
}

/// Runs the operator on the first `m` rows and returns y as f32 (after the guard checks).
fn run<T: Float + DeviceRepr>(
    dev: &CudaDevice,
    op: &LinearW4A16Cuda,
    x: &[f32],
    m: usize,
    bias: Option<&[f32]>,
) -> Vec<f32> {
    let (n, k) = (op.plan().n, op.plan().k);
    let xs: Vec<T> = x[..m * k].iter().map(|&v| T::from_f32(v)).collect();
    let x_dev = dev.upload(&xs).unwrap();
    let b_dev = bias.map(|b| {
        dev.upload(&b.iter().map(|&v| T::from_f32(v)).collect::<Vec<T>>())
            .unwrap()
    });
    let poison = T::from_f32(f32::NAN);
    let guard = T::from_f32(-12345.0);
    let mut y = Guarded::new(dev, m * n, poison, guard);
    let ws_guard = 0xA5u8;
    let mut ws = Guarded::<u8>::new_bytes(dev, op.workspace_bytes(), ws_guard);
    {
        let mut y_view = y.buf.slice_mut(GUARD..GUARD + m * n);
        let mut ws_view = ws.buf.slice_mut(GUARD * 4..GUARD * 4 + ws.len);
        op.run(
            dev.stream(),
            &x_dev,
            m,
            b_dev.as_ref().map(|b| b as &dyn DevicePtr<T>),
            &mut y_view,
            &mut ws_view,
        )
        .unwrap();
    }
    dev.synchronize().unwrap();
    ws.check(dev, ws_guard);
    y.read(dev, guard).iter().map(|v| v.to_f32()).collect()
}

impl Guarded<u8> {
    /// A byte workspace: 256-byte aligned inside (GUARD * 4 bytes of guard each side), guards `guard`.
    fn new_bytes(dev: &CudaDevice, len: usize, guard: u8) -> Self {
        let host = vec![guard; len + 8 * GUARD];
        Guarded {
            buf: dev.upload(&host).unwrap(),
            len,
        }
    }
    fn check(&self, dev: &CudaDevice, guard: u8) {
        let host = dev.download(&self.buf).unwrap();
        assert!(
            host[..4 * GUARD].iter().all(|&g| g == guard),
            "guard before the workspace was overwritten"
        );
        assert!(
            host[4 * GUARD + self.len..].iter().all(|&g| g == guard),
            "guard after the workspace was overwritten"
        );
    }
}

fn rounded(act: DType, v: f64) -> f32 {
    lowbit::dtype::round_to(act, v as f32)
}

/// mean |Δ| / mean |ref| and the worst element, failing on NaN/Inf.
fn error(got: &[f32], want: &[f64], label: &str) -> (f64, f64, usize) {
    let (mut diff, mut refs, mut max_abs, mut worst) = (0f64, 0f64, 0f64, 0);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(g.is_finite(), "{label}: non-finite output {g} at {i} (reference {w})");
        let d = (f64::from(g) - w).abs();
        diff += d;
        refs += w.abs();
        if d > max_abs {
            max_abs = d;
            worst = i;
        }
    }
    (diff / refs.max(f64::MIN_POSITIVE), max_abs, worst)
}

/// `op.run_strided` on the `m` rows of `x` (K values each) laid `x_stride` apart (the gaps hold 7.0), into y rows
/// `y_stride` apart (poisoned with NaN first): returns the `m` rows of y, after checking that the gaps between them
/// are untouched.
#[allow(clippy::too_many_arguments)]
fn run_strided_f16(
    dev: &CudaDevice,
    op: &LinearW4A16Cuda,
    x: &[f32],
    m: usize,
    x_stride: usize,
    y_stride: usize,
    bias: Option<&CudaSlice<f16>>,
) -> Vec<f32> {
    let (n, k) = (op.plan().n, op.plan().k);
    let mut xs = vec![f16::from_f32(7.0); m * x_stride];
    for r in 0..m {
        for i in 0..k {
            xs[r * x_stride + i] = f16::from_f32(x[r * k + i]);
        }
    }
    let x_dev = dev.upload(&xs).unwrap();
    let mut y = dev.upload(&vec![f16::from_f32(f32::NAN); m * y_stride]).unwrap();
    let mut ws = dev.alloc_zeros::<u8>(op.workspace_bytes()).unwrap();
    let bias = bias.map(|b| b as &dyn DevicePtr<f16>);
    op.run_strided(dev.stream(), &x_dev, x_stride, m, bias, &mut y, y_stride, &mut ws)
        .unwrap();
    let host = dev.download(&y).unwrap();
    for r in 0..m - 1 {
        let gap = &host[r * y_stride + n..(r + 1) * y_stride];
        assert!(gap.iter().all(|v| v.is_nan()), "gap after y row {r} written");
    }
    (0..m)
        .flat_map(|r| host[r * y_stride..r * y_stride + n].iter().map(|v| v.to_f32()))
        .collect()
}

/// All batch sizes of one weight: accuracy per M, batch invariance against the 64-row call, determinism.
fn check_case<T: Float + DeviceRepr>(dev: &CudaDevice, rng: &mut Rng, c: &Case) {
    check_case_bits::<T>(dev, rng, c, 4)
}

/// [`check_case`] with `bits`-bit codes: 8-bit weights in the int8 layout (`repack_int8`, f16 only).
fn check_case_bits<T: Float + DeviceRepr>(dev: &CudaDevice, rng: &mut Rng, c: &Case, bits: u8) {
    const MS: [usize; 12] = [1, 2, 3, 7, 8, 13, 16, 17, 31, 32, 33, 64];
    let w = quant(rng, c, bits);
    let x = activations(rng, 64 * c.k, c.act, c.data);
    let bias = c
        .bias
        .then(|| activations(rng, c.n, c.act, Data::Random { x_scale: 1.0 }));
    let want = reference::linear(&x, 64, &w, bias.as_deref());
    let tuning = Tuning {
        ctas_per_sm: c.ctas_per_sm,
        stages: c.stages,
        ctas: c.ctas,
        splits: c.splits,
        wgmma: c.wgmma,
        gather: c.gather,
        paired: c.paired,
        ..Tuning::default()
    };
    let packed = if bits == 8 {
        repack_int8(&w, c.act)
    } else {
        repack(&w, c.act)
    };
    let op = LinearW4A16Cuda::with_tuning(dev, &packed.unwrap(), 64, tuning).unwrap();
    let label = format!(
        "W{bits} N={} K={} G={} {} zeros={} act_order={} bias={} {:?} stages={:?} wgmma={:?} (tiles of {} columns, {} CTAs, splits {})",
        c.n,
        c.k,
        c.group,
        c.act,
        c.zeros,
        c.act_order,
        c.bias,
        c.data,
        c.stages,
        c.wgmma,
        op.tile_width(),
        op.ctas(),
        op.splits()
    );
    if c.gather == Some(true) {
        assert!(
            op.tile_width() < op.plan().n_cta && op.splits() == 2,
            "{label}: not gathered"
        );
    }
    let full = run::<T>(dev, &op, &x, 64, bias.as_deref());
    let again = run::<T>(dev, &op, &x, 64, bias.as_deref());
    assert!(
        full.iter().zip(&again).all(|(a, b)| a.to_bits() == b.to_bits()),
        "{label}: repeated run differs"
    );
    let tolerance = if c.act == DType::F16 { 1e-3 } else { 8e-3 };
    for m in MS {
        let got = if m == 64 {
            full.clone()
        } else {
            run::<T>(dev, &op, &x, m, bias.as_deref())
        };
        let rows = m * c.n;
        let first_diff = got
            .iter()
            .zip(&full[..rows])
            .position(|(a, b)| a.to_bits() != b.to_bits());
        assert!(
            first_diff.is_none(),
            "{label}: M={m} differs from the 64-row call at {first_diff:?}"
        );
        match c.data {
            Data::ExactInteger => {
                for (i, (&g, &r)) in got.iter().zip(&want[..rows]).enumerate() {
                    assert_eq!(
                        g.to_bits(),
                        rounded(c.act, r).to_bits(),
                        "{label}: M={m} element {i}: {g} vs {r}"
                    );
                }
            }
            Data::Random { .. } => {
                let (rel, max_abs, worst) = error(&got, &want[..rows], &label);
                assert!(
                    rel <= tolerance,
                    "{label}: M={m} mean rel error {rel:.2e} > {tolerance:.0e} (max |Δ| {max_abs:.3e} at {worst})"
                );
            }
        }
    }
    println!("ok {label}");
}

fn check<T: Float + DeviceRepr>(dev: &CudaDevice, rng: &mut Rng, c: &Case) {
    check_case::<T>(dev, rng, c)
}

fn dispatch(dev: &CudaDevice, rng: &mut Rng, c: &Case) {
    match c.act {
        DType::Bf16 => check::<bf16>(dev, rng, c),
        _ => check::<f16>(dev, rng, c),
    }
}

#[test]
fn matches_reference_across_shapes_and_batches() {
    let Some(dev) = device() else { return };
    let mut rng = Rng(0x11ea_4a16);
    let mut index = 0usize;
    for n in [64, 192, 576, 4096] {
        for k in [128, 192, 384, 4160, 4096] {
            for (i, group) in [32, 64, 128, k].into_iter().enumerate() {
                if k % group != 0 || (i == 3 && k == 128) {
                    continue; // not a divisor, or per-channel already covered by G = 128
                }
                // Rotate the remaining axes through the cases so each value meets many shapes.
                index += 1;
                let case = Case {
                    n,
                    k,
                    group,
                    act: if index % 2 == 0 { DType::F16 } else { DType::Bf16 },
                    zeros: index % 3 != 0,
                    act_order: group < k && index % 4 == 1,
                    bias: index % 5 < 3,
                    data: Data::Random {
                        x_scale: if index % 3 == 2 { 100.0 } else { 1.0 },
                    },
                    // Half the cases on the two-CTAs-per-SM grid (its own kernel variants: fewer registers,
                    // fewer stages, more split tiles), which only large layers get by default.
                    ctas_per_sm: (index % 2 == 1).then_some(2),
                    stages: None,
                    ctas: None,
                    splits: None,
                    wgmma: None,
                    gather: None,
                    paired: None,
                };
                dispatch(&dev, &mut rng, &case);
            }
        }
    }
}

#[test]
fn exact_integer_mode_is_bit_exact() {
    let Some(dev) = device() else { return };
    let mut rng = Rng(0xe4ac7);
    for (n, k, group, act, zeros, act_order) in [
        (192, 4160, 64, DType::F16, true, false),
        (4096, 384, 128, DType::Bf16, true, true),
        (576, 192, 192, DType::F16, false, false),
        (64, 4096, 32, DType::Bf16, false, true),
    ] {
        let case = Case {
            zeros,
            act_order,
            data: Data::ExactInteger,
            ctas_per_sm: (n == 4096).then_some(2),
            ..Case::new(n, k, group, act)
        };
        dispatch(&dev, &mut rng, &case);
    }
}

/// Group sizes that are not multiples of 128 (groups start inside a 128-k unit: the kernel applies the scales at
/// each group start) or larger than 128 but not a multiple of it (groups span units at varying offsets).
#[test]
fn groups_not_aligned_to_units() {
    let Some(dev) = device() else { return };
    let mut rng = Rng(0x9a11);
    for (n, k, group, act, act_order, data) in [
        (256, 384, 48, DType::F16, false, Data::Random { x_scale: 1.0 }),
        (192, 4160, 80, DType::Bf16, false, Data::Random { x_scale: 1.0 }),
        (576, 768, 192, DType::F16, true, Data::Random { x_scale: 100.0 }),
        (64, 384, 16, DType::Bf16, true, Data::Random { x_scale: 1.0 }),
        (256, 384, 48, DType::F16, true, Data::ExactInteger),
        (128, 960, 320, DType::Bf16, false, Data::ExactInteger),
    ] {
        let case = Case {
            act_order,
            bias: n % 3 == 0,
            data,
            ctas_per_sm: (n == 192).then_some(2),
            ..Case::new(n, k, group, act)
        };
        dispatch(&dev, &mut rng, &case);
    }
}

/// Every pipeline depth from 2 to 6 on a grid of 7 CTAs (dozens of units each, so the ring of stages and its
/// mbarrier phases wrap many times), with the one- and two-CTA-per-SM kernels, groups inside and across units.
#[test]
fn pipeline_depths() {
    let Some(dev) = device() else { return };
    let mut rng = Rng(0xde97);
    for stages in 2..=6 {
        for (n, k, group, act, ctas_per_sm) in [
            (576, 4224, 128, DType::F16, Some(2)),
            (2048, 3072, 64, DType::Bf16, None),
        ] {
            let case = Case {
                ctas_per_sm,
                stages: Some(stages),
                ctas: Some(7),
                ..Case::new(n, k, group, act)
            };
            dispatch(&dev, &mut rng, &case);
        }
    }
}

/// STREAM-K with forced grids of one or two units per CTA: 300 and 400 CTAs are more than fit at once on an H200,
/// so they run in waves, and the CTAs of later waves finish tiles that earlier waves began (100 CTAs on a narrow
/// layer fit in one wave). CTAs whose ranges cross a tile boundary finish the last piece of one tile and the first
/// of the next. Exact integers with bias check the sums against the
/// reference, and check_case compares every M bit for bit with the 64-row call (the cp.async kernel).
#[test]
fn stream_k_in_later_waves() {
    let Some(dev) = device() else { return };
    let mut rng = Rng(0x4a2d0);
    for (n, k, group, act, ctas) in [
        (4096, 4096, 128, DType::F16, 300),
        (1024, 4224, 64, DType::Bf16, 100),
        (2048, 8192, 128, DType::F16, 400),
    ] {
        let case = Case {
            bias: true,
            data: Data::ExactInteger,
            ctas_per_sm: Some(2),
            ctas: Some(ctas),
            splits: Some(1),
            ..Case::new(n, k, group, act)
        };
        dispatch(&dev, &mut rng, &case);
    }
}

/// Cluster split-K (the partials meet in the cluster's shared memory) at every split count, on the default
/// shapes that pick it (4096 x 4096: 16 tiles x 8 splits on 132 SMs; 112 tiles x 2 at two per SM) and forced on odd ones: narrow tiles, K not
/// a multiple of the split count's units, groups inside units, act-order, bias. check_case also checks batch
/// invariance (every M against the 64-row call) and byte-identical repeats; exact-integer data checks the sum.
#[test]
fn cluster_split_k() {
    let Some(dev) = device() else { return };
    if dev.info().compute_capability.0 < 9 {
        println!(
            "skipped: cluster split-K needs sm_90 (this GPU is sm_{}{})",
            dev.info().compute_capability.0,
            dev.info().compute_capability.1
        );
        return;
    }
    let mut rng = Rng(0xc105_7e25);
    for (n, k, group, act, zeros, act_order, bias, data, splits) in [
        (
            4096,
            4096,
            128,
            DType::F16,
            true,
            false,
            true,
            Data::Random { x_scale: 1.0 },
            None,
        ),
        (
            4096,
            4096,
            128,
            DType::Bf16,
            true,
            false,
            false,
            Data::ExactInteger,
            None,
        ),
        (
            192,
            4160,
            64,
            DType::F16,
            true,
            false,
            true,
            Data::Random { x_scale: 100.0 },
            Some(8),
        ),
        (
            576,
            1280,
            32,
            DType::Bf16,
            false,
            true,
            false,
            Data::Random { x_scale: 1.0 },
            Some(4),
        ),
        (
            4096,
            384,
            128,
            DType::F16,
            true,
            true,
            false,
            Data::ExactInteger,
            Some(2),
        ),
        (
            64,
            4096,
            4096,
            DType::F16,
            false,
            false,
            true,
            Data::Random { x_scale: 1.0 },
            Some(8),
        ),
        // 112 tiles (8192 x 28672's width): on an H200 two splits at two CTAs per SM, by default; M > 16 then
        // takes the global fix-up of the same partition, in two waves.
        (28672, 512, 128, DType::F16, true, false, true, Data::ExactInteger, None),
        (
            27136,
            768,
            128,
            DType::Bf16,
            true,
            true,
            false,
            Data::Random { x_scale: 1.0 },
            None,
        ),
    ] {
        let case = Case {
            zeros,
            act_order,
            bias,
            data,
            splits,
            ..Case::new(n, k, group, act)
        };
        dispatch(&dev, &mut rng, &case);
    }
}

/// GATHERED TILES forced on small layers (each with 256-column tiles: 56 or 48 slices): kernel tiles of 7 or 6 warps
/// cut out of 256-column units, so tiles run from one stored tile into the next at every offset; N padded; per
/// channel; act-order; bf16; with and without zeros. A layer of narrower tiles gets a typed error. check_case covers
/// every M against the reference, the 64-row call and a repeat: up to 16 rows the kernels gather (both splits in one
/// CTA, and once as clusters of two CTAs), above they take the stored tiles with the same two splits, so row 0 of
/// every batch must still have the bits of M = 1.
#[test]
fn gathered_tiles() {
    let Some(dev) = device() else { return };
    if dev.info().compute_capability.0 < 9 {
        println!("skipped: gathered tiles run as cluster split-K, which needs sm_90");
        return;
    }
    let mut rng = Rng(0x09a7_e7ed);
    for (n, k, group, act, zeros, act_order, bias, data, paired) in [
        (1792, 1024, 128, DType::F16, true, false, true, Data::ExactInteger, None),
        // The same as clusters of two CTAs, each split in a CTA of its own.
        (
            1792,
            1024,
            128,
            DType::F16,
            true,
            false,
            true,
            Data::ExactInteger,
            Some(false),
        ),
        // 5 k tiles: the second split is the longer.
        (
            1536,
            640,
            128,
            DType::Bf16,
            true,
            true,
            false,
            Data::Random { x_scale: 1.0 },
            None,
        ),
        (
            1790,
            2048,
            2048,
            DType::F16,
            false,
            false,
            true,
            Data::Random { x_scale: 100.0 },
            None,
        ),
        (
            1792,
            1536,
            256,
            DType::Bf16,
            false,
            false,
            false,
            Data::ExactInteger,
            None,
        ),
    ] {
        let case = Case {
            zeros,
            act_order,
            bias,
            data,
            gather: Some(true),
            paired,
            ..Case::new(n, k, group, act)
        };
        dispatch(&dev, &mut rng, &case);
    }
    // 1920 columns take 128-column tiles: no gathered tiles, a typed error.
    let packed = repack(&quant(&mut rng, &Case::new(1920, 640, 128, DType::F16), 4), DType::F16).unwrap();
    let tuning = Tuning {
        gather: Some(true),
        ..Tuning::default()
    };
    let err = LinearW4A16Cuda::with_tuning(&dev, &packed, 64, tuning).unwrap_err();
    assert!(
        matches!(&err, Error::Invalid { tensor, .. } if tensor == "gather"),
        "{err}"
    );
}

/// Programmatic dependent launch: each launch may start while the previous kernel in the stream still runs, so it
/// must wait for that kernel before it reads x or writes anything. Two layers run back to back without a host
/// sync, each reading the other's output and overwriting the other's input (and each op reusing its own counters
/// and workspace across launches), must give the bits of the same chain synchronised after every launch.
#[test]
fn back_to_back_launches_see_each_others_writes() {
    let Some(dev) = device() else { return };
    let mut rng = Rng(0xb2b);
    let case = |n, k| Case::new(n, k, 128, DType::F16);
    // A: 2048 -> 4096 (cluster split-K on an H200), B: 4096 -> 2048 (stream-K with the global fix-up).
    let (a, b) = (case(4096, 2048), case(2048, 4096));
    let ops = [&a, &b].map(|c| LinearW4A16Cuda::new(&dev, &quant(&mut rng, c, 4), DType::F16, 16).unwrap());
    let m = 16;
    let x0: Vec<f16> = activations(&mut rng, m * a.k, DType::F16, a.data)
        .iter()
        .map(|&v| f16::from_f32(v))
        .collect();
    let workspaces = [ops[0].workspace_bytes(), ops[1].workspace_bytes()];
    common::assert_back_to_back_matches_synchronised(&dev, &x0, m * a.n, workspaces, |i, x, y, ws| {
        ops[i].run(dev.stream(), x, m, None, y, ws).unwrap()
    });
    println!("ok: 6 chained launches, bit-identical to the synchronised chain");
}

#[test]
fn strided_and_unaligned_activation_rows() {
    let Some(dev) = device() else { return };
    let mut rng = Rng(5);
    let c = Case {
        bias: true,
        ..Case::new(576, 384, 64, DType::F16)
    };
    let w = quant(&mut rng, &c, 4);
    let op = LinearW4A16Cuda::new(&dev, &w, DType::F16, 16).unwrap();
    let m = 13;
    let x = activations(&mut rng, m * c.k, c.act, c.data);
    let bias = activations(&mut rng, c.n, c.act, c.data);
    let want = reference::linear(&x, m, &w, Some(&bias));
    let b_dev = dev
        .upload(&bias.iter().map(|&v| f16::from_f32(v)).collect::<Vec<_>>())
        .unwrap();
    // x_stride K + 8 (aligned, read in place) and K + 3 (unaligned rows, staged); y_stride N + 5.
    for x_stride in [c.k + 8, c.k + 3] {
        let got = run_strided_f16(&dev, &op, &x, m, x_stride, c.n + 5, Some(&b_dev));
        let (rel, _, _) = error(&got, &want, "strided");
        assert!(rel <= 1e-3, "x_stride {x_stride}: mean rel error {rel:.2e}");
    }
}

#[test]
fn bad_inputs_give_typed_errors() {
    // Host-side rules (no GPU needed).
    let mut rng = Rng(9);
    let c = Case {
        ..Case::new(64, 128, 32, DType::F16)
    };
    let mut w = quant(&mut rng, &c, 4);
    assert!(matches!(repack(&w, DType::F32), Err(Error::Invalid { .. })));
    w.group_size = 8;
    w.scales = vec![0.01; 64 * 16];
    w.zeros = Some(vec![8; 64 * 16]);
    assert!(matches!(repack(&w, DType::F16), Err(Error::Unsupported(_))));
    let mut big = quant(&mut rng, &c, 4);
    big.scales[0] = 1e6; // overflows f16
    assert!(matches!(repack(&big, DType::F16), Err(Error::Invalid { .. })));

    let Some(dev) = device() else { return };
    let w = quant(&mut rng, &c, 4);
    let op = LinearW4A16Cuda::new(&dev, &w, DType::F16, 8).unwrap();
    let x = dev.alloc_zeros::<f16>(8 * 128).unwrap();
    let xb = dev.alloc_zeros::<bf16>(8 * 128).unwrap();
    let mut y = dev.alloc_zeros::<f16>(8 * 64).unwrap();
    let mut yb = dev.alloc_zeros::<bf16>(8 * 64).unwrap();
    let mut ws = dev.alloc_zeros::<u8>(op.workspace_bytes()).unwrap();
    let mut small_ws = dev.alloc_zeros::<u8>(16).unwrap();
    let s = dev.stream();
    assert!(
        matches!(op.run(s, &xb, 1, None, &mut yb, &mut ws), Err(Error::Invalid { .. })),
        "dtype"
    );
    assert!(
        matches!(op.run(s, &x, 9, None, &mut y, &mut ws), Err(Error::Invalid { .. })),
        "m > max_m"
    );
    let short = dev.alloc_zeros::<f16>(100).unwrap();
    assert!(
        matches!(op.run(s, &short, 1, None, &mut y, &mut ws), Err(Error::Invalid { .. })),
        "short x"
    );
    assert!(
        matches!(
            op.run(s, &x, 8, None, &mut y, &mut small_ws),
            Err(Error::Invalid { .. })
        ),
        "workspace"
    );
    assert!(
        matches!(
            LinearW4A16Cuda::new(&dev, &w, DType::F16, 0),
            Err(Error::Invalid { .. })
        ),
        "max_m"
    );
    // An activation runs fused only where a twin was built (with_fused_activation: mma.sync, M <= 16); elsewhere
    // it is refused, not dropped: an operator built without it, more than 16 rows, forced wgmma (sm_90).
    let big = quant(&mut rng, &Case::new(256, 256, 128, DType::F16), 4);
    let packed = repack(&big, DType::F16).unwrap();
    let x = dev.alloc_zeros::<f16>(64 * 256).unwrap();
    let mut y = dev.alloc_zeros::<f16>(64 * 256).unwrap();
    let wgmma = Tuning {
        wgmma: Some(true),
        ..Tuning::default()
    };
    let plain = LinearW4A16Cuda::new(&dev, &big, DType::F16, 64).unwrap();
    let fused = LinearW4A16Cuda::new(&dev, &big, DType::F16, 64)
        .and_then(|op| op.with_fused_activation(&dev))
        .unwrap();
    for (label, op, m) in [("plain", &plain, 12), ("fused", &fused, 40)] {
        let mut ws = dev.alloc_zeros::<u8>(op.workspace_bytes()).unwrap();
        let run = op.run_with_activation(s, &x, m, None, Activation::Silu, &mut y, &mut ws);
        assert!(
            matches!(run, Err(Error::Unsupported(_))),
            "{label} at {m} rows: {run:?}"
        );
        assert!(!op.fuses_activation(m), "{label} at {m} rows");
    }
    assert!(fused.fuses_activation(12));
    if dev.info().compute_capability.0 == 9 {
        let op = LinearW4A16Cuda::with_tuning(&dev, &packed, 16, wgmma)
            .and_then(|op| op.with_fused_activation(&dev))
            .unwrap();
        let mut ws = dev.alloc_zeros::<u8>(op.workspace_bytes()).unwrap();
        let run = op.run_with_activation(s, &x, 12, None, Activation::Silu, &mut y, &mut ws);
        assert!(matches!(run, Err(Error::Unsupported(_))), "forced wgmma: {run:?}");
    }
}

/// Batches above 64 rows run as 64-row chunks (the `mma.sync` path for any M where the Hopper GEMM is absent): every
/// row equals the call of its own chunk of at most 64 rows bit for bit (so row 0 equals M = 1), the result is within
/// tolerance of the reference (bit-exact in exact-integer mode), repeated calls are identical, and guard words stay.
/// Covers act-order and unaligned rows (x staged per chunk), stream-K and cluster split-K, f16 and bf16.
#[test]
fn batches_above_64_rows_run_in_chunks() {
    let Some(dev) = device() else { return };
    let mut rng = Rng(0xc4_0a_4e);
    let cases = [
        Case {
            act_order: true,
            bias: true,
            ..Case::new(576, 4160, 64, DType::Bf16)
        },
        // 16 tiles of 256 columns: cluster split-K on an H200.
        Case::new(4096, 4096, 128, DType::F16),
        Case {
            bias: true,
            data: Data::ExactInteger,
            ..Case::new(256, 1024, 128, DType::F16)
        },
    ];
    const M: usize = 200;
    for c in &cases {
        let w = quant(&mut rng, c, 4);
        let x = activations(&mut rng, M * c.k, c.act, c.data);
        let bias = c
            .bias
            .then(|| activations(&mut rng, c.n, c.act, Data::Random { x_scale: 1.0 }));
        let want = reference::linear(&x, M, &w, bias.as_deref());
        let op = LinearW4A16Cuda::new(&dev, &w, c.act, M).unwrap();
        let label = format!(
            "N={} K={} {} act_order={} splits {}",
            c.n,
            c.k,
            c.act,
            c.act_order,
            op.splits()
        );
        let call = |x: &[f32], m: usize| match c.act {
            DType::Bf16 => run::<bf16>(&dev, &op, x, m, bias.as_deref()),
            _ => run::<f16>(&dev, &op, x, m, bias.as_deref()),
        };
        for m in [65, 129, M] {
            let got = call(&x, m);
            if m == M {
                assert!(
                    got.iter().zip(&call(&x, m)).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{label}: repeated run differs"
                );
            }
            for first in (0..m).step_by(64) {
                let rows = 64.min(m - first);
                let chunk = call(&x[first * c.k..], rows);
                let diff = got[first * c.n..(first + rows) * c.n]
                    .iter()
                    .zip(&chunk)
                    .position(|(a, b)| a.to_bits() != b.to_bits());
                assert!(
                    diff.is_none(),
                    "{label}: M={m} rows from {first} differ from their own call at {diff:?}"
                );
            }
            let rows = m * c.n;
            match c.data {
                Data::ExactInteger => {
                    for (i, (&g, &r)) in got.iter().zip(&want[..rows]).enumerate() {
                        assert_eq!(g.to_bits(), rounded(c.act, r).to_bits(), "{label}: M={m} element {i}");
                    }
                }
                Data::Random { .. } => {
                    let tolerance = if c.act == DType::F16 { 1e-3 } else { 8e-3 };
                    let (rel, max_abs, worst) = error(&got, &want[..rows], &label);
                    assert!(
                        rel <= tolerance,
                        "{label}: M={m} mean rel error {rel:.2e} (max |Δ| {max_abs:.3e} at {worst})"
                    );
                }
            }
        }
        // Row 0 of the largest batch is the single-row call's.
        let single = call(&x, 1);
        assert!(
            single.iter().zip(&call(&x, M)).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{label}: row 0"
        );
        println!("ok {label}");
    }

    // Strided rows over several chunks: K + 3 (unaligned: each chunk is staged) and y rows N + 5 apart.
    let c = &cases[2];
    let w = quant(&mut rng, c, 4);
    let op = LinearW4A16Cuda::new(&dev, &w, DType::F16, M).unwrap();
    let m = 150;
    let x = activations(&mut rng, m * c.k, c.act, c.data);
    let want = reference::linear(&x, m, &w, None);
    let got = run_strided_f16(&dev, &op, &x, m, c.k + 3, c.n + 5, None);
    for (i, (&g, &r)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.to_bits(), rounded(c.act, r).to_bits(), "strided chunks: element {i}");
    }
}

/// 8-bit weights in the int8 layout (one byte per code, fp16): stream-K and cluster split-K (one and two CTAs per
/// SM), 256- and 64-column tiles, groups inside units, act-order, symmetric; random data within tolerance, exact
/// data bit for bit, every M bit-identical to the 64-row call.
#[test]
fn int8_layout() {
    let Some(dev) = device() else { return };
    let mut rng = Rng(0x1e8_1a70);
    for (n, k, group, zeros, act_order, data, splits) in [
        (4096, 4096, 128, true, false, Data::Random { x_scale: 1.0 }, None),
        (4096, 4096, 128, true, false, Data::ExactInteger, Some(1)),
        (192, 4160, 64, true, false, Data::ExactInteger, None),
        (576, 192, 192, false, false, Data::ExactInteger, None),
        (512, 1024, 32, true, true, Data::Random { x_scale: 1.0 }, None),
        // 106 tiles: on an H200 two splits at two CTAs per SM (cluster_splits' 8-bit rule); M > 16 then takes
        // the global fix-up of the same partition, in two waves.
        (27136, 512, 128, true, false, Data::ExactInteger, None),
        // The 8-bit rule's 4 splits: 56 tiles as clusters of 4 (224 CTAs); 112 tiles through the global fix-up
        // (448 CTAs, two waves).
        (14336, 1024, 128, true, false, Data::ExactInteger, None),
        (28672, 1024, 128, true, false, Data::ExactInteger, None),
    ] {
        let case = Case {
            zeros,
            act_order,
            bias: true,
            data,
            splits,
            ..Case::new(n, k, group, DType::F16)
        };
        check_case_bits::<f16>(&dev, &mut rng, &case, 8);
    }
}

/// The mma warps' two instruction sets (sm_90: wgmma with x from shared memory, or mma.sync with x fragments from
/// ldmatrix), each forced: stream-K and cluster split-K, one and two CTAs per SM, groups inside units, act-order,
/// bf16, int8 codes, a short ring that wraps. check_case compares every M (the wgmma variants serve M <= 32) with
/// the 64-row call, which is mma.sync either way: the two must give the same bits.
#[test]
fn wgmma_and_mma_sync_agree() {
    let Some(dev) = device() else { return };
    if dev.info().compute_capability != (9, 0) {
        println!("skipped: wgmma needs sm_90a");
        return;
    }
    let mut rng = Rng(0x3939a);
    for wgmma in [true, false] {
        for (n, k, group, act, act_order, data, ctas_per_sm, stages, ctas, bits) in [
            (
                4096,
                384,
                128,
                DType::F16,
                true,
                Data::Random { x_scale: 100.0 },
                Some(2),
                None,
                None,
                4,
            ),
            (
                256,
                4160,
                64,
                DType::Bf16,
                false,
                Data::ExactInteger,
                None,
                None,
                None,
                4,
            ),
            (
                4096,
                4096,
                128,
                DType::Bf16,
                false,
                Data::Random { x_scale: 1.0 },
                None,
                None,
                None,
                4,
            ),
            (
                1024,
                4224,
                32,
                DType::F16,
                true,
                Data::Random { x_scale: 1.0 },
                Some(2),
                Some(2),
                Some(7),
                4,
            ),
            (
                4096,
                4096,
                128,
                DType::F16,
                false,
                Data::ExactInteger,
                Some(2),
                None,
                None,
                8,
            ),
        ] {
            let case = Case {
                act_order,
                bias: n % 3 == 1,
                data,
                ctas_per_sm,
                stages,
                ctas,
                wgmma: Some(wgmma),
                ..Case::new(n, k, group, act)
            };
            match act {
                DType::Bf16 => check_case_bits::<bf16>(&dev, &mut rng, &case, bits),
                _ => check_case_bits::<f16>(&dev, &mut rng, &case, bits),
            }
        }
    }
}
