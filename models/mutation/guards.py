"""Where each mutation applies: the `guard: <id>` tags in the code, and
the text a mutation makes of the file that holds them. Reads only."""

import os
import re

#: A mutation edits only the GUARD_WINDOW lines after each of its tags.
GUARD_WINDOW = 12
GUARD_TAG = re.compile(r"^[ \t]*(?://|#|--) guard: ([A-Z][A-Za-z0-9-]*)[ \t]*$")

#: Where guard tags live: the library, the CLI, the Python package's native
#: module (Rust, `// guard:`) and its Python code (`# guard:`).
GUARDED = ["src", os.path.join("cli", "src"), os.path.join("python", "src"), os.path.join("python", "kvtier")]
GUARDED_SUFFIXES = (".rs", ".py", ".lua")

_TAGS = {}


def guard_tags(tree, read=None):
    """{id: [(file, line)]} for every `guard: <id>` line under GUARDED,
    lines counted in the file with every tag line removed."""
    read = read or (lambda path: open(os.path.join(tree, path)).read())
    tags = {}
    for folder, dirs, files in (w for top in GUARDED for w in os.walk(os.path.join(tree, top))):
        dirs.sort()
        for name in sorted(files):
            if not name.endswith(GUARDED_SUFFIXES):
                continue
            path = os.path.relpath(os.path.join(folder, name), tree)
            kept = 0
            for line in read(path).split("\n"):
                match = GUARD_TAG.match(line)
                if match:
                    tags.setdefault(match.group(1), []).append((path, kept))
                else:
                    kept += 1
    return tags


def cached_guard_tags(tree):
    if tree not in _TAGS:
        _TAGS[tree] = guard_tags(tree)
    return _TAGS[tree]


def locate(mutation, tree):
    """(file, untagged text, [(start, end)] windows) for the mutation's
    tags, or a reason why they cannot be used."""
    places = guard_tags(tree).get(mutation.id)
    if not places:
        return f"no `// guard: {mutation.id}` tag under {' or '.join(GUARDED)}"
    files = {file for file, _ in places}
    if len(files) != 1:
        return f"the tags of {mutation.id} are in several files: {sorted(files)}"
    file = places[0][0]
    lines = [l for l in open(os.path.join(tree, file)).read().split("\n") if not GUARD_TAG.match(l)]
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line) + 1)
    windows = [(offsets[n], offsets[min(n + GUARD_WINDOW, len(lines))]) for _, n in places]
    return file, "\n".join(lines), windows


def mutated_text(mutation, tree):
    """(file, the mutated text) for the mutation in `tree` (the text without
    its guard tags, which are comments), or a string saying why the
    mutation is stale. Reads only."""
    located = locate(mutation, tree)
    if isinstance(located, str):
        return located
    file, text, windows = located
    for old, new in mutation.edits:
        hits = sorted({start + i for start, end in windows for i in find_all(text[start:end], old)})
        if len(hits) != 1:
            return f"`{old.strip()[:50]}` occurs {len(hits)} times after the {mutation.id} tags in {file}"
        at = hits[0]
        text = text[:at] + new + text[at + len(old):]
        shift = len(new) - len(old)
        windows = [(s if s <= at else s + shift, e if e <= at else e + shift) for s, e in windows]
    return file, text


def find_all(text, needle):
    found, at = [], text.find(needle)
    while at != -1:
        found.append(at)
        at = text.find(needle, at + 1)
    return found
