//! Real chat templates (Llama 3.1/3.2/3.3, Qwen2.5, Qwen3, Mistral Nemo, Devstral, Phi-3,
//! Phi-3.5, Gemma 2, Gemma 4, SmolLM3, DeepSeek R1 distills, and LFM2.5 and three Poolside
//! Laguna templates, which use transformers' `{% generation %}` block) rendered by `src/chat.rs` exactly
//! as Hugging Face transformers renders them: tests/data/chat/renders.json, made by
//! tests/data/chat/make_renders.py (plain turns, a system prompt, unicode, tools offered, a
//! tool call and its result; with and without the generation prompt). Where the template
//! itself refuses the conversation (Gemma 2: no system role), the render must fail with the
//! same message.

use reprolm::chat::{map, ChatTemplate, Value};
use reprolm::error::Error;
use reprolm::gguf::GgufFile;
use serde_json::Value as Json;

fn data(path: &str) -> std::path::PathBuf {
    crate::common::data_path(path)
}

/// A JSON value as a template value, keeping the order of object keys (as Python dicts do).
fn to_value(json: &Json) -> Value {
    match json {
        Json::Null => Value::from(()),
        Json::Bool(b) => Value::from(*b),
        Json::Number(n) => match n.as_i64() {
            Some(i) => Value::from(i),
            None => Value::from(n.as_f64().unwrap()),
        },
        Json::String(s) => Value::from(s.as_str()),
        Json::Array(items) => Value::from(items.iter().map(to_value).collect::<Vec<Value>>()),
        Json::Object(fields) => map(fields.iter().map(|(k, v)| (k.clone(), to_value(v)))),
    }
}

fn template_source(name: &str) -> String {
    match name.strip_prefix("gguf:") {
        Some(file) => {
            let file = GgufFile::open(data("vocab").join(file)).unwrap();
            file.get(reprolm::chat::TEMPLATE_KEY).unwrap().as_str().unwrap().to_owned()
        }
        None => std::fs::read_to_string(data("chat/templates").join(name)).unwrap(),
    }
}

#[test]
fn templates_render_as_transformers_renders_them() {
    let renders: Json = serde_json::from_str(&std::fs::read_to_string(data("chat/renders.json")).unwrap()).unwrap();
    let cases = renders["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 228);
    let mut failures = Vec::new();
    let mut families = std::collections::BTreeSet::new();
    for case in cases {
        let name = case["template"].as_str().unwrap();
        families.insert(name);
        let template = ChatTemplate::new(template_source(name))
            .with_special_tokens(case["bos_token"].as_str().unwrap(), case["eos_token"].as_str().unwrap());
        let variables: Vec<(String, Value)> =
            case["variables"].as_object().unwrap().iter().map(|(k, v)| (k.clone(), to_value(v))).collect();
        let agp = case["add_generation_prompt"].as_bool().unwrap();
        let got = template.render_value(to_value(&case["messages"]), agp, variables);
        let label = format!("{name} / {} / add_generation_prompt={agp}", case["conversation"].as_str().unwrap());
        match (case.get("expected").and_then(Json::as_str), got) {
            (Some(want), Ok(got)) if got == want => {}
            (Some(want), Ok(got)) => failures.push(format!("{label}\n  want {want:?}\n  got  {got:?}")),
            (Some(_), Err(e)) => failures.push(format!("{label}: failed: {e}")),
            (None, Err(Error::ChatTemplate(message))) => {
                let want = case["error"].as_str().unwrap();
                if !message.contains(want) {
                    failures.push(format!("{label}: error {message:?} does not say {want:?}"));
                }
            }
            (None, other) => failures.push(format!("{label}: expected an error, got {other:?}")),
        }
    }
    assert_eq!(families.len(), 19);
    assert!(failures.is_empty(), "{} of {} renders differ:\n{}", failures.len(), cases.len(), failures.join("\n"));
}
