//! Helpers shared by the CPU test suites: error metrics against the f64 reference, assertions on exact results and
//! typed errors, the golden fixture, and slice conversions. Seeded inputs (PRNG, random `QuantMatrix`) live in
//! `lowbit::testing`, shared with the benches.

// Each test binary compiles this module and uses a part of it.
#![allow(dead_code)]

use lowbit::{DType, Error, Float, Result, TensorRef};
use safetensors::SafeTensors;

// ---- Comparison with the f64 reference -----------------------------------------------------------------------------

/// How far `got` is from the f64 reference.
#[derive(Debug, Clone, Copy)]
pub struct Metrics {
    /// mean |Δ| / mean |ref|.
    pub mean_rel: f64,
    /// max |Δ|.
    pub max_abs: f64,
    /// max |ref|.
    pub max_ref: f64,
    /// Where max |Δ| is.
    pub worst: usize,
}

/// The error metrics of `got` against `want`; fails on a length mismatch or any NaN/Inf in `got`.
pub fn compare<G: Copy + Into<f64>>(got: &[G], want: &[f64]) -> Metrics {
    assert_eq!(got.len(), want.len(), "output length");
    let (mut sum_abs_diff, mut sum_abs_ref, mut max_abs, mut max_ref, mut worst) = (0f64, 0f64, 0f64, 0f64, 0);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let g: f64 = g.into();
        assert!(g.is_finite(), "non-finite output {g} at {i} (reference {w})");
        let d = (g - w).abs();
        sum_abs_diff += d;
        sum_abs_ref += w.abs();
        max_ref = max_ref.max(w.abs());
        if d > max_abs {
            (max_abs, worst) = (d, i);
        }
    }
    Metrics {
        mean_rel: sum_abs_diff / sum_abs_ref.max(f64::MIN_POSITIVE),
        max_abs,
        max_ref,
        worst,
    }
}

/// Bounds for [`assert_close`]: mean |Δ| / mean |ref| ≤ `mean_rel` and max |Δ| ≤ `max_rel` · max(max |ref|,
/// `ref_floor`).
#[derive(Debug, Clone, Copy)]
pub struct Tolerance {
    pub mean_rel: f64,
    pub max_rel: f64,
    /// 1 where outputs are O(1) by construction (the max bound then never asks for less than `max_rel`
    /// absolute); 0 where max |ref| alone sets the scale.
    pub ref_floor: f64,
}

impl Tolerance {
    /// `mean_rel` and `max_rel`, the max bound relative to max(max |ref|, 1).
    pub fn floored(mean_rel: f64, max_rel: f64) -> Self {
        Tolerance {
            mean_rel,
            max_rel,
            ref_floor: 1.0,
        }
    }

    /// `tol` for both bounds, the max bound relative to max |ref| itself.
    pub fn relative(tol: f64) -> Self {
        Tolerance {
            mean_rel: tol,
            max_rel: tol,
            ref_floor: 0.0,
        }
    }
}

/// Fails unless `got` is within `tol` of the f64 reference `want` (NaN/Inf always fail); prints the metrics.
pub fn assert_close<G: Copy + Into<f64>>(what: &str, got: &[G], want: &[f64], tol: Tolerance) {
    let m = compare(got, want);
    let max_scale = m.max_ref.max(tol.ref_floor);
    println!(
        "{what}: mean rel {:.2e}, max |Δ| / max |ref| {:.2e}",
        m.mean_rel,
        m.max_abs / max_scale
    );
    assert!(
        m.mean_rel <= tol.mean_rel && m.max_abs <= tol.max_rel * max_scale,
        "{what}: mean |Δ| / mean |ref| = {:.3e}, max |Δ| = {:.3e} at {} (got {}, ref {}), max |ref| = {:.3e}; {tol:?}",
        m.mean_rel,
        m.max_abs,
        m.worst,
        Into::<f64>::into(got[m.worst]),
        want[m.worst],
        m.max_ref
    );
}

/// Fails unless every `got[i]` is bit for bit the f32 rounding of `want[i]` (exact-integer modes).
pub fn assert_bits_equal(what: &str, got: &[f32], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: output length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.to_bits(), (w as f32).to_bits(), "{what}: element {i}: {g} vs {w}");
    }
}

/// `v` as f32 (exact for f16/bf16).
pub fn to_f32<T: Float>(v: &[T]) -> Vec<f32> {
    v.iter().map(|x| x.to_f32()).collect()
}

/// `v` rounded to `T`.
pub fn from_f32<T: Float>(v: &[f32]) -> Vec<T> {
    v.iter().map(|&x| T::from_f32(x)).collect()
}

// ---- Typed errors ------------------------------------------------------------------------------------------------

/// The tensor an `Error::Invalid` names; fails on anything else, or on an empty value or rule.
pub fn invalid_tensor<T: std::fmt::Debug>(r: Result<T>) -> String {
    match r {
        Err(Error::Invalid { tensor, value, rule }) => {
            assert!(!value.is_empty() && !rule.is_empty(), "{tensor}: empty value or rule");
            tensor
        }
        other => panic!("expected Error::Invalid, got {other:?}"),
    }
}

/// Asserts an `Error::Invalid` naming `tensor` whose message mentions `value`.
pub fn assert_invalid<T: std::fmt::Debug>(r: Result<T>, tensor: &str, value: &str) {
    match r {
        Err(e @ Error::Invalid { .. }) => {
            let Error::Invalid { tensor: t, .. } = &e else {
                unreachable!()
            };
            assert_eq!(t, tensor, "wrong tensor named in: {e}");
            assert!(e.to_string().contains(value), "{e} does not mention {value}");
        }
        other => panic!("expected Invalid naming {tensor}, got {other:?}"),
    }
}

// ---- The golden fixture -------------------------------------------------------------------------------------------

/// Tensors made by AutoAWQ and compressed-tensors themselves (tests/fixtures/README.md).
pub const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/fixtures/golden_public.safetensors"
);

/// The golden fixture, read into memory.
pub struct Fixture {
    bytes: Vec<u8>,
}

impl Fixture {
    pub fn load() -> Self {
        Self {
            bytes: std::fs::read(FIXTURE).unwrap_or_else(|e| panic!("{FIXTURE}: {e}")),
        }
    }

    fn file(&self) -> SafeTensors<'_> {
        SafeTensors::deserialize(&self.bytes).expect("fixture parses")
    }

    /// `(case name, kind, args)` from the `cases` metadata.
    pub fn cases(&self) -> Vec<(String, String, serde_json::Value)> {
        let (_, meta) = SafeTensors::read_metadata(&self.bytes).expect("fixture header");
        let cases = meta
            .metadata()
            .as_ref()
            .and_then(|m| m.get("cases"))
            .expect("cases metadata");
        let cases: serde_json::Map<String, serde_json::Value> = serde_json::from_str(cases).expect("cases JSON");
        cases
            .into_iter()
            .map(|(name, c)| (name, c["kind"].as_str().unwrap().to_string(), c["args"].clone()))
            .collect()
    }

    /// The tensor `name`, borrowed from the fixture bytes.
    pub fn get(&self, name: &str) -> TensorRef<'_> {
        let view = self.file().tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        let dtype = match view.dtype() {
            safetensors::Dtype::F32 => DType::F32,
            safetensors::Dtype::F16 => DType::F16,
            safetensors::Dtype::BF16 => DType::Bf16,
            safetensors::Dtype::I32 => DType::I32,
            safetensors::Dtype::I8 => DType::I8,
            other => panic!("{name}: unexpected dtype {other:?}"),
        };
        // Borrow from the file bytes, which outlive the view.
        let data = view.data();
        let offset = data.as_ptr() as usize - self.bytes.as_ptr() as usize;
        TensorRef::new(
            name,
            dtype,
            view.shape().to_vec(),
            &self.bytes[offset..offset + data.len()],
        )
        .unwrap()
    }

    /// Whether the fixture has a tensor `name`.
    pub fn has(&self, name: &str) -> bool {
        self.file().tensor(name).is_ok()
    }
}

// ---- The int8 convolution (ConvInt8) suites, CPU and GPU ------------------------------------------------------------

use lowbit::formats::block::{BlockBits, BlockQuantWeight, BlockShape};
use lowbit::ops::conv::{Activation, Conv2dParams};
use lowbit::ops::conv_int8::{ConvInt8Params, Int8Quant};
use lowbit::testing::SplitMix64;

/// One int8 convolution problem of the test matrix.
pub struct Int8ConvCase {
    pub input: [usize; 4],
    pub co: usize,
    pub kernel: (usize, usize),
    pub conv: Conv2dParams,
    pub bias: bool,
}

/// The convolution matrix both int8 suites run: kernel sizes, stride, padding, dilation, groups and depthwise,
/// none/relu/relu6, bias on and off.
pub fn int8_conv_cases() -> Vec<Int8ConvCase> {
    let p = |stride, padding, dilation, groups, activation| Conv2dParams {
        stride,
        padding,
        dilation,
        groups,
        activation,
    };
    vec![
        Int8ConvCase {
            input: [1, 16, 9, 11],
            co: 24,
            kernel: (3, 3),
            conv: p((1, 1), (1, 1), (1, 1), 1, Activation::None),
            bias: true,
        },
        Int8ConvCase {
            input: [2, 8, 12, 10],
            co: 8,
            kernel: (3, 3),
            conv: p((2, 2), (1, 1), (1, 1), 1, Activation::Relu),
            bias: false,
        },
        Int8ConvCase {
            input: [1, 12, 13, 13],
            co: 12,
            kernel: (3, 3),
            conv: p((1, 1), (2, 2), (2, 2), 3, Activation::Relu6),
            bias: true,
        },
        Int8ConvCase {
            input: [2, 32, 7, 7],
            co: 32,
            kernel: (3, 3),
            conv: p((1, 1), (1, 1), (1, 1), 32, Activation::None),
            bias: true,
        },
        Int8ConvCase {
            input: [1, 64, 6, 5],
            co: 40,
            kernel: (1, 1),
            conv: p((1, 1), (0, 0), (1, 1), 1, Activation::Relu),
            bias: true,
        },
        Int8ConvCase {
            input: [1, 6, 17, 9],
            co: 10,
            kernel: (5, 3),
            conv: p((2, 1), (2, 1), (1, 1), 2, Activation::None),
            bias: false,
        },
    ]
}

/// A symmetric int8 weight with one scale per output channel: codes over ±127, scales in [0.002, 0.02) or, `exact`,
/// powers of two.
pub fn int8_conv_weight(
    rng: &mut SplitMix64,
    co: usize,
    ci_g: usize,
    kernel: (usize, usize),
    exact: bool,
) -> BlockQuantWeight {
    let shape = BlockShape::conv(co, ci_g, kernel, 1).unwrap();
    let codes = (0..co * shape.cols())
        .map(|_| (rng.below(255) as i32 - 127) as i8)
        .collect();
    let scales = (0..co)
        .map(|_| {
            if exact {
                2f32.powi(-5 - rng.below(3) as i32)
            } else {
                rng.uniform(0.002, 0.02)
            }
        })
        .collect();
    BlockQuantWeight::from_parts(shape, BlockBits::Int8, codes, scales, vec![0.0; co]).unwrap()
}

/// Random input and output quantizations (scales and zero points of both signs) for `conv`.
pub fn random_int8_params(rng: &mut SplitMix64, conv: Conv2dParams) -> ConvInt8Params {
    ConvInt8Params {
        conv,
        input: Int8Quant {
            scale: rng.uniform(0.01, 0.05),
            zero_point: rng.below(41) as i8 - 20,
        },
        output: Int8Quant {
            scale: rng.uniform(0.05, 0.3),
            zero_point: rng.below(41) as i8 - 20,
        },
    }
}

use half::f16;
use lowbit::cuda::{CudaDevice, CudaSlice};

/// Programmatic dependent launch (the decode kernel's and the GEMM's DEPENDENT LAUNCH): two layers chained for three
/// rounds, A reading buffer 0 (first `x0`) into buffer 1 (`a_out` elements), B the reverse, so each launch reads the
/// previous one's output and overwrites the input of the one before it. `run(layer, x, y, workspace)` launches one
/// layer; each layer keeps its own workspace of `workspaces[layer]` bytes (and its counters) across the chain. Run
/// with no host sync and again synchronised after every launch, both buffers must end bit-identical.
pub fn assert_back_to_back_matches_synchronised(
    dev: &CudaDevice,
    x0: &[f16],
    a_out: usize,
    workspaces: [usize; 2],
    mut run: impl FnMut(usize, &CudaSlice<f16>, &mut CudaSlice<f16>, &mut CudaSlice<u8>),
) {
    let mut chain = |sync: bool| {
        let mut bufs = [dev.upload(x0).unwrap(), dev.alloc_zeros::<f16>(a_out).unwrap()];
        let mut ws = workspaces.map(|bytes| dev.alloc_zeros::<u8>(bytes.max(1)).unwrap());
        for _ in 0..3 {
            for (layer, ws) in ws.iter_mut().enumerate() {
                let [first, second] = &mut bufs;
                let (x, y) = if layer == 0 {
                    (&*first, second)
                } else {
                    (&*second, first)
                };
                run(layer, x, y, ws);
                if sync {
                    dev.synchronize().unwrap();
                }
            }
        }
        dev.synchronize().unwrap();
        bufs.map(|b| dev.download(&b).unwrap())
    };
    let (overlapped, serial) = (chain(false), chain(true));
    for (got, want) in overlapped.iter().zip(&serial) {
        assert!(
            want.iter().all(|v| v.is_finite()),
            "the chain overflowed: pick smaller scales"
        );
        let first_diff = got.iter().zip(want).position(|(g, w)| g.to_bits() != w.to_bits());
        assert!(first_diff.is_none(), "back-to-back launches differ at {first_diff:?}");
    }
}
