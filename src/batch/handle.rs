//! What a caller holds for a submitted request: a [`RequestHandle`] on the request's event
//! channel, filled by the engine thread and drained by the caller, and cancellable from
//! either side.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::Duration;

use super::Wakeup;
use crate::decode::{Finish, Step};
use crate::error::Error;

/// What a request produces, in order: one `Token` per generated token (the last carries the
/// finish reason), or a single `Finished` when no token is generated (`max_tokens = 0`), or an
/// `Error` that ends the request.
#[derive(Debug)]
pub enum Event {
    Token(Step),
    Finished(Finish),
    Error(Error),
}

impl Event {
    /// Whether this is the request's last event.
    pub fn is_last(&self) -> bool {
        match self {
            Event::Token(step) => step.finish.is_some(),
            Event::Finished(_) | Event::Error(_) => true,
        }
    }
}

#[derive(Default)]
struct Queue {
    events: VecDeque<Event>,
    /// The last event has been pushed.
    closed: bool,
}

/// The channel between the engine and one request's handle.
pub(super) struct Channel {
    id: u64,
    queue: Mutex<Queue>,
    ready: Condvar,
    cancelled: AtomicBool,
    /// Events are announced to [`BatchEngine::wait_ready`](super::BatchEngine::wait_ready).
    watched: AtomicBool,
    /// Prompt positions copied from the prefix cache, set at admission (before any event).
    cached_tokens: AtomicUsize,
    /// Told about a cancellation (so the engine frees the request's cache at once) and about
    /// the events of a watched request.
    loaded: Weak<Wakeup>,
}

impl Channel {
    pub(super) fn new(id: u64, loaded: Weak<Wakeup>) -> Arc<Channel> {
        Arc::new(Channel {
            id,
            queue: Mutex::new(Queue::default()),
            ready: Condvar::new(),
            cancelled: AtomicBool::new(false),
            watched: AtomicBool::new(false),
            cached_tokens: AtomicUsize::new(0),
            loaded,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends an event (ignored after the last one).
    pub(super) fn push(&self, event: Event) {
        {
            let mut queue = self.lock();
            if queue.closed {
                return;
            }
            queue.closed = event.is_last();
            queue.events.push_back(event);
        }
        self.ready.notify_all();
        if self.watched.load(Ordering::Acquire) {
            if let Some(loaded) = self.loaded.upgrade() {
                loaded.event_ready(self.id);
            }
        }
    }

    pub(super) fn set_cached_tokens(&self, n: usize) {
        self.cached_tokens.store(n, Ordering::Release);
    }

    pub(super) fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }
}

/// The caller's side of a submitted request. Dropping it cancels the request.
pub struct RequestHandle {
    channel: Arc<Channel>,
}

/// The outcome of [`RequestHandle::next_event`].
#[derive(Debug)]
pub enum Poll {
    Event(Event),
    /// Nothing arrived within the timeout.
    Pending,
    /// Every event has been taken.
    Done,
}

impl RequestHandle {
    pub(super) fn new(channel: Arc<Channel>) -> RequestHandle {
        RequestHandle { channel }
    }

    /// The request's id, unique within its engine.
    pub fn id(&self) -> u64 {
        self.channel.id
    }

    /// The next event, waiting at most `timeout` for it (`None`: as long as it takes).
    pub fn next_event(&self, timeout: Option<Duration>) -> Poll {
        let mut queue = self.channel.lock();
        loop {
            if let Some(event) = queue.events.pop_front() {
                return Poll::Event(event);
            }
            if queue.closed {
                return Poll::Done;
            }
            queue = match timeout {
                None => self.channel.ready.wait(queue).unwrap_or_else(|e| e.into_inner()),
                Some(t) => {
                    let (queue, waited) = self.channel.ready.wait_timeout(queue, t).unwrap_or_else(|e| e.into_inner());
                    if waited.timed_out() && queue.events.is_empty() && !queue.closed {
                        return Poll::Pending;
                    }
                    queue
                }
            };
        }
    }

    /// Cancels the request: it produces no more tokens, ends with [`Error::Cancelled`] unless
    /// it had already finished, and its KV cache is freed before the engine's next pass.
    pub fn cancel(&self) {
        if !self.channel.cancelled.swap(true, Ordering::AcqRel) {
            self.channel.push(Event::Error(Error::Cancelled));
            if let Some(loaded) = self.channel.loaded.upgrade() {
                loaded.wake();
            }
        }
    }

    /// From now on, announce this request's events to
    /// [`BatchEngine::wait_ready`](super::BatchEngine::wait_ready) (an async dispatcher then
    /// wakes whoever awaits them). Announces once right away, so nothing produced before is
    /// missed.
    pub fn watch(&self) {
        self.channel.watched.store(true, Ordering::Release);
        if let Some(loaded) = self.channel.loaded.upgrade() {
            loaded.event_ready(self.channel.id);
        }
    }

    /// How many of the prompt's tokens were copied from the prefix cache rather than
    /// computed (0 until the request is admitted; set before its first event).
    pub fn cached_tokens(&self) -> usize {
        self.channel.cached_tokens.load(Ordering::Acquire)
    }

    /// Whether the request's last event has been produced (it may not have been taken yet).
    pub fn is_finished(&self) -> bool {
        self.channel.lock().closed
    }
}

impl Drop for RequestHandle {
    fn drop(&mut self) {
        self.cancel();
    }
}
