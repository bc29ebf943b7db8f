//! What a request produced, read the two ways the engine tests compare: from the batch
//! engine's event stream, and from the request run alone on a session of its own.

use std::sync::Arc;

use reprolm::batch::{Event, Poll, RequestHandle};
use reprolm::decode::stream::Generator;
use reprolm::decode::{Finish, GenerationSpec};
use reprolm::loaded_model::{LoadedModel, Session, SessionOptions};
use reprolm::model::{KvDtype, Overflow};

/// What a request produced: ids, log-probability bits, text, finish.
pub type Outcome = (Vec<u32>, Vec<u64>, String, Finish);

/// A batch engine request's events until its last; panics on an error or an early end.
pub fn drain(handle: &RequestHandle) -> Outcome {
    let (mut ids, mut logprobs, mut text) = (Vec::new(), Vec::new(), String::new());
    loop {
        match handle.next_event(None) {
            Poll::Event(Event::Token(step)) => {
                ids.push(step.selection.token);
                logprobs.push(step.selection.logprob.to_bits());
                text.push_str(&step.text);
                if let Some(finish) = step.finish {
                    return (ids, logprobs, text, finish);
                }
            }
            Poll::Event(Event::Finished(finish)) => return (ids, logprobs, text, finish),
            Poll::Event(Event::Error(e)) => panic!("request failed: {e}"),
            Poll::Done | Poll::Pending => panic!("the stream ended without its last event"),
        }
    }
}

/// The request run alone on a fresh session with a cache of `dtype`, just long enough.
pub fn alone(loaded: &Arc<LoadedModel>, dtype: KvDtype, request: &GenerationSpec) -> Outcome {
    let options = SessionOptions {
        context_length: Some(request.positions_needed().max(1)),
        kv_dtype: dtype,
        overflow: Overflow::Error,
    };
    let session = Session::with_options(Arc::clone(loaded), &options).unwrap();
    let mut generator = Generator::new(session, request.clone()).unwrap();
    let (mut ids, mut logprobs, mut text) = (Vec::new(), Vec::new(), String::new());
    while let Some(step) = generator.next_step().unwrap() {
        ids.push(step.selection.token);
        logprobs.push(step.selection.logprob.to_bits());
        text.push_str(&step.text);
    }
    (ids, logprobs, text, generator.finish().unwrap())
}
