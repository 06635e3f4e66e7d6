//! The full-int8 convolution (`ops::conv_int8`, seed 004's ConvInt8) on the CPU against the f64 reference.
//!
//! - Random data over the convolution matrix (kernel sizes, stride, padding, dilation, groups and depthwise,
//!   none/relu/relu6, bias on/off, zero points of both signs): every output code within 1 of the rounded reference
//!   (the fused bias is rounded to f32 once, so a value next to a .5 boundary may round the other way), and at least
//!   99% of them equal.
//! - Exact mode (power-of-two scales, bias on the output grid): `M · acc + bias` is exact in f32, so every code must
//!   equal the reference's.
//! - Bad weights and quantization parameters give typed errors naming the tensor.

use lowbit::formats::block::{BlockBits, BlockQuantWeight, BlockShape};
use lowbit::ops::conv::Conv2dParams;
use lowbit::ops::conv_int8::{reference, ConvInt8Cpu, ConvInt8Params, Int8Quant};
use lowbit::testing::SplitMix64 as Rng;

mod common;
use common::{int8_conv_cases, int8_conv_weight, random_int8_params, Int8ConvCase};

/// Runs one case; returns (outputs, outputs equal to the rounded reference).
fn run(rng: &mut Rng, c: &Int8ConvCase, exact: bool) -> (usize, usize) {
    let ci_g = c.input[1] / c.conv.groups;
    let w = int8_conv_weight(rng, c.co, ci_g, c.kernel, exact);
    let params = if exact {
        ConvInt8Params {
            conv: c.conv,
            input: Int8Quant {
                scale: 0.0625,
                zero_point: -3,
            },
            output: Int8Quant {
                scale: 4.0,
                zero_point: 5,
            },
        }
    } else {
        random_int8_params(rng, c.conv)
    };
    // Exact mode: bias values on the output grid (multiples of S_O), so B / S_O is an integer.
    let bias: Option<Vec<f32>> = c.bias.then(|| {
        (0..c.co)
            .map(|_| {
                if exact {
                    4.0 * (rng.below(21) as f32 - 10.0)
                } else {
                    rng.uniform(-3.0, 3.0)
                }
            })
            .collect()
    });
    let x: Vec<i8> = (0..c.input.iter().product::<usize>())
        .map(|_| (rng.below(256) as i32 - 128) as i8)
        .collect();
    let op = ConvInt8Cpu::new(&w, bias.as_deref(), params).unwrap();
    let shape = op.output_shape(c.input).unwrap();
    let mut out = vec![0i8; shape.iter().product()];
    op.forward(&x, c.input, &mut out).unwrap();
    let want = reference::conv_int8(&x, c.input, &w, bias.as_deref(), &params).unwrap();
    let mut equal = 0;
    for (i, (&g, &r)) in out.iter().zip(&want).enumerate() {
        let r = r.round().clamp(-128.0, 127.0) as i32;
        let d = (g as i32 - r).abs();
        if exact {
            assert_eq!(d, 0, "exact mode: output {i}: {g} vs {r}");
        }
        assert!(
            d <= 1,
            "output {i}: {g} vs reference {r} (case {:?} {:?})",
            c.input,
            c.conv
        );
        equal += usize::from(d == 0);
    }
    (out.len(), equal)
}

#[test]
fn matches_the_f64_reference_within_one_code() {
    let mut rng = Rng(0xc0a7);
    let (mut total, mut equal) = (0, 0);
    for c in int8_conv_cases() {
        let (t, e) = run(&mut rng, &c, false);
        total += t;
        equal += e;
    }
    println!("{equal} of {total} codes equal to the rounded reference, the rest within 1");
    assert!(equal as f64 >= 0.99 * total as f64, "{equal} of {total} equal");
}

#[test]
fn exact_mode_is_bit_exact() {
    let mut rng = Rng(0xe8ac7);
    for c in int8_conv_cases() {
        run(&mut rng, &c, true);
    }
}

#[test]
fn bad_weights_and_quantization_are_typed_errors() {
    let mut rng = Rng(3);
    let params = ConvInt8Params {
        conv: Conv2dParams::default(),
        input: Int8Quant {
            scale: 0.1,
            zero_point: 0,
        },
        output: Int8Quant {
            scale: 0.1,
            zero_point: 0,
        },
    };
    let w = int8_conv_weight(&mut rng, 4, 8, (3, 3), false);
    let err = |r: lowbit::Result<ConvInt8Cpu>| r.unwrap_err().to_string();
    // Per-block scales, offsets, int4 codes.
    let shape = BlockShape::conv(4, 8, (3, 3), 2).unwrap();
    let blocked =
        BlockQuantWeight::from_parts(shape, BlockBits::Int8, w.codes().to_vec(), vec![0.1; 8], vec![0.0; 8]).unwrap();
    assert!(err(ConvInt8Cpu::new(&blocked, None, params)).contains("one scale per output channel"));
    let (shape, bits, codes, scales, _) = w.clone().into_parts();
    let offset = BlockQuantWeight::from_parts(shape, bits, codes.clone(), scales.clone(), vec![0.5; 4]).unwrap();
    assert!(err(ConvInt8Cpu::new(&offset, None, params)).contains("weight offsets"));
    let int4_codes: Vec<i8> = codes.iter().map(|&q| q / 16).collect();
    let int4 = BlockQuantWeight::from_parts(shape, BlockBits::Int4, int4_codes, scales, vec![0.0; 4]).unwrap();
    assert!(err(ConvInt8Cpu::new(&int4, None, params)).contains("int8 weights"));
    // Scales, bias length, input shape.
    let zero_scale = ConvInt8Params {
        input: Int8Quant {
            scale: 0.0,
            zero_point: 0,
        },
        ..params
    };
    assert!(err(ConvInt8Cpu::new(&w, None, zero_scale)).contains("input quantization"));
    let nan_scale = ConvInt8Params {
        output: Int8Quant {
            scale: f32::NAN,
            zero_point: 0,
        },
        ..params
    };
    assert!(err(ConvInt8Cpu::new(&w, None, nan_scale)).contains("output quantization"));
    assert!(err(ConvInt8Cpu::new(&w, Some(&[0.0; 3]), params)).contains("bias"));
    let op = ConvInt8Cpu::new(&w, None, params).unwrap();
    let mut out = vec![0i8; 4];
    let e = op
        .forward(&[0i8; 8 * 4], [1, 8, 2, 2], &mut out)
        .unwrap_err()
        .to_string();
    assert!(e.contains("input"), "{e}");
}

#[test]
fn non_clamp_activations_are_refused() {
    let w = int8_conv_weight(&mut Rng(9), 4, 8, (1, 1), false);
    let params = ConvInt8Params {
        conv: Conv2dParams {
            activation: lowbit::ops::Activation::Gelu,
            ..Conv2dParams::default()
        },
        input: Int8Quant {
            scale: 0.1,
            zero_point: 0,
        },
        output: Int8Quant {
            scale: 0.1,
            zero_point: 0,
        },
    };
    let e = ConvInt8Cpu::new(&w, None, params).unwrap_err().to_string();
    assert!(e.contains("activation") && e.contains("gelu"), "{e}");
}
