//! Ranged reads through `RemoteStore` over an in-memory object store and the
//! fault-injecting double: exact bytes, pieces in flight, retries, and typed errors that
//! name the object and the range; never short or stale bytes presented as whole.

use std::sync::Arc;

use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, PutPayload};
use sluice_remote::{Fault, FaultyStore, ObjectUrl, RemoteError, RemoteOptions, RemoteStore};

fn bytes(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 % 251) as u8).collect()
}

fn put(store: &InMemory, key: &str, data: &[u8]) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(store.put(&Path::from(key), PutPayload::from(data.to_vec())))
        .unwrap();
}

fn opts(retries: usize) -> RemoteOptions {
    RemoteOptions {
        retries,
        concurrency: 4,
        piece_bytes: 1000,
        ..RemoteOptions::default()
    }
}

fn setup(faults: Vec<Fault>, retries: usize) -> (Arc<InMemory>, Arc<FaultyStore>, RemoteStore) {
    let mem = Arc::new(InMemory::new());
    put(&mem, "m/model.safetensors", &bytes(10_000));
    put(&mem, "m/other.bin", &bytes(10));
    let faulty = Arc::new(FaultyStore::new(mem.clone(), faults));
    let url = ObjectUrl::parse("s3://bucket/m").unwrap();
    let store = RemoteStore::with_store(&url, faulty.clone(), &opts(retries));
    (mem, faulty, store)
}

fn url(key: &str) -> ObjectUrl {
    ObjectUrl::parse(&format!("s3://bucket/{key}")).unwrap()
}

#[test]
fn ranges_land_exactly_in_pieces_in_flight_together() {
    let (_, faulty, store) = setup(vec![], 3);
    let info = store.info(&url("m/model.safetensors")).unwrap();
    assert_eq!(info.size, 10_000);
    let mut a = vec![0u8; 4500];
    let mut b = vec![0u8; 17];
    let mut empty = vec![0u8; 0];
    let r = store
        .read_ranges(&info, vec![(100, &mut a), (9983, &mut b), (5, &mut empty)])
        .unwrap();
    let all = bytes(10_000);
    assert_eq!(a, all[100..4600]);
    assert_eq!(b, all[9983..]);
    assert_eq!((r.requests, r.retried, r.bytes), (6, 0, 4517));
    assert_eq!(faulty.gets(), 6);
    let listed: Vec<_> = store
        .list(&url("m"))
        .unwrap()
        .into_iter()
        .map(|o| (o.url.to_string(), o.size))
        .collect();
    assert_eq!(
        listed,
        [
            ("s3://bucket/m/model.safetensors".to_string(), 10_000),
            ("s3://bucket/m/other.bin".to_string(), 10)
        ]
    );
}

#[test]
fn vectored_reads_cut_pieces_across_buffers() {
    let (_, faulty, store) = setup(vec![], 3);
    let info = store.info(&url("m/model.safetensors")).unwrap();
    let all = bytes(10_000);
    // A 40-byte head and a 2,460-byte payload from 300: pieces of 1,000 bytes from 300,
    // the first spanning both buffers (3 GETs, not 4); an empty buffer between them.
    let (mut head, mut empty, mut payload) = (vec![0u8; 40], vec![0u8; 0], vec![0u8; 2460]);
    let r = store
        .read_vectored(&info, 300, vec![&mut head, &mut empty, &mut payload])
        .unwrap();
    assert_eq!(head, all[300..340]);
    assert_eq!(payload, all[340..2800]);
    assert_eq!((r.requests, r.bytes), (3, 2500));
    assert_eq!(faulty.gets(), 3);
    // Past the end: a typed error naming the range, before any request.
    let mut tail = vec![0u8; 10];
    let e = store
        .read_vectored(&info, 9_995, vec![&mut head[..1], &mut tail])
        .unwrap_err();
    assert!(
        matches!(e, RemoteError::OutOfRange { size: 10_000, .. }),
        "{e:?}"
    );
    assert_eq!(faulty.gets(), 3);
}

#[test]
fn a_vectored_piece_cut_short_is_retried_whole() {
    let (_, _, store) = setup(vec![Fault::Short(5)], 3);
    let info = store.info(&url("m/model.safetensors")).unwrap();
    let (mut head, mut payload) = (vec![0u8; 8], vec![0u8; 700]);
    let r = store
        .read_vectored(&info, 1000, vec![&mut head, &mut payload])
        .unwrap();
    let all = bytes(10_000);
    assert_eq!(head, all[1000..1008]);
    assert_eq!(payload, all[1008..1708]);
    assert_eq!((r.requests, r.retried), (1, 1));
}

#[test]
fn a_failed_or_short_get_is_retried_and_counted() {
    let (_, _, store) = setup(vec![Fault::Fail, Fault::Short(3), Fault::Long], 3);
    let info = store.info(&url("m/model.safetensors")).unwrap();
    let mut a = vec![0u8; 800];
    let r = store.read_ranges(&info, vec![(0, &mut a)]).unwrap();
    assert_eq!(a, bytes(10_000)[..800]);
    assert_eq!((r.requests, r.retried), (1, 3));
}

#[test]
fn a_get_that_stays_short_is_a_typed_error_naming_object_and_range() {
    let (_, _, store) = setup(vec![Fault::Short(1); 3], 2);
    let info = store.info(&url("m/model.safetensors")).unwrap();
    let mut a = vec![0u8; 500];
    let e = store.read_ranges(&info, vec![(1000, &mut a)]).unwrap_err();
    assert!(matches!(e, RemoteError::Short { got: 499, .. }), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.contains("s3://bucket/m/model.safetensors") && msg.contains("1000..1500"),
        "{msg}"
    );
    let (_, _, store) = setup(vec![Fault::Long; 3], 2);
    let e = store.read_ranges(&info, vec![(0, &mut a)]).unwrap_err();
    assert!(matches!(e, RemoteError::Short { got: 501, .. }), "{e:?}");
    let (_, _, store) = setup(vec![Fault::Fail; 3], 2);
    let e = store.read_ranges(&info, vec![(0, &mut a)]).unwrap_err();
    assert!(
        matches!(e, RemoteError::Read { .. }) && e.to_string().contains("0..500"),
        "{e}"
    );
}

#[test]
fn an_object_replaced_mid_load_is_refused_not_mixed() {
    let (mem, _, store) = setup(vec![], 3);
    let info = store.info(&url("m/model.safetensors")).unwrap();
    assert!(info.etag.is_some());
    put(&mem, "m/model.safetensors", &vec![9u8; 10_000]); // a new version
    let mut a = vec![0u8; 100];
    let e = store.read_ranges(&info, vec![(0, &mut a)]).unwrap_err();
    assert!(matches!(e, RemoteError::Changed { .. }), "{e:?}");
    // The double's injected precondition failure reads the same, and is not retried.
    let (_, faulty, store) = setup(vec![Fault::Changed], 3);
    let info = store.info(&url("m/model.safetensors")).unwrap();
    let e = store.read_ranges(&info, vec![(0, &mut a)]).unwrap_err();
    assert!(matches!(e, RemoteError::Changed { .. }), "{e:?}");
    assert_eq!(faulty.gets(), 1);
}

#[test]
fn missing_objects_ranges_past_the_end_and_foreign_urls_are_typed_errors() {
    let (mem, _, store) = setup(vec![], 3);
    let e = store.info(&url("m/nope")).unwrap_err();
    assert!(matches!(e, RemoteError::NotFound { .. }) && e.to_string().contains("m/nope"));
    let info = store.info(&url("m/other.bin")).unwrap();
    let mut a = vec![0u8; 11];
    let e = store.read_ranges(&info, vec![(0, &mut a)]).unwrap_err();
    assert!(
        matches!(e, RemoteError::OutOfRange { size: 10, .. }),
        "{e:?}"
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(mem.delete(&Path::from("m/other.bin"))).unwrap();
    let mut a = vec![0u8; 5];
    let e = store.read_ranges(&info, vec![(0, &mut a)]).unwrap_err();
    assert!(matches!(e, RemoteError::NotFound { .. }), "{e:?}");
    let e = store
        .info(&ObjectUrl::parse("s3://elsewhere/k").unwrap())
        .unwrap_err();
    assert!(matches!(e, RemoteError::BadUrl { .. }), "{e:?}");
}

#[test]
fn a_store_configures_from_options_without_touching_the_network() {
    let u = ObjectUrl::parse("s3://models/llama").unwrap();
    let o = RemoteOptions {
        endpoint: Some("http://127.0.0.1:9".into()),
        region: Some("us-east-1".into()),
        virtual_hosted: Some(false),
        allow_http: true,
        ..RemoteOptions::default()
    };
    assert!(RemoteStore::open(&u, &o).is_ok());
}

#[test]
fn a_failed_listing_is_classified_by_a_typed_head_not_by_its_text() {
    use sluice_engine::{Classify, ErrorClass};
    use sluice_remote::ListFault;
    let mem = Arc::new(InMemory::new());
    put(&mem, "m/model.safetensors", &bytes(10));
    let bucket = ObjectUrl::parse("s3://bucket/m").unwrap();
    for (fault, class) in [
        (ListFault::MissingBucket, ErrorClass::NotFound),
        (ListFault::Refused, ErrorClass::PermissionDenied),
    ] {
        let faulty = Arc::new(FaultyStore::new(mem.clone(), vec![]).lists(fault));
        let store = RemoteStore::with_store(&bucket, faulty, &opts(0));
        for err in [
            store.list(&url("m")).unwrap_err(),
            store.list_dir(&url("m")).unwrap_err(),
        ] {
            assert_eq!(err.class(), class, "{fault:?}: {err}");
            assert!(err.to_string().contains("s3://bucket/m"), "{err}");
        }
    }
    let err = RemoteStore::with_store(
        &bucket,
        Arc::new(FaultyStore::new(mem.clone(), vec![]).lists(ListFault::MissingBucket)),
        &opts(0),
    )
    .list(&url("m"))
    .unwrap_err();
    assert!(err.to_string().contains("no such bucket"), "{err}");
}
