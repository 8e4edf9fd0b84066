//! Which CUDA address ranges a `lava_flow.torch` pool handed to PyTorch, and what each is: the
//! bookkeeping behind `torch_pool`, kept free of CUDA and Python so that it is tested without
//! a GPU.
//!
//! PyTorch's allocator asks for whole segments and frees them by their first address; a tensor
//! lies anywhere inside one (PyTorch splits segments into blocks), so a lookup finds the range
//! that holds an address, not only the one that starts there.
use std::collections::BTreeMap;

/// Address ranges, each with its value; ranges never overlap.
pub struct AddressMap<V> {
    ranges: BTreeMap<u64, (u64, V)>,
}

impl<V> Default for AddressMap<V> {
    fn default() -> Self {
        AddressMap::new()
    }
}

impl<V> AddressMap<V> {
    pub const fn new() -> Self {
        AddressMap { ranges: BTreeMap::new() }
    }

    /// Adds `[start, start + len)`; refused (the value handed back) when it is empty, wraps
    /// around, or overlaps a range present: the same memory cannot be handed out twice.
    pub fn insert(&mut self, start: u64, len: u64, value: V) -> Result<(), V> {
        let Some(end) = start.checked_add(len).filter(|_| len > 0) else { return Err(value) };
        let below = self.ranges.range(..end).next_back();
        if below.is_some_and(|(&s, &(l, _))| s + l > start) {
            return Err(value);
        }
        self.ranges.insert(start, (len, value));
        Ok(())
    }

    /// The range that holds `address`: its value and how far into it `address` is.
    pub fn find(&self, address: u64) -> Option<(&V, u64)> {
        let (&start, (len, value)) = self.ranges.range(..=address).next_back()?;
        (address - start < *len).then_some((value, address - start))
    }

    /// Takes out the range that starts at `start` (PyTorch frees a segment by its first address).
    pub fn remove(&mut self, start: u64) -> Option<V> {
        self.ranges.remove(&start).map(|(_, v)| v)
    }

    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    /// The bytes of every range together.
    pub fn bytes(&self) -> u64 {
        self.ranges.values().map(|(len, _)| len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_inside_a_range_finds_it_with_its_offset() {
        let mut m = AddressMap::new();
        m.insert(0x1000, 0x200, "a").unwrap();
        m.insert(0x2000, 0x100, "b").unwrap();
        assert_eq!(m.find(0x1000), Some((&"a", 0)));
        assert_eq!(m.find(0x11ff), Some((&"a", 0x1ff)));
        assert_eq!(m.find(0x2080), Some((&"b", 0x80)));
        assert_eq!(m.len(), 2);
        assert_eq!(m.bytes(), 0x300);
    }

    #[test]
    fn addresses_outside_every_range_find_nothing() {
        let mut m = AddressMap::new();
        m.insert(0x1000, 0x200, ()).unwrap();
        assert!(m.find(0xfff).is_none(), "below the first range");
        assert!(m.find(0x1200).is_none(), "one past the end");
        assert!(m.find(0).is_none());
        assert!(m.find(u64::MAX).is_none());
    }

    #[test]
    fn overlapping_empty_or_wrapping_ranges_are_refused() {
        let mut m = AddressMap::new();
        m.insert(0x1000, 0x200, 1).unwrap();
        assert_eq!(m.insert(0x1100, 0x10, 2), Err(2), "inside");
        assert_eq!(m.insert(0x0f00, 0x101, 3), Err(3), "runs into it");
        assert_eq!(m.insert(0x1000, 0x200, 4), Err(4), "the same");
        assert_eq!(m.insert(0x3000, 0, 5), Err(5), "empty");
        assert_eq!(m.insert(u64::MAX - 1, 4, 6), Err(6), "wraps around");
        m.insert(0x0f00, 0x100, 7).unwrap();
        m.insert(0x1200, 0x100, 8).unwrap();
        assert_eq!(m.len(), 3, "ranges that touch it are fine");
    }

    #[test]
    fn a_range_is_removed_by_its_start_only() {
        let mut m = AddressMap::new();
        m.insert(0x1000, 0x200, "a").unwrap();
        assert!(m.remove(0x1100).is_none(), "an address inside frees nothing");
        assert_eq!(m.remove(0x1000), Some("a"));
        assert!(m.remove(0x1000).is_none(), "a second free of the same address");
        assert!(m.find(0x1000).is_none());
        assert_eq!(m.len(), 0);
        m.insert(0x1000, 0x400, "again").unwrap();
        assert_eq!(m.find(0x13ff), Some((&"again", 0x3ff)), "the address may be handed out again");
    }
}
