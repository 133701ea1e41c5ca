//! Deterministic test data shared by the tests of every crate and the fuzz targets.

use std::sync::{Arc, Mutex};

use crate::reservation::{Notice, State, Store, StoreError, Version};
pub use storage::testing::{pattern, InlineOnly};

/// A gateway group's shared reservation store, in memory, for tests: one state with a
/// version that every replacement bumps, handed to each "gateway" as its own [`Store`]
/// ([`MemStore::gateway`]). Publishing calls the other gateways' subscribers in turn (as a
/// watch/notify round with acknowledgements would), and a one-shot hook can slip another
/// writer's change in between a read and the conditional write.
#[derive(Default)]
pub struct MemStore {
    inner: Mutex<MemInner>,
}

type Subscriber = Box<dyn Fn(Version, &[Notice], bool) + Send + Sync>;
/// Another writer's change, slipped in before the next conditional write.
type Interference = Box<dyn FnOnce(&mut State) + Send>;

#[derive(Default)]
struct MemInner {
    state: State,
    version: Version,
    replaced: usize,
    refused: usize,
    subscribers: Vec<(usize, Arc<Subscriber>)>,
    before_replace: Option<Interference>,
}

impl std::fmt::Debug for MemStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        f.debug_struct("MemStore")
            .field("version", &g.version)
            .finish()
    }
}

impl MemStore {
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// Gateway `id`'s handle on the store.
    pub fn gateway(self: &Arc<Self>, id: usize) -> Arc<dyn Store> {
        Arc::new(MemGateway {
            store: Arc::clone(self),
            id,
        })
    }

    /// What gateway `id` does when another one publishes a change.
    pub fn subscribe(
        &self,
        id: usize,
        f: impl Fn(Version, &[Notice], bool) + Send + Sync + 'static,
    ) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.subscribers.push((id, Arc::new(Box::new(f))));
    }

    /// Another writer's change, applied to the stored state after the next read and before
    /// the write that follows it (which must then be refused as stale).
    pub fn before_next_replace(&self, f: impl FnOnce(&mut State) + Send + 'static) {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .before_replace = Some(Box::new(f));
    }

    /// (version, successful replacements, replacements refused as stale).
    pub fn counts(&self) -> (Version, usize, usize) {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        (g.version, g.replaced, g.refused)
    }
}

#[derive(Debug)]
struct MemGateway {
    store: Arc<MemStore>,
    id: usize,
}

impl Store for MemGateway {
    fn load(&self) -> Result<(State, Version), StoreError> {
        let g = self.store.inner.lock().unwrap_or_else(|e| e.into_inner());
        Ok((g.state.clone(), g.version))
    }

    fn replace(
        &self,
        version: Version,
        _before: &State,
        next: &State,
    ) -> Result<Version, StoreError> {
        let mut g = self.store.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = g.before_replace.take() {
            f(&mut g.state);
            g.version += 1;
        }
        if g.version != version {
            g.refused += 1;
            return Err(StoreError::Stale);
        }
        g.state = next.clone();
        g.version += 1;
        g.replaced += 1;
        Ok(g.version)
    }

    fn shared(&self) -> bool {
        true
    }

    fn alone(&self) -> Result<bool, StoreError> {
        let g = self.store.inner.lock().unwrap_or_else(|e| e.into_inner());
        Ok(!g.subscribers.iter().any(|(id, _)| *id != self.id))
    }

    fn publish(&self, version: Version, notices: &[Notice], abort: bool) {
        let others: Vec<_> = {
            let g = self.store.inner.lock().unwrap_or_else(|e| e.into_inner());
            g.subscribers
                .iter()
                .filter(|(id, _)| *id != self.id)
                .map(|(_, f)| Arc::clone(f))
                .collect()
        };
        for f in others {
            f(version, notices, abort);
        }
    }
}
