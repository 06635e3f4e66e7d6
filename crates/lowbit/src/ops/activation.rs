//! The activation an operation fuses after its bias: every activation for the linear layers (the CUDA epilogues
//! take its `code`), the clamps none/relu/relu6 for the convolutions (MNN's `minV`/`maxV`, see `bounds`).

use crate::error::{Error, Result};

/// `act(x · W^T + bias)`: applied in fp32 before the one rounding to the output type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Activation {
    /// Identity.
    #[default]
    None,
    /// `max(v, 0)`.
    Relu,
    /// `min(max(v, 0), 6)`.
    Relu6,
    /// `v · Φ(v)`, the exact (erf) GELU, PyTorch's default.
    Gelu,
    /// `v · sigmoid(v)` (SiLU / swish).
    Silu,
}

impl Activation {
    /// Every activation, in code order.
    pub const ALL: [Activation; 5] = [
        Activation::None,
        Activation::Relu,
        Activation::Relu6,
        Activation::Gelu,
        Activation::Silu,
    ];

    /// The code the CUDA kernels take (`enum Activation` of `kernels/common.cuh`).
    pub fn code(self) -> i32 {
        self as i32
    }

    /// The name used by the CLI and in records.
    pub fn name(self) -> &'static str {
        match self {
            Activation::None => "none",
            Activation::Relu => "relu",
            Activation::Relu6 => "relu6",
            Activation::Gelu => "gelu",
            Activation::Silu => "silu",
        }
    }

    /// Parses [`Activation::name`].
    pub fn parse(name: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|a| a.name() == name)
            .ok_or_else(|| Error::invalid("activation", name, "must be none, relu, relu6, gelu or silu"))
    }

    /// Whether the activation is a clamp `[lo, hi]` (none, relu, relu6): what the convolutions fuse.
    pub fn is_clamp(self) -> bool {
        matches!(self, Activation::None | Activation::Relu | Activation::Relu6)
    }

    /// The clamp bounds `(lo, hi)` of a clamp activation (`±inf` where open); `(−inf, inf)` for gelu and silu,
    /// which are not clamps (the convolutions reject them, see [`Activation::is_clamp`]).
    pub fn bounds(self) -> (f32, f32) {
        match self {
            Activation::Relu => (0.0, f32::INFINITY),
            Activation::Relu6 => (0.0, 6.0),
            _ => (f32::NEG_INFINITY, f32::INFINITY),
        }
    }

    /// Applies the activation in f32 (what the kernels compute).
    pub fn apply(self, v: f32) -> f32 {
        match self {
            Activation::None => v,
            Activation::Relu => v.max(0.0),
            Activation::Relu6 => v.clamp(0.0, 6.0),
            Activation::Gelu => 0.5 * v * (1.0 + erf(f64::from(v) * std::f64::consts::FRAC_1_SQRT_2) as f32),
            Activation::Silu => v / (1.0 + (-v).exp()),
        }
    }

    /// Applies the activation in f64 (the reference).
    pub fn apply_f64(self, v: f64) -> f64 {
        match self {
            Activation::None => v,
            Activation::Relu => v.max(0.0),
            Activation::Relu6 => v.clamp(0.0, 6.0),
            Activation::Gelu => 0.5 * v * (1.0 + erf(v * std::f64::consts::FRAC_1_SQRT_2)),
            Activation::Silu => v / (1.0 + (-v).exp()),
        }
    }
}

/// The error function (std has none), to ~1e-15: its Maclaurin series below 2, the continued fraction of erfc above
/// (short polynomial fits stop at ~1e-7, too coarse for an f64 reference).
fn erf(x: f64) -> f64 {
    let a = x.abs();
    let r = if a < 2.0 {
        // Maclaurin series: erf(a) = 2/sqrt(pi) * sum (-1)^n a^(2n+1) / (n! (2n+1)); converges fast for a < 2.
        let (mut term, mut sum, a2) = (a, a, a * a);
        let mut n = 0.0;
        while term.abs() > 1e-17 * sum.abs() {
            n += 1.0;
            term *= -a2 / n;
            sum += term / (2.0 * n + 1.0);
        }
        sum * std::f64::consts::FRAC_2_SQRT_PI
    } else {
        // Continued fraction of erfc (Lentz), accurate for a >= 2.
        let a2 = a * a;
        let mut f = a;
        let (mut c, mut d) = (a, 0.0);
        for i in 1..200 {
            let an = i as f64 * 0.5;
            d = a + an * d;
            d = if d == 0.0 { 1e-300 } else { 1.0 / d };
            c = a + an / c;
            let delta = c * d;
            f *= delta;
            if (delta - 1.0).abs() < 1e-16 {
                break;
            }
        }
        1.0 - (-a2).exp() / (f * std::f64::consts::PI.sqrt())
    };
    r.copysign(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_matches_known_values() {
        // erf values from tables (Abramowitz & Stegun 7.1), 1e-12 agreement.
        for (x, want) in [
            (0.0, 0.0),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (1.5, 0.966_105_146_475_310_7),
            (2.0, 0.995_322_265_018_952_7),
            (3.0, 0.999_977_909_503_001_4),
            (-1.0, -0.842_700_792_949_714_9),
        ] {
            assert!((erf(x) - want).abs() < 1e-12, "erf({x}) = {} want {want}", erf(x));
        }
    }

    #[test]
    fn names_round_trip() {
        for a in Activation::ALL {
            assert_eq!(Activation::parse(a.name()).unwrap(), a);
        }
        assert!(Activation::parse("tanh").is_err());
        assert_eq!(Activation::Relu6.apply(7.5), 6.0);
        assert!((Activation::Silu.apply(1.0) - 0.731_058_6).abs() < 1e-6);
    }
}
