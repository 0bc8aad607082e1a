//! KV-cache bytes per token of the models whose caches Sluice sizes.
//!
//! A KV trace names blocks of tokens; a cache holds bytes. The bridge is the
//! model's KV footprint per token:
//!
//! - **MHA / GQA**: every layer stores one key and one value vector per KV
//!   head, so a token costs `2 × layers × kv_heads × head_dim × dtype_bytes`.
//!   Grouped-query attention only lowers `kv_heads` below the query heads.
//! - **MLA** (DeepSeek-V2/V3): every layer stores one compressed latent of
//!   `kv_lora_rank` elements plus one shared RoPE key of `rope_dim`
//!   elements, so a token costs `layers × (kv_lora_rank + rope_dim) ×
//!   dtype_bytes`; the per-head keys and values are rebuilt from the latent.
//!
//! Presets carry the numbers of the models' public `config.json`; the
//! derivation sits on each preset. A custom model is a spec string such as
//! `layers=32,kv_heads=8,head_dim=128,dtype_bytes=2`.

use crate::error::SimError;

/// How a model's attention lays out its KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionKind {
    /// Multi-head attention: as many KV heads as query heads.
    Mha,
    /// Grouped-query attention: fewer KV heads, each shared by a group of
    /// query heads. Same per-token formula as MHA.
    Gqa,
    /// Multi-head latent attention: one compressed latent plus one decoupled
    /// RoPE key per token and layer; `kv_heads` and `head_dim` do not count.
    Mla { kv_lora_rank: u64, rope_dim: u64 },
}

/// A model's KV-cache geometry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvModel {
    /// The preset name, or the spec a custom model was parsed from.
    pub name: String,
    /// Transformer layers that keep a KV cache (`num_hidden_layers`).
    pub layers: u64,
    /// KV heads per layer (`num_key_value_heads`).
    pub kv_heads: u64,
    /// Elements per head (`head_dim`, or `hidden_size / num_attention_heads`).
    pub head_dim: u64,
    /// Bytes per cached element: 2 for bf16/fp16, 1 for fp8.
    pub dtype_bytes: u64,
    pub kind: AttentionKind,
}

/// Names `KvModel::preset` accepts.
pub const PRESET_NAMES: [&str; 4] = ["llama3-8b", "llama3.1-70b", "deepseek-v3", "gpt-oss-120b"];

impl KvModel {
    /// KV-cache bytes of one token, all layers together.
    pub fn bytes_per_token(&self) -> u64 {
        let per_layer = match self.kind {
            AttentionKind::Mha | AttentionKind::Gqa => 2 * self.kv_heads * self.head_dim,
            AttentionKind::Mla {
                kv_lora_rank,
                rope_dim,
            } => kv_lora_rank + rope_dim,
        };
        // `checked_bytes_per_token` ran when the model was built, so the
        // product fits; saturating keeps a hand-built struct from panicking.
        per_layer
            .saturating_mul(self.layers)
            .saturating_mul(self.dtype_bytes)
    }

    /// How [`bytes_per_token`](KvModel::bytes_per_token) is computed, with
    /// the result, e.g. `2 (K,V) × 32 layers × 8 KV heads × 128 dims × 2 B
    /// = 131072 B/token`.
    pub fn derivation(&self) -> String {
        let product = match self.kind {
            AttentionKind::Mha | AttentionKind::Gqa => format!(
                "2 (K,V) × {} layers × {} KV heads × {} dims × {} B",
                self.layers, self.kv_heads, self.head_dim, self.dtype_bytes
            ),
            AttentionKind::Mla {
                kv_lora_rank,
                rope_dim,
            } => format!(
                "{} layers × ({kv_lora_rank} latent + {rope_dim} RoPE) × {} B",
                self.layers, self.dtype_bytes
            ),
        };
        format!("{product} = {} B/token", self.bytes_per_token())
    }

    /// Every preset, in [`PRESET_NAMES`] order.
    pub fn presets() -> Vec<KvModel> {
        vec![llama3_8b(), llama3_1_70b(), deepseek_v3(), gpt_oss_120b()]
    }

    /// Bytes of one block of `block_tokens` tokens (saturating).
    pub fn block_bytes(&self, block_tokens: u64) -> u64 {
        self.bytes_per_token().saturating_mul(block_tokens)
    }

    /// A preset by name (case-insensitive); the error lists the presets.
    pub fn preset(name: &str) -> Result<KvModel, SimError> {
        let model = match name.trim().to_ascii_lowercase().as_str() {
            "llama3-8b" => llama3_8b(),
            "llama3.1-70b" => llama3_1_70b(),
            "deepseek-v3" => deepseek_v3(),
            "gpt-oss-120b" => gpt_oss_120b(),
            _ => {
                return Err(SimError::config(
                    format!("model {name:?}"),
                    format!(
                        "unknown: use one of {} or a spec like \
                         \"layers=32,kv_heads=8,head_dim=128,dtype_bytes=2\"",
                        PRESET_NAMES.join(", ")
                    ),
                ))
            }
        };
        Ok(model)
    }

    /// A preset name, or a custom spec of `key=value` pairs:
    /// `layers`, `kv_heads`, `head_dim`, `dtype_bytes` (default 2, bf16) or
    /// `dtype` (`bf16`, `fp16`, `fp8`, `fp32`), `attention` (`mha`, `gqa`,
    /// `mla`; default `gqa`, or `mla` when `kv_lora_rank` is given), and for
    /// MLA `kv_lora_rank` and `rope_dim` instead of `kv_heads`/`head_dim`.
    pub fn parse(spec: &str) -> Result<KvModel, SimError> {
        if !spec.contains('=') {
            return KvModel::preset(spec);
        }
        let fields = SpecFields::parse(spec)?;
        let model = fields.into_model(spec)?;
        checked_bytes_per_token(&model)?;
        Ok(model)
    }
}

/// `bytes_per_token` with overflow reported instead of saturated.
fn checked_bytes_per_token(model: &KvModel) -> Result<u64, SimError> {
    let per_layer = match model.kind {
        AttentionKind::Mha | AttentionKind::Gqa => model
            .kv_heads
            .checked_mul(model.head_dim)
            .and_then(|v| v.checked_mul(2)),
        AttentionKind::Mla {
            kv_lora_rank,
            rope_dim,
        } => kv_lora_rank.checked_add(rope_dim),
    };
    per_layer
        .and_then(|v| v.checked_mul(model.layers))
        .and_then(|v| v.checked_mul(model.dtype_bytes))
        .ok_or_else(|| {
            SimError::config(
                format!("model {:?}", model.name),
                "KV bytes per token overflow 64 bits",
            )
        })
}

/// The values a custom spec named.
#[derive(Default)]
struct SpecFields {
    layers: Option<u64>,
    kv_heads: Option<u64>,
    head_dim: Option<u64>,
    dtype_bytes: Option<u64>,
    kv_lora_rank: Option<u64>,
    rope_dim: Option<u64>,
    attention: Option<String>,
}

const SPEC_KEYS: &str =
    "layers, kv_heads, head_dim, dtype_bytes, dtype, attention, kv_lora_rank, rope_dim";

impl SpecFields {
    fn parse(spec: &str) -> Result<SpecFields, SimError> {
        let mut fields = SpecFields::default();
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let Some((key, value)) = item.split_once('=') else {
                return Err(spec_error(spec, &format!("{item:?} is not key=value")));
            };
            let (key, value) = (key.trim(), value.trim());
            match key {
                "layers" => fields.layers = Some(positive(spec, key, value)?),
                "kv_heads" => fields.kv_heads = Some(positive(spec, key, value)?),
                "head_dim" => fields.head_dim = Some(positive(spec, key, value)?),
                "dtype_bytes" => fields.dtype_bytes = Some(positive(spec, key, value)?),
                "dtype" => fields.dtype_bytes = Some(dtype_bytes(spec, value)?),
                "kv_lora_rank" => fields.kv_lora_rank = Some(positive(spec, key, value)?),
                "rope_dim" => fields.rope_dim = Some(unsigned(spec, key, value)?),
                "attention" => fields.attention = Some(value.to_ascii_lowercase()),
                _ => {
                    return Err(spec_error(
                        spec,
                        &format!("unknown key {key:?} (known: {SPEC_KEYS})"),
                    ))
                }
            }
        }
        Ok(fields)
    }

    fn into_model(self, spec: &str) -> Result<KvModel, SimError> {
        let require = |v: Option<u64>, key: &str| {
            v.ok_or_else(|| spec_error(spec, &format!("{key} is missing")))
        };
        let attention = match (self.attention.as_deref(), self.kv_lora_rank) {
            (Some(a), _) => a.to_string(),
            (None, Some(_)) => "mla".to_string(),
            (None, None) => "gqa".to_string(),
        };
        let kind = match attention.as_str() {
            "mha" => AttentionKind::Mha,
            "gqa" => AttentionKind::Gqa,
            "mla" => AttentionKind::Mla {
                kv_lora_rank: require(self.kv_lora_rank, "kv_lora_rank")?,
                rope_dim: require(self.rope_dim, "rope_dim")?,
            },
            other => {
                return Err(spec_error(
                    spec,
                    &format!("attention {other:?} is not mha, gqa or mla"),
                ))
            }
        };
        let is_mla = matches!(kind, AttentionKind::Mla { .. });
        Ok(KvModel {
            name: spec.trim().to_string(),
            layers: require(self.layers, "layers")?,
            kv_heads: if is_mla {
                self.kv_heads.unwrap_or(1)
            } else {
                require(self.kv_heads, "kv_heads")?
            },
            head_dim: if is_mla {
                self.head_dim.unwrap_or(1)
            } else {
                require(self.head_dim, "head_dim")?
            },
            // bf16 is what serving engines cache by default.
            dtype_bytes: self.dtype_bytes.unwrap_or(2),
            kind,
        })
    }
}

fn spec_error(spec: &str, message: &str) -> SimError {
    SimError::config(format!("model spec {spec:?}"), message)
}

fn unsigned(spec: &str, key: &str, value: &str) -> Result<u64, SimError> {
    value
        .parse::<u64>()
        .map_err(|_| spec_error(spec, &format!("{key}={value:?} is not an unsigned integer")))
}

fn positive(spec: &str, key: &str, value: &str) -> Result<u64, SimError> {
    match unsigned(spec, key, value)? {
        0 => Err(spec_error(spec, &format!("{key} must be at least 1"))),
        v => Ok(v),
    }
}

fn dtype_bytes(spec: &str, value: &str) -> Result<u64, SimError> {
    match value.to_ascii_lowercase().as_str() {
        "bf16" | "fp16" | "f16" | "bfloat16" | "float16" => Ok(2),
        "fp8" | "f8" | "fp8_e4m3" | "fp8_e5m2" | "int8" => Ok(1),
        "fp32" | "f32" | "float32" => Ok(4),
        other => Err(spec_error(
            spec,
            &format!("dtype {other:?} is not bf16, fp16, fp8 or fp32"),
        )),
    }
}

/// Meta-Llama-3-8B `config.json`: `num_hidden_layers` 32,
/// `num_attention_heads` 32, `num_key_value_heads` 8, `hidden_size` 4096, so
/// `head_dim` = 4096 / 32 = 128; bf16. Per token: 2 × 32 × 8 × 128 × 2 =
/// 131,072 B (128 KiB; a 512-token block is 64 MiB).
fn llama3_8b() -> KvModel {
    gqa("llama3-8b", 32, 8, 128)
}

/// Llama-3.1-70B `config.json`: `num_hidden_layers` 80,
/// `num_attention_heads` 64, `num_key_value_heads` 8, `hidden_size` 8192, so
/// `head_dim` = 8192 / 64 = 128; bf16. Per token: 2 × 80 × 8 × 128 × 2 =
/// 327,680 B (320 KiB).
fn llama3_1_70b() -> KvModel {
    gqa("llama3.1-70b", 80, 8, 128)
}

/// gpt-oss-120b `config.json`: `num_hidden_layers` 36,
/// `num_attention_heads` 64, `num_key_value_heads` 8, `head_dim` 64; the
/// attention weights (and so the cache) stay bf16 under its MXFP4 MoE
/// quantisation. Per token: 2 × 36 × 8 × 64 × 2 = 73,728 B. Half its layers
/// use a 128-token sliding window; counting every layer in full is the
/// upper bound a prefix cache that keeps whole blocks must budget for.
fn gpt_oss_120b() -> KvModel {
    gqa("gpt-oss-120b", 36, 8, 64)
}

/// DeepSeek-V3 `config.json`: `num_hidden_layers` 61, `kv_lora_rank` 512,
/// `qk_rope_head_dim` 64 (MLA; `num_key_value_heads` 128 and
/// `v_head_dim` 128 describe the decompressed heads and are not cached);
/// bf16. Per token: 61 × (512 + 64) × 2 = 70,272 B. The multi-token
/// prediction module (layer 61) is not counted: it is a speculative-decoding
/// extra, not part of the served model's cache.
fn deepseek_v3() -> KvModel {
    KvModel {
        name: "deepseek-v3".into(),
        layers: 61,
        kv_heads: 128,
        head_dim: 128,
        dtype_bytes: 2,
        kind: AttentionKind::Mla {
            kv_lora_rank: 512,
            rope_dim: 64,
        },
    }
}

fn gqa(name: &str, layers: u64, kv_heads: u64, head_dim: u64) -> KvModel {
    KvModel {
        name: name.into(),
        layers,
        kv_heads,
        head_dim,
        dtype_bytes: 2,
        kind: AttentionKind::Gqa,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derivations_state_the_formula_and_the_result() {
        let presets = KvModel::presets();
        let names: Vec<&str> = presets.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, PRESET_NAMES);
        assert_eq!(
            KvModel::preset("llama3-8b").unwrap().derivation(),
            "2 (K,V) × 32 layers × 8 KV heads × 128 dims × 2 B = 131072 B/token"
        );
        assert_eq!(
            KvModel::preset("deepseek-v3").unwrap().derivation(),
            "61 layers × (512 latent + 64 RoPE) × 2 B = 70272 B/token"
        );
    }

    fn bpt(name: &str) -> u64 {
        KvModel::preset(name).unwrap().bytes_per_token()
    }

    #[test]
    fn presets_have_the_documented_bytes_per_token() {
        assert_eq!(bpt("llama3-8b"), 131_072);
        assert_eq!(bpt("llama3.1-70b"), 327_680);
        assert_eq!(bpt("deepseek-v3"), 70_272);
        assert_eq!(bpt("gpt-oss-120b"), 73_728);
    }

    #[test]
    fn every_listed_preset_resolves() {
        for name in PRESET_NAMES {
            assert_eq!(KvModel::preset(name).unwrap().name, name);
        }
    }

    #[test]
    fn preset_names_are_case_insensitive() {
        assert_eq!(bpt("Llama3-8B"), 131_072);
    }

    #[test]
    fn unknown_preset_error_lists_the_presets() {
        let err = KvModel::parse("llama2").unwrap_err().to_string();
        for name in PRESET_NAMES {
            assert!(err.contains(name), "{err}");
        }
    }

    #[test]
    fn block_bytes_multiplies_by_block_tokens() {
        let m = KvModel::preset("llama3-8b").unwrap();
        assert_eq!(m.block_bytes(512), 64 << 20);
    }

    #[test]
    fn custom_gqa_spec_matches_the_preset() {
        let m = KvModel::parse("layers=32,kv_heads=8,head_dim=128,dtype_bytes=2").unwrap();
        assert_eq!(m.bytes_per_token(), 131_072);
        assert_eq!(m.kind, AttentionKind::Gqa);
    }

    #[test]
    fn custom_spec_defaults_to_bf16_and_accepts_dtype_names() {
        let bf16 = KvModel::parse("layers=2, kv_heads=1, head_dim=4").unwrap();
        assert_eq!(bf16.bytes_per_token(), 2 * 2 * 4 * 2);
        let fp8 = KvModel::parse("layers=2,kv_heads=1,head_dim=4,dtype=fp8").unwrap();
        assert_eq!(fp8.bytes_per_token(), 2 * 2 * 4);
    }

    #[test]
    fn custom_mla_spec_counts_latent_and_rope() {
        let m = KvModel::parse("layers=61,kv_lora_rank=512,rope_dim=64").unwrap();
        assert_eq!(m.bytes_per_token(), 70_272);
    }

    #[test]
    fn custom_spec_errors_name_the_problem() {
        let cases = [
            ("layers=32,kv_heads=8", "head_dim is missing"),
            (
                "layers=x,kv_heads=8,head_dim=1",
                "layers=\"x\" is not an unsigned integer",
            ),
            (
                "layers=0,kv_heads=8,head_dim=1",
                "layers must be at least 1",
            ),
            ("layers=1,heads=8", "unknown key \"heads\""),
            (
                "layers=1,kv_heads=1,head_dim=1,dtype=int4",
                "dtype \"int4\"",
            ),
            ("layers=1,attention=mla", "kv_lora_rank is missing"),
            ("layers=1,kv_heads", "not key=value"),
        ];
        for (spec, want) in cases {
            let err = KvModel::parse(spec).unwrap_err().to_string();
            assert!(err.contains(want), "{spec}: {err}");
        }
    }

    #[test]
    fn overflowing_spec_is_an_error_not_a_panic() {
        let spec = format!("layers={},kv_heads=8,head_dim=128", u64::MAX);
        let err = KvModel::parse(&spec).unwrap_err().to_string();
        assert!(err.contains("overflow"), "{err}");
    }
}
