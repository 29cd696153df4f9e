//! Pack files: the objects a remote lacks, written as a pack to push or to
//! upload to a snapshot; and received packs indexed into a repository.
//!
//! Which objects a remote lacks is computed from the commit graph: the
//! commits reachable from the new tips but not from any tip the remote is
//! known to have, and in each of them the trees and blobs that differ from
//! the same path in every parent. Unchanged subtrees are skipped by id, so
//! the cost grows with the size of the change, not of the repository.

use crate::repo::{GitRepo, RepoError};
use gix::ObjectId;
use gix::objs::tree::EntryKind;
use gix::progress::Discard;
use gix::zlib::stream::deflate::Compress;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicBool;

fn pack_error(step: &'static str) -> impl FnOnce(gix::Error) -> RepoError {
    move |e| RepoError::Git {
        step,
        source: e.into(),
    }
}

/// Git's order of tree entries: by name, a tree's name compared as if it
/// ended with `/`.
fn git_order(a: &[u8], a_tree: bool, b: &[u8], b_tree: bool) -> std::cmp::Ordering {
    let common = a.len().min(b.len());
    a[..common].cmp(&b[..common]).then_with(|| {
        let next = |name: &[u8], tree: bool| {
            name.get(common)
                .copied()
                .unwrap_or(if tree { b'/' } else { 0 })
        };
        next(a, a_tree)
            .cmp(&next(b, b_tree))
            .then_with(|| a.len().cmp(&b.len()))
    })
}

/// One entry of a tree's bytes: `<mode> <name>\0<20-byte id>`.
struct RawEntry<'a> {
    mode: gix::objs::tree::EntryMode,
    name: &'a [u8],
    id: ObjectId,
    /// Bytes the entry takes.
    len: usize,
}

impl<'a> RawEntry<'a> {
    /// The entry `data` starts with.
    fn at(data: &'a [u8]) -> Result<Self, RepoError> {
        let malformed = || RepoError::Git {
            step: "decode a tree",
            source: "a tree entry is malformed".into(),
        };
        let space = data
            .iter()
            .take(8)
            .position(|b| *b == b' ')
            .ok_or_else(malformed)?;
        let mode = gix::objs::tree::EntryMode::from_bytes(&data[..=space]).ok_or_else(malformed)?;
        let name_len = data[space + 1..]
            .iter()
            .position(|b| *b == 0)
            .ok_or_else(malformed)?;
        let id_at = space + 1 + name_len + 1;
        let id = data.get(id_at..id_at + 20).ok_or_else(malformed)?;
        Ok(Self {
            mode,
            name: &data[space + 1..space + 1 + name_len],
            id: ObjectId::from_bytes_or_panic(id),
            len: id_at + 20,
        })
    }
}

/// How many bytes the entry `data` starts with takes, found by its name's
/// terminating NUL alone: for stepping over entries two trees share (the
/// entry where they differ is decoded whole with [`RawEntry::at`]).
fn entry_len(data: &[u8]) -> Option<usize> {
    use gix::bstr::ByteSlice as _;
    // `memchr`: the names of a root tree of 10,000 packages are 350 KB to step over
    let len = data.find_byte(0)? + 21;
    (len <= data.len()).then_some(len)
}

/// A tree's bytes with the entries named in `edits` removed (whatever
/// their kind) and, for `Some` ids, directory entries of those names put in
/// their places in git's order. Names hold no `/`.
///
/// # Errors
/// A malformed tree.
pub(crate) fn splice_directories(
    data: &[u8],
    edits: &std::collections::BTreeMap<&[u8], Option<ObjectId>>,
) -> Result<Vec<u8>, RepoError> {
    let mut inserts: Vec<(&[u8], ObjectId)> = edits
        .iter()
        .filter_map(|(name, id)| Some((*name, (*id)?)))
        .collect();
    inserts.sort_by(|(a, _), (b, _)| git_order(a, true, b, true));
    let mut inserts = inserts.into_iter().peekable();
    let mut out = Vec::with_capacity(data.len() + inserts.len() * 64);
    let directory = |out: &mut Vec<u8>, name: &[u8], id: ObjectId| {
        out.extend_from_slice(b"40000 ");
        out.extend_from_slice(name);
        out.push(0);
        out.extend_from_slice(id.as_bytes());
    };
    // bytes from `run` on are copied as they are when the next edit comes
    let (mut at, mut run) = (0, 0);
    while at < data.len() {
        let entry = RawEntry::at(&data[at..])?;
        while let Some((name, id)) = inserts
            .next_if(|(name, _)| git_order(name, true, entry.name, entry.mode.is_tree()).is_lt())
        {
            out.extend_from_slice(&data[run..at]);
            run = at;
            directory(&mut out, name, id);
        }
        if edits.contains_key(entry.name) {
            out.extend_from_slice(&data[run..at]);
            run = at + entry.len;
        }
        at += entry.len;
    }
    out.extend_from_slice(&data[run..]);
    for (name, id) in inserts {
        directory(&mut out, name, id);
    }
    Ok(out)
}

/// The most a tree delta inserts in one stretch before it walks both
/// trees entry by entry for the runs they share.
const ONE_STRETCH_AT_MOST: usize = 4096;

/// How many trailing bytes `a` and `b` share.
fn common_suffix(a: &[u8], b: &[u8]) -> usize {
    const CHUNK: usize = 128;
    let n = a.len().min(b.len());
    let (a, b) = (&a[a.len() - n..], &b[b.len() - n..]);
    let mut i = 0;
    // whole chunks compare with `memcmp`
    while i + CHUNK <= n && a[n - i - CHUNK..n - i] == b[n - i - CHUNK..n - i] {
        i += CHUNK;
    }
    while i < n && a[n - i - 1] == b[n - i - 1] {
        i += 1;
    }
    i
}

/// How many leading bytes `a` and `b` share.
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    const CHUNK: usize = 128;
    let n = a.len().min(b.len());
    let mut i = 0;
    // whole chunks compare with `memcmp`
    while i + CHUNK <= n && a[i..i + CHUNK] == b[i..i + CHUNK] {
        i += CHUNK;
    }
    while i < n && a[i] == b[i] {
        i += 1;
    }
    i
}

/// What a walk for objects to send found.
#[derive(Debug, Default)]
struct Found {
    seen: HashSet<ObjectId>,
    /// The objects, in the order found.
    out: Vec<ObjectId>,
    /// New trees with the tree at their path in the first parent commit.
    pairs: DeltaBases,
}

/// New trees, each with the tree at its path in its commit's first
/// parent: the bases [`GitRepo::write_thin_pack`] may store them against.
pub type DeltaBases = Vec<(ObjectId, ObjectId)>;

/// A large tree a pack holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredTree {
    pub id: ObjectId,
    /// How many deltas it stands on (0: stored whole).
    pub depth: u8,
    /// The tree at its path in its commit's first parent, when that
    /// differs (a base a compaction may store it against).
    pub base: Option<ObjectId>,
}

/// The large trees a pack holds.
pub type StoredTrees = Vec<StoredTree>;

/// How many deltas a large tree in a snapshot may stand on, one pack
/// each: gix resolves a base in another pack by recursion, up to 32 deep.
pub const MAX_DELTA_DEPTH: u8 = 8;

/// A git delta (as `OBJ_REF_DELTA` and `OBJ_OFS_DELTA` entries hold)
/// that makes the tree `target` from the tree `base`: the two are walked
/// entry by entry in git's order, runs of entries they share are copied
/// from the base (found with one `memcmp` each, as in
/// [`GitRepo::new_tree_objects`]), and the target's other entries are
/// inserted. A root tree with a few packages changed is a few copies and
/// inserts. `None` when more than half of `target` would be inserted
/// (storing it whole is as good), or for a malformed tree.
pub(crate) fn tree_delta(base: &[u8], target: &[u8]) -> Option<Vec<u8>> {
    let mut delta = Vec::with_capacity(256);
    let varint = |delta: &mut Vec<u8>, mut n: usize| {
        while n >= 0x80 {
            delta.push((n & 0x7f) as u8 | 0x80);
            n >>= 7;
        }
        delta.push(n as u8);
    };
    varint(&mut delta, base.len());
    varint(&mut delta, target.len());
    // The usual change, one stretch (a package added, replaced or
    // removed): the bytes before it copied, the stretch inserted, the
    // bytes after it copied. A delta is made of bytes, so the copies need
    // not end where entries do, and no entry is decoded.
    let prefix = common_prefix(target, base);
    let suffix = common_suffix(&target[prefix..], &base[prefix..]);
    let stretch = &target[prefix..target.len() - suffix];
    if stretch.len() <= ONE_STRETCH_AT_MOST {
        copy_instructions(&mut delta, 0, prefix)?;
        for chunk in stretch.chunks(0x7f) {
            delta.push(chunk.len() as u8);
            delta.extend_from_slice(chunk);
        }
        copy_instructions(&mut delta, base.len() - suffix, suffix)?;
        return Some(delta);
    }
    let (mut a, mut b) = (0, 0); // in target, in base
    // the pending copy (from, len) in the base and insert (from) in the target
    let mut copy: Option<(usize, usize)> = None;
    let mut insert_from = 0;
    let mut inserted = 0;
    let flush_insert = |delta: &mut Vec<u8>, from: usize, to: usize| {
        for chunk in target[from..to].chunks(0x7f) {
            delta.push(chunk.len() as u8);
            delta.extend_from_slice(chunk);
        }
    };
    loop {
        let mut common = common_prefix(&target[a..], &base[b..]);
        let mut run = 0;
        while a + run < target.len() && b + run < base.len() {
            let len = entry_len(&target[a + run..])?;
            if len > common {
                break;
            }
            common -= len;
            run += len;
        }
        if run > 0 {
            flush_insert(&mut delta, insert_from, a);
            copy = match copy {
                Some((from, len)) if from + len == b => Some((from, len + run)),
                Some((from, len)) => {
                    copy_instructions(&mut delta, from, len)?;
                    Some((b, run))
                }
                None => Some((b, run)),
            };
            a += run;
            b += run;
            insert_from = a;
        }
        if a == target.len() {
            break;
        }
        let entry = RawEntry::at(&target[a..]).ok()?;
        let order = if b == base.len() {
            std::cmp::Ordering::Greater
        } else {
            let other = RawEntry::at(&base[b..]).ok()?;
            git_order(
                other.name,
                other.mode.is_tree(),
                entry.name,
                entry.mode.is_tree(),
            )
        };
        match order {
            // gone from the target
            std::cmp::Ordering::Less => b += RawEntry::at(&base[b..]).ok()?.len,
            ordering => {
                if let Some((from, len)) = copy.take() {
                    copy_instructions(&mut delta, from, len)?;
                }
                if ordering == std::cmp::Ordering::Equal {
                    b += RawEntry::at(&base[b..]).ok()?.len;
                }
                a += entry.len;
                inserted += entry.len;
            }
        }
    }
    flush_insert(&mut delta, insert_from, a);
    if let Some((from, len)) = copy {
        copy_instructions(&mut delta, from, len)?;
    }
    (inserted <= target.len() / 2).then_some(delta)
}

/// Copy instructions for `len` bytes of the base from `offset`: a byte
/// with the high bit set and a bit for each offset byte (4) and size byte
/// (3) that follows, the zero ones left out.
fn copy_instructions(delta: &mut Vec<u8>, mut offset: usize, mut len: usize) -> Option<()> {
    const MAX_COPY: usize = 0x00ff_ffff;
    while len > 0 {
        let size = len.min(MAX_COPY);
        let offset32 = u32::try_from(offset).ok()?;
        let at = delta.len();
        delta.push(0x80);
        for (i, byte) in offset32.to_le_bytes().into_iter().enumerate() {
            if byte != 0 {
                delta[at] |= 1 << i;
                delta.push(byte);
            }
        }
        for (i, byte) in (size as u32).to_le_bytes().into_iter().take(3).enumerate() {
            if byte != 0 {
                delta[at] |= 0x10 << i;
                delta.push(byte);
            }
        }
        offset += size;
        len -= size;
    }
    Some(())
}

/// A pack in memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pack {
    /// The pack file's bytes (header, entries, trailer).
    pub bytes: Vec<u8>,
    /// How many objects it holds.
    pub objects: u32,
    /// The trailer (SHA-1 of everything before it), which names the pack's
    /// `.pack` and `.idx` files.
    pub checksum: ObjectId,
    /// Where each object starts, for the index.
    entries: Vec<PackEntry>,
}

/// One object's place in a pack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PackEntry {
    id: ObjectId,
    offset: u64,
    /// CRC-32 of the entry as stored (header and compressed data).
    crc32: u32,
}

impl Pack {
    /// The pack's version 2 index (`.idx`), as `git index-pack` writes it:
    /// the objects' ids in order with a fan-out table by first byte, each
    /// one's CRC-32 and offset, then the pack's checksum and the index's.
    /// Written from what the writer knew, not by reading the pack again.
    ///
    /// # Errors
    /// The index's own checksum cannot be computed.
    pub fn index(&self) -> Result<Vec<u8>, RepoError> {
        let mut entries = self.entries.clone();
        entries.sort_unstable_by_key(|e| e.id);
        let mut idx = Vec::with_capacity(8 + 256 * 4 + entries.len() * 28 + 40);
        idx.extend_from_slice(b"\xfftOc");
        idx.extend_from_slice(&2u32.to_be_bytes());
        let mut fanout = [0u32; 256];
        for entry in &entries {
            fanout[usize::from(entry.id.as_bytes()[0])] += 1;
        }
        let mut total = 0u32;
        for count in fanout {
            total += count;
            idx.extend_from_slice(&total.to_be_bytes());
        }
        for entry in &entries {
            idx.extend_from_slice(entry.id.as_bytes());
        }
        for entry in &entries {
            idx.extend_from_slice(&entry.crc32.to_be_bytes());
        }
        // offsets past 2 GiB go to a table of 8-byte offsets, marked by
        // the high bit
        let mut large = Vec::new();
        for entry in &entries {
            let small = match u32::try_from(entry.offset) {
                Ok(offset) if offset < 0x8000_0000 => offset,
                _ => {
                    let at = u32::try_from(large.len()).unwrap_or(u32::MAX);
                    large.push(entry.offset);
                    0x8000_0000 | at
                }
            };
            idx.extend_from_slice(&small.to_be_bytes());
        }
        for offset in large {
            idx.extend_from_slice(&offset.to_be_bytes());
        }
        idx.extend_from_slice(self.checksum.as_bytes());
        // the index's own checksum names nothing: a plain SHA-1
        let own = fast_sha1(&[&idx]);
        idx.extend_from_slice(own.as_bytes());
        Ok(idx)
    }
}

/// The ids a version 2 pack index lists, in order; `None` when `idx` is not
/// one (a bad header, a count its size cannot hold, or ids out of order).
/// The checksums are not checked here.
pub fn index_object_ids(idx: &[u8]) -> Option<Vec<ObjectId>> {
    const HEADER: usize = 8 + 256 * 4;
    if idx.len() < HEADER + 40 || !idx.starts_with(b"\xfftOc\0\0\0\x02") {
        return None;
    }
    let count = |at: usize| -> Option<usize> {
        let bytes: [u8; 4] = idx.get(at..at + 4)?.try_into().ok()?;
        usize::try_from(u32::from_be_bytes(bytes)).ok()
    };
    let objects = count(8 + 255 * 4)?;
    // ids, CRCs and offsets for each, then two checksums
    let needed = objects.checked_mul(28)?.checked_add(HEADER + 40)?;
    if idx.len() < needed {
        return None;
    }
    let ids: Vec<ObjectId> = idx[HEADER..HEADER + objects * 20]
        .chunks_exact(20)
        .map(ObjectId::try_from)
        .collect::<Result<_, _>>()
        .ok()?;
    let mut first_bytes_below = 0;
    for byte in 0..256 {
        let end = count(8 + byte * 4)?;
        if end < first_bytes_below || end > objects {
            return None;
        }
        if ids[first_bytes_below..end]
            .iter()
            .any(|id| usize::from(id.as_bytes()[0]) != byte)
        {
            return None;
        }
        first_bytes_below = end;
    }
    ids.windows(2).all(|w| w[0] < w[1]).then_some(ids)
}

/// What a pack of a snapshot (and its index) says about how deep its large
/// trees stand on deltas in other packs, given how deep the trees it
/// stands on are (`known`): a large tree stored whole, or as deltas within
/// the pack down to one stored whole, is 0; a delta against a tree
/// outside the pack is one more than that tree. A process that loads a
/// pack so learns what another process saved, and may store its next
/// tree as a delta against it. Entries it cannot place (an unknown base,
/// another kind of delta, a malformed entry) are left out; so is
/// everything when the index is malformed. The bases of deltas come with
/// them.
pub fn large_tree_depths(
    pack: &[u8],
    idx: &[u8],
    known: &dyn Fn(&ObjectId) -> Option<u8>,
) -> StoredTrees {
    const HEADER: usize = 8 + 256 * 4;
    let Some(ids) = index_object_ids(idx) else {
        return Vec::new();
    };
    let offsets_at = HEADER + ids.len() * 24;
    let offset_of: HashMap<ObjectId, usize> = ids
        .iter()
        .enumerate()
        .filter_map(|(i, id)| {
            let bytes: [u8; 4] = idx
                .get(offsets_at + i * 4..offsets_at + i * 4 + 4)?
                .try_into()
                .ok()?;
            let offset = u32::from_be_bytes(bytes);
            // the large-offset table: not in packs this project writes
            (offset & 0x8000_0000 == 0).then_some((*id, offset as usize))
        })
        .collect();
    // an entry: its type, size, and for a ref delta its base
    let entry = |offset: usize| -> Option<(u8, u64, Option<ObjectId>)> {
        let mut at = offset;
        let first = *pack.get(at)?;
        let kind = (first >> 4) & 7;
        let mut size = u64::from(first & 0x0f);
        let mut shift = 4;
        let mut byte = first;
        while byte & 0x80 != 0 {
            at += 1;
            byte = *pack.get(at)?;
            size |= u64::from(byte & 0x7f).checked_shl(shift)?;
            shift += 7;
        }
        at += 1;
        let base = if kind == 7 {
            Some(ObjectId::try_from(pack.get(at..at + 20)?).ok()?)
        } else {
            None
        };
        Some((kind, size, base))
    };
    let mut out = Vec::new();
    for (id, offset) in &offset_of {
        let Some((kind, size, base)) = entry(*offset) else {
            continue;
        };
        match (kind, base) {
            (2, None) if size >= LARGE_TREE as u64 => out.push(StoredTree {
                id: *id,
                depth: 0,
                base: None,
            }),
            (7, Some(base)) => {
                // down the chain of bases within the pack
                let mut below = base;
                let mut depth = None;
                for _ in 0..64 {
                    match offset_of.get(&below).and_then(|at| entry(*at)) {
                        Some((7, _, Some(next))) => below = next,
                        Some((1..=4, _, None)) => {
                            depth = Some(0);
                            break;
                        }
                        Some(_) => break,
                        None => {
                            depth = known(&below).and_then(|d| d.checked_add(1));
                            break;
                        }
                    }
                }
                if let Some(depth) = depth {
                    out.push(StoredTree {
                        id: *id,
                        depth,
                        base: Some(base),
                    });
                }
            }
            _ => {}
        }
    }
    out
}

/// SHA-1 of `bytes` without collision detection (several times faster),
/// for checksums of what this process wrote from objects it had already
/// hashed with collision detection: a pack's trailer (its name) and its
/// index's, a local store's entity tags. Object ids keep collision
/// detection, and so does every check of a pack read from a store or a
/// remote, which is where a crafted collision would have to be caught.
pub(crate) fn fast_sha1(parts: &[&[u8]]) -> ObjectId {
    use sha1::Digest as _;
    let mut hasher = sha1::Sha1::new();
    for part in parts {
        hasher.update(part);
    }
    let digest: [u8; 20] = hasher.finalize().into();
    ObjectId::from_bytes_or_panic(&digest)
}

/// Writes a version 2 pack one whole object at a time, with one
/// compressor for all of them.
struct PackWriter {
    bytes: Vec<u8>,
    entries: Vec<PackEntry>,
    deflate: Compress,
    /// For large trees: level 0, a zlib stream of stored blocks.
    stored: Option<Compress>,
}

/// Trees from this size on are stored uncompressed (in packs and loose).
pub(crate) const LARGE_TREE: usize = 16 * 1024;

/// Appends `data` to `out` as one whole zlib stream.
pub(crate) fn deflate_into(
    deflate: &mut Compress,
    mut data: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), RepoError> {
    use gix::zlib::Status;
    use gix::zlib::stream::deflate::FlushCompress;
    let failed = |e: gix::Error| RepoError::Git {
        step: "compress an object",
        source: e.into(),
    };
    deflate.reset();
    loop {
        // incompressible data grows by a few bytes per 16 KiB block
        let len = out.len();
        out.resize(len + data.len() + data.len() / 64 + 64, 0);
        let (read, wrote) = (deflate.total_in(), deflate.total_out());
        let status = deflate
            .compress(data, &mut out[len..], FlushCompress::Finish)
            .map_err(failed)?;
        let consumed = (deflate.total_in() - read) as usize;
        let produced = (deflate.total_out() - wrote) as usize;
        out.truncate(len + produced);
        data = &data[consumed..];
        match status {
            Status::StreamEnd => return Ok(()),
            Status::Ok | Status::BufError if consumed > 0 || produced > 0 => {}
            Status::Ok | Status::BufError => {
                return Err(RepoError::Git {
                    step: "compress an object",
                    source: "the compressor made no progress".into(),
                });
            }
        }
    }
}

impl PackWriter {
    fn new(objects: u32) -> Self {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(b"PACK");
        bytes.extend_from_slice(&2u32.to_be_bytes());
        bytes.extend_from_slice(&objects.to_be_bytes());
        Self {
            bytes,
            entries: Vec::with_capacity(objects as usize),
            deflate: Compress::new(gix::zlib::Compression::BEST_SPEED),
            stored: None,
        }
    }

    fn add(&mut self, id: ObjectId, kind: gix::object::Kind, data: &[u8]) -> Result<(), RepoError> {
        let offset = self.bytes.len();
        let code: u8 = match kind {
            gix::object::Kind::Commit => 1,
            gix::object::Kind::Tree => 2,
            gix::object::Kind::Blob => 3,
            gix::object::Kind::Tag => 4,
        };
        self.entry_header(code, data.len());
        // a large tree is mostly object ids, which do not compress: level
        // 1 saved 30% of a 10,000-entry root tree at ten times the time
        let deflate = if kind == gix::object::Kind::Tree && data.len() >= LARGE_TREE {
            self.stored
                .get_or_insert_with(|| Compress::new(gix::zlib::Compression::NONE))
        } else {
            &mut self.deflate
        };
        deflate_into(deflate, data, &mut self.bytes)?;
        self.entries.push(PackEntry {
            id,
            offset: offset as u64,
            crc32: crc32fast::hash(&self.bytes[offset..]),
        });
        Ok(())
    }

    /// An entry's type and size: 3 bits of type and 4 of size, then 7
    /// bits of size per byte while the high bit says more follow.
    fn entry_header(&mut self, code: u8, size: usize) {
        let mut size = size as u64;
        let mut byte = (code << 4) | (size & 0x0f) as u8;
        size >>= 4;
        while size > 0 {
            self.bytes.push(byte | 0x80);
            byte = (size & 0x7f) as u8;
            size >>= 7;
        }
        self.bytes.push(byte);
    }

    /// Adds `id` as a delta against `base`, an object outside the pack
    /// (`OBJ_REF_DELTA`, type 7: the base's id, then the delta).
    fn add_ref_delta(
        &mut self,
        id: ObjectId,
        base: ObjectId,
        delta: &[u8],
    ) -> Result<(), RepoError> {
        let offset = self.bytes.len();
        self.entry_header(7, delta.len());
        self.bytes.extend_from_slice(base.as_bytes());
        deflate_into(&mut self.deflate, delta, &mut self.bytes)?;
        self.entries.push(PackEntry {
            id,
            offset: offset as u64,
            crc32: crc32fast::hash(&self.bytes[offset..]),
        });
        Ok(())
    }

    fn finish(mut self) -> Result<Pack, RepoError> {
        let objects = u32::try_from(self.entries.len()).unwrap_or(u32::MAX);
        let checksum = fast_sha1(&[&self.bytes]);
        self.bytes.extend_from_slice(checksum.as_bytes());
        Ok(Pack {
            bytes: self.bytes,
            objects,
            checksum,
            entries: self.entries,
        })
    }
}

/// Where a received pack was stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexedPack {
    /// The pack's checksum, which names its `.pack` and `.idx` files.
    pub checksum: ObjectId,
    pub objects: u32,
}

impl GitRepo {
    /// Whether the object database holds `id`.
    pub fn has_object(&self, id: ObjectId) -> bool {
        self.repo.has_object(id)
    }

    /// Whether `id` is in the packs the object database knew when this
    /// handle was opened (or at its first lookup), or loose now. Unlike
    /// [`Self::has_object`], a miss does not list the pack directory again
    /// and resolve its alternates, which costs more than the lookup itself;
    /// a pack written meanwhile by someone else is missed, so a caller
    /// deciding what to send sends an object too many, never one too few.
    pub(crate) fn has_object_without_rescan(&self, id: ObjectId) -> bool {
        self.repo.objects.exists_without_refresh(&id)
    }

    /// Writes `ids` into `to` as loose objects (ids `to` has are skipped):
    /// for a few objects, cheaper than a pack and its index. An object that
    /// is loose here is linked to its file, or else copied as it is, still
    /// compressed (a root tree of 10,000 packages is 350 KB to inflate,
    /// hash and deflate again otherwise). Blobs first, then trees, commits
    /// and tags last, so a reader that sees an object finds what it points
    /// to.
    ///
    /// # Errors
    /// An object missing here, or a failed write.
    pub fn copy_loose(&self, ids: &[ObjectId], to: &GitRepo) -> Result<(), RepoError> {
        use gix::objs::Write as _;
        enum Source {
            File(std::path::PathBuf),
            Data(Vec<u8>),
        }
        let here = self.repo.objects.store_ref().path().to_path_buf();
        let there = to.repo.objects.store_ref().path().to_path_buf();
        let mut objects = Vec::with_capacity(ids.len());
        for id in ids {
            if to.has_object_without_rescan(*id) {
                continue;
            }
            let header = self.repo.find_header(*id).map_err(|e| RepoError::Git {
                step: "read an object to copy",
                source: Box::new(e),
            })?;
            let kind = header.kind();
            let rank = match kind {
                gix::objs::Kind::Blob => 0,
                gix::objs::Kind::Tree => 1,
                gix::objs::Kind::Commit => 2,
                gix::objs::Kind::Tag => 3,
            };
            let source = match header {
                gix::odb::find::Header::Loose { .. } => Source::File(loose_path(&here, id)),
                gix::odb::find::Header::Packed(_) => Source::Data(self.object_data(*id)?),
            };
            objects.push((rank, *id, kind, source));
        }
        objects.sort_by_key(|(rank, _, _, _)| *rank);
        for (_, id, kind, source) in objects {
            let data = match source {
                Source::File(path) if link_object_file(&path, &loose_path(&there, &id)) => continue,
                Source::File(path) => match std::fs::read(&path) {
                    Ok(compressed) => {
                        write_object_file(&loose_path(&there, &id), &compressed)?;
                        continue;
                    }
                    // packed meanwhile (a concurrent writer): read it there
                    Err(_) => self.object_data(id)?,
                },
                Source::Data(data) => data,
            };
            to.repo
                .objects
                .write_buf(kind, &data)
                .map_err(|e| RepoError::Git {
                    step: "write a copied object",
                    source: e.into(),
                })?;
        }
        Ok(())
    }

    fn object_data(&self, id: ObjectId) -> Result<Vec<u8>, RepoError> {
        let object = self.repo.find_object(id).map_err(|e| RepoError::Git {
            step: "read an object to copy",
            source: Box::new(e),
        })?;
        Ok(object.detach().data)
    }

    /// The ids of the objects reachable from `tips` and not from `known`
    /// (tips the other side has; ids missing here are ignored).
    ///
    /// # Errors
    /// A missing or unreadable object under `tips`.
    pub fn missing_objects(
        &self,
        tips: &[ObjectId],
        known: &[ObjectId],
    ) -> Result<Vec<ObjectId>, RepoError> {
        Ok(self.missing_objects_and_bases(tips, known)?.0)
    }

    /// [`Self::missing_objects`], with each new tree paired with the tree
    /// at its path in its commit's first parent (where that differs): the
    /// base a snapshot pack may store it as a delta against
    /// ([`Self::write_thin_pack`]).
    ///
    /// # Errors
    /// A missing or unreadable object under `tips`.
    pub fn missing_objects_and_bases(
        &self,
        tips: &[ObjectId],
        known: &[ObjectId],
    ) -> Result<(Vec<ObjectId>, DeltaBases), RepoError> {
        let known_set: HashSet<ObjectId> = known.iter().copied().collect();
        let found = self.objects_to_send(tips, &|id| known_set.contains(id), &|| {
            Ok(known_set.iter().copied().collect())
        })?;
        Ok((found.out, found.pairs))
    }

    /// [`Self::missing_objects_and_bases`] with `known` as the ids the refs
    /// of some maps hold: looked up in them for the few commits the walk
    /// asks about, rather than every id of a large listing gathered first.
    ///
    /// # Errors
    /// A missing or unreadable object under `tips`.
    pub fn missing_objects_and_bases_beyond(
        &self,
        tips: &[ObjectId],
        known: &[std::sync::Arc<crate::listing::RefMap>],
    ) -> Result<(Vec<ObjectId>, DeltaBases), RepoError> {
        let found = self.objects_to_send(
            tips,
            &|id| known.iter().any(|refs| refs.contains_value(id)),
            &|| {
                Ok(known
                    .iter()
                    .flat_map(|refs| refs.values().copied())
                    .collect())
            },
        )?;
        Ok((found.out, found.pairs))
    }

    /// The ids of the objects reachable from `tips` that `target` lacks:
    /// the walk stops at the first commits `target` holds (a repository
    /// holding a commit holds what it reaches), so no ref of `target` is
    /// listed unless the new history is long.
    ///
    /// # Errors
    /// A missing or unreadable object under `tips`; unreadable refs of
    /// `target` when the walk needs them.
    pub fn objects_missing_from(
        &self,
        tips: &[ObjectId],
        target: &GitRepo,
    ) -> Result<Vec<ObjectId>, RepoError> {
        Ok(self
            .objects_to_send(tips, &|id| target.has_object_without_rescan(*id), &|| {
                Ok(target.try_refs_unpeeled()?.into_values().collect())
            })?
            .out)
    }

    /// The objects reachable from `tips` and not from commits for which
    /// `known` holds; `hidden` lists the tips to hide from an exact walk
    /// when the quick one grows large.
    fn objects_to_send(
        &self,
        tips: &[ObjectId],
        known: &dyn Fn(&ObjectId) -> bool,
        hidden: &dyn Fn() -> Result<Vec<ObjectId>, RepoError>,
    ) -> Result<Found, RepoError> {
        let mut tips: Vec<ObjectId> = tips.iter().copied().filter(|t| !known(t)).collect();
        tips.sort();
        tips.dedup();
        if tips.is_empty() {
            return Ok(Found::default());
        }
        // annotated tags are sent themselves, their commits walked
        let mut tag_objects = Vec::new();
        let mut tree_tips = Vec::new();
        let mut commit_tips = Vec::new();
        for tip in tips {
            let mut id = tip;
            loop {
                let object = self.repo.find_object(id).map_err(|e| RepoError::Git {
                    step: "read an object to send",
                    source: Box::new(e),
                })?;
                match object.kind {
                    gix::objs::Kind::Tag => {
                        tag_objects.push(id);
                        id = object
                            .into_tag()
                            .target_id()
                            .map_err(|e| RepoError::Git {
                                step: "read a tag to send",
                                source: Box::new(e),
                            })?
                            .detach();
                        if known(&id) {
                            break;
                        }
                    }
                    gix::objs::Kind::Commit => {
                        commit_tips.push(id);
                        break;
                    }
                    gix::objs::Kind::Tree => {
                        tree_tips.push(id);
                        break;
                    }
                    gix::objs::Kind::Blob => {
                        tag_objects.push(id);
                        break;
                    }
                }
            }
        }
        let tips = commit_tips;
        let commits = match self.commits_until_known(&tips, known)? {
            Some(commits) => commits,
            None => {
                let known: Vec<ObjectId> = hidden()?
                    .into_iter()
                    .filter(|id| self.repo.has_object(*id))
                    .collect();
                let walk = self
                    .repo
                    .rev_walk(tips)
                    .with_hidden(known)
                    .all()
                    .map_err(|e| RepoError::Git {
                        step: "walk the commits to send",
                        source: Box::new(e),
                    })?;
                let mut commits = Vec::new();
                for info in walk {
                    let info = info.map_err(|e| RepoError::Git {
                        step: "walk the commits to send",
                        source: Box::new(e),
                    })?;
                    commits.push(info.id);
                }
                commits
            }
        };
        let mut found = Found {
            seen: tag_objects.iter().copied().collect(),
            out: tag_objects,
            pairs: Vec::new(),
        };
        for tree in tree_tips {
            self.new_tree_objects(tree, None, &mut found)?;
        }
        for commit in commits {
            let (tree, parents) = self.commit_tree_and_parents(commit)?;
            found.out.push(commit);
            // what differs from the first parent is a superset of what
            // differs from all of them: a merge sends a few objects twice
            let first_parent_tree = parents
                .first()
                .map(|p| self.commit_tree_and_parents(*p).map(|(t, _)| t))
                .transpose()?;
            self.new_tree_objects(tree, first_parent_tree, &mut found)?;
        }
        Ok(found)
    }

    /// The commits from `tips` back to the first known ones, when that
    /// takes few steps (the usual case: new commits on top of known
    /// heads); `None` when the walk grows large, and the exact walk with
    /// every known tip hidden is used instead. A commit reachable from a
    /// known one without being known itself may be included: that only
    /// sends objects twice.
    fn commits_until_known(
        &self,
        tips: &[ObjectId],
        known: &dyn Fn(&ObjectId) -> bool,
    ) -> Result<Option<Vec<ObjectId>>, RepoError> {
        const BUDGET: usize = 1024;
        let mut queue: std::collections::VecDeque<ObjectId> = tips.iter().copied().collect();
        let mut seen: HashSet<ObjectId> = tips.iter().copied().collect();
        let mut out = Vec::new();
        while let Some(commit) = queue.pop_front() {
            if out.len() >= BUDGET {
                return Ok(None);
            }
            out.push(commit);
            for parent in self.commit_tree_and_parents(commit)?.1 {
                if !known(&parent) && seen.insert(parent) {
                    queue.push_back(parent);
                }
            }
        }
        Ok(Some(out))
    }

    fn commit_tree_and_parents(
        &self,
        id: ObjectId,
    ) -> Result<(ObjectId, Vec<ObjectId>), RepoError> {
        let commit = self.repo.find_commit(id).map_err(|e| RepoError::Git {
            step: "read a commit to send",
            source: Box::new(e),
        })?;
        let tree = commit.tree_id().map_err(|e| RepoError::Git {
            step: "read a commit's tree",
            source: Box::new(e),
        })?;
        Ok((
            tree.detach(),
            commit.parent_ids().map(|p| p.detach()).collect(),
        ))
    }

    /// A tree's bytes: a large one shared from where it is kept decoded.
    pub(crate) fn tree_data(&self, id: ObjectId) -> Result<std::sync::Arc<[u8]>, RepoError> {
        if let Some(data) = crate::repo::kept_large_tree(&id) {
            return Ok(data);
        }
        Ok(self.find_tree(id)?.detach().data.into())
    }

    fn find_tree(&self, id: ObjectId) -> Result<gix::Tree<'_>, RepoError> {
        self.repo.find_tree(id).map_err(|e| RepoError::Git {
            step: "read a tree to send",
            source: Box::new(e),
        })
    }

    /// Adds `tree` and everything under it that differs from `parent`, the
    /// tree at the same path in the parent commit (`None`: absent there).
    fn new_tree_objects(
        &self,
        tree: ObjectId,
        parent: Option<ObjectId>,
        found: &mut Found,
    ) -> Result<(), RepoError> {
        if parent == Some(tree) || !found.seen.insert(tree) {
            return Ok(());
        }
        found.out.push(tree);
        if let Some(parent) = parent {
            found.pairs.push((tree, parent));
            return self.tree_changes(tree, parent, found);
        }
        let own = self.find_tree(tree)?.detach().data;
        let mut at = 0;
        while at < own.len() {
            let entry = RawEntry::at(&own[at..])?;
            self.new_entry(&entry, None, found)?;
            at += entry.len;
        }
        Ok(())
    }

    /// Adds what `tree` (already added) holds that `parent` does not hold
    /// at the same path, from their raw bytes: runs of bytes the two share
    /// are skipped entry by entry without a comparison (found with one
    /// `memcmp`), so a root tree of thousands of packages with one changed
    /// costs a scan of its entry boundaries and nothing per entry.
    fn tree_changes(
        &self,
        tree: ObjectId,
        parent: ObjectId,
        found: &mut Found,
    ) -> Result<(), RepoError> {
        let own = self.tree_data(tree)?;
        let theirs = self.tree_data(parent)?;
        // the bytes both end with: once what is left of each is as long
        // and no longer, it is the same entries (usually one package
        // changed, and nothing after it is walked)
        let suffix = common_suffix(&own, &theirs);
        let (mut a, mut b) = (0, 0);
        loop {
            if own.len() - a == theirs.len() - b && own.len() - a <= suffix {
                return Ok(());
            }
            let mut common = common_prefix(&own[a..], &theirs[b..]);
            while a < own.len() && b < theirs.len() {
                let Some(len) = entry_len(&own[a..]) else {
                    break;
                };
                if len > common {
                    break;
                }
                common -= len;
                a += len;
                b += len;
            }
            if a == own.len() {
                return Ok(());
            }
            let entry = RawEntry::at(&own[a..])?;
            if b == theirs.len() {
                self.new_entry(&entry, None, found)?;
                a += entry.len;
                continue;
            }
            let other = RawEntry::at(&theirs[b..])?;
            match git_order(
                other.name,
                other.mode.is_tree(),
                entry.name,
                entry.mode.is_tree(),
            ) {
                std::cmp::Ordering::Less => b += other.len,
                std::cmp::Ordering::Greater => {
                    self.new_entry(&entry, None, found)?;
                    a += entry.len;
                }
                std::cmp::Ordering::Equal => {
                    self.new_entry(&entry, Some(other.id), found)?;
                    a += entry.len;
                    b += other.len;
                }
            }
        }
    }

    /// Adds a tree entry's object (and what is new under it) unless it is
    /// `before`, the entry at its path in a parent.
    fn new_entry(
        &self,
        entry: &RawEntry<'_>,
        before: Option<ObjectId>,
        found: &mut Found,
    ) -> Result<(), RepoError> {
        if before == Some(entry.id) {
            return Ok(());
        }
        match entry.mode.kind() {
            EntryKind::Tree => self.new_tree_objects(entry.id, before, found),
            EntryKind::Commit => Ok(()), // a submodule's commit lives elsewhere
            EntryKind::Blob | EntryKind::BlobExecutable | EntryKind::Link => {
                if found.seen.insert(entry.id) {
                    found.out.push(entry.id);
                }
                Ok(())
            }
        }
    }

    /// A pack (version 2, every object whole: no deltas, so it never
    /// depends on objects outside it) of `ids`, compressed at zlib's
    /// fastest level: a root tree listing thousands of packages is mostly
    /// object ids, which do not compress, and level 6 took three times as
    /// long for a few percent.
    ///
    /// # Errors
    /// A missing object, or a failed pack write.
    pub fn write_pack(&self, ids: &[ObjectId]) -> Result<Pack, RepoError> {
        let objects = u32::try_from(ids.len()).map_err(|_| RepoError::Git {
            step: "write a pack",
            source: "more than 4 billion objects".into(),
        })?;
        let mut writer = PackWriter::new(objects);
        for id in ids {
            let object = self.repo.find_object(*id).map_err(|e| RepoError::Git {
                step: "read an object to pack",
                source: Box::new(e),
            })?;
            writer.add(*id, object.kind, &object.data)?;
        }
        writer.finish()
    }

    /// A pack of `ids` for a snapshot, which may be thin: a large tree
    /// paired in `bases` with a tree outside `ids` (so one the snapshot
    /// holds already) is stored as a delta against it when `depth_of` says
    /// how many deltas that base stands on and one more stays within
    /// [`MAX_DELTA_DEPTH`]. A root tree of 10,000 packages with one
    /// package changed is then a few dozen bytes instead of 350 KB, so the
    /// pack grows with the change, not with the repository. Other objects
    /// are whole, as in [`Self::write_pack`].
    ///
    /// Only for snapshots, which gix reads (it finds a delta's base in
    /// another pack): git itself wants every pack on disk complete, so
    /// packs for remotes are written by [`Self::write_pack`].
    ///
    /// # Errors
    /// A missing object, or a failed pack write.
    pub fn write_thin_pack(
        &self,
        ids: &[ObjectId],
        bases: &[(ObjectId, ObjectId)],
        depth_of: &dyn Fn(&ObjectId) -> Option<u8>,
    ) -> Result<(Pack, StoredTrees), RepoError> {
        let in_pack: HashSet<ObjectId> = ids.iter().copied().collect();
        let base_of: HashMap<ObjectId, ObjectId> = bases.iter().copied().collect();
        self.write_with_deltas(ids, &base_of, &|tree| {
            let base = *base_of.get(tree)?;
            if in_pack.contains(&base) {
                return None;
            }
            let depth = depth_of(&base)?.checked_add(1)?;
            (depth <= MAX_DELTA_DEPTH).then_some((base, depth))
        })
    }

    /// A complete pack of `ids` (git's kind: every delta's base is in it),
    /// where a large tree paired in `bases` with another tree of the pack
    /// is stored as a delta against it, up to [`MAX_DELTA_DEPTH`] deltas
    /// deep: what a compaction writes, so that rolling up the saves of a
    /// repository with a large root tree does not write each of their root
    /// trees whole.
    ///
    /// # Errors
    /// A missing object, or a failed pack write.
    pub fn write_complete_pack(
        &self,
        ids: &[ObjectId],
        bases: &[(ObjectId, ObjectId)],
    ) -> Result<Pack, RepoError> {
        let in_pack: HashSet<ObjectId> = ids.iter().copied().collect();
        let base_of: HashMap<ObjectId, ObjectId> = bases
            .iter()
            .filter(|(tree, base)| in_pack.contains(tree) && in_pack.contains(base))
            .copied()
            .collect();
        // how deep each tree's chain of bases in the pack goes, a chain
        // that reaches the limit starting again with a whole tree (an upper
        // bound: a tree the delta does not suit is whole too)
        let mut depths: HashMap<ObjectId, u8> = HashMap::new();
        for tree in base_of.keys() {
            let mut chain = vec![*tree];
            while let Some(base) = base_of.get(chain.last().unwrap_or(tree)) {
                if depths.contains_key(base) || chain.contains(base) {
                    break;
                }
                chain.push(*base);
            }
            let end = chain.last().copied().unwrap_or(*tree);
            let mut depth = match base_of.get(&end) {
                // a cycle (a tree that came back): its first tree is whole
                Some(base) if chain.contains(base) => 0,
                Some(base) => depths.get(base).map_or(0, |d| d + 1),
                None => 0,
            };
            if depth > MAX_DELTA_DEPTH {
                depth = 0;
            }
            depths.insert(end, depth);
            for id in chain.iter().rev().skip(1) {
                depth = if depth >= MAX_DELTA_DEPTH {
                    0
                } else {
                    depth + 1
                };
                depths.insert(*id, depth);
            }
        }
        let (pack, _) = self.write_with_deltas(ids, &base_of, &|tree| {
            let depth = *depths.get(tree)?;
            (depth > 0).then(|| base_of.get(tree).map(|base| (*base, depth)))?
        })?;
        Ok(pack)
    }

    /// Writes `ids` as a pack, each large tree as a delta against the base
    /// `choose` gives (with the depth it stands at) when the delta suits
    /// it, else whole.
    fn write_with_deltas(
        &self,
        ids: &[ObjectId],
        base_of: &HashMap<ObjectId, ObjectId>,
        choose: &dyn Fn(&ObjectId) -> Option<(ObjectId, u8)>,
    ) -> Result<(Pack, StoredTrees), RepoError> {
        let objects = u32::try_from(ids.len()).map_err(|_| RepoError::Git {
            step: "write a pack",
            source: "more than 4 billion objects".into(),
        })?;
        let mut writer = PackWriter::new(objects);
        let mut stored = Vec::new();
        for id in ids {
            let kept = crate::repo::kept_large_tree(id);
            let read;
            let (kind, data): (gix::object::Kind, &[u8]) = match &kept {
                Some(data) => (gix::object::Kind::Tree, data),
                None => {
                    read = self.repo.find_object(*id).map_err(|e| RepoError::Git {
                        step: "read an object to pack",
                        source: Box::new(e),
                    })?;
                    (read.kind, &read.data)
                }
            };
            if kind == gix::object::Kind::Tree && data.len() >= LARGE_TREE {
                let delta = choose(id).and_then(|(base, depth)| {
                    let base_data = match crate::repo::kept_large_tree(&base) {
                        Some(data) => data,
                        None => self.repo.find_object(base).ok()?.detach().data.into(),
                    };
                    Some((base, depth, tree_delta(&base_data, data)?))
                });
                let base = base_of.get(id).copied();
                if let Some((delta_base, depth, delta)) = delta {
                    writer.add_ref_delta(*id, delta_base, &delta)?;
                    stored.push(StoredTree {
                        id: *id,
                        depth,
                        base,
                    });
                    continue;
                }
                stored.push(StoredTree {
                    id: *id,
                    depth: 0,
                    base,
                });
            }
            writer.add(*id, kind, data)?;
        }
        Ok((writer.finish()?, stored))
    }

    /// Installs a pack this process wrote, with its index, in
    /// `objects/pack`: nothing to inflate or hash again, unlike a pack
    /// received from elsewhere ([`GitRepo::index_pack`]). The index is
    /// written last, so a reader never finds an index without its pack.
    ///
    /// # Errors
    /// A failed write.
    pub fn install_pack(&self, pack: &Pack) -> Result<(), RepoError> {
        if pack.objects == 0 {
            return Ok(());
        }
        let directory = self.repo.objects.store_ref().path().join("pack");
        let write = |ext: &str, bytes: &[u8]| {
            write_object_file(
                &directory.join(format!("pack-{}.{ext}", pack.checksum)),
                bytes,
            )
        };
        write("pack", &pack.bytes)?;
        write("idx", &pack.index()?)
    }

    /// Stores a pack (as received from a remote or a snapshot) with its
    /// index in `objects/pack`. An empty pack stores nothing.
    ///
    /// # Errors
    /// A malformed or truncated pack, or a failed write.
    pub fn index_pack(&self, pack: &[u8]) -> Result<Option<IndexedPack>, RepoError> {
        let directory = self.repo.objects.store_ref().path().join("pack");
        std::fs::create_dir_all(&directory).map_err(|e| RepoError::Git {
            step: "create objects/pack",
            source: Box::new(e),
        })?;
        Self::index_pack_into(pack, &directory)
    }

    /// Writes `pack` with its index into `directory` (which must exist) as
    /// `pack-<checksum>.pack` and `.idx`; `None` for an empty pack.
    ///
    /// # Errors
    /// A malformed pack, or a failed write.
    pub fn index_pack_into(
        pack: &[u8],
        directory: &std::path::Path,
    ) -> Result<Option<IndexedPack>, RepoError> {
        if pack.len() >= 12 && pack[8..12] == [0, 0, 0, 0] {
            return Ok(None);
        }
        let interrupt = AtomicBool::new(false);
        let mut reader = std::io::BufReader::new(pack);
        let outcome = gix_pack::Bundle::write_to_directory(
            &mut reader,
            Some(directory),
            &mut Discard,
            &interrupt,
            None::<gix::objs::find::Never>,
            gix::hash::Kind::Sha1,
            gix_pack::bundle::write::Options::default(),
        )
        .map_err(pack_error("index a received pack"))?;
        if let Some(keep) = &outcome.keep_path {
            // the refs that make these objects reachable are written next;
            // nothing here collects garbage in between
            let _ = std::fs::remove_file(keep);
        }
        Ok(Some(IndexedPack {
            checksum: outcome.index.data_hash,
            objects: outcome.index.num_objects,
        }))
    }
}

/// Where the loose object `id` lives under the objects directory `objects`.
pub(crate) fn loose_path(objects: &std::path::Path, id: &ObjectId) -> std::path::PathBuf {
    let hex = id.to_hex().to_string();
    let (fan, rest) = hex.split_at(2);
    objects.join(fan).join(rest)
}

/// Puts the loose object file `from` at `to`, the same object's path in
/// another repository on the same filesystem, as a hard link: no bytes
/// read or written (a root tree of 10,000 packages is 350 KB), and the file
/// is whole the moment it appears, as git's `clone --local` shares objects.
/// Object files are never written in place, so sharing one is safe. `false`
/// when it cannot be linked (another filesystem, no permission, or gone
/// meanwhile): the caller copies it.
fn link_object_file(from: &std::path::Path, to: &std::path::Path) -> bool {
    if to
        .parent()
        .is_some_and(|dir| std::fs::create_dir_all(dir).is_err())
    {
        return false;
    }
    match std::fs::hard_link(from, to) {
        Ok(()) => true,
        // named by its content: the object there is this one
        Err(e) => e.kind() == std::io::ErrorKind::AlreadyExists,
    }
}

/// Writes a file of the object database (a loose object's compressed
/// file, a pack, an index): to a temporary name beside it, then renamed,
/// so a reader never sees half of it.
pub(crate) fn write_object_file(path: &std::path::Path, bytes: &[u8]) -> Result<(), RepoError> {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let io = |e: std::io::Error| RepoError::Git {
        step: "write an object file",
        source: Box::new(e),
    };
    let dir = path.parent().ok_or_else(|| RepoError::Git {
        step: "write an object file",
        source: "an object path without a directory".into(),
    })?;
    std::fs::create_dir_all(dir).map_err(io)?;
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!("tmp_obj_{}_{n}", std::process::id()));
    std::fs::write(&tmp, bytes).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io(e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Applies a git delta to `base`, as a reader of the pack would.
    fn apply(base: &[u8], delta: &[u8]) -> Vec<u8> {
        let mut at = 0;
        let mut varint = || {
            let (mut n, mut shift) = (0usize, 0);
            loop {
                let byte = delta[at];
                at += 1;
                n |= usize::from(byte & 0x7f) << shift;
                shift += 7;
                if byte & 0x80 == 0 {
                    return n;
                }
            }
        };
        assert_eq!(varint(), base.len());
        let size = varint();
        let mut out = Vec::new();
        while at < delta.len() {
            let op = delta[at];
            at += 1;
            if op & 0x80 == 0 {
                let len = usize::from(op);
                assert!(len > 0, "reserved instruction");
                out.extend_from_slice(&delta[at..at + len]);
                at += len;
                continue;
            }
            let mut field = |bits: std::ops::Range<u8>| {
                let mut n = 0usize;
                for (i, bit) in bits.enumerate() {
                    if op & (1 << bit) != 0 {
                        n |= usize::from(delta[at]) << (8 * i);
                        at += 1;
                    }
                }
                n
            };
            let offset = field(0..4);
            let len = match field(4..7) {
                0 => 0x10000,
                n => n,
            };
            out.extend_from_slice(&base[offset..offset + len]);
        }
        assert_eq!(out.len(), size);
        out
    }

    fn tree(names: &[String]) -> Vec<u8> {
        let mut data = Vec::new();
        for name in names {
            data.extend_from_slice(b"40000 ");
            data.extend_from_slice(name.as_bytes());
            data.push(0);
            // an id of the name, with NULs and spaces among its bytes
            let seed = name.bytes().fold(0u8, |h, b| h.wrapping_mul(31) ^ b);
            data.extend((0..20u8).map(|b| b.wrapping_mul(seed | 1).wrapping_add(seed)));
        }
        data
    }

    #[test]
    fn a_tree_delta_rebuilds_the_target_from_one_stretch_or_many() {
        let names: Vec<String> = (0..2_000).map(|i| format!("pkg-{i:05}")).collect();
        let base = tree(&names);
        let mut added = names.clone();
        added.insert(700, "pkg-00699a".to_owned());
        let mut removed = names.clone();
        removed.remove(1_999);
        let mut first = names.clone();
        first[0] = "pkg-0000".to_owned();
        // changes all over the tree: more than one stretch
        let scattered: Vec<String> = names
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 97 != 0)
            .map(|(_, n)| n.clone())
            .collect();
        for (what, target) in [
            ("same", base.clone()),
            ("added", tree(&added)),
            ("removed", tree(&removed)),
            ("first", tree(&first)),
            ("scattered", tree(&scattered)),
        ] {
            let delta = tree_delta(&base, &target).expect(what);
            assert_eq!(apply(&base, &delta), target, "{what}");
            assert!(delta.len() < 2_000, "{what}: {} bytes", delta.len());
        }
        // one stretch is copy, insert, copy: a few dozen bytes
        let one = tree_delta(&base, &tree(&added)).expect("added");
        assert!(one.len() < 64, "{} bytes", one.len());
    }
}
