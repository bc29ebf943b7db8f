//! [`GrammarSpec`]: what the generated text must be, before it is compiled for a vocabulary.

use llguidance::api::TopLevelGrammar;
use serde_json::Value;

use crate::error::{Error, Result};

/// What the generated text must be. The whole text is constrained: a regular expression must
/// match all of it, a JSON Schema describes one JSON value, a Lark grammar derives it from
/// its `start` rule, a choice is exactly one of the strings.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum GrammarSpec {
    /// A JSON Schema (as JSON text). The JSON is written compactly, with `", "` between items
    /// and `": "` after keys, unless the schema's own `x-guidance` options say otherwise.
    JsonSchema(String),
    /// A regular expression in Rust `regex` syntax, matched against the whole text.
    Regex(String),
    /// A grammar in llguidance's Lark-like syntax.
    Lark(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
}

/// The JSON layout used unless the schema sets `x-guidance`: one fixed way to write each
/// value (a model cannot wander off into whitespace), spaced as Python's `json.dumps`.
fn default_json_options() -> Value {
    serde_json::json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
}

impl GrammarSpec {
    /// The grammar in llguidance's form.
    ///
    /// # Errors
    /// [`Error::Grammar`] for a JSON Schema that is not JSON, or an empty choice.
    pub(super) fn to_llguidance(&self) -> Result<TopLevelGrammar> {
        Ok(match self {
            GrammarSpec::JsonSchema(text) => {
                let mut schema: Value = serde_json::from_str(text)
                    .map_err(|e| Error::Grammar(format!("the JSON Schema is not valid JSON: {e}")))?;
                if let Value::Object(map) = &mut schema {
                    map.entry("x-guidance").or_insert_with(default_json_options);
                }
                TopLevelGrammar::from_json_schema(schema)
            }
            GrammarSpec::Regex(pattern) => TopLevelGrammar::from_regex(pattern),
            GrammarSpec::Lark(text) => TopLevelGrammar::from_lark(text.clone()),
            GrammarSpec::Choice(options) => {
                if options.is_empty() {
                    return Err(Error::Grammar("a choice needs at least one string".into()));
                }
                let alternatives: Vec<String> = options.iter().map(|s| regex_syntax::escape(s)).collect();
                TopLevelGrammar::from_regex(&format!("(?:{})", alternatives.join("|")))
            }
        })
    }
}
