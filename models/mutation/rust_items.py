"""The items of a Rust source file, found without a compiler: enough for
the mutation record to key a check on its own test functions and the
helpers they name (keys.py), whichever file holds them.

A tokenizer that knows comments (nested block comments too), strings (raw
and byte strings), character literals and lifetimes, then a walk over the
tokens that finds `fn`, `struct`, `enum`, `trait`, `type`, `const`,
`static`, `impl`, `macro_rules!` and `mod` items with their nesting. An
item's text is its tokens joined by single spaces: comments and layout do
not change it.
"""

import re
from dataclasses import dataclass, field

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NUMBER = re.compile(r"[0-9][A-Za-z0-9_.]*")


@dataclass
class Item:
    kind: str        # fn, struct, enum, trait, type, const, static, impl, macro, mod
    name: str        # for an impl, the type it is for
    text: str        # the item's tokens, space-joined
    path: list       # the inline modules it sits in
    test: bool       # a function marked #[test] (or #[tokio::test], ...)
    test_module: bool  # inside a module named `tests` or marked #[cfg(test)]
    idents: set = field(default_factory=set)


def tokens(text):
    """[(kind, text)]: kind is 'ident', 'lit' (string, char or number),
    'life' (lifetime) or 'punct'. Never raises: an unterminated string or
    comment ends at the end of the text (a guard window may cut one)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif (m := re.compile(r'b?r(#*)"').match(text, i)) and (i == 0 or not _ident_char(text[i - 1])):
            close = '"' + m.group(1)
            j = text.find(close, m.end())
            j = n if j < 0 else j + len(close)
            out.append(("lit", text[i:j]))
            i = j
        elif c == '"' or (c == "b" and text.startswith('b"', i)):
            j = i + (2 if c == "b" else 1)
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(("lit", text[i:j + 1]))
            i = j + 1
        elif c == "'" or (c == "b" and text.startswith("b'", i)):
            start = i
            i += 2 if c == "b" else 1
            if i < n and text[i] == "\\":
                j = text.find("'", i + 2)
                i = n if j < 0 else j + 1
                out.append(("lit", text[start:i]))
            elif i + 1 < n and text[i + 1] == "'":
                out.append(("lit", text[start:i + 2]))
                i += 2
            else:
                m = _IDENT.match(text, i)
                i = m.end() if m else i
                out.append(("life", text[start:i]))
        elif m := _IDENT.match(text, i):
            out.append(("ident", m.group()))
            i = m.end()
        elif m := _NUMBER.match(text, i):
            out.append(("lit", m.group()))
            i = m.end()
        else:
            out.append(("punct", c))
            i += 1
    return out


def _ident_char(c):
    return c.isalnum() or c == "_"


def joined(toks):
    return " ".join(t for _, t in toks)


_ITEM_KINDS = {"fn", "struct", "enum", "trait", "type", "const", "static", "impl", "mod", "union"}


_PARSED = {}


def items(text):
    """Every item of a Rust file, nested ones included, and the files its
    `mod name;` lines declare: (items, [(name, [attribute])]). Memoized by
    text."""
    if text not in _PARSED:
        _PARSED[text] = _items(text)
    return _PARSED[text]


def _items(text):
    toks = tokens(text)
    found, declared = [], []
    _walk(toks, 0, len(toks), [], False, found, declared)
    return found, declared


def _matching(toks, at):
    """The index just past the `}` that closes the `{` at `at`."""
    depth = 0
    for j in range(at, len(toks)):
        kind, t = toks[j]
        if kind == "punct" and t == "{":
            depth += 1
        elif kind == "punct" and t == "}":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(toks)


def _attrs_before(toks, at):
    """The `#[...]` attributes just before token `at` (past visibility and
    qualifier words), each as its tokens' text."""
    j = at - 1
    while j >= 0 and toks[j][0] == "ident" and toks[j][1] in ("pub", "async", "unsafe", "const", "extern", "crate", "default"):
        j -= 1
    if j >= 0 and toks[j] == ("punct", ")") and toks[j - 1][1] == "crate":  # pub(crate)
        j -= 4
    attrs = []
    while j >= 0 and toks[j] == ("punct", "]"):
        depth, k = 0, j
        while k >= 0:
            if toks[k] == ("punct", "]"):
                depth += 1
            elif toks[k] == ("punct", "["):
                depth -= 1
                if depth == 0:
                    break
            k -= 1
        if k >= 1 and toks[k - 1] == ("punct", "#"):
            attrs.append(joined(toks[k + 1:j]))
            j = k - 2
        elif k >= 2 and toks[k - 1] == ("punct", "!") and toks[k - 2] == ("punct", "#"):
            j = k - 3
        else:
            break
    return list(reversed(attrs))


def _walk(toks, start, end, path, in_test, found, declared):
    i = start
    while i < end:
        kind, t = toks[i]
        if kind == "ident" and t == "macro_rules" and i + 2 < end and toks[i + 1] == ("punct", "!"):
            name = toks[i + 2][1]
            j = i + 3
            while j < end and toks[j][1] not in ("{", "(", "["):
                j += 1
            stop = _matching(toks, j) if toks[j][1] == "{" else _until_semicolon(toks, j, end)
            found.append(_item("macro", name, toks[i:stop], path, False, in_test))
            i = stop
            continue
        if kind != "ident" or t not in _ITEM_KINDS or i + 1 >= end:
            i += 1
            continue
        if t == "const" and toks[i + 1][1] in ("fn", "unsafe", "async", "extern"):
            i += 1
            continue
        if t != "impl" and toks[i + 1][0] != "ident":
            i += 1  # `fn(u32)` as a type, `x.union(..)`: not an item
            continue
        if t in ("type", "const", "static") and i and toks[i - 1][1] in ("<", ","):
            i += 1  # a generic parameter, not an item
            continue
        name = _name(toks, i, end)
        attrs = _attrs_before(toks, i)
        # Where the item ends: a `;` before any `{`, or the `}` matching its
        # first `{` (a tuple struct's `(...)` and a const's initializer `{}`
        # are both handled by looking for whichever comes first at depth 0).
        j, depth = i + 1, 0
        while j < end:
            k, s = toks[j]
            if k == "punct" and s in "([":
                depth += 1
            elif k == "punct" and s in ")]":
                depth -= 1
            elif k == "punct" and s == ";" and depth == 0:
                break
            elif k == "punct" and s == "{" and depth == 0 and t != "const" and t != "static":
                break
            elif k == "punct" and s == "{" and t in ("const", "static"):
                j = _matching(toks, j) - 1
            j += 1
        if j >= end or toks[j][1] == ";":
            stop = min(j + 1, end)
            if t == "mod":
                declared.append((name, attrs))
            else:
                found.append(_item(t, name, toks[i:stop], path, _is_test(t, attrs), in_test))
            i = stop
            continue
        stop = _matching(toks, j)
        if t == "mod":
            testish = in_test or name == "tests" or is_cfg_test(attrs)
            found.append(_item("mod", name, toks[i:stop], path, False, in_test))
            _walk(toks, j + 1, stop - 1, path + [name], testish, found, declared)
        else:
            # An impl is its header: its methods are items of their own,
            # followed by name like any function.
            text = toks[i:j + 1] if t == "impl" else toks[i:stop]
            found.append(_item(t, name, text, path, _is_test(t, attrs), in_test))
            _walk(toks, j + 1, stop - 1, path, in_test, found, declared)
        i = stop
    return found


def is_cfg_test(attrs):
    """Whether attributes hold a `cfg(...)` that needs `test`."""
    return any(a.startswith("cfg (") and re.search(r"\btest\b", a) and "not ( test" not in a for a in attrs)


def _is_test(kind, attrs):
    """A function marked `#[test]`, `#[tokio::test]` or `#[test_case(..)]`-like."""
    return kind == "fn" and any(a == "test" or a.endswith(": test") or a.startswith("test (")
                                or a.endswith(": test (") for a in attrs)


def _until_semicolon(toks, j, end):
    while j < end and toks[j][1] != ";":
        j += 1
    return min(j + 1, end)


def _name(toks, i, end):
    kind = toks[i][1]
    if kind != "impl":
        return toks[i + 1][1]
    # impl<..> Trait for Type<..> { / impl<..> Type<..> {
    j, header = i + 1, []
    while j < end and toks[j][1] != "{":
        header.append(toks[j])
        j += 1
    words = [t for k, t in header if k == "ident"]
    if "for" in words:
        words = words[words.index("for") + 1:]
    else:
        # Skip the generic parameters after `impl`.
        depth, rest = 0, []
        for k, t in header:
            if t == "<":
                depth += 1
            elif t == ">":
                depth -= 1
            elif depth == 0 and k == "ident":
                rest.append(t)
        words = rest or words
    words = [w for w in words if w not in ("dyn", "mut", "const", "where", "crate", "super", "self")]
    return words[0] if words else "?"


def _item(kind, name, toks, path, is_test, in_test):
    return Item(kind, name, joined(toks), list(path), is_test, in_test,
                {t for k, t in toks if k == "ident"})
