//! The streaming [`Generator`] on the real model: the same ids as `decode::generate`, step texts
//! that join to the decoded text, stop strings cut across token boundaries, and chat templates.

use crate::common;

use std::sync::Arc;

use reprolm::chat::{ChatTemplate, Message};
use reprolm::decode::stream::Generator;
use reprolm::decode::{generate, Finish, GenerationSpec, StopConditions};
use reprolm::loaded_model::{LoadedModel, LoadOptions, Session};
use reprolm::sampling::SamplerConfig;
use reprolm::Error;

fn loaded() -> Arc<LoadedModel> {
    Arc::new(LoadedModel::load(common::model_path(), &LoadOptions::default()).expect("model loads"))
}

fn run(loaded: &Arc<LoadedModel>, prompt: &[u32], config: &SamplerConfig, stop: StopConditions) -> (Vec<u32>, Vec<String>, Finish) {
    let vocab = loaded.config().vocab_size;
    let session = Session::new(Arc::clone(loaded), 512).unwrap();
    let request = GenerationSpec::new(prompt.to_vec(), config.clone(), stop, vocab).unwrap();
    let mut generator = Generator::new(session, request).unwrap();
    let mut texts = Vec::new();
    let mut ids = Vec::new();
    while let Some(step) = generator.next_step().unwrap() {
        ids.push(step.selection.token);
        texts.push(step.text);
        assert_eq!(step.finish, generator.finish());
    }
    assert_eq!(ids, generator.generated());
    (ids, texts, generator.finish().unwrap())
}

fn stop_after(max_tokens: usize) -> StopConditions {
    StopConditions { max_tokens, ..StopConditions::default() }
}

#[test]
fn generator_matches_generate_and_decode() {
    let loaded = loaded();
    let vocab = loaded.config().vocab_size;
    let japanese = loaded.tokenizer.encode("<|im_start|>user\n日本語で挨拶してください。<|im_end|>\n<|im_start|>assistant\n", true).unwrap();
    for config in [SamplerConfig::greedy(), SamplerConfig { temperature: 0.9, seed: 5, ..SamplerConfig::default() }] {
        let (ids, texts, finish) = run(&loaded, &japanese, &config, stop_after(16));
        let mut session = Session::new(Arc::clone(&loaded), 512).unwrap();
        let request = GenerationSpec::new(japanese.clone(), config.clone(), stop_after(16), vocab).unwrap();
        let reference = generate(&mut session, request).unwrap();
        assert_eq!(ids, reference.ids);
        assert_eq!(reference.finish, Finish::Length);
        assert_eq!(finish, Finish::Length);
        assert_eq!(texts.concat(), loaded.tokenizer.decode(&ids).unwrap());
        assert!(texts.iter().any(String::is_empty), "no character was split across tokens");
    }
}

#[test]
fn stop_strings_and_errors() {
    let loaded = loaded();
    let g = &common::generations()[0]; // " Paris.\n\nThe answer is: ..."
    let greedy = SamplerConfig::greedy();
    let stop = |s: &[&str]| StopConditions {
        max_tokens: 30,
        stop_strings: s.iter().map(|s| s.to_string()).collect(),
        ..StopConditions::default()
    };
    let (ids, texts, finish) = run(&loaded, &g.prompt_ids, &greedy, stop(&["s.\n\nTh"]));
    assert_eq!((texts.concat().as_str(), finish), (" Pari", Finish::StopString(0)));
    assert_eq!(ids, g.greedy_ids[..5]);
    assert_eq!(texts, [" Pari", "", "", "", ""]);

    let vocab = loaded.config().vocab_size;
    let new = |prompt: &[u32], stop: StopConditions| {
        let session = Session::new(Arc::clone(&loaded), 64).unwrap();
        GenerationSpec::new(prompt.to_vec(), greedy.clone(), stop, vocab).and_then(|r| Generator::new(session, r)).err()
    };
    assert!(matches!(new(&[], stop(&[])), Some(Error::EmptyPrompt)));
    assert!(matches!(new(&[1], stop(&[""])), Some(Error::InvalidArgument { .. })));
    assert!(matches!(new(&[1; 40], stop(&[])), Some(Error::ContextOverflow { requested: 70, allowed: 64 })));
    let bad_stop = StopConditions { stop_token_ids: vec![vocab as u32], ..stop(&[]) };
    assert!(matches!(new(&[1], bad_stop), Some(Error::InvalidArgument { .. })));
}

#[test]
fn chat_template_from_the_file_reproduces_the_reference_prompt() {
    let loaded = loaded();
    let g = &common::generations()[2];
    let template = ChatTemplate::for_loaded(&loaded, None).unwrap();
    let text = template.render(&[Message::new("user", "What is the boiling point of water?")], true).unwrap();
    assert_eq!(text, g.prompt);
    assert_eq!(loaded.tokenizer.encode(&text, true).unwrap(), g.prompt_ids);
}
