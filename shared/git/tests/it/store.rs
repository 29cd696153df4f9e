//! The local directory store keeps S3's conditional-write semantics, also
//! under concurrent writers.

use porch_git::store::{Fetched, LocalDirStore, ObjectStore, PutCondition, StoreError};

#[tokio::test]
async fn conditional_writes_behave_like_s3() {
    let tmp = tempfile::tempdir().expect("tempdir");
    conditional_semantics(&LocalDirStore::new(tmp.path())).await;
}

/// S3's conditional reads and writes, which every store must have.
pub(crate) async fn conditional_semantics<S: ObjectStore>(store: &S) {
    let key = "repos/ns/blueprints/manifest.json";
    assert_eq!(store.get(key).await.expect("get"), None);
    // If-Match on a missing object: 404
    let err = store
        .put(
            key,
            b"x".to_vec(),
            PutCondition::IfMatch(porch_git::store::ETag("\"nope\"".into())),
        )
        .await
        .expect_err("missing");
    assert!(matches!(err, StoreError::NotFound { .. }), "{err}");
    let first = store
        .put(key, b"one".to_vec(), PutCondition::IfAbsent)
        .await
        .expect("create");
    // If-None-Match: * on an existing object: 412
    let err = store
        .put(key, b"two".to_vec(), PutCondition::IfAbsent)
        .await
        .expect_err("exists");
    assert!(
        matches!(err, StoreError::PreconditionFailed { .. }),
        "{err}"
    );
    let second = store
        .put(key, b"two".to_vec(), PutCondition::IfMatch(first.clone()))
        .await
        .expect("swap");
    assert_ne!(first, second);
    // a stale tag: 412, and nothing changed
    let err = store
        .put(key, b"three".to_vec(), PutCondition::IfMatch(first))
        .await
        .expect_err("stale");
    assert!(
        matches!(err, StoreError::PreconditionFailed { .. }),
        "{err}"
    );
    let got = store.get(key).await.expect("get").expect("present");
    assert_eq!(
        (got.body.as_slice(), &got.etag),
        (b"two".as_slice(), &second)
    );

    store
        .put(
            "repos/ns/blueprints/packs/a.pack",
            vec![1],
            PutCondition::Always,
        )
        .await
        .expect("pack");
    store
        .put(
            "repos/ns/other/manifest.json",
            vec![2],
            PutCondition::Always,
        )
        .await
        .expect("other");
    assert_eq!(
        store.list("repos/ns/blueprints/").await.expect("list"),
        vec![
            "repos/ns/blueprints/manifest.json",
            "repos/ns/blueprints/packs/a.pack"
        ]
    );
    // an immutable object: created once, never replaced, and its tag
    // (read back) is the content's like any other
    let immutable = "repos/ns/blueprints/packs/b.pack";
    assert!(store.create(immutable, vec![3, 4]).await.expect("create"));
    assert!(!store.create(immutable, vec![5]).await.expect("exists"));
    let created = store.get(immutable).await.expect("get").expect("present");
    assert_eq!(created.body, vec![3, 4]);
    let err = store
        .put(
            immutable,
            vec![6],
            PutCondition::IfMatch(created.etag.clone()),
        )
        .await;
    assert!(err.is_ok(), "its tag conditions a put: {err:?}");
    store.delete(immutable).await.expect("delete");
    // a conditional read with the current tag reads nothing
    assert_eq!(
        store.get_if_changed(key, Some(&second)).await.expect("get"),
        Fetched::NotModified
    );
    assert!(matches!(
        store.get_if_changed(key, Some(&porch_git::store::ETag("\"old\"".into()))).await,
        Ok(Fetched::Found(o)) if o.body == b"two"
    ));
    store.delete(key).await.expect("delete");
    store.delete(key).await.expect("absent is fine");
    assert_eq!(store.get(key).await.expect("get"), None);
    assert_eq!(
        store.get_if_changed(key, Some(&second)).await.expect("get"),
        Fetched::Missing
    );
}

#[tokio::test]
async fn hostile_keys_are_refused() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = LocalDirStore::new(tmp.path().join("root"));
    for key in [
        "",
        "../escape",
        "/abs",
        "a//b",
        "a/./b",
        "a\\b",
        "a/x.lock",
        "a/.tmp-1-x",
        "a\u{0}b",
    ] {
        let err = store
            .put(key, vec![1], PutCondition::Always)
            .await
            .expect_err(key);
        assert!(
            matches!(err, StoreError::InvalidKey { .. }),
            "{key:?}: {err}"
        );
        assert!(store.get(key).await.is_err(), "{key:?}");
        let err = store.create(key, vec![1]).await.expect_err(key);
        assert!(
            matches!(err, StoreError::InvalidKey { .. }),
            "{key:?}: {err}"
        );
    }
    assert!(!tmp.path().join("escape").exists());
}

/// 20 writers each add one entry to a shared object with read → modify →
/// conditional put, retrying on 412: every entry lands, none is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writers_lose_nothing() {
    let tmp = tempfile::tempdir().expect("tempdir");
    concurrent_writers(LocalDirStore::new(tmp.path())).await;
}

/// 20 read → modify → conditional-put writers of one object.
pub(crate) async fn concurrent_writers<S: ObjectStore + Clone + 'static>(store: S) {
    let key = "repos/ns/r/manifest.json";
    store
        .put(key, b"[]".to_vec(), PutCondition::IfAbsent)
        .await
        .expect("create");
    let mut tasks = Vec::new();
    for i in 0..20 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut retries = 0;
            loop {
                let current = store.get(key).await.expect("get").expect("present");
                let mut entries: Vec<u32> = serde_json::from_slice(&current.body).expect("json");
                entries.push(i);
                let body = serde_json::to_vec(&entries).expect("json");
                match store
                    .put(key, body, PutCondition::IfMatch(current.etag))
                    .await
                {
                    Ok(_) => return retries,
                    Err(StoreError::PreconditionFailed { .. }) => retries += 1,
                    Err(e) => panic!("writer {i}: {e}"),
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("writer");
    }
    let last = store.get(key).await.expect("get").expect("present");
    let mut entries: Vec<u32> = serde_json::from_slice(&last.body).expect("json");
    entries.sort_unstable();
    assert_eq!(entries, (0..20).collect::<Vec<u32>>());
}
