//! Chat templates: a list of messages rendered into a prompt by the model's own Jinja template
//! (`tokenizer.chat_template` in the GGUF metadata), with the `minijinja` engine set up the way
//! Hugging Face transformers sets up Jinja2 for `apply_chat_template`:
//!
//! - `trim_blocks` and `lstrip_blocks` on, the `loopcontrols` extension (`break`/`continue`),
//!   Python string/dict/list methods (`.strip()`, `.items()`, ...), `tojson`;
//! - the context has `messages`, `add_generation_prompt`, `bos_token`, `eos_token` and any
//!   extra variables the caller passes (such as `tools`);
//! - `raise_exception(message)` fails the render with that message, and `strftime_now(format)`
//!   formats the current UTC time;
//! - transformers' `{% generation %}...{% endgeneration %}` block (its `AssistantTracker`
//!   extension, which marks the assistant's tokens for training masks) renders its body, as
//!   transformers renders it when it collects no masks: each tag becomes a `with` block tag
//!   with the same whitespace control, so the body keeps its own scope (as the extension's
//!   call block does) and the text around it is trimmed exactly as before.
//!
//! Templates come from files, so they are untrusted: a render has a fuel budget (a template
//! cannot loop forever) and every failure is an [`Error::ChatTemplate`].

use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::{Environment, ErrorKind};

pub use minijinja::Value;

use crate::loaded_model::LoadedModel;
use crate::error::{Error, Result};

/// The metadata key of the chat template.
pub const TEMPLATE_KEY: &str = "tokenizer.chat_template";

/// Render budget in minijinja fuel units (about one per instruction): far above what any chat
/// template needs for a long conversation, small enough to stop a runaway loop within about a second.
const FUEL: u64 = 5_000_000;

/// One chat message, for callers that only need role and text (a template may read other
/// fields, such as `tool_calls`; pass a [`Value`] to [`ChatTemplate::render_value`] for those).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Message {
        Message { role: role.into(), content: content.into() }
    }

    fn to_value(&self) -> Value {
        map([("role".into(), Value::from(self.role.as_str())), ("content".into(), Value::from(self.content.as_str()))])
    }
}

/// A chat template with the special-token texts it may refer to.
#[derive(Clone, Debug)]
pub struct ChatTemplate {
    source: String,
    bos_token: String,
    eos_token: String,
}

impl ChatTemplate {
    /// A template from its source, with empty `bos_token` and `eos_token`.
    pub fn new(source: impl Into<String>) -> ChatTemplate {
        ChatTemplate { source: source.into(), bos_token: String::new(), eos_token: String::new() }
    }

    /// Sets the texts of `bos_token` and `eos_token`.
    pub fn with_special_tokens(mut self, bos_token: impl Into<String>, eos_token: impl Into<String>) -> ChatTemplate {
        self.bos_token = bos_token.into();
        self.eos_token = eos_token.into();
        self
    }

    /// The template of `engine`'s file, or `source` if given, with the model's BOS and EOS
    /// token texts.
    ///
    /// # Errors
    /// [`Error::ChatTemplate`] if `source` is `None` and the file has no `tokenizer.chat_template`
    /// (or it is not a string).
    pub fn for_loaded(loaded: &LoadedModel, source: Option<&str>) -> Result<ChatTemplate> {
        let source = match source {
            Some(s) => s.to_owned(),
            None => loaded.file.get(TEMPLATE_KEY).and_then(|v| v.as_str()).map(str::to_owned).ok_or_else(|| {
                Error::ChatTemplate(format!(
                    "the model file has no '{TEMPLATE_KEY}' in its metadata; pass a template explicitly"
                ))
            })?,
        };
        let token_text = |id: Option<u32>| -> String {
            id.and_then(|id| loaded.tokenizer.token_bytes(id).ok())
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_default()
        };
        let config = loaded.config();
        Ok(ChatTemplate::new(source).with_special_tokens(token_text(config.bos_id), token_text(config.eos_id)))
    }

    /// The template source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders plain role/content messages.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let messages = Value::from_iter(messages.iter().map(Message::to_value));
        self.render_value(messages, add_generation_prompt, Vec::new())
    }

    /// Renders `messages` (a sequence of maps) with `add_generation_prompt` and the extra
    /// context variables `extra` (which may override `bos_token` and `eos_token`).
    ///
    /// # Errors
    /// [`Error::ChatTemplate`] for a syntax error, a failed render (including the template's
    /// own `raise_exception`), or a render that runs out of its fuel budget.
    pub fn render_value(&self, messages: Value, add_generation_prompt: bool, extra: Vec<(String, Value)>) -> Result<String> {
        let mut env = Environment::new();
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .map_err(template_error)?,
        );
        env.set_fuel(Some(FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        let source = generation_blocks_as_scopes(&self.source);
        env.add_template("chat_template", &source).map_err(template_error)?;
        let mut context: Vec<(String, Value)> = vec![
            ("messages".into(), messages),
            ("add_generation_prompt".into(), Value::from(add_generation_prompt)),
            ("bos_token".into(), Value::from(self.bos_token.as_str())),
            ("eos_token".into(), Value::from(self.eos_token.as_str())),
        ];
        for (key, value) in extra {
            match context.iter_mut().find(|(k, _)| *k == key) {
                Some(slot) => slot.1 = value,
                None => context.push((key, value)),
            }
        }
        let template = env.get_template("chat_template").map_err(template_error)?;
        template.render(map(context)).map_err(template_error)
    }
}

/// `source` with every `{% generation %}` tag made `{% with %}` and every `{% endgeneration %}`
/// `{% endwith %}`, keeping the tags' whitespace-control marks (`{%-`, `-%}`, `+`) and spacing.
fn generation_blocks_as_scopes(source: &str) -> std::borrow::Cow<'_, str> {
    if !source.contains("generation") {
        return std::borrow::Cow::Borrowed(source);
    }
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(open) = rest.find("{%") {
        out.push_str(&rest[..open]);
        let tag = &rest[open..];
        match generation_tag(tag) {
            Some((len, name_at, end)) => {
                let (name, scope) = if end { ("endgeneration", "endwith") } else { ("generation", "with") };
                out.push_str(&tag[..name_at]);
                out.push_str(scope);
                out.push_str(&tag[name_at + name.len()..len]);
                rest = &tag[len..];
            }
            None => {
                out.push_str("{%");
                rest = &tag[2..];
            }
        }
    }
    out.push_str(rest);
    std::borrow::Cow::Owned(out)
}

/// If `tag` starts with a `generation` or `endgeneration` block tag: (its length, where the
/// name starts, whether it is the end tag).
fn generation_tag(tag: &str) -> Option<(usize, usize, bool)> {
    let bytes = tag.as_bytes();
    let mut at = 2;
    if matches!(bytes.get(at), Some(b'-' | b'+')) {
        at += 1;
    }
    while bytes.get(at).is_some_and(u8::is_ascii_whitespace) {
        at += 1;
    }
    let name_at = at;
    let end = tag[at..].starts_with("endgeneration");
    if !end && !tag[at..].starts_with("generation") {
        return None;
    }
    at += if end { "endgeneration".len() } else { "generation".len() };
    while bytes.get(at).is_some_and(u8::is_ascii_whitespace) {
        at += 1;
    }
    if matches!(bytes.get(at), Some(b'-' | b'+')) {
        at += 1;
    }
    tag[at..].starts_with("%}").then_some((at + 2, name_at, end))
}

/// A map value that keeps the order of `pairs` (as a Python dict does).
pub fn map(pairs: impl IntoIterator<Item = (String, Value)>) -> Value {
    Value::from(pairs.into_iter().map(|(k, v)| (Value::from(k), v)).collect::<indexmap::IndexMap<Value, Value>>())
}

/// `raise_exception(message)`: the template's way to reject its input.
fn raise_exception(message: String) -> std::result::Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, format!("raise_exception: {message}")))
}

/// `strftime_now(format)`: the current UTC time formatted with the C `strftime` directives
/// `%Y %y %m %d %e %j %H %I %M %S %p %b %B %a %A %%` (what chat templates use for dates).
fn strftime_now(format: String) -> std::result::Result<String, minijinja::Error> {
    let seconds = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    strftime(&format, seconds)
}

const MONTHS: [&str; 12] =
    ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"];
const WEEKDAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];

/// Formats `seconds` since the Unix epoch (UTC).
fn strftime(format: &str, seconds: u64) -> std::result::Result<String, minijinja::Error> {
    let days = (seconds / 86_400) as i64;
    let secs_of_day = seconds % 86_400;
    let (year, month, day) = civil_from_days(days);
    // 1970-01-01 was a Thursday (index 3 with Monday = 0).
    let weekday = (days + 3).rem_euclid(7) as usize;
    let is_leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let before: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = before[month as usize - 1] + day + u32::from(is_leap && month > 2);
    let (hour, minute, second) = (secs_of_day / 3600, secs_of_day / 60 % 60, secs_of_day % 60);
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let directive = chars.next().ok_or_else(|| {
            minijinja::Error::new(ErrorKind::InvalidOperation, "strftime_now: format ends with a lone '%'")
        })?;
        let month_name = MONTHS[month as usize - 1];
        match directive {
            'Y' => out.push_str(&year.to_string()),
            'y' => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            'm' => out.push_str(&format!("{month:02}")),
            'd' => out.push_str(&format!("{day:02}")),
            'e' => out.push_str(&format!("{day:>2}")),
            'j' => out.push_str(&format!("{yday:03}")),
            'H' => out.push_str(&format!("{hour:02}")),
            'I' => out.push_str(&format!("{:02}", (hour + 11) % 12 + 1)),
            'M' => out.push_str(&format!("{minute:02}")),
            'S' => out.push_str(&format!("{second:02}")),
            'p' => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            'b' => out.push_str(&month_name[..3]),
            'B' => out.push_str(month_name),
            'a' => out.push_str(&WEEKDAYS[weekday][..3]),
            'A' => out.push_str(WEEKDAYS[weekday]),
            '%' => out.push('%'),
            other => {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    format!("strftime_now: unsupported directive '%{other}'"),
                ))
            }
        }
    }
    Ok(out)
}

/// (year, month 1..=12, day 1..=31) of a day count since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`, proleptic Gregorian calendar).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// A minijinja error as [`Error::ChatTemplate`], with the line it happened on.
fn template_error(e: minijinja::Error) -> Error {
    let mut message = match e.kind() {
        ErrorKind::SyntaxError => format!("syntax error: {}", e.detail().unwrap_or("")),
        ErrorKind::OutOfFuel => "the template ran out of its render budget (an endless loop?)".to_owned(),
        _ => match e.detail() {
            Some(detail) => detail.strip_prefix("raise_exception: ").map_or_else(|| format!("{}: {detail}", e.kind()), str::to_owned),
            None => e.kind().to_string(),
        },
    };
    if let Some(line) = e.line() {
        message.push_str(&format!(" (template line {line})"));
    }
    Error::ChatTemplate(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nDefault<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn renders_chatml_with_and_without_generation_prompt() {
        let t = ChatTemplate::new(CHATML);
        let messages = [Message::new("user", "Hi")];
        assert_eq!(
            t.render(&messages, true).unwrap(),
            "<|im_start|>system\nDefault<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        let messages = [Message::new("system", "S"), Message::new("user", "Hi")];
        assert_eq!(
            t.render(&messages, false).unwrap(),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        );
    }

    #[test]
    fn hugging_face_conventions() {
        // trim_blocks / lstrip_blocks, pycompat methods, bos/eos variables, loop controls, extra vars.
        let source = "{{ bos_token }}\n{% for m in messages %}\n    {% if m.role == 'skip' %}{% continue %}{% endif %}\n{{ m.content.strip() | upper }}{{ eos_token }}\n{% endfor %}{{ tools | tojson }}";
        let t = ChatTemplate::new(source).with_special_tokens("<s>", "</s>");
        let message = |role: &str, content: &str| {
            map([("role".into(), Value::from(role)), ("content".into(), Value::from(content))])
        };
        let messages = Value::from_iter([message("user", "  a "), message("skip", "b")]);
        let out = t.render_value(messages, true, vec![("tools".into(), Value::from_iter([1, 2]))]).unwrap();
        assert_eq!(out, "<s>\nA</s>\n[1, 2]");
    }

    #[test]
    fn generation_blocks_render_their_body_with_the_same_whitespace_control() {
        let source = "{% for m in messages %}\n  {%- generation -%}\n  [{{ m.content }}]\n  {%- endgeneration %}\n{% endfor %}";
        let plain = "{% for m in messages %}\n  {%- if true -%}\n  [{{ m.content }}]\n  {%- endif %}\n{% endfor %}";
        let messages = [Message::new("assistant", "a"), Message::new("assistant", "b")];
        let rendered = ChatTemplate::new(source).render(&messages, false).unwrap();
        assert_eq!(rendered, ChatTemplate::new(plain).render(&messages, false).unwrap());
        assert_eq!(rendered, "[a][b]");
        // A set inside the block stays inside it, as in transformers' call block.
        let scoped = "{% set x = 1 %}{% generation %}{% set x = 2 %}{{ x }}{% endgeneration %}{{ x }}";
        assert_eq!(ChatTemplate::new(scoped).render(&[], false).unwrap(), "21");
        // Other tags and text naming it are untouched.
        assert_eq!(generation_blocks_as_scopes("{{ 'generation' }}{% if generation_x %}{% endif %}"),
                   "{{ 'generation' }}{% if generation_x %}{% endif %}");
    }

    #[test]
    fn errors_are_typed_and_clear() {
        let raise = ChatTemplate::new("{{ raise_exception('roles must alternate') }}");
        match raise.render(&[], true) {
            Err(Error::ChatTemplate(m)) => assert!(m.starts_with("roles must alternate"), "{m}"),
            other => panic!("{other:?}"),
        }
        match ChatTemplate::new("{% for %}").render(&[], true) {
            Err(Error::ChatTemplate(m)) => assert!(m.contains("syntax error"), "{m}"),
            other => panic!("{other:?}"),
        }
        match ChatTemplate::new("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}").render(&[], true) {
            Err(Error::ChatTemplate(m)) => assert!(m.contains("budget"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn strftime_formats_utc_dates() {
        // 2024-02-29 13:05:09 UTC, a Thursday.
        let t = 1_709_211_909;
        assert_eq!(strftime("%Y-%m-%d %H:%M:%S", t).unwrap(), "2024-02-29 13:05:09");
        assert_eq!(strftime("%d %b %Y, %A %j %I%p %%", t).unwrap(), "29 Feb 2024, Thursday 060 01PM %");
        assert!(strftime("%Q", t).is_err());
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
    }
}
