//! CUDA dequantization against the CPU path, bit for bit.
//!
//! Every case draws a fresh random `QuantMatrix`, packs it with the format modules (AWQ, GPTQ v2,
//! compressed-tensors, int8), runs the GPU kernel into an output surrounded by guard words, and requires the
//! `[K, N]` result to equal `ops::dequantize::cpu::dequantize(.., Layout::Kn, ..)` bit for bit (tolerance: none;
//! both compute round((q − z) · s) with a single rounding). Negative tests check that bad descriptors and buffers
//! give typed errors before anything is launched. Without a GPU every test prints `skipped: <reason>` and passes.

use half::{bf16, f16};
use lowbit::cuda::{CudaDevice, CudaSlice, DeviceRepr, ValidAsZeroBits};
use lowbit::dtype::round_to;
use lowbit::formats::awq::AwqWeight;
use lowbit::formats::compressed_tensors::CompressedTensorsWeight;
use lowbit::formats::gptq::{GptqVersion, GptqWeight};
use lowbit::formats::int8::Int8Weight;
use lowbit::ops::dequantize::cuda::{DequantDesc, DequantizeInt4, DequantizeInt8, Int4Layout, Int4Weight};
use lowbit::ops::dequantize::{cpu, Layout};
use lowbit::testing::SplitMix64 as Rng;
use lowbit::{DType, Error, Float, QuantMatrix};
// One device for the whole test binary (kernels compile once), or a printed reason to skip.
use lowbit::testing::cuda_device as device;

/// A scale spanning 2^-16 (subnormal results in f16) to 2^3, one in eight negative.
fn random_scale(rng: &mut Rng, dtype: DType) -> f32 {
    let mag = 2f32.powf(rng.uniform(-16.0, 3.0));
    let s = if rng.below(8) == 0 { -mag } else { mag };
    round_to(dtype, s)
}

/// Zero points of a case: none (symmetric), a constant, or random codes covering every nibble.
#[derive(Debug, Clone, Copy)]
enum Zeros {
    Symmetric,
    Const(u8),
    Random,
}

// One argument per axis of the test matrix: a struct would only rename them.
#[allow(clippy::too_many_arguments)]
fn random_quant(
    rng: &mut Rng,
    k: usize,
    n: usize,
    group: usize,
    bits: u8,
    zeros: Zeros,
    dtype: DType,
    act_order: bool,
) -> QuantMatrix {
    let max = (1u64 << bits) - 1;
    let groups = k / group;
    let codes = (0..n * k).map(|_| rng.below(max + 1) as u8).collect();
    let zeros = match zeros {
        Zeros::Symmetric => None,
        Zeros::Const(z) => Some(vec![z; n * groups]),
        Zeros::Random => Some((0..n * groups).map(|_| rng.below(max + 1) as u8).collect()),
    };
    let scales = (0..n * groups).map(|_| random_scale(rng, dtype)).collect();
    // Act-order: every group keeps `group` members, scattered over K.
    let g_idx = act_order.then(|| {
        let mut g: Vec<u32> = (0..k).map(|i| (i / group) as u32).collect();
        for i in (1..k).rev() {
            g.swap(i, rng.below(i as u64 + 1) as usize);
        }
        g
    });
    QuantMatrix {
        n,
        k,
        bits,
        group_size: group,
        codes,
        zeros,
        scales,
        scale_dtype: dtype,
        g_idx,
    }
}

/// Guard words around every output: a kernel writing one element out of place changes them.
const GUARD: usize = 64; // elements; 128 bytes keeps the output 16-byte aligned
const GUARD_BITS: u16 = 0xBEEF;
const POISON_BITS: u16 = 0x7FFF; // NaN in f16 and bf16: any element the kernel misses stays NaN

trait Half: Float + DeviceRepr + ValidAsZeroBits + Default + Clone {
    fn bits(self) -> u16;
    fn from_bits(b: u16) -> Self;
}
impl Half for f16 {
    fn bits(self) -> u16 {
        self.to_bits()
    }
    fn from_bits(b: u16) -> Self {
        f16::from_bits(b)
    }
}
impl Half for bf16 {
    fn bits(self) -> u16 {
        self.to_bits()
    }
    fn from_bits(b: u16) -> Self {
        bf16::from_bits(b)
    }
}

fn guarded_output<T: Half>(dev: &CudaDevice, len: usize) -> CudaSlice<T> {
    let mut host = vec![T::from_bits(GUARD_BITS); len + 2 * GUARD];
    host[GUARD..GUARD + len].fill(T::from_bits(POISON_BITS));
    dev.upload(&host).unwrap()
}

/// Downloads a guarded output, checks the guards, and compares the interior with the CPU result bit for bit.
fn check_output<T: Half>(dev: &CudaDevice, out: &CudaSlice<T>, q: &QuantMatrix, what: &str) {
    let got = dev.download(out).unwrap();
    let len = q.k * q.n;
    assert!(
        got[..GUARD]
            .iter()
            .chain(&got[GUARD + len..])
            .all(|v| v.bits() == GUARD_BITS),
        "{what}: guard words overwritten"
    );
    let mut want = vec![T::default(); len];
    cpu::dequantize(q, Layout::Kn, &mut want).unwrap();
    let got = &got[GUARD..GUARD + len];
    if let Some(i) = (0..len).find(|&i| got[i].bits() != want[i].bits()) {
        let bad = (0..len).filter(|&i| got[i].bits() != want[i].bits()).count();
        panic!(
            "{what}: {bad} of {len} elements differ; first at [k={}, n={}]: got {:?} ({:#06x}), want {:?} ({:#06x})",
            i / q.n,
            i % q.n,
            got[i],
            got[i].bits(),
            want[i],
            want[i].bits()
        );
    }
}

fn words(v: &[i32]) -> Vec<i32> {
    v.to_vec()
}

fn scales_as<T: Half>(v: &[f32]) -> Vec<T> {
    v.iter().map(|&s| T::from_f32(s)).collect()
}

fn g_idx_i32(g: &Option<Vec<u32>>) -> Option<Vec<i32>> {
    g.as_ref().map(|g| g.iter().map(|&x| x as i32).collect())
}

/// Packs `q` in `layout`, runs the default CUDA kernel into a guarded output, and checks it.
fn run_int4<T: Half>(dev: &CudaDevice, q: &QuantMatrix, layout: Int4Layout) {
    run_int4_variant::<T>(dev, q, layout, None)
}

/// As [`run_int4`], with a forced kernel variant.
fn run_int4_variant<T: Half>(dev: &CudaDevice, q: &QuantMatrix, layout: Int4Layout, variant: Option<&str>) {
    let (qweight, qzeros, scales, g_idx) = match layout {
        Int4Layout::Awq => {
            let w = AwqWeight::from_quant(q).unwrap();
            (
                words(&w.qweight),
                q.zeros.as_ref().map(|_| words(&w.qzeros)),
                w.scales,
                None,
            )
        }
        Int4Layout::Gptq => {
            let w = GptqWeight::from_quant(q, GptqVersion::V2).unwrap();
            let g = g_idx_i32(&q.g_idx);
            (
                words(&w.qweight),
                q.zeros.as_ref().map(|_| words(&w.qzeros)),
                w.scales,
                g,
            )
        }
        Int4Layout::CompressedTensors => {
            let w = CompressedTensorsWeight::from_quant(q).unwrap();
            let g = g_idx_i32(&q.g_idx);
            (words(&w.weight_packed), w.weight_zero_point.clone(), w.weight_scale, g)
        }
    };
    let desc = DequantDesc {
        layout,
        k: q.k,
        n: q.n,
        group_size: q.group_size,
        zeros: qzeros.is_some(),
        g_idx: g_idx.is_some(),
        dtype: T::DTYPE,
    };
    let what = format!("{desc:?} variant {variant:?}");
    let op = DequantizeInt4::with_variant(dev, desc, variant).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(op.output_shape(), [q.k, q.n]);
    assert_eq!(op.workspace_bytes(), 0);
    let qweight = dev.upload(&qweight).unwrap();
    let qzeros = qzeros.map(|z| dev.upload(&z).unwrap());
    let scales = dev.upload(&scales_as::<T>(&scales)).unwrap();
    let g_idx = g_idx.map(|g| dev.upload(&g).unwrap());
    let mut out = guarded_output::<T>(dev, q.k * q.n);
    let weight = Int4Weight {
        qweight: &qweight,
        zeros: qzeros.as_ref().map(|z| z as _),
        scales: &scales,
        g_idx: g_idx.as_ref().map(|g| g as _),
    };
    let mut interior = out.slice_mut(GUARD..GUARD + q.k * q.n);
    op.run(dev.stream(), &weight, &mut interior, None)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    dev.synchronize().unwrap();
    check_output(dev, &out, q, &format!("{what} kernel {}", op.kernel_name()));
}

fn for_dtype(dev: &CudaDevice, dtype: DType, q: &QuantMatrix, layout: Int4Layout) {
    match dtype {
        DType::F16 => run_int4::<f16>(dev, q, layout),
        _ => run_int4::<bf16>(dev, q, layout),
    }
}

/// The (K, N) pairs of the testing.md dequant matrix, pruned so that no case exceeds ~20M elements.
const SHAPES: [(usize, usize); 12] = [
    (32, 8),
    (32, 576),
    (128, 24),
    (128, 28672),
    (384, 128),
    (384, 4736),
    (3584, 8),
    (3584, 576),
    (3584, 4736),
    (18944, 24),
    (18944, 128),
    (18944, 576),
];

fn groups_for(k: usize) -> Vec<usize> {
    [32, 64, 128, k]
        .into_iter()
        .filter(|&g| k % g == 0)
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect()
}

fn int4_matrix(layout: Int4Layout, seed: u64) {
    let Some(dev) = device() else { return };
    let mut rng = Rng(seed);
    let zero_modes = [
        Zeros::Random,
        Zeros::Const(0),
        Zeros::Const(8),
        Zeros::Const(15),
        Zeros::Symmetric,
    ];
    let mut case = 0;
    for (k, n) in SHAPES {
        for g in groups_for(k) {
            for dtype in [DType::F16, DType::Bf16] {
                let zeros = zero_modes[case % zero_modes.len()];
                case += 1;
                let q = random_quant(&mut rng, k, n, g, 4, zeros, dtype, false);
                for_dtype(&dev, dtype, &q, layout);
            }
        }
    }
}

#[test]
fn awq_matches_cpu_bit_for_bit() {
    int4_matrix(Int4Layout::Awq, 1);
}

#[test]
fn gptq_matches_cpu_bit_for_bit() {
    int4_matrix(Int4Layout::Gptq, 2);
}

#[test]
fn compressed_tensors_matches_cpu_bit_for_bit() {
    int4_matrix(Int4Layout::CompressedTensors, 3);
}

#[test]
fn act_order_g_idx_matches_cpu() {
    let Some(dev) = device() else { return };
    let mut rng = Rng(4);
    for (k, n, g) in [(128, 64, 32), (384, 576, 128), (3584, 128, 128), (4096, 4736, 128)] {
        for dtype in [DType::F16, DType::Bf16] {
            for layout in [Int4Layout::Gptq, Int4Layout::CompressedTensors] {
                let q = random_quant(&mut rng, k, n, g, 4, Zeros::Random, dtype, true);
                for_dtype(&dev, dtype, &q, layout);
            }
        }
    }
}

#[test]
fn k_not_a_multiple_of_the_tile() {
    // K % 32 != 0 takes the compressed-tensors scalar-load kernel; K % 16 != 0 leaves a partial AWQ/GPTQ tile.
    let Some(dev) = device() else { return };
    let mut rng = Rng(5);
    for (k, n, g) in [(8, 8, 8), (24, 16, 8), (40, 24, 40), (200, 64, 40), (264, 576, 88)] {
        for layout in [Int4Layout::Awq, Int4Layout::Gptq, Int4Layout::CompressedTensors] {
            for dtype in [DType::F16, DType::Bf16] {
                let q = random_quant(&mut rng, k, n, g, 4, Zeros::Random, dtype, false);
                for_dtype(&dev, dtype, &q, layout);
            }
        }
    }
}

/// Every AWQ/GPTQ kernel variant (tile heights, persistent + pipelined) on shapes with partial tiles and uneven
/// persistent strides.
#[test]
fn kernel_variants_match_cpu() {
    let Some(dev) = device() else { return };
    let mut rng = Rng(6);
    for (k, n, g) in [
        (24, 32, 8),
        (200, 64, 40),
        (3584, 576, 128),
        (4096, 4736, 128),
        (4104, 4736, 8),
    ] {
        for dtype in [DType::F16, DType::Bf16] {
            let q = random_quant(&mut rng, k, n, g, 4, Zeros::Random, dtype, false);
            for (layout, variants) in [
                (Int4Layout::Awq, &["r2", "r4", "r8", "p8"][..]),
                (Int4Layout::Gptq, &["r8", "p8"][..]),
            ] {
                for &v in variants {
                    match dtype {
                        DType::F16 => run_int4_variant::<f16>(&dev, &q, layout, Some(v)),
                        _ => run_int4_variant::<bf16>(&dev, &q, layout, Some(v)),
                    }
                }
            }
        }
    }
}

fn run_int8<T: Half>(dev: &CudaDevice, q: &QuantMatrix) {
    let w = Int8Weight::from_quant(q).unwrap();
    let op = DequantizeInt8::new(dev, q.k, q.n, T::DTYPE).unwrap();
    let weight = dev.upload(&w.weight).unwrap();
    let scales = dev.upload(&scales_as::<T>(&w.weight_scale)).unwrap();
    let mut out = guarded_output::<T>(dev, q.k * q.n);
    op.run(
        dev.stream(),
        &weight,
        &scales,
        &mut out.slice_mut(GUARD..GUARD + q.k * q.n),
        None,
    )
    .unwrap();
    check_output(dev, &out, q, &format!("int8 K={} N={} {}", q.k, q.n, T::DTYPE));
}

#[test]
fn int8_per_channel_matches_cpu_bit_for_bit() {
    let Some(dev) = device() else { return };
    let mut rng = Rng(7);
    for (k, n) in [
        (32, 8),
        (128, 24),
        (384, 576),
        (3584, 4736),
        (18944, 128),
        (20, 8),
        (100, 64),
        (4100, 72),
    ] {
        for dtype in [DType::F16, DType::Bf16] {
            let q = random_quant(&mut rng, k, n, k, 8, Zeros::Symmetric, dtype, false);
            match dtype {
                DType::F16 => run_int8::<f16>(&dev, &q),
                _ => run_int8::<bf16>(&dev, &q),
            }
        }
    }
}

#[test]
fn deterministic_across_runs() {
    let Some(dev) = device() else { return };
    let mut rng = Rng(8);
    let q = random_quant(&mut rng, 4096, 4736, 128, 4, Zeros::Random, DType::Bf16, false);
    let w = AwqWeight::from_quant(&q).unwrap();
    let desc = DequantDesc {
        layout: Int4Layout::Awq,
        k: q.k,
        n: q.n,
        group_size: 128,
        zeros: true,
        g_idx: false,
        dtype: DType::Bf16,
    };
    let op = DequantizeInt4::new(&dev, desc).unwrap();
    let (qweight, qzeros) = (dev.upload(&w.qweight).unwrap(), dev.upload(&w.qzeros).unwrap());
    let scales = dev.upload(&scales_as::<bf16>(&w.scales)).unwrap();
    let weight = Int4Weight {
        qweight: &qweight,
        zeros: Some(&qzeros),
        scales: &scales,
        g_idx: None,
    };
    let mut first = dev.alloc_zeros::<bf16>(q.k * q.n).unwrap();
    let mut second = dev.alloc_zeros::<bf16>(q.k * q.n).unwrap();
    op.run(dev.stream(), &weight, &mut first, None).unwrap();
    op.run(dev.stream(), &weight, &mut second, None).unwrap();
    let (a, b) = (dev.download(&first).unwrap(), dev.download(&second).unwrap());
    assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
}

/// More than 2^31 output elements: 32-bit index overflow is a known bug class. Checks sampled rows, including the
/// rows around element 2^31, against values computed here from the packed words. Needs ~6 GiB of GPU memory.
#[test]
fn more_than_2_pow_31_outputs() {
    let Some(dev) = device() else { return };
    if dev.info().total_memory < (16usize << 30) {
        println!("skipped: needs a GPU with 16 GiB");
        return;
    }
    let (k, n, g) = (69632usize, 32768usize, 128usize);
    assert!(k * n > 1 << 31);
    let mut rng = Rng(9);
    let qweight: Vec<i32> = (0..k * n / 8).map(|_| rng.next_u64() as i32).collect();
    let qzeros: Vec<i32> = (0..k / g * n / 8).map(|_| rng.next_u64() as i32).collect();
    let scales: Vec<f16> = (0..k / g * n)
        .map(|_| f16::from_f32(random_scale(&mut rng, DType::F16)))
        .collect();
    let desc = DequantDesc {
        layout: Int4Layout::Awq,
        k,
        n,
        group_size: g,
        zeros: true,
        g_idx: false,
        dtype: DType::F16,
    };
    let op = DequantizeInt4::new(&dev, desc).unwrap();
    let (d_q, d_z, d_s) = (
        dev.upload(&qweight).unwrap(),
        dev.upload(&qzeros).unwrap(),
        dev.upload(&scales).unwrap(),
    );
    let mut out = dev.alloc_zeros::<f16>(k * n).unwrap();
    let weight = Int4Weight {
        qweight: &d_q,
        zeros: Some(&d_z),
        scales: &d_s,
        g_idx: None,
    };
    op.run(dev.stream(), &weight, &mut out, None).unwrap();
    dev.synchronize().unwrap();
    const ORDER: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];
    let nibble = |word: i32, col: usize| ((word as u32) >> (4 * ORDER.iter().position(|&o| o == col).unwrap())) & 15;
    let boundary = (1usize << 31) / n;
    for row in [0, boundary - 1, boundary, boundary + 1, k - 1] {
        let got = dev.download(&out.slice(row * n..(row + 1) * n)).unwrap();
        for col in 0..n {
            let (w, grp) = (row * n / 8 + col / 8, row / g);
            let q = nibble(qweight[w], col % 8) as i32;
            let z = nibble(qzeros[grp * n / 8 + col / 8], col % 8) as i32;
            let want = f16::from_f32((q - z) as f32 * scales[grp * n + col].to_f32());
            assert_eq!(got[col].to_bits(), want.to_bits(), "row {row} col {col}");
        }
    }
}

/// A descriptor for the negative tests: valid unless a field is changed.
fn valid_desc() -> DequantDesc {
    DequantDesc {
        layout: Int4Layout::Awq,
        k: 256,
        n: 64,
        group_size: 128,
        zeros: true,
        g_idx: false,
        dtype: DType::F16,
    }
}

fn invalid_tensor(e: Error) -> String {
    match e {
        Error::Invalid { tensor, .. } => tensor,
        other => panic!("expected Error::Invalid, got {other:?}"),
    }
}

#[test]
fn bad_descriptors_are_typed_errors() {
    let Some(dev) = device() else { return };
    let cases: [(DequantDesc, &str); 7] = [
        (DequantDesc { n: 60, ..valid_desc() }, "n"),
        (DequantDesc { k: 250, ..valid_desc() }, "k"),
        (
            DequantDesc {
                group_size: 96,
                ..valid_desc()
            },
            "group_size",
        ),
        (
            DequantDesc {
                group_size: 4,
                k: 8,
                ..valid_desc()
            },
            "group_size",
        ),
        (
            DequantDesc {
                dtype: DType::F32,
                ..valid_desc()
            },
            "dtype",
        ),
        (
            DequantDesc {
                g_idx: true,
                ..valid_desc()
            },
            "g_idx",
        ),
        (DequantDesc { k: 0, ..valid_desc() }, "weight"),
    ];
    for (desc, tensor) in cases {
        let e = DequantizeInt4::new(&dev, desc).expect_err(&format!("{desc:?} must be rejected"));
        assert_eq!(invalid_tensor(e), tensor, "{desc:?}");
    }
    assert_eq!(
        invalid_tensor(DequantizeInt8::new(&dev, 30, 8, DType::F16).unwrap_err()),
        "k"
    );
    assert_eq!(
        invalid_tensor(DequantizeInt8::new(&dev, 32, 12, DType::F16).unwrap_err()),
        "n"
    );
}

#[test]
fn bad_buffers_are_typed_errors_and_nothing_is_written() {
    let Some(dev) = device() else { return };
    let d = valid_desc();
    let op = DequantizeInt4::new(&dev, d).unwrap();
    let (q_len, z_len, s_len, o_len) = d.lens();
    let qweight = dev.alloc_zeros::<i32>(q_len).unwrap();
    let short_q = dev.alloc_zeros::<i32>(q_len - 1).unwrap();
    let qzeros = dev.alloc_zeros::<i32>(z_len).unwrap();
    let scales = dev.alloc_zeros::<f16>(s_len).unwrap();
    let bf_scales = dev.alloc_zeros::<bf16>(s_len).unwrap();
    let mut out = guarded_output::<f16>(&dev, o_len);
    let mut bf_out = dev.alloc_zeros::<bf16>(o_len).unwrap();
    let good = Int4Weight {
        qweight: &qweight,
        zeros: Some(&qzeros),
        scales: &scales,
        g_idx: None,
    };
    let stream = dev.stream();

    let short = Int4Weight {
        qweight: &short_q,
        ..good
    };
    let e = op
        .run(stream, &short, &mut out.slice_mut(GUARD..GUARD + o_len), None)
        .unwrap_err();
    assert_eq!(invalid_tensor(e), "awq.qweight");

    let no_zeros = Int4Weight { zeros: None, ..good };
    let e = op
        .run(stream, &no_zeros, &mut out.slice_mut(GUARD..GUARD + o_len), None)
        .unwrap_err();
    assert_eq!(invalid_tensor(e), "awq.zeros");

    let e = op
        .run(stream, &good, &mut out.slice_mut(GUARD..GUARD + o_len - 1), None)
        .unwrap_err();
    assert_eq!(invalid_tensor(e), "out", "too short");

    // One element in: 2-byte aligned, not 16.
    let e = op
        .run(stream, &good, &mut out.slice_mut(GUARD + 1..GUARD + 1 + o_len), None)
        .unwrap_err();
    assert_eq!(invalid_tensor(e), "out", "misaligned");

    let bf = Int4Weight {
        qweight: &qweight,
        zeros: Some(&qzeros),
        scales: &bf_scales,
        g_idx: None,
    };
    let e = op.run(stream, &bf, &mut bf_out, None).unwrap_err();
    assert_eq!(invalid_tensor(e), "out", "dtype mismatch");

    let misaligned_scales = scales.slice(1..);
    let e = op
        .run(
            stream,
            &Int4Weight {
                scales: &misaligned_scales,
                ..good
            },
            &mut out.slice_mut(GUARD..GUARD + o_len),
            None,
        )
        .unwrap_err();
    assert_eq!(invalid_tensor(e), "awq.scales");

    // Nothing was launched: the output still holds its poison and guards.
    let host = dev.download(&out).unwrap();
    assert!(host[..GUARD].iter().all(|v| v.to_bits() == GUARD_BITS));
    assert!(host[GUARD..GUARD + o_len].iter().all(|v| v.to_bits() == POISON_BITS));
    let _ = qweight.len();
}
