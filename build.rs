//! Names for the cfg conditions the library repeats, written once.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    cfg_aliases::cfg_aliases! {
        // Under a model checker, only the pieces it models are built.
        model_checked: { any(kvtier_loom, kvtier_shuttle) },
        // The tokio prober: on tokio, or on shuttle's executor under shuttle.
        tokio_driver: { any(all(feature = "tokio", not(model_checked)), all(kvtier_shuttle, not(kvtier_loom))) },
        fs_tier: { all(feature = "fs", not(model_checked)) },
        object_tier: { all(feature = "object-store", not(model_checked)) },
        // The fleet's books in Valkey or Redis.
        fleet_index: { all(feature = "fleet", not(model_checked)) },
        // Code both tiers share.
        tiers: { any(fs_tier, object_tier) },
    }
}
