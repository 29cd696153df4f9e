//! Porch's git layout (spec `porch-v1alpha2.md` §4.1, §4.2): where each
//! package revision lives in a repository, how its commits are titled and
//! annotated, and who authors them.
//!
//! * [`layout`]: ref names of drafts, proposed revisions, tags, deletion
//!   proposals and the registered branch, and parsing them back;
//! * [`annotation`]: the `kpt:` JSON annotation in commit messages, with the
//!   real task and the PackageRevision uid and generation;
//! * [`identity`]: author and committer rules;
//! * [`discovery`]: every package revision of a repository, from its refs;
//! * [`operations`]: draft, propose, reject, publish, deletion on a local
//!   repository, every ref change a compare-and-swap, safe to repeat;
//! * [`pktline`]: the wire pieces of native push (pkt-lines, ref
//!   advertisement, side-band, report-status) parsed from untrusted input;
//! * [`store`]: object stores with S3's conditional-write semantics (the
//!   local directory store; S3 comes with the snapshot);
//! * [`listing`]: every branch and tag of a repository, its `packed-refs`
//!   parse kept while the file stays the same;
//! * [`packed_refs`]: a mirror's branches and tags packed into one
//!   `packed-refs` file under its lock, as `git pack-refs` does;
//! * `opened`: repositories opened in this process, kept by path and
//!   checked against the disk at every open;
//! * [`repo`]: repository access with gix (objects, package trees,
//!   compare-and-swap ref updates), isolated from user configuration.

pub mod annotation;
pub mod discovery;
pub mod egress;
pub mod identity;
pub mod layout;
pub mod listing;
pub mod mirror;
mod opened;
pub mod operations;
pub mod pack;
pub mod packed_refs;
pub mod pktline;
pub mod refmap;
pub mod remote;
pub mod repo;
pub mod s3;
pub mod snapshot;
pub mod store;
