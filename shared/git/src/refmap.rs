//! A sorted map of branch and tag names to ids that two holders can compare
//! in time proportional to where they differ, not to their size.
//!
//! Every operation compares ref listings: the mirror's against the local
//! remote's on a fetch, against the snapshot's on a load and a save. At
//! 10,000 packages a listing holds 20,000 refs, and a map compared, cloned
//! or dropped entry by entry costs milliseconds each time, although two
//! listings seldom differ in more than a few names.
//!
//! So the entries are kept in chunks whose ends are chosen by the names
//! themselves: a chunk ends after a name whose hash has its low bits zero
//! (32 entries on average). Any two maps with the same names in a stretch
//! therefore cut that stretch into the same chunks, however each was built,
//! and a chunk carries a digest of its entries. A comparison steps over
//! chunks that are shared, or equal by digest, and walks entries only
//! where the maps differ; a clone copies the list of chunks, and an edit
//! rewrites the chunk it falls in. The hashes are keyed by a random value
//! drawn once per process, so names chosen to defeat the chunking (one
//! huge chunk: the cost of a plain map again) or to collide two digests
//! cannot be computed in advance.

use gix::ObjectId;
use std::sync::{Arc, LazyLock};

/// A chunk ends after a name whose hash has these bits zero.
const BOUNDARY_MASK: u64 = 31;

/// The per-process keys of the chunk boundaries and digests.
struct Keys {
    boundary: u64,
    digest: [u8; 16],
}

static KEYS: LazyLock<Keys> = LazyLock::new(|| {
    use std::hash::{BuildHasher as _, Hasher as _};
    let random = |salt: u64| {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u64(salt);
        hasher.finish()
    };
    let mut digest = [0u8; 16];
    digest[..8].copy_from_slice(&random(1).to_le_bytes());
    digest[8..].copy_from_slice(&random(2).to_le_bytes());
    Keys {
        boundary: random(0),
        digest,
    }
});

/// Whether a chunk ends after `name`: FNV-1a from the process's key, then
/// a 64-bit finaliser so every bit depends on every byte.
fn is_boundary(name: &str) -> bool {
    let mut hash = KEYS.boundary ^ 0xcbf2_9ce4_8422_2325;
    for byte in name.as_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    hash ^= hash >> 33;
    hash & BOUNDARY_MASK == 0
}

/// A run of entries that ends after a boundary name or at the map's end.
struct Chunk {
    entries: Vec<(String, ObjectId)>,
    digest: [u8; 20],
}

impl Chunk {
    fn new(entries: Vec<(String, ObjectId)>) -> Self {
        use sha1::Digest as _;
        let mut hasher = sha1::Sha1::new();
        hasher.update(KEYS.digest);
        for (name, id) in &entries {
            // the length first: no two lists of entries hash the same bytes
            hasher.update((name.len() as u64).to_le_bytes());
            hasher.update(name.as_bytes());
            hasher.update(id.as_bytes());
        }
        Self {
            digest: hasher.finalize().into(),
            entries,
        }
    }

    fn same(a: &Arc<Chunk>, b: &Arc<Chunk>) -> bool {
        Arc::ptr_eq(a, b) || (a.entries.len() == b.entries.len() && a.digest == b.digest)
    }
}

/// Sorted, deduplicated entries cut into chunks.
fn chunked(entries: Vec<(String, ObjectId)>, out: &mut Vec<Arc<Chunk>>) {
    let mut run = Vec::new();
    for (name, id) in entries {
        let end = is_boundary(&name);
        run.push((name, id));
        if end {
            out.push(Arc::new(Chunk::new(std::mem::take(&mut run))));
        }
    }
    if !run.is_empty() {
        out.push(Arc::new(Chunk::new(run)));
    }
}

/// Branch and tag names → the ids their refs hold, in name order.
#[derive(Clone, Default)]
pub struct RefMap {
    chunks: Vec<Arc<Chunk>>,
    len: usize,
}

impl RefMap {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The chunk `name` falls in: the last one starting at or before it
    /// (the first one for a name before every other).
    fn chunk_of(&self, name: &str) -> usize {
        self.chunks
            .partition_point(|c| c.entries[0].0.as_str() <= name)
            .saturating_sub(1)
    }

    pub fn get(&self, name: &str) -> Option<&ObjectId> {
        let chunk = self.chunks.get(self.chunk_of(name))?;
        chunk
            .entries
            .binary_search_by(|(n, _)| n.as_str().cmp(name))
            .ok()
            .map(|at| &chunk.entries[at].1)
    }

    pub fn contains_key(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// Sets `name` to `id`, returning its id before.
    pub fn insert(&mut self, name: String, id: ObjectId) -> Option<ObjectId> {
        if self.chunks.is_empty() {
            self.chunks.push(Arc::new(Chunk::new(vec![(name, id)])));
            self.len = 1;
            return None;
        }
        let at = self.chunk_of(&name);
        if let Ok(found) = self.chunks[at]
            .entries
            .binary_search_by(|(n, _)| n.as_str().cmp(&name))
        {
            let old = self.chunks[at].entries[found].1;
            if old != id {
                let mut entries = self.chunks[at].entries.clone();
                entries[found].1 = id;
                self.chunks[at] = Arc::new(Chunk::new(entries));
            }
            return Some(old);
        }
        self.rechunk(at, |entries| {
            let pos = entries.partition_point(|(n, _)| *n < name);
            entries.insert(pos, (name, id));
        });
        self.len += 1;
        None
    }

    /// Removes `name`, returning its id.
    pub fn remove(&mut self, name: &str) -> Option<ObjectId> {
        let at = self.chunk_of(name);
        let found = self
            .chunks
            .get(at)?
            .entries
            .binary_search_by(|(n, _)| n.as_str().cmp(name))
            .ok()?;
        let old = self.chunks[at].entries[found].1;
        self.rechunk(at, |entries| {
            entries.remove(found);
        });
        self.len -= 1;
        Some(old)
    }

    /// Edits chunk `at` and cuts it again with the one after it (an entry
    /// added after its boundary name belongs to the next chunk; its
    /// boundary name removed, it runs on into the next one).
    fn rechunk(&mut self, at: usize, edit: impl FnOnce(&mut Vec<(String, ObjectId)>)) {
        let end = (at + 2).min(self.chunks.len());
        let mut entries: Vec<(String, ObjectId)> = self.chunks[at].entries.clone();
        edit(&mut entries);
        if end == at + 2 {
            entries.extend(self.chunks[at + 1].entries.iter().cloned());
        }
        let mut cut = Vec::new();
        chunked(entries, &mut cut);
        self.chunks.splice(at..end, cut);
    }

    pub fn iter(&self) -> Iter<'_> {
        Iter {
            chunks: self.chunks.iter(),
            entries: [].iter(),
        }
    }

    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.iter().map(|(name, _)| name)
    }

    pub fn values(&self) -> impl Iterator<Item = &ObjectId> {
        self.iter().map(|(_, id)| id)
    }

    /// The entries whose names start with `prefix`, in name order, found
    /// from the chunk the prefix falls in.
    pub fn prefixed<'a>(
        &'a self,
        prefix: &'a str,
    ) -> impl Iterator<Item = (&'a String, &'a ObjectId)> + 'a {
        let from = self.chunk_of(prefix);
        Iter {
            chunks: self.chunks[from.min(self.chunks.len())..].iter(),
            entries: [].iter(),
        }
        .skip_while(move |(name, _)| name.as_str() < prefix)
        .take_while(move |(name, _)| name.starts_with(prefix))
    }

    /// Whether any name holds `id`.
    pub fn contains_value(&self, id: &ObjectId) -> bool {
        self.values().any(|v| v == id)
    }
}

/// The entries of a [`RefMap`] in name order.
#[derive(Debug)]
pub struct Iter<'a> {
    chunks: std::slice::Iter<'a, Arc<Chunk>>,
    entries: std::slice::Iter<'a, (String, ObjectId)>,
}

impl<'a> Iterator for Iter<'a> {
    type Item = (&'a String, &'a ObjectId);

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some((name, id)) = self.entries.next() {
                return Some((name, id));
            }
            self.entries = self.chunks.next()?.entries.iter();
        }
    }
}

impl<'a> IntoIterator for &'a RefMap {
    type Item = (&'a String, &'a ObjectId);
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

impl std::fmt::Debug for Chunk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.entries.iter().map(|(n, id)| (n, id)))
            .finish()
    }
}

impl std::fmt::Debug for RefMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl FromIterator<(String, ObjectId)> for RefMap {
    /// As a `BTreeMap` collects: a name given twice keeps its last id.
    fn from_iter<I: IntoIterator<Item = (String, ObjectId)>>(iter: I) -> Self {
        let mut entries: Vec<(String, ObjectId)> = iter.into_iter().collect();
        // stable: of equal names the last one given stays last
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let mut deduplicated: Vec<(String, ObjectId)> = Vec::with_capacity(entries.len());
        for entry in entries {
            match deduplicated.last_mut() {
                Some(last) if last.0 == entry.0 => *last = entry,
                _ => deduplicated.push(entry),
            }
        }
        let len = deduplicated.len();
        let mut chunks = Vec::with_capacity(len / 16 + 1);
        chunked(deduplicated, &mut chunks);
        Self { chunks, len }
    }
}

impl<const N: usize> From<[(String, ObjectId); N]> for RefMap {
    fn from(entries: [(String, ObjectId); N]) -> Self {
        entries.into_iter().collect()
    }
}

impl From<std::collections::BTreeMap<String, ObjectId>> for RefMap {
    fn from(map: std::collections::BTreeMap<String, ObjectId>) -> Self {
        let len = map.len();
        let mut chunks = Vec::with_capacity(len / 16 + 1);
        chunked(map.into_iter().collect(), &mut chunks);
        Self { chunks, len }
    }
}

impl Extend<(String, ObjectId)> for RefMap {
    fn extend<I: IntoIterator<Item = (String, ObjectId)>>(&mut self, iter: I) {
        for (name, id) in iter {
            self.insert(name, id);
        }
    }
}

impl std::ops::Index<&str> for RefMap {
    type Output = ObjectId;

    fn index(&self, name: &str) -> &ObjectId {
        match self.get(name) {
            Some(id) => id,
            None => panic!("no ref {name:?} in the map"),
        }
    }
}

impl PartialEq for RefMap {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && Walk::new(self, other).next().is_none()
    }
}

impl Eq for RefMap {}

/// The names whose ids differ between two maps, in name order, each with
/// its id before and after (`None`: absent). Chunks both hold are stepped
/// over: the cost is in the number of chunks and the entries of the ones
/// that differ.
pub fn differences<'a>(
    before: &'a RefMap,
    after: &'a RefMap,
) -> Vec<(&'a str, Option<ObjectId>, Option<ObjectId>)> {
    if std::ptr::eq(before, after) {
        return Vec::new();
    }
    Walk::new(before, after).collect()
}

/// A position in a map: a chunk and an entry in it.
#[derive(Clone, Copy)]
struct Cursor {
    chunk: usize,
    entry: usize,
}

impl Cursor {
    fn entry<'a>(&self, map: &'a RefMap) -> Option<&'a (String, ObjectId)> {
        map.chunks.get(self.chunk).map(|c| &c.entries[self.entry])
    }

    fn advance(&mut self, map: &RefMap) {
        self.entry += 1;
        if self.entry == map.chunks[self.chunk].entries.len() {
            self.chunk += 1;
            self.entry = 0;
        }
    }
}

/// The side-by-side walk of [`differences`].
struct Walk<'a> {
    before: &'a RefMap,
    after: &'a RefMap,
    old: Cursor,
    new: Cursor,
}

impl<'a> Walk<'a> {
    fn new(before: &'a RefMap, after: &'a RefMap) -> Self {
        let start = Cursor { chunk: 0, entry: 0 };
        Self {
            before,
            after,
            old: start,
            new: start,
        }
    }
}

impl<'a> Iterator for Walk<'a> {
    type Item = (&'a str, Option<ObjectId>, Option<ObjectId>);

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            // both at the start of a chunk: equal chunks are stepped over
            while self.old.entry == 0
                && self.new.entry == 0
                && let (Some(a), Some(b)) = (
                    self.before.chunks.get(self.old.chunk),
                    self.after.chunks.get(self.new.chunk),
                )
                && Chunk::same(a, b)
            {
                self.old.chunk += 1;
                self.new.chunk += 1;
            }
            match (self.old.entry(self.before), self.new.entry(self.after)) {
                (None, None) => return None,
                (Some((name, id)), None) => {
                    self.old.advance(self.before);
                    return Some((name.as_str(), Some(*id), None));
                }
                (None, Some((name, id))) => {
                    self.new.advance(self.after);
                    return Some((name.as_str(), None, Some(*id)));
                }
                (Some((a, a_id)), Some((b, b_id))) => match a.cmp(b) {
                    std::cmp::Ordering::Less => {
                        self.old.advance(self.before);
                        return Some((a.as_str(), Some(*a_id), None));
                    }
                    std::cmp::Ordering::Greater => {
                        self.new.advance(self.after);
                        return Some((b.as_str(), None, Some(*b_id)));
                    }
                    std::cmp::Ordering::Equal => {
                        self.old.advance(self.before);
                        self.new.advance(self.after);
                        if a_id != b_id {
                            return Some((a.as_str(), Some(*a_id), Some(*b_id)));
                        }
                    }
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn id(n: u32) -> ObjectId {
        let mut bytes = [0u8; 20];
        bytes[..4].copy_from_slice(&n.to_be_bytes());
        ObjectId::from_bytes_or_panic(&bytes)
    }

    /// The chunks are the ones a map of the same entries built at once has.
    fn assert_canonical(map: &RefMap) {
        let rebuilt: RefMap = map.iter().map(|(n, id)| (n.clone(), *id)).collect();
        let cut = |m: &RefMap| {
            m.chunks
                .iter()
                .map(|c| (c.entries.clone(), c.digest))
                .collect::<Vec<_>>()
        };
        assert_eq!(cut(map), cut(&rebuilt));
        assert_eq!(map.len(), rebuilt.len());
        assert!(map.chunks.iter().all(|c| !c.entries.is_empty()));
    }

    /// A small deterministic generator (no dependency for tests).
    struct Lcg(u64);

    impl Lcg {
        fn next(&mut self, below: u32) -> u32 {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            u32::try_from((self.0 >> 33) % u64::from(below)).expect("below a u32")
        }
    }

    #[test]
    fn edits_keep_the_map_equal_to_a_btree_map_and_its_chunks_canonical() {
        let mut random = Lcg(7);
        let mut map = RefMap::new();
        let mut model = BTreeMap::new();
        for step in 0..4_000u32 {
            let name = format!("refs/tags/pkg-{}/v1", random.next(600));
            if random.next(4) == 0 {
                assert_eq!(map.remove(&name), model.remove(&name), "{name}");
            } else {
                let value = id(random.next(3));
                assert_eq!(
                    map.insert(name.clone(), value),
                    model.insert(name.clone(), value)
                );
            }
            if step % 97 == 0 {
                assert_canonical(&map);
            }
            assert_eq!(map.len(), model.len());
        }
        assert_canonical(&map);
        assert!(map.chunks.len() > 4, "several chunks: {}", map.chunks.len());
        assert!(map.iter().map(|(n, i)| (n.clone(), *i)).eq(model.clone()));
        for (name, value) in &model {
            assert_eq!(map.get(name), Some(value));
            assert_eq!(map[name.as_str()], *value);
        }
        for prefix in [
            "refs/tags/pkg-1",
            "refs/tags/pkg-59",
            "refs/tags/",
            "",
            "refs/z",
            "a",
        ] {
            assert!(
                map.prefixed(prefix).map(|(n, i)| (n.clone(), *i)).eq(model
                    .iter()
                    .filter(|(n, _)| n.starts_with(prefix))
                    .map(|(n, i)| (n.clone(), *i))),
                "{prefix}"
            );
        }
        assert_eq!(map.get("refs/heads/nothing"), None);
        assert_eq!(map.get(""), None);
        assert_eq!(map.get("zzz"), None);
        assert_eq!(RefMap::from(model), map);
    }

    #[test]
    fn from_iter_keeps_the_last_id_of_a_name_as_a_btree_map_does() {
        let entries = vec![
            ("refs/heads/b".to_owned(), id(1)),
            ("refs/heads/a".to_owned(), id(1)),
            ("refs/heads/b".to_owned(), id(2)),
        ];
        let map: RefMap = entries.clone().into_iter().collect();
        let model: BTreeMap<String, ObjectId> = entries.into_iter().collect();
        assert_eq!(map.len(), 2);
        assert!(map.iter().map(|(n, i)| (n.clone(), *i)).eq(model));
    }

    #[test]
    fn differences_and_equality_match_a_walk_over_every_entry() {
        let mut random = Lcg(11);
        let base: RefMap = (0..3_000u32)
            .map(|i| (format!("refs/tags/p{i}/v1"), id(i)))
            .collect();
        for round in 0..60 {
            // one edited from the other, or built apart with the same edits
            let mut after = base.clone();
            let mut model: BTreeMap<String, ObjectId> =
                base.iter().map(|(n, i)| (n.clone(), *i)).collect();
            for _ in 0..random.next(12) {
                let name = format!("refs/tags/p{}/v1", random.next(3_200));
                if random.next(3) == 0 {
                    after.remove(&name);
                    model.remove(&name);
                } else {
                    let value = id(random.next(5));
                    after.insert(name.clone(), value);
                    model.insert(name, value);
                }
            }
            let apart: RefMap = model.clone().into_iter().collect();
            let model_base: BTreeMap<String, ObjectId> =
                base.iter().map(|(n, i)| (n.clone(), *i)).collect();
            let expected: Vec<(String, Option<ObjectId>, Option<ObjectId>)> = model_base
                .keys()
                .chain(model.keys())
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .map(|n| (n.clone(), model_base.get(n).copied(), model.get(n).copied()))
                .filter(|(_, a, b)| a != b)
                .collect();
            let owned = |d: Vec<(&str, Option<ObjectId>, Option<ObjectId>)>| {
                d.into_iter()
                    .map(|(n, a, b)| (n.to_owned(), a, b))
                    .collect::<Vec<_>>()
            };
            assert_eq!(owned(differences(&base, &after)), expected, "round {round}");
            assert_eq!(owned(differences(&base, &apart)), expected, "round {round}");
            let reversed: Vec<_> = expected
                .iter()
                .map(|(n, a, b)| (n.clone(), *b, *a))
                .collect();
            assert_eq!(owned(differences(&apart, &base)), reversed);
            assert_eq!(base == after, expected.is_empty());
            assert!(after == apart);
        }
    }

    #[test]
    fn a_one_name_change_leaves_all_but_a_chunk_or_two_shared() {
        let base: RefMap = (0..20_000u32)
            .map(|i| (format!("refs/tags/pkg-{i}/v1"), id(i)))
            .collect();
        let mut after = base.clone();
        after.insert("refs/tags/pkg-new/v1".to_owned(), id(1));
        after.insert("refs/heads/main".to_owned(), id(2));
        let shared = after
            .chunks
            .iter()
            .filter(|c| base.chunks.iter().any(|b| Arc::ptr_eq(b, c)))
            .count();
        assert!(
            shared + 4 >= after.chunks.len(),
            "{shared} of {} chunks shared",
            after.chunks.len()
        );
        assert_eq!(differences(&base, &after).len(), 2);
    }
}
