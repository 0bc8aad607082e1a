//! An arena of cache entries threaded on intrusive doubly linked lists.
//!
//! Most policies are a few queues of objects (LRU's one list, SLRU's two
//! segments, ARC's four). Keeping every entry in one `Vec` and linking them by
//! `u32` index means an access moves two or three indices around, allocates
//! nothing once the arena has grown, and a policy can move an entry from one
//! list to another without copying it. Freed slots are reused.
//!
//! Lists run from `head` (most recently inserted, "front") to `tail`
//! (oldest, "back"). A slot is on at most one list at a time; the caller
//! knows which (policies keep a segment tag in the entry's `meta`).

/// Index of a slot in a [`Slab`].
pub type Slot = u32;

use crate::policy::Evicted;

const NIL: Slot = Slot::MAX;

/// One cached (or ghost) object.
#[derive(Clone, Copy, Debug)]
pub struct Entry<M> {
    prev: Slot,
    next: Slot,
    pub id: u64,
    pub size: u64,
    /// Hits since admission (see `Evicted::hits`).
    pub hits: u32,
    /// Policy-specific state: a segment tag, a reference bit, a counter.
    pub meta: M,
}

impl<M> Entry<M> {
    /// The entry as reported when it leaves the cache.
    #[inline]
    pub fn evicted(&self) -> Evicted {
        Evicted {
            id: self.id,
            size: self.size,
            hits: self.hits,
        }
    }
}

/// The head and tail of one list, with its length and total bytes.
#[derive(Clone, Copy, Debug)]
pub struct List {
    head: Slot,
    tail: Slot,
    len: usize,
    bytes: u64,
}

impl Default for List {
    fn default() -> List {
        List {
            head: NIL,
            tail: NIL,
            len: 0,
            bytes: 0,
        }
    }
}

impl List {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Sum of the sizes of the entries on this list.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The most recently pushed entry.
    pub fn front(&self) -> Option<Slot> {
        (self.head != NIL).then_some(self.head)
    }

    /// The oldest entry.
    pub fn back(&self) -> Option<Slot> {
        (self.tail != NIL).then_some(self.tail)
    }
}

/// The arena.
#[derive(Clone, Debug, Default)]
pub struct Slab<M> {
    entries: Vec<Entry<M>>,
    free: Vec<Slot>,
}

impl<M: Copy> Slab<M> {
    pub fn with_capacity(n: usize) -> Slab<M> {
        Slab {
            entries: Vec::with_capacity(n),
            free: Vec::new(),
        }
    }

    /// A new unlinked entry.
    pub fn alloc(&mut self, id: u64, size: u64, meta: M) -> Slot {
        let entry = Entry {
            prev: NIL,
            next: NIL,
            id,
            size,
            hits: 0,
            meta,
        };
        if let Some(slot) = self.free.pop() {
            self.entries[slot as usize] = entry;
            slot
        } else {
            let slot = Slot::try_from(self.entries.len()).expect("fewer than 2^32 live entries");
            assert!(slot != NIL, "fewer than 2^32 - 1 live entries");
            self.entries.push(entry);
            slot
        }
    }

    /// Returns an unlinked slot to the free list.
    pub fn free(&mut self, slot: Slot) {
        debug_assert!(self.entries[slot as usize].prev == NIL);
        debug_assert!(self.entries[slot as usize].next == NIL);
        self.free.push(slot);
    }

    #[inline]
    pub fn get(&self, slot: Slot) -> &Entry<M> {
        &self.entries[slot as usize]
    }

    #[inline]
    pub fn get_mut(&mut self, slot: Slot) -> &mut Entry<M> {
        &mut self.entries[slot as usize]
    }

    /// Links an unlinked `slot` at the front of `list`.
    #[inline]
    pub fn push_front(&mut self, list: &mut List, slot: Slot) {
        let old_head = list.head;
        {
            let e = &mut self.entries[slot as usize];
            debug_assert!(e.prev == NIL && e.next == NIL, "slot already linked");
            e.next = old_head;
            e.prev = NIL;
            list.bytes += e.size;
        }
        if old_head != NIL {
            self.entries[old_head as usize].prev = slot;
        } else {
            list.tail = slot;
        }
        list.head = slot;
        list.len += 1;
    }

    /// Links an unlinked `slot` at the back of `list`.
    #[inline]
    pub fn push_back(&mut self, list: &mut List, slot: Slot) {
        let old_tail = list.tail;
        {
            let e = &mut self.entries[slot as usize];
            debug_assert!(e.prev == NIL && e.next == NIL, "slot already linked");
            e.prev = old_tail;
            e.next = NIL;
            list.bytes += e.size;
        }
        if old_tail != NIL {
            self.entries[old_tail as usize].next = slot;
        } else {
            list.head = slot;
        }
        list.tail = slot;
        list.len += 1;
    }

    /// Removes `slot` from `list`, which must hold it.
    #[inline]
    pub fn unlink(&mut self, list: &mut List, slot: Slot) {
        let (prev, next, size) = {
            let e = &mut self.entries[slot as usize];
            let out = (e.prev, e.next, e.size);
            e.prev = NIL;
            e.next = NIL;
            out
        };
        if prev != NIL {
            self.entries[prev as usize].next = next;
        } else {
            list.head = next;
        }
        if next != NIL {
            self.entries[next as usize].prev = prev;
        } else {
            list.tail = prev;
        }
        list.len -= 1;
        list.bytes -= size;
    }

    /// Moves `slot`, which `list` holds, to the front of `list`.
    #[inline]
    pub fn move_to_front(&mut self, list: &mut List, slot: Slot) {
        if list.head != slot {
            self.unlink(list, slot);
            self.push_front(list, slot);
        }
    }

    /// Unlinks and returns the oldest entry of `list`.
    #[inline]
    pub fn pop_back(&mut self, list: &mut List) -> Option<Slot> {
        let slot = list.back()?;
        self.unlink(list, slot);
        Some(slot)
    }

    /// Moves every entry of `other` behind the oldest entry of `list`,
    /// keeping their order, in O(1); `other` is left empty.
    pub fn append_back(&mut self, list: &mut List, other: &mut List) {
        if other.is_empty() {
            return;
        }
        if list.is_empty() {
            *list = std::mem::take(other);
            return;
        }
        self.entries[list.tail as usize].next = other.head;
        self.entries[other.head as usize].prev = list.tail;
        list.tail = other.tail;
        list.len += other.len;
        list.bytes += other.bytes;
        *other = List::default();
    }

    /// The entry after `slot` toward the back of its list (older).
    #[inline]
    pub fn older(&self, slot: Slot) -> Option<Slot> {
        let next = self.entries[slot as usize].next;
        (next != NIL).then_some(next)
    }

    /// The entry before `slot` toward the front of its list (newer).
    #[inline]
    pub fn newer(&self, slot: Slot) -> Option<Slot> {
        let prev = self.entries[slot as usize].prev;
        (prev != NIL).then_some(prev)
    }

    /// Every entry of `list`, front to back.
    pub fn iter<'a>(&'a self, list: &List) -> impl Iterator<Item = &'a Entry<M>> + 'a {
        let mut cursor = list.head;
        std::iter::from_fn(move || {
            if cursor == NIL {
                return None;
            }
            let e = &self.entries[cursor as usize];
            cursor = e.next;
            Some(e)
        })
    }

    /// Reports every entry of `lists` as it would leave the cache: the body
    /// of `Policy::for_each_resident` for list-based policies.
    pub fn report(&self, lists: &[&List], f: &mut dyn FnMut(Evicted)) {
        for list in lists {
            for e in self.iter(list) {
                f(e.evicted());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(slab: &Slab<()>, list: &List) -> Vec<u64> {
        slab.iter(list).map(|e| e.id).collect()
    }

    #[test]
    fn lists_keep_order_length_and_bytes() {
        let mut slab = Slab::with_capacity(4);
        let mut list = List::default();
        let a = slab.alloc(1, 10, ());
        let b = slab.alloc(2, 20, ());
        let c = slab.alloc(3, 30, ());
        slab.push_front(&mut list, a);
        slab.push_front(&mut list, b);
        slab.push_back(&mut list, c);
        assert_eq!(ids(&slab, &list), [2, 1, 3]);
        assert_eq!((list.len(), list.bytes()), (3, 60));
        slab.move_to_front(&mut list, c);
        assert_eq!(ids(&slab, &list), [3, 2, 1]);
        assert_eq!(slab.pop_back(&mut list), Some(a));
        slab.unlink(&mut list, c);
        assert_eq!(ids(&slab, &list), [2]);
        assert_eq!((list.len(), list.bytes()), (1, 20));
        slab.free(a);
        assert_eq!(slab.alloc(9, 1, ()), a, "freed slots are reused");
    }

    #[test]
    fn append_back_splices_a_whole_list_behind_another() {
        let mut slab = Slab::with_capacity(4);
        let (mut x, mut y) = (List::default(), List::default());
        for id in 1..=2 {
            let s = slab.alloc(id, id, ());
            slab.push_back(&mut x, s);
        }
        for id in 3..=4 {
            let s = slab.alloc(id, id, ());
            slab.push_back(&mut y, s);
        }
        slab.append_back(&mut x, &mut y);
        assert_eq!(ids(&slab, &x), [1, 2, 3, 4]);
        assert_eq!((x.len(), x.bytes()), (4, 10));
        assert!(y.is_empty() && y.bytes() == 0);
        let mut empty = List::default();
        slab.append_back(&mut empty, &mut x);
        assert_eq!(ids(&slab, &empty), [1, 2, 3, 4]);
        let back = empty.back().unwrap();
        assert_eq!((slab.get(back).id, slab.older(back)), (4, None));
    }

    #[test]
    fn entries_move_between_lists() {
        let mut slab = Slab::with_capacity(2);
        let (mut x, mut y) = (List::default(), List::default());
        let a = slab.alloc(1, 5, ());
        slab.push_front(&mut x, a);
        slab.unlink(&mut x, a);
        slab.push_front(&mut y, a);
        assert!(x.is_empty() && x.front().is_none());
        assert_eq!((y.len(), y.bytes(), y.back()), (1, 5, Some(a)));
    }
}
