"""Issue 43's mutations, appended after issue 42's so that the CI sample
keeps its members: the fleet's books in Valkey (src/tier/fleet/books.lua),
each caught by the script's differential test against the reference model
on a real Valkey (models/tests/fleet_differential.rs), and a host's side
(src/tier/fleet/budget.rs), caught by tests/fleet_budget.rs. Both need a
Valkey: KVTIER_VALKEY or target/valkey-venv."""

from ..defs import TEST, Mutation, pytest

DIFFERENTIAL = TEST + ["-p", "kvtier-models", "--test", "fleet_differential"]

MUTATIONS = [
    Mutation(
        "G1-victims-are-unpinned-least-recent-blocks",
        "a reserve that needs room evicts a block a host is reading (its pin ignored)",
        [("      if pinned == 0 then", "      if pinned >= 0 then")],
        DIFFERENTIAL,
    ),
    Mutation(
        "G2-a-caller-of-another-epoch-is-refused",
        "a host of the books' previous life reserves, commits and pins in the rebuilt books with its old tokens",
        [("if current ~= epoch then", "if current ~= epoch and false then")],
        DIFFERENTIAL,
    ),
    Mutation(
        "G3-only-the-lock-holder-rebuilds",
        "a host that does not hold the rebuild lock adds blocks to the books being rebuilt",
        [("  if status ~= 'rebuilding' or redis.call('GET', LOCK) ~= ARGV[3] then\n    return { 'not_holder' }\n  end\n  local capacity",
          "  if status ~= 'rebuilding' then\n    return { 'not_holder' }\n  end\n  local capacity")],
        DIFFERENTIAL,
    ),
    Mutation(
        "G4-a-reservation-is-granted-only-what-fits",
        "a reservation is granted beyond the capacity: the fleet's bytes exceed the budget",
        [("  if used + bytes <= capacity then", "  if used <= capacity then")],
        DIFFERENTIAL,
    ),
    Mutation(
        "G5-a-commit-after-its-lease-is-refused",
        "a commit whose reservation's lease ended (claimed by a sweeper meanwhile) is accepted: the books count an object the sweeper deletes",
        [("  if not entry or entry.kind ~= 'r' or entry.token ~= token or entry.deadline <= now then",
          "  if not entry or entry.kind ~= 'r' or entry.token ~= token then")],
        DIFFERENTIAL,
    ),
    Mutation(
        "G6-only-the-holder-releases",
        "any host releases another's reservation or eviction: its bytes leave the books while its object is written or deleted",
        [("    if entry and entry.token == token then\n      unhold(ARGV[i], entry)",
          "    if entry then\n      unhold(ARGV[i], entry)")],
        DIFFERENTIAL,
    ),
    Mutation(
        "G7-an-expired-lease-is-not-renewed",
        "an expired lease is renewed: a holder presumed dead (and its entry claimed) takes it back",
        [("    if entry and entry.token == token and entry.deadline > now then",
          "    if entry and entry.token == token then")],
        DIFFERENTIAL,
    ),
    Mutation(
        "G8-only-expired-entries-are-claimed",
        "a sweeper claims live reservations and evictions: a store under way loses its reservation",
        [("  local keys = redis.call('ZRANGEBYSCORE', DEADLINES, '-inf', now, 'LIMIT', 0, tonumber(ARGV[5]))",
          "  local keys = redis.call('ZRANGEBYSCORE', DEADLINES, '-inf', '+inf', 'LIMIT', 0, tonumber(ARGV[5]))")],
        DIFFERENTIAL,
    ),
    Mutation(
        "G9-one-holder-per-block",
        "a block already reserved (or being evicted) is reserved again: two holders, its bytes counted twice",
        [("  if redis.call('HEXISTS', HELD, key) == 1 then\n    return { 'busy' }",
          "  if redis.call('HEXISTS', HELD, key) == 2 then\n    return { 'busy' }")],
        DIFFERENTIAL,
    ),
    Mutation(
        "G10-no-step-while-the-books-are-rebuilt",
        "lookups, reserves and commits run on books half rebuilt: blocks not yet listed miss, and room is granted from a partial count",
        [("if status ~= 'ready' then\n  return { 'rebuilding' }", "if false then\n  return { 'rebuilding' }")],
        DIFFERENTIAL,
    ),
    Mutation(
        "G11-a-refused-commit-deletes-its-object",
        "a commit the books refuse (its lease ended, a sweeper settled it) leaves its object: the bucket holds bytes the books do not count",
        [("                delete_objects(store, std::slice::from_ref(&self.key)).await;\n",
          "")],
        TEST + ["-p", "kvtier", "--test", "fleet_budget", "a_dead_writers_space_comes_back_after_its_lease"],
    ),
    Mutation(
        "G12-only-deleted-victims-are-released",
        "a victim whose object could not be deleted is released: its bytes leave the books while its object stays in the bucket",
        [("                    self.release(&deleted).await?;", "                    self.release(&keys).await?;")],
        TEST + ["-p", "kvtier", "--test", "fleet_budget", "a_victim_whose_object_stays"],
    ),
    Mutation(
        "G13-the-index-url-is-checked",
        "an index URL of another scheme (http://) is taken: the client fails later, far from the setting",
        [("        if !SCHEMES.contains(&scheme) {", "        if SCHEMES.is_empty() {")],
        TEST + ["-p", "kvtier", "--lib", "settings::index::tests::urls_are_checked"],
    ),
    Mutation(
        "G16-the-books-are-kept-up-on-a-task",
        "the fleet's books are kept up only on demand: leases lapse, hits are never touched, and books lost in a restart stay lost",
        [("                tokio::time::sleep(every).await;\n", "                tokio::time::sleep(every).await;\n                if every > std::time::Duration::ZERO {\n                    return;\n                }\n")],
        TEST + ["-p", "kvtier", "--test", "vllm_fleet", "a_restarted_index_is_rebuilt"],
    ),
    Mutation(
        "G17-an-index-needs-a-bucket-and-a-capacity",
        "an index without capacity_bytes (or without a bucket) is taken and ignored: the operator believes the fleet bounded",
        [("        if !missing.is_empty() {", "        if missing.is_empty() && false {")],
        pytest("tests/test_fleet_index.py::test_the_index_passes_the_door_with_its_rules"),
    ),
    Mutation(
        "G18-only-keys-the-books-do-not-know-are-orphans",
        "the orphan sweep takes every listed block for an orphan: committed and reserved blocks are deleted",
        [("    reply[#reply + 1] = known and 0 or 1", "    reply[#reply + 1] = 1")],
        DIFFERENTIAL,
    ),
    Mutation(
        "G19-a-write-of-lost-books-is-admitted-again",
        "a store reserved in books that were lost and rebuilt commits nowhere: its object stays in the bucket, counted by no books",
        [("            return budget.readmit(store, &self.key, self.bytes).await;",
          "            return Err(TierError::Index { op: \"commit\", detail: String::new() });"),
         ("                budget.readmit(store, &self.key, self.bytes).await\n",
          "                Err(TierError::Index { op: \"commit\", detail: String::new() })\n")],
        TEST + ["-p", "kvtier", "--test", "fleet_budget", "a_write_whose_books_were_lost"],
    ),
    Mutation(
        "G20-only-old-orphans-are-swept",
        "the orphan sweep deletes objects of any age: a store between its put and its commit loses its object",
        [("            if classify(&meta.location) && meta.last_modified < cutoff {",
          "            if classify(&meta.location) && meta.last_modified <= chrono::Utc::now() {")],
        TEST + ["-p", "kvtier", "--test", "fleet_budget", "a_write_whose_books_were_lost"],
    ),
    Mutation(
        "G21-a-readmitted-write-needs-its-object",
        "a write admitted again after a rebuild makes room before looking: blocks are evicted for an object the rebuilt books' eviction took already",
        [("        if store.head(&location).await.is_err() {", "        if store.head(&location).await.is_err() && false {")],
        TEST + ["-p", "kvtier", "--test", "fleet_budget", "a_write_whose_object_was_evicted"],
    ),
    Mutation(
        "G23-a-key-is-renewed-until-its-last-hold-goes",
        "the first of two pins of a block let go stops renewing it: the other read's pin lapses and the block can be evicted under it",
        [("            Some(count) if *count > 1 => {", "            Some(count) if *count > 99 => {")],
        TEST + ["-p", "kvtier", "--lib", "holds_count_and_the_last_one_lets_go"],
    ),
    Mutation(
        "G24-a-commit-is-a-change-for-the-lookups",
        "a host's commits are not logged: its lookups keep the misses they cached for blocks it has since stored (never settled)",
        [("                budget.inner.host.note_changes([self.key.as_str()], true);\n", "")],
        TEST + ["-p", "kvtier", "--test", "vllm_fleet", "a_hosts_commits_and_the_blocks_it_takes_out"],
    ),
    Mutation(
        "G25-an-indexed-store-is-admitted-by-the-books",
        "kvtier's ObjectTier with an index puts its blocks without asking the books: the namespace grows past the fleet's capacity",
        [("    let write = match fleet.admit(store, location, bytes).await? {",
          "    if bytes > 0 {\n        return put(store, location, payload).await;\n    }\n    let write = match fleet.admit(store, location, bytes).await? {")],
        TEST + ["-p", "kvtier", "--test", "object_index", "two_tiers_share_one_budget"],
    ),
]
