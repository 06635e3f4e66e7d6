//! The full-int8 convolution on the GPU (`ConvInt8Cuda`, both routes: im2col + cuBLASLt int8 + epilogue, and the
//! dp4a kernel) against the CPU kernel, which the f64 reference checks (`tests/conv_int8_cpu.rs`). All compute the
//! same exact int32 dot and the same f32 epilogue, so every output code must be equal, bit for bit:
//! - the convolution matrix (kernel sizes, stride, padding, dilation, groups and depthwise, none/relu/relu6, bias on
//!   and off, zero points of both signs), plus channel counts that leave partial 64-channel and 64-pixel tiles and
//!   taps that are not a multiple of 32; input channels of a multiple of 16 (the GEMM route's NHWC patches) and not;
//! - nothing past the output is written (guard bytes); the input is not modified;
//! - short buffers and bad inputs give typed errors.
//!
//! Without a GPU every test prints `skipped: <reason>` and passes.

use lowbit::formats::block::{BlockBits, BlockQuantWeight, BlockShape};
use lowbit::ops::conv::{Activation, Conv2dParams};
use lowbit::ops::conv_int8::{ConvInt8Cpu, ConvInt8Cuda};
use lowbit::testing::cuda_device as device;
use lowbit::testing::SplitMix64 as Rng;
use lowbit::Error;

mod common;
use common::{int8_conv_cases, int8_conv_weight, random_int8_params, Int8ConvCase};

/// Bytes after the output that must stay untouched.
const GUARD: usize = 256;

fn params(stride: usize, padding: usize, dilation: usize, groups: usize, activation: Activation) -> Conv2dParams {
    Conv2dParams {
        stride: (stride, stride),
        padding: (padding, padding),
        dilation: (dilation, dilation),
        groups,
        activation,
    }
}

/// The CPU suite's convolution matrix, plus tile and tap edges of the GPU kernels.
fn cases() -> Vec<Int8ConvCase> {
    let case = |input, co, kernel, conv, bias| Int8ConvCase {
        input,
        co,
        kernel,
        conv,
        bias,
    };
    let mut cases = int8_conv_cases();
    cases.extend([
        // Several 64 x 64 tiles, partial in both channels (150) and pixels (23 x 19 = 437).
        case([2, 48, 23, 19], 150, (3, 3), params(1, 1, 1, 1, Activation::Relu), true),
        // Ci a multiple of 16 (the GEMM route's NHWC patches) with stride 2, padding 2 and dilation 2.
        case([1, 32, 15, 13], 40, (3, 3), params(2, 2, 2, 1, Activation::Relu6), true),
        // A 7 x 7 stride-2 stem: 3 · 49 = 147 taps, not a multiple of 32.
        case([1, 3, 40, 36], 70, (7, 7), params(2, 3, 1, 1, Activation::None), true),
    ]);
    cases
}

#[test]
fn equals_the_cpu_kernel_bit_for_bit() {
    let Some(dev) = device() else { return };
    let mut rng = Rng(0x1a78);
    for c in cases() {
        let w = int8_conv_weight(&mut rng, c.co, c.input[1] / c.conv.groups, c.kernel, false);
        let p = random_int8_params(&mut rng, c.conv);
        let bias: Option<Vec<f32>> = c.bias.then(|| (0..c.co).map(|_| rng.uniform(-3.0, 3.0)).collect());
        let x: Vec<i8> = (0..c.input.iter().product::<usize>())
            .map(|_| (rng.below(256) as i32 - 128) as i8)
            .collect();
        let cpu = ConvInt8Cpu::new(&w, bias.as_deref(), p).unwrap();
        let shape = cpu.output_shape(c.input).unwrap();
        let n: usize = shape.iter().product();
        let mut want = vec![0i8; n];
        cpu.forward(&x, c.input, &mut want).unwrap();

        for direct in [false, true] {
            let gpu = ConvInt8Cuda::with_route(&dev, &w, bias.as_deref(), p, direct).unwrap();
            assert_eq!(gpu.output_shape(c.input).unwrap(), shape);
            let route = if gpu.uses_gemm() { "GEMM" } else { "direct" };
            let x_dev = dev.upload(&x).unwrap();
            let mut y_dev = dev.upload(&vec![0x5a_i8; n + GUARD]).unwrap();
            let mut ws = dev
                .alloc_zeros::<u8>(gpu.workspace_bytes(c.input).unwrap().max(1))
                .unwrap();
            gpu.run(dev.stream(), &x_dev, c.input, &mut y_dev, &mut ws).unwrap();
            let got = dev.download(&y_dev).unwrap();
            for (i, (&g, &r)) in got[..n].iter().zip(&want).enumerate() {
                assert_eq!(
                    g, r,
                    "{route}: output {i} of {:?} {:?} co={}: GPU {g}, CPU {r}",
                    c.input, c.conv, c.co
                );
            }
            assert!(
                got[n..].iter().all(|&v| v == 0x5a),
                "{route} {:?}: wrote past the output",
                c.input
            );
            assert_eq!(
                dev.download(&x_dev).unwrap(),
                x,
                "{route} {:?}: the input changed",
                c.input
            );
        }
    }
}

#[test]
fn bad_inputs_are_typed_errors() {
    let Some(dev) = device() else { return };
    let mut rng = Rng(7);
    let w = int8_conv_weight(&mut rng, 8, 4, (3, 3), false);
    let p = random_int8_params(&mut rng, params(1, 1, 1, 1, Activation::None));
    let op = ConvInt8Cuda::new(&dev, &w, None, p).unwrap();
    let input = [1, 4, 5, 5];
    let x = dev.upload(&[0i8; 100]).unwrap();
    let short_x = dev.upload(&[0i8; 99]).unwrap();
    let mut y = dev.upload(&[0i8; 200]).unwrap();
    let mut short_y = dev.upload(&[0i8; 199]).unwrap();
    let message = |r: lowbit::Result<()>| r.unwrap_err().to_string();
    let mut ws = dev
        .alloc_zeros::<u8>(op.workspace_bytes(input).unwrap().max(1))
        .unwrap();
    let e = message(op.run(dev.stream(), &short_x, input, &mut y, &mut ws));
    assert!(e.contains('x') && e.contains("99"), "{e}");
    let e = message(op.run(dev.stream(), &x, input, &mut short_y, &mut ws));
    assert!(e.contains('y') && e.contains("199"), "{e}");
    if op.workspace_bytes(input).unwrap() > 0 {
        let mut short_ws = dev.alloc_zeros::<u8>(op.workspace_bytes(input).unwrap() - 1).unwrap();
        let e = message(op.run(dev.stream(), &x, input, &mut y, &mut short_ws));
        assert!(e.contains("workspace"), "{e}");
    }
    // Channels that do not match the weight.
    assert!(matches!(
        op.run(dev.stream(), &x, [1, 5, 4, 5], &mut y, &mut ws),
        Err(Error::Invalid { .. })
    ));
    // An int4 weight is refused when the operator is made.
    let int4 = BlockQuantWeight::from_parts(
        BlockShape::conv(4, 4, (1, 1), 1).unwrap(),
        BlockBits::Int4,
        vec![1; 16],
        vec![0.1; 4],
        vec![0.0; 4],
    )
    .unwrap();
    assert!(ConvInt8Cuda::new(&dev, &int4, None, p).is_err());
}
