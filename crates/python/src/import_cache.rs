//! Which lava-flow arenas this process has imported into CUDA, and for which channels: the
//! bookkeeping behind `cuda::imported`, kept free of CUDA so that it is tested without a GPU.
//!
//! An arena is named by its exporter (pid and per-run token) and its id, which lava-flow never
//! reuses within a run: the same key is the same memory. Each entry remembers the channels
//! that delivered a message in it; a channel that is freed takes its entries with it unless
//! another channel still uses them, and beyond `capacity` entries the one used longest ago
//! goes. An entry that goes is only dropped from the cache: the import itself is an `Arc`,
//! alive while a tensor (a DLPack capsule) still holds it.
use std::sync::Arc;

/// The identity of an exported arena (`lf_export`'s exporter and arena fields).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArenaKey {
    pub pid: u32,
    pub token: u64,
    pub arena: u64,
    pub size: u64,
}

struct Entry<V> {
    key: ArenaKey,
    value: Arc<V>,
    /// The channels (their ids) that delivered messages in this arena.
    channels: Vec<u64>,
    /// When it was last looked up (the cache's clock).
    used: u64,
}

/// The cache: a few entries (a channel's producer has a few arenas), so lookups scan.
pub struct ImportCache<V> {
    entries: Vec<Entry<V>>,
    capacity: usize,
    clock: u64,
}

impl<V> ImportCache<V> {
    pub const fn new(capacity: usize) -> Self {
        ImportCache { entries: Vec::new(), capacity, clock: 0 }
    }

    /// The import of `key`, noting that `channel` uses it.
    pub fn get(&mut self, key: &ArenaKey, channel: u64) -> Option<Arc<V>> {
        self.clock += 1;
        let clock = self.clock;
        let e = self.entries.iter_mut().find(|e| e.key == *key)?;
        e.used = clock;
        if !e.channels.contains(&channel) {
            e.channels.push(channel);
        }
        Some(e.value.clone())
    }

    /// Caches `value` as the import of `key` for `channel`; returns what had to go to keep
    /// within the capacity (to be dropped outside the caller's lock: the last reference
    /// destroys an import, which waits for the GPU).
    pub fn insert(&mut self, key: ArenaKey, channel: u64, value: Arc<V>) -> Vec<Arc<V>> {
        self.clock += 1;
        let mut gone = Vec::new();
        if let Some(i) = self.entries.iter().position(|e| e.key == key) {
            gone.push(self.entries.swap_remove(i).value);
        }
        while !self.entries.is_empty() && self.entries.len() >= self.capacity {
            let oldest = (0..self.entries.len()).min_by_key(|&i| self.entries[i].used).expect("not empty");
            gone.push(self.entries.swap_remove(oldest).value);
        }
        self.entries.push(Entry { key, value, channels: vec![channel], used: self.clock });
        gone
    }

    /// `channel` is gone: entries no other channel uses go too (returned, as by `insert`).
    pub fn forget_channel(&mut self, channel: u64) -> Vec<Arc<V>> {
        let mut gone = Vec::new();
        let mut i = 0;
        while i < self.entries.len() {
            let e = &mut self.entries[i];
            e.channels.retain(|&c| c != channel);
            if e.channels.is_empty() {
                gone.push(self.entries.swap_remove(i).value);
            } else {
                i += 1;
            }
        }
        gone
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(arena: u64) -> ArenaKey {
        ArenaKey { pid: 42, token: 7, arena, size: 64 << 20 }
    }

    #[test]
    fn an_arena_is_imported_once_for_many_messages_and_channels() {
        let mut c = ImportCache::new(4);
        assert!(c.get(&key(1), 10).is_none());
        assert!(c.insert(key(1), 10, Arc::new("import 1")).is_empty());
        for _ in 0..100 {
            assert_eq!(*c.get(&key(1), 10).unwrap(), "import 1");
        }
        // Another channel from the same exporter reuses it.
        assert_eq!(*c.get(&key(1), 11).unwrap(), "import 1");
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn another_exporter_or_run_is_another_arena() {
        let mut c = ImportCache::new(4);
        c.insert(key(1), 10, Arc::new(1));
        assert!(c.get(&ArenaKey { pid: 43, ..key(1) }, 10).is_none());
        assert!(c.get(&ArenaKey { token: 8, ..key(1) }, 10).is_none());
        assert!(c.get(&ArenaKey { size: 2 << 20, ..key(1) }, 10).is_none());
    }

    #[test]
    fn the_least_recently_used_goes_beyond_the_capacity() {
        let mut c = ImportCache::new(2);
        c.insert(key(1), 10, Arc::new(1));
        c.insert(key(2), 10, Arc::new(2));
        c.get(&key(1), 10);
        let gone = c.insert(key(3), 10, Arc::new(3));
        assert_eq!(gone.iter().map(|v| **v).collect::<Vec<_>>(), vec![2]);
        assert!(c.get(&key(2), 10).is_none());
        assert!(c.get(&key(1), 10).is_some() && c.get(&key(3), 10).is_some());
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn a_forgotten_channel_takes_the_arenas_only_it_used() {
        let mut c = ImportCache::new(8);
        c.insert(key(1), 10, Arc::new(1));
        c.insert(key(2), 11, Arc::new(2));
        c.get(&key(2), 10);
        let gone = c.forget_channel(10);
        assert_eq!(gone.iter().map(|v| **v).collect::<Vec<_>>(), vec![1]);
        assert!(c.get(&key(2), 12).is_some(), "channel 11 still uses arena 2");
        let gone = c.forget_channel(11);
        assert!(gone.is_empty(), "channel 12 looked arena 2 up as well");
        assert_eq!(c.forget_channel(12).len(), 1);
        assert_eq!(c.len(), 0);
    }

    #[test]
    fn a_tensor_keeps_an_import_the_cache_let_go() {
        let mut c = ImportCache::new(1);
        c.insert(key(1), 10, Arc::new(1));
        let held = c.get(&key(1), 10).unwrap();
        let gone = c.forget_channel(10);
        assert_eq!(Arc::strong_count(&held), 2, "the cache's reference is returned, not destroyed");
        drop(gone);
        assert_eq!(Arc::strong_count(&held), 1);
        assert_eq!(*held, 1);
    }

    #[test]
    fn reinserting_a_key_replaces_its_import() {
        let mut c = ImportCache::new(4);
        c.insert(key(1), 10, Arc::new(1));
        let gone = c.insert(key(1), 10, Arc::new(2));
        assert_eq!(gone.len(), 1);
        assert_eq!(*c.get(&key(1), 10).unwrap(), 2);
        assert_eq!(c.len(), 1);
    }
}
