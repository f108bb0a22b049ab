//! Hosts sharing one bucket prefix through the fleet's books on a real
//! Valkey (tests/common/valkey.rs; skipped with the reason without one),
//! the objects in memory: one budget and one recency across hosts, pins,
//! a dead writer's space coming back after its lease, a commit after its
//! lease refused and its object deleted, lost books rebuilt from a listing.
#![cfg(all(feature = "fleet", not(any(kvtier_loom, kvtier_shuttle))))]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::outage::Outage;
use common::valkey::ValkeyServer;
use futures_util::StreamExt;
use kvtier::TierError;
use kvtier::tier::fleet::{Admission, FleetBooks, FleetBudget, IndexTimeouts};
use object_store::memory::InMemory;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};

const BLOCK: u64 = 100;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

async fn host(url: &str, namespace: &str, blocks: u64, lease: Duration) -> FleetBudget {
    let books = FleetBooks::connect(url, namespace, IndexTimeouts::default())
        .await
        .unwrap();
    FleetBudget::open(books, blocks * BLOCK, lease).await
}

fn at(name: &str) -> ObjectPath {
    ObjectPath::from(format!("ns/{name}.bin"))
}

fn is_block(location: &ObjectPath) -> bool {
    location.as_ref().ends_with(".bin")
}

/// Writes `name`'s object through `budget` (room, put, commit).
async fn store(
    budget: &FleetBudget,
    objects: &dyn ObjectStore,
    name: &str,
) -> Result<(), TierError> {
    let location = at(name);
    match budget.admit(objects, &location, BLOCK).await? {
        Admission::Present => Ok(()),
        Admission::Write(write) => {
            objects
                .put(&location, vec![7u8; BLOCK as usize].into())
                .await
                .unwrap();
            write.commit(objects).await
        }
    }
}

async fn bytes_in(objects: &dyn ObjectStore) -> u64 {
    let mut total = 0;
    let mut listing = objects.list(Some(&ObjectPath::from("ns")));
    while let Some(meta) = listing.next().await {
        total += meta.unwrap().size;
    }
    total
}

async fn ready(budget: &FleetBudget, objects: &dyn ObjectStore) {
    for _ in 0..50 {
        budget
            .maintain(objects, &ObjectPath::from("ns"), is_block)
            .await
            .unwrap();
        if budget.epoch().is_some() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the books did not become ready");
}

#[test]
fn hosts_share_one_budget_and_one_recency() {
    let Some(server) = ValkeyServer::start("hosts_share_one_budget_and_one_recency") else {
        return;
    };
    runtime().block_on(async {
        let objects: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let a = host(&server.url, "share", 3, Duration::from_secs(30)).await;
        ready(&a, &*objects).await;
        let b = host(&server.url, "share", 3, Duration::from_secs(30)).await;
        assert_eq!(a.epoch(), b.epoch(), "B adopts the books A made");
        for name in ["x0", "x1", "x2"] {
            store(&a, &*objects, name).await.unwrap();
        }
        // B reads x0 (a hit touches it): A's next store evicts x1, the
        // least recent across both hosts, not x0.
        assert_eq!(
            b.lookup(&[at("x0"), at("x9")]).await.unwrap(),
            [true, false]
        );
        b.note_hits([at("x0")]);
        b.maintain(&*objects, &ObjectPath::from("ns"), is_block)
            .await
            .unwrap();
        store(&a, &*objects, "x3").await.unwrap();
        assert_eq!(
            a.lookup(&[at("x0"), at("x1"), at("x2"), at("x3")])
                .await
                .unwrap(),
            [true, false, true, true]
        );
        assert!(
            objects.head(&at("x1")).await.is_err(),
            "the victim's object is deleted"
        );
        assert_eq!(bytes_in(&*objects).await, 3 * BLOCK);
        // A pinned block is not a victim: B pins x2, A stores x4 and x5.
        let pin = b.pin(&at("x2")).await.unwrap().expect("x2 is committed");
        store(&a, &*objects, "x4").await.unwrap();
        store(&a, &*objects, "x5").await.unwrap();
        assert_eq!(a.lookup(&[at("x2")]).await.unwrap(), [true]);
        pin.release().await.unwrap();
        assert!(
            b.pin(&at("x1")).await.unwrap().is_none(),
            "an evicted block is not pinned"
        );
        assert_eq!(bytes_in(&*objects).await, 3 * BLOCK);
        // A block stored again while committed is not written again.
        assert!(matches!(
            a.admit(&*objects, &at("x5"), BLOCK).await.unwrap(),
            Admission::Present
        ));
    });
}

#[test]
fn a_dead_writers_space_comes_back_after_its_lease() {
    let Some(server) = ValkeyServer::start("a_dead_writers_space_comes_back_after_its_lease")
    else {
        return;
    };
    runtime().block_on(async {
        let objects: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let lease = Duration::from_millis(300);
        let dead = host(&server.url, "dead", 2, lease).await;
        ready(&dead, &*objects).await;
        let alive = host(&server.url, "dead", 2, lease).await;
        store(&alive, &*objects, "y0").await.unwrap();
        // The dead host reserved y1, wrote its object, and died before
        // committing: its bytes stay counted, so the budget is full.
        let Admission::Write(write) = dead.admit(&*objects, &at("y1"), BLOCK).await.unwrap() else {
            panic!("room for y1");
        };
        objects.put(&at("y1"), vec![1u8; 100].into()).await.unwrap();
        // Dead: it renews nothing from now on.
        drop(dead);
        // y0 is the only victim the books may name: the reservation stays.
        match alive.admit(&*objects, &at("y2"), BLOCK).await {
            Ok(Admission::Write(y2)) => y2.abort().await.unwrap(),
            other => panic!("room for y2 by evicting y0: {other:?}"),
        }
        assert!(objects.head(&at("y0")).await.is_err());
        assert_eq!(bytes_in(&*objects).await, BLOCK, "y1 only");
        tokio::time::sleep(lease * 2).await;
        let swept = alive
            .maintain(&*objects, &ObjectPath::from("ns"), is_block)
            .await
            .unwrap();
        assert_eq!((swept.settled, swept.claimed_reservations), (1, 1));
        assert!(
            objects.head(&at("y1")).await.is_err(),
            "the dead writer's object is deleted"
        );
        // Its commit, late, is refused and deletes the object it wrote again.
        objects.put(&at("y1"), vec![1u8; 100].into()).await.unwrap();
        assert!(matches!(
            write.commit(&*objects).await,
            Err(TierError::Index { .. })
        ));
        assert!(objects.head(&at("y1")).await.is_err());
    });
}

#[test]
fn lost_books_are_rebuilt_from_a_listing() {
    let Some(mut server) = ValkeyServer::start("lost_books_are_rebuilt_from_a_listing") else {
        return;
    };
    runtime().block_on(async {
        let objects: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let a = host(&server.url, "lost", 4, Duration::from_secs(30)).await;
        ready(&a, &*objects).await;
        for name in ["z0", "z1", "z2"] {
            store(&a, &*objects, name).await.unwrap();
        }
        // A foreign object beside the blocks is neither counted nor deleted.
        objects
            .put(&ObjectPath::from("ns/notes.txt"), vec![0u8; 5].into())
            .await
            .unwrap();
        let before = a.epoch();
        if !server.stop() {
            return; // a server the test did not start cannot be restarted
        }
        server.restart();
        // Until rebuilt: lookups fail (misses), stores are refused.
        assert!(a.lookup(&[at("z0")]).await.is_err());
        assert!(a.admit(&*objects, &at("z3"), BLOCK).await.is_err());
        ready(&a, &*objects).await;
        assert_ne!(a.epoch(), before, "new books, a new epoch");
        assert_eq!(
            a.lookup(&[at("z0"), at("z1"), at("z2"), at("z3")])
                .await
                .unwrap(),
            [true, true, true, false]
        );
        store(&a, &*objects, "z3").await.unwrap();
        store(&a, &*objects, "z4").await.unwrap();
        assert_eq!(bytes_in(&*objects).await, 4 * BLOCK + 5);
    });
}

#[test]
fn a_victim_whose_object_stays_keeps_its_bytes_counted() {
    let Some(server) = ValkeyServer::start("a_victim_whose_object_stays_keeps_its_bytes_counted")
    else {
        return;
    };
    runtime().block_on(async {
        let outage = Arc::new(Outage::default());
        let objects: Arc<dyn ObjectStore> = outage.clone();
        let a = host(&server.url, "outage", 2, Duration::from_secs(30)).await;
        ready(&a, &*objects).await;
        store(&a, &*objects, "w0").await.unwrap();
        store(&a, &*objects, "w1").await.unwrap();
        // The store stops answering: w0, the victim, cannot be deleted, and
        // its bytes stay in the books while its object is in the bucket.
        outage.set_down(true);
        assert!(a.admit(&*objects, &at("w2"), BLOCK).await.is_err());
        outage.set_down(false);
        let status = a.status().await.unwrap();
        assert_eq!(status.committed + status.held, bytes_in(&*objects).await);
        assert_eq!((status.committed, status.held), (BLOCK, BLOCK));
        // No other store gets its room until the victim is settled.
        assert!(a.admit(&*objects, &at("w3"), BLOCK).await.is_ok());
        let status = a.status().await.unwrap();
        assert!(status.committed + status.held <= 2 * BLOCK, "{status:?}");
    });
}

#[test]
fn a_write_whose_books_were_lost_is_admitted_again_and_orphans_are_swept() {
    let Some(server) = ValkeyServer::start("a_write_whose_books_were_lost_is_admitted_again")
    else {
        return;
    };
    runtime().block_on(async {
        let objects: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let a = host(&server.url, "readmit", 3, Duration::from_secs(30)).await;
        ready(&a, &*objects).await;
        store(&a, &*objects, "v0").await.unwrap();
        // A reserves v1; the books are lost and rebuilt (by B) before its
        // object lands: its commit admits it again in the new books.
        let Admission::Write(write) = a.admit(&*objects, &at("v1"), BLOCK).await.unwrap() else {
            panic!("room for v1");
        };
        let books = FleetBooks::connect(&server.url, "readmit", IndexTimeouts::default())
            .await
            .unwrap();
        books.wipe().await.unwrap();
        let b = host(&server.url, "readmit", 3, Duration::from_secs(30)).await;
        ready(&b, &*objects).await;
        objects.put(&at("v1"), vec![1u8; 100].into()).await.unwrap();
        write.commit(&*objects).await.unwrap();
        assert_eq!(b.lookup(&[at("v0"), at("v1")]).await.unwrap(), [true, true]);
        let status = b.status().await.unwrap();
        assert_eq!((status.committed, status.held), (2 * BLOCK, 0));
        assert_eq!(bytes_in(&*objects).await, 2 * BLOCK);
        // An object nobody's books count (a writer that died between its
        // put and a refused commit) is swept once old enough; committed and
        // reserved blocks stay.
        objects
            .put(&at("orphan"), vec![2u8; 100].into())
            .await
            .unwrap();
        let Admission::Write(pending) = b.admit(&*objects, &at("v2"), BLOCK).await.unwrap() else {
            panic!("room for v2");
        };
        objects.put(&at("v2"), vec![3u8; 100].into()).await.unwrap();
        let prefix = ObjectPath::from("ns");
        assert_eq!(
            b.sweep_orphans(&*objects, &prefix, is_block, Duration::from_secs(600))
                .await
                .unwrap(),
            0,
            "too young"
        );
        assert_eq!(
            b.sweep_orphans(&*objects, &prefix, is_block, Duration::ZERO)
                .await
                .unwrap(),
            1
        );
        assert!(objects.head(&at("orphan")).await.is_err());
        pending.commit(&*objects).await.unwrap();
        assert_eq!(bytes_in(&*objects).await, 3 * BLOCK);
    });
}

#[test]
fn a_write_whose_object_was_evicted_during_a_rebuild_is_not_committed() {
    let Some(server) = ValkeyServer::start("a_write_whose_object_was_evicted_during_a_rebuild")
    else {
        return;
    };
    runtime().block_on(async {
        let objects: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let a = host(&server.url, "evicted", 1, Duration::from_secs(30)).await;
        ready(&a, &*objects).await;
        let Admission::Write(write) = a.admit(&*objects, &at("u1"), BLOCK).await.unwrap() else {
            panic!("room for u1");
        };
        objects.put(&at("u1"), vec![1u8; 100].into()).await.unwrap();
        // The books are lost; B rebuilds them (u1 listed, committed), then
        // evicts u1 for its own store before A's commit.
        FleetBooks::connect(&server.url, "evicted", IndexTimeouts::default())
            .await
            .unwrap()
            .wipe()
            .await
            .unwrap();
        let b = host(&server.url, "evicted", 1, Duration::from_secs(30)).await;
        ready(&b, &*objects).await;
        assert_eq!(
            b.lookup(&[at("u1")]).await.unwrap(),
            [true],
            "the rebuild listed u1"
        );
        store(&b, &*objects, "u2").await.unwrap();
        // A's commit admits u1 again, finds its object gone: not committed.
        assert!(write.commit(&*objects).await.is_err());
        assert_eq!(
            b.lookup(&[at("u1"), at("u2")]).await.unwrap(),
            [false, true]
        );
        let status = b.status().await.unwrap();
        assert_eq!((status.committed, status.held), (BLOCK, 0));
    });
}
