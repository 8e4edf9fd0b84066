//! The suballocator of every pooled arena, CPU and GPU: which byte ranges of `[0, size)` are
//! handed out. Offsets and sizes only; it never touches the memory.
//!
//! Two-level segregated fit (TLSF): free ranges are kept in bins by size (8 bins per power of
//! two, exact below 8 bytes), a bitmap says which bins hold any, and each range knows its
//! neighbours in the arena so that a released range merges with them at once. Allocating and
//! releasing take a few bit operations and list links, O(1) whatever the arena's size or the
//! number of ranges, with no memory allocation once the arena has had its peak number of
//! ranges. Each allocation has its own alignment (GPU buffers need the device's); nothing is
//! rounded to a power of two, so a range wastes at most its alignment. A request fails only
//! when no free range can hold it (the last resort is a scan of the bins that may).

/// No node: the end of a list.
const NONE: u32 = u32::MAX;
/// Bins per power of two (log2).
const SUB_BITS: u32 = 3;
const SUB_BINS: u32 = 1 << SUB_BITS;
/// Enough bins for every `u64` size.
const BINS: usize = ((64 - SUB_BITS + 1) << SUB_BITS) as usize;
const GROUPS: usize = BINS / SUB_BINS as usize;

/// The bin of a range of `size` bytes: every size in bin `b` is at least `bin_min(b)`.
fn bin_of(size: u64) -> u32 {
    if size < u64::from(SUB_BINS) {
        return size as u32;
    }
    let top = 63 - size.leading_zeros();
    let shift = top - SUB_BITS;
    ((shift + 1) << SUB_BITS) | ((size >> shift) as u32 & (SUB_BINS - 1))
}

/// The first bin all of whose ranges hold `size` bytes.
fn bin_holding(size: u64) -> u32 {
    let bin = bin_of(size);
    if size < u64::from(SUB_BINS) {
        return bin;
    }
    let shift = 63 - size.leading_zeros() - SUB_BITS;
    bin + u32::from(size & ((1 << shift) - 1) != 0)
}

/// A range handed out: where it starts, and what [`Suballocator::release`] takes back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Allocation {
    pub(crate) offset: u64,
    node: u32,
}

/// A range of the arena, free or handed out.
#[derive(Clone, Copy, Debug)]
struct Node {
    offset: u64,
    size: u64,
    free: bool,
    /// Neighbours in the arena (address order).
    prev: u32,
    next: u32,
    /// Neighbours in the bin's list (free ranges only).
    bin_prev: u32,
    bin_next: u32,
}

/// The ranges of one arena.
#[derive(Debug)]
pub(crate) struct Suballocator {
    size: u64,
    used: u64,
    nodes: Vec<Node>,
    /// Slots of `nodes` to reuse.
    spare: Vec<u32>,
    /// The first free range of each bin.
    heads: Box<[u32; BINS]>,
    /// Bit `g`: some bin of group `g` (bins `8g..8g+8`) holds a range.
    groups: u64,
    /// Bit `b % 8` of `bins[b / 8]`: bin `b` holds a range.
    bins: [u8; GROUPS],
}

impl Suballocator {
    /// All of `[0, size)` free.
    pub(crate) fn new(size: u64) -> Self {
        let mut allocator = Suballocator {
            size,
            used: 0,
            nodes: Vec::new(),
            spare: Vec::new(),
            heads: Box::new([NONE; BINS]),
            groups: 0,
            bins: [0; GROUPS],
        };
        if size > 0 {
            let node = allocator.new_node(Node {
                offset: 0,
                size,
                free: true,
                prev: NONE,
                next: NONE,
                bin_prev: NONE,
                bin_next: NONE,
            });
            allocator.insert_free(node);
        }
        allocator
    }

    /// `size` bytes (more than 0) at an offset aligned to `align` (a power of two); `None` if
    /// no free range holds them.
    pub(crate) fn allocate(&mut self, size: u64, align: u64) -> Option<Allocation> {
        debug_assert!(align.is_power_of_two() && size > 0);
        let fits = |node: &Node| {
            let start = node.offset.checked_add(align - 1)? & !(align - 1);
            (start.checked_add(size)? <= node.offset + node.size).then_some(start)
        };
        // A range of the first bin whose ranges all hold `size` bytes, if it is aligned;
        // else one that holds them at any alignment; else any range that holds them.
        let node = self
            .first_bin_from(bin_holding(size))
            .map(|bin| self.heads[bin as usize])
            .filter(|&node| fits(&self.nodes[node as usize]).is_some())
            .or_else(|| {
                let padded = size.checked_add(align - 1)?;
                (align > 1)
                    .then(|| self.first_bin_from(bin_holding(padded)))
                    .flatten()
                    .map(|bin| self.heads[bin as usize])
            })
            .or_else(|| self.scan(bin_of(size), |node| fits(node).is_some()))?;
        let start = fits(&self.nodes[node as usize]).expect("the range was chosen because it fits");
        self.remove_free(node);
        let Node { offset, size: len, .. } = self.nodes[node as usize];
        if start > offset {
            let before = self.split_before(node, start - offset);
            self.insert_free(before);
        }
        if start + size < offset + len {
            let after = self.split_after(node, size);
            self.insert_free(after);
        }
        self.used += size;
        Some(Allocation { offset: start, node })
    }

    /// Gives back a range that [`allocate`](Self::allocate) handed out, merging it with the
    /// free ranges around it.
    pub(crate) fn release(&mut self, allocation: Allocation) {
        let mut node = allocation.node;
        let n = self.nodes[node as usize];
        debug_assert!(
            !n.free && n.offset == allocation.offset && n.offset + n.size <= self.size,
            "range released twice, or of another arena"
        );
        self.used -= n.size;
        self.nodes[node as usize].free = true;
        if n.prev != NONE && self.nodes[n.prev as usize].free {
            let prev = n.prev;
            self.remove_free(prev);
            self.merge_into_prev(node);
            node = prev;
        }
        let next = self.nodes[node as usize].next;
        if next != NONE && self.nodes[next as usize].free {
            self.remove_free(next);
            self.merge_into_prev(next);
        }
        self.insert_free(node);
    }

    /// The bytes handed out now.
    #[cfg_attr(not(feature = "vulkan"), allow(dead_code))]
    pub(crate) fn used(&self) -> u64 {
        self.used
    }

    /// Whether nothing is handed out.
    pub(crate) fn is_empty(&self) -> bool {
        self.used == 0
    }

    /// The first bin from `bin` on that holds a range.
    fn first_bin_from(&self, bin: u32) -> Option<u32> {
        let group = (bin / SUB_BINS) as usize;
        if group >= GROUPS {
            return None;
        }
        let here = self.bins[group] & (0xff << (bin % SUB_BINS));
        if here != 0 {
            return Some(group as u32 * SUB_BINS + here.trailing_zeros());
        }
        let later = self.groups & (!0u64).checked_shl(group as u32 + 1).unwrap_or(0);
        if later == 0 {
            return None;
        }
        let group = later.trailing_zeros();
        Some(group * SUB_BINS + self.bins[group as usize].trailing_zeros())
    }

    /// The first free range, in bins from `bin` on, that `wanted` accepts: the last resort.
    fn scan(&self, bin: u32, wanted: impl Fn(&Node) -> bool) -> Option<u32> {
        let mut bin = self.first_bin_from(bin)?;
        loop {
            let mut node = self.heads[bin as usize];
            while node != NONE {
                if wanted(&self.nodes[node as usize]) {
                    return Some(node);
                }
                node = self.nodes[node as usize].bin_next;
            }
            bin = self.first_bin_from(bin + 1)?;
        }
    }

    fn new_node(&mut self, node: Node) -> u32 {
        match self.spare.pop() {
            Some(index) => {
                self.nodes[index as usize] = node;
                index
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        }
    }

    /// Cuts the first `len` bytes off `node` into a new node before it (handed out, like
    /// `node`); returns the new node.
    fn split_before(&mut self, node: u32, len: u64) -> u32 {
        let n = self.nodes[node as usize];
        let before = self.new_node(Node { offset: n.offset, size: len, free: false, next: node, ..n });
        if n.prev != NONE {
            self.nodes[n.prev as usize].next = before;
        }
        let n = &mut self.nodes[node as usize];
        n.prev = before;
        n.offset += len;
        n.size -= len;
        before
    }

    /// Keeps the first `len` bytes of `node` and cuts the rest into a new node after it;
    /// returns the new node.
    fn split_after(&mut self, node: u32, len: u64) -> u32 {
        let n = self.nodes[node as usize];
        let after = self.new_node(Node { offset: n.offset + len, size: n.size - len, free: false, prev: node, ..n });
        if n.next != NONE {
            self.nodes[n.next as usize].prev = after;
        }
        let n = &mut self.nodes[node as usize];
        n.next = after;
        n.size = len;
        after
    }

    /// Merges `node` into the node before it, and recycles `node`.
    fn merge_into_prev(&mut self, node: u32) {
        let n = self.nodes[node as usize];
        let prev = &mut self.nodes[n.prev as usize];
        prev.size += n.size;
        prev.next = n.next;
        if n.next != NONE {
            self.nodes[n.next as usize].prev = n.prev;
        }
        self.spare.push(node);
    }

    fn insert_free(&mut self, node: u32) {
        let bin = bin_of(self.nodes[node as usize].size);
        let head = self.heads[bin as usize];
        let n = &mut self.nodes[node as usize];
        n.free = true;
        n.bin_prev = NONE;
        n.bin_next = head;
        if head != NONE {
            self.nodes[head as usize].bin_prev = node;
        }
        self.heads[bin as usize] = node;
        self.bins[(bin / SUB_BINS) as usize] |= 1 << (bin % SUB_BINS);
        self.groups |= 1 << (bin / SUB_BINS);
    }

    fn remove_free(&mut self, node: u32) {
        let n = self.nodes[node as usize];
        let bin = bin_of(n.size);
        if n.bin_prev != NONE {
            self.nodes[n.bin_prev as usize].bin_next = n.bin_next;
        } else {
            self.heads[bin as usize] = n.bin_next;
        }
        if n.bin_next != NONE {
            self.nodes[n.bin_next as usize].bin_prev = n.bin_prev;
        }
        self.nodes[node as usize].free = false;
        if self.heads[bin as usize] == NONE {
            let group = (bin / SUB_BINS) as usize;
            self.bins[group] &= !(1 << (bin % SUB_BINS));
            if self.bins[group] == 0 {
                self.groups &= !(1 << group);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    impl Suballocator {
        /// The free ranges in offset order.
        fn free_ranges(&self) -> Vec<(u64, u64)> {
            let mut ranges = Vec::new();
            for bin in 0..BINS {
                let mut node = self.heads[bin];
                while node != NONE {
                    let n = self.nodes[node as usize];
                    ranges.push((n.offset, n.size));
                    node = n.bin_next;
                }
            }
            ranges.sort_unstable();
            ranges
        }

        /// The longest free range: the largest request (at alignment 1) that would succeed.
        fn largest_free(&self) -> u64 {
            self.free_ranges().iter().map(|&(_, len)| len).max().unwrap_or(0)
        }

        /// Every invariant: the ranges, walked in address order, tile the arena; free ones are
        /// never adjacent, each is in the bin of its size and the bitmaps say which bins hold
        /// any; `used` is the size of the others.
        fn check(&self) {
            let listed = self.free_ranges();
            let mut walked = Vec::new();
            let mut used = 0;
            let first =
                (0..self.nodes.len() as u32).find(|&i| !self.spare.contains(&i) && self.nodes[i as usize].prev == NONE);
            let (mut node, mut end, mut last_free) = (first.unwrap_or(NONE), 0, false);
            while node != NONE {
                let n = self.nodes[node as usize];
                assert_eq!(n.offset, end, "ranges must tile the arena");
                assert!(n.size > 0);
                if n.free {
                    assert!(!last_free, "two free ranges side by side at {}", n.offset);
                    walked.push((n.offset, n.size));
                } else {
                    used += n.size;
                }
                if n.next != NONE {
                    assert_eq!(self.nodes[n.next as usize].prev, node);
                }
                (end, last_free, node) = (n.offset + n.size, n.free, n.next);
            }
            assert_eq!(end, self.size);
            assert_eq!(walked, listed, "the bins must list exactly the free ranges");
            assert_eq!(used, self.used);
            for bin in 0..BINS {
                let mut node = self.heads[bin];
                while node != NONE {
                    assert_eq!(bin_of(self.nodes[node as usize].size) as usize, bin);
                    node = self.nodes[node as usize].bin_next;
                }
                let marked = self.bins[bin / 8] & (1 << (bin % 8)) != 0;
                assert_eq!(marked, self.heads[bin] != NONE, "bitmap of bin {bin}");
                assert_eq!(self.groups & (1 << (bin / 8)) != 0, self.bins[bin / 8] != 0);
            }
        }
    }

    #[test]
    fn bins_order_sizes() {
        for size in 1..5000u64 {
            assert!(bin_of(size) <= bin_of(size + 1));
            assert!(bin_holding(size) >= bin_of(size) && bin_holding(size) <= bin_of(size) + 1);
            // Every size of the bin `bin_holding` names is at least `size`.
            let smallest = (size..).find(|&s| bin_of(s) == bin_holding(size)).unwrap();
            assert!(smallest >= size);
        }
        assert_eq!(bin_of(u64::MAX) as usize, BINS - 1);
    }

    #[test]
    fn aligns_splits_and_coalesces() {
        let mut list = Suballocator::new(1024);
        let a = list.allocate(100, 64).unwrap();
        let b = list.allocate(100, 64).unwrap();
        let c = list.allocate(300, 256).unwrap();
        assert_eq!((a.offset, b.offset, c.offset), (0, 128, 256));
        assert_eq!(list.allocate(600, 1), None);
        let d = list.allocate(20, 1).unwrap();
        assert!([100, 228].contains(&d.offset), "a 28-byte alignment gap serves 20 bytes: {}", d.offset);
        list.check();
        for range in [b, a, d, c] {
            list.release(range);
            list.check();
        }
        assert_eq!(list.free_ranges(), vec![(0, 1024)]);
        assert!(list.is_empty());
        assert_eq!(list.allocate(1024, 4096).map(|r| r.offset), Some(0));
        assert_eq!(list.allocate(1, 1), None);
        assert_eq!(list.largest_free(), 0);
    }

    #[test]
    fn small_holes_serve_small_requests() {
        let mut list = Suballocator::new(1 << 20);
        let small = list.allocate(64, 64).unwrap();
        let big = list.allocate(4096, 64).unwrap();
        let tail = list.allocate(64, 64).unwrap();
        assert_eq!((small.offset, big.offset, tail.offset), (0, 64, 4160));
        list.release(small);
        // The 64-byte hole serves the next 64-byte request, not the large free range after.
        assert_eq!(list.allocate(64, 64).map(|r| r.offset), Some(0));
        list.release(big);
        // The 4096-byte hole [64, 4160) cannot hold 4000 bytes at a 4096 boundary: they come
        // from the free range after `tail`; at 64 bytes' alignment the hole serves.
        assert_eq!(list.allocate(4000, 4096).map(|r| r.offset), Some(8192));
        assert_eq!(list.allocate(4000, 64).map(|r| r.offset), Some(64));
        list.check();
    }

    #[test]
    fn large_arenas_and_alignments() {
        // A 1 TiB GPU arena: offsets and alignments far beyond 32 bits.
        let mut list = Suballocator::new(1 << 40);
        let a = list.allocate(3, 1 << 32).unwrap();
        let b = list.allocate(1 << 39, 1 << 39).unwrap();
        assert_eq!((a.offset, b.offset), (0, 1 << 39));
        assert_eq!(list.allocate(1 << 39, 1), None, "3 bytes at 0 leave less than half");
        assert_eq!(list.largest_free(), (1 << 39) - 3);
        list.check();
        list.release(b);
        list.release(a);
        list.check();
        assert!(list.is_empty());
        assert_eq!(Suballocator::new(0).allocate(1, 1), None);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Allocate { size: u64, align_log2: u32 },
        Release { pick: usize },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (1u64..5000, 0u32..13).prop_map(|(size, align_log2)| Op::Allocate { size, align_log2 }),
            any::<usize>().prop_map(|pick| Op::Release { pick }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Any sequence of allocations and releases: every range handed out is aligned, inside
        /// the arena and disjoint from every other live one; a request fails only when no free
        /// range could hold it; releasing everything leaves the whole arena free again.
        #[test]
        fn ranges_stay_disjoint_aligned_and_coalesced(
            size in 1u64..(1 << 16),
            ops in proptest::collection::vec(op(), 1..200),
        ) {
            let mut list = Suballocator::new(size);
            let mut live: Vec<(Allocation, u64)> = Vec::new();
            for op in ops {
                match op {
                    Op::Allocate { size: want, align_log2 } => {
                        let align = 1u64 << align_log2;
                        match list.allocate(want, align) {
                            Some(range) => {
                                let offset = range.offset;
                                prop_assert_eq!(offset % align, 0);
                                prop_assert!(offset + want <= size);
                                for &(other, len) in &live {
                                    prop_assert!(offset + want <= other.offset || other.offset + len <= offset, "overlaps a live range");
                                }
                                live.push((range, want));
                            }
                            None => {
                                let fits = list.free_ranges().iter().any(|&(o, l)| {
                                    let start = (o + align - 1) & !(align - 1);
                                    start + want <= o + l
                                });
                                prop_assert!(!fits, "{} bytes at alignment {} were refused though a range holds them", want, align);
                            }
                        }
                    }
                    Op::Release { pick } => {
                        if !live.is_empty() {
                            let (range, _) = live.swap_remove(pick % live.len());
                            list.release(range);
                        }
                    }
                }
                list.check();
                prop_assert_eq!(list.used(), live.iter().map(|&(_, l)| l).sum::<u64>());
            }
            for (range, _) in live.drain(..) {
                list.release(range);
            }
            list.check();
            prop_assert_eq!(list.free_ranges(), vec![(0, size)]);
        }
    }
}
