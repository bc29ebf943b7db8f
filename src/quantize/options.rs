//! What the user asks for, validated once, with the names the user spells.

use crate::error::{Error, Result};
use crate::tensor::GgmlType;

/// How block scales and codes are chosen for Q4_1 tensors.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scheme {
    /// ggml's reference rules (Q4_1: the block's [min, max] in 15 steps), bit-exact.
    MinMax,
    /// The b-bit uniform quantizer per block, range [-a, a] with a = max|w| or, with
    /// `clip = Some(P)`, the P-th percentile of |w|; stored as Q4_1 (m = -a, d = Δ).
    Uniform { clip: Option<f64> },
}

/// Options of [`super::quantize_file`].
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizeOptions {
    /// Type of the 2-D weights other than the embedding/output matrix: Q4_0, Q4_1 or Q8_0.
    pub weight_type: GgmlType,
    pub scheme: Scheme,
    /// Type of `token_embd.weight` and `output.weight` (default Q8_0).
    pub output_type: GgmlType,
    /// A text on which to measure the KL divergence of the next-token distributions.
    pub report_text: Option<String>,
}

/// The embedding/output matrix type when none is given: 8 bits, the type of SmolLM2's tied
/// embedding in its published Q4_1 file, since the output matrix's error reaches the logits
/// directly.
pub const DEFAULT_OUTPUT_TYPE: GgmlType = GgmlType::Q8_0;

const WEIGHT_TYPES: [GgmlType; 3] = [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0];
const OUTPUT_TYPES: [GgmlType; 6] =
    [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::F16, GgmlType::BF16, GgmlType::F32];
const CONVERT_TYPES: [GgmlType; 2] = [GgmlType::F32, GgmlType::F16];

fn names(types: &[GgmlType]) -> String {
    types.iter().map(|t| t.name().to_ascii_lowercase()).collect::<Vec<_>>().join(", ")
}

/// `name` as one of `allowed`, or an error naming the setting and the choices.
fn parse_type(setting: &str, name: &str, allowed: &[GgmlType]) -> Result<GgmlType> {
    GgmlType::from_name(name)
        .filter(|t| allowed.contains(t))
        .ok_or_else(|| Error::invalid_argument(setting, format!("'{name}' is not one of {}", names(allowed))))
}

impl QuantizeOptions {
    /// Validates the options as the CLI and Python API spell them: `type` in q4_0, q4_1,
    /// q8_0; `scheme` "minmax" or "uniform" (Q4_1 only); `clip` a percentile in (0, 100],
    /// uniform scheme only; `output_type` a quantized type, f16, bf16 or f32.
    pub fn parse(
        type_name: &str,
        scheme: &str,
        clip: Option<f64>,
        output_type: Option<&str>,
        report_text: Option<String>,
    ) -> Result<QuantizeOptions> {
        let weight_type = parse_type("type", type_name, &WEIGHT_TYPES)?;
        if report_text.as_deref() == Some("") {
            return Err(Error::invalid_argument("report_text", "is empty: the KL divergence needs at least one token"));
        }
        let output_type = match output_type {
            None => DEFAULT_OUTPUT_TYPE,
            Some(name) => parse_type("output_type", name, &OUTPUT_TYPES)?,
        };
        if let Some(p) = clip {
            if !(p > 0.0 && p <= 100.0) {
                return Err(Error::invalid_argument("clip", format!("a percentile in (0, 100] is required, got {p}")));
            }
        }
        let scheme = match scheme.to_ascii_lowercase().as_str() {
            "minmax" => {
                if clip.is_some() {
                    return Err(Error::invalid_argument("clip", "applies only to scheme 'uniform'"));
                }
                Scheme::MinMax
            }
            "uniform" => {
                if weight_type != GgmlType::Q4_1 {
                    return Err(Error::invalid_argument(
                        "scheme",
                        format!(
                            "'uniform' needs a level offset, which only q4_1 stores (w = d*q + m); got type {}",
                            type_name
                        ),
                    ));
                }
                Scheme::Uniform { clip }
            }
            _ => return Err(Error::invalid_argument("scheme", format!("'{scheme}' is not one of minmax, uniform"))),
        };
        Ok(QuantizeOptions { weight_type, scheme, output_type, report_text })
    }
}

/// The type of [`super::convert_file`]'s output: "f32" or "f16".
pub fn parse_convert_type(name: &str) -> Result<GgmlType> {
    parse_type("to", name, &CONVERT_TYPES)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bad(r: Result<QuantizeOptions>, setting: &str) {
        match r {
            Err(Error::InvalidArgument { name, .. }) => assert_eq!(name, setting),
            other => panic!("expected an invalid '{setting}', got {other:?}"),
        }
    }

    #[test]
    fn parses_and_rejects() {
        let o = QuantizeOptions::parse("Q4_1", "uniform", Some(99.0), None, None).unwrap();
        assert_eq!(o.weight_type, GgmlType::Q4_1);
        assert_eq!(o.scheme, Scheme::Uniform { clip: Some(99.0) });
        assert_eq!(o.output_type, GgmlType::Q8_0);
        bad(QuantizeOptions::parse("q5_k", "minmax", None, None, None), "type");
        bad(QuantizeOptions::parse("f16", "minmax", None, None, None), "type");
        bad(QuantizeOptions::parse("q4_1", "fancy", None, None, None), "scheme");
        bad(QuantizeOptions::parse("q8_0", "uniform", None, None, None), "scheme");
        bad(QuantizeOptions::parse("q4_1", "minmax", Some(50.0), None, None), "clip");
        for p in [0.0, -1.0, 100.5, f64::NAN, f64::INFINITY] {
            bad(QuantizeOptions::parse("q4_1", "uniform", Some(p), None, None), "clip");
        }
        bad(QuantizeOptions::parse("q4_1", "minmax", None, Some("q6_k"), None), "output_type");
        bad(QuantizeOptions::parse("q4_1", "minmax", None, None, Some(String::new())), "report_text");
        assert_eq!(parse_convert_type("F16").unwrap(), GgmlType::F16);
        assert!(parse_convert_type("q8_0").is_err());
    }
}
