"""Issue 41's mutations, appended last so that the CI sample
(record.fixed_sample, taken in registry order) keeps its members: the one
door settings pass (src/settings/, kvtier::settings), H7-H10; and vLLM's
transfers' change log (src/tier/vllm/changes.rs), V11."""

from ..defs import TEST, Mutation

MUTATIONS = [
    Mutation(
        "H7-durations-are-not-negative",
        "a negative or NaN duration reaches Duration::from_secs_f64, which panics",
        [("    if value.is_nan() || value < 0.0 {", "    if false {")],
        TEST + ["-p", "kvtier", "--lib", "settings::values::tests::durations_threads_and_policies"],
    ),
    Mutation(
        "H8-sizes-parse-whole-units",
        "a size's unit is read by stripping suffixes: 5GIBIBIB and 5BBBB pass as sizes",
        [("    let shift = match unit.as_str() {",
          "    let shift = match unit.trim_end_matches(\"IB\").trim_end_matches('B') {")],
        TEST + ["-p", "kvtier", "--lib", "settings::values::tests::sizes_parse_whole_units"],
    ),
    Mutation(
        "H9-a-budget-holds-a-byte",
        "a budget of 0 bytes is built: every store then evicts everything and fails",
        [("NonZeroU64::new(capacity_bytes).ok_or_else(", "NonZeroU64::new(capacity_bytes.max(1)).ok_or_else(")],
        TEST + ["-p", "kvtier", "--lib", "settings::budget::tests::a_budget_holds_a_byte"],
    ),
    Mutation(
        "H10-a-budget-holds-a-block",
        "vLLM's transfers take a budget smaller than one block: every store fails, seen only in a counter",
        [("        if capacity < block {", "        if false {")],
        TEST + ["-p", "kvtier", "--test", "vllm_capacity", "a_budget_smaller_than_one_block"],
    ),
    Mutation(
        "V11-a-block-already-there-is-no-change",
        "without a budget, a store of blocks the tier holds already logs them stored again for the lookups",
        [(".filter(|(i, _)| job.present.binary_search(i).is_err());", ".filter(|_| true);")],
        TEST + ["-p", "kvtier", "--test", "vllm_transfers", "a_store_of_blocks_already_there"],
    ),
]
