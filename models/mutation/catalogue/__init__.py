"""Every mutation, one catalogue per subsystem. Each entry names the
invariant (docs/design.md) whose guard it breaks, the text it replaces,
and the check expected to catch it; the code marks each guard with a
`guard: <id>` comment (guards.py)."""

from . import capacity, engine, fleet, fs_tier, limits, lookup, objects, python, save, settings, vllm

#: In a fixed order: the CI sample (record.fixed_sample) is taken in it.
MUTATIONS = (lookup.MUTATIONS + save.MUTATIONS + fs_tier.MUTATIONS + vllm.MUTATIONS
             + capacity.MUTATIONS + limits.MUTATIONS + python.MUTATIONS + engine.MUTATIONS
             + settings.MUTATIONS + objects.MUTATIONS + fleet.MUTATIONS + vllm.APPENDED)
