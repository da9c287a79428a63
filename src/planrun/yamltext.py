"""The YAML side of :mod:`planrun.loading`: PyYAML, loaded only when YAML text is parsed.

YAML 1.2 *core* typing on libyaml's parser (PyYAML's ``CSafeLoader`` when built with it),
the node graph turned into the JSON data model (duplicate keys, non-text keys, tags, merge
keys, non-finite numbers and deep nesting refused), alias expansion bounded, and lines and
columns of JSON Pointers found in the composed nodes. Importing PyYAML costs a process
about 7 ms: a ``resume`` whose registry is known (:mod:`planrun.parse_cache`), or a JSON
plan, does not pay it.
"""

from __future__ import annotations

import math
import re
from typing import Any

import yaml

from .issues import Issue
from .loading import (
    MAX_ALIAS_CHARS,
    MAX_ALIAS_EXPANSION,
    MAX_DEPTH,
    Document,
    DocumentError,
    _issue,
    has_surrogate,
    not_text,
)
from .pointers import pointer_escape, split_pointer


class CoreResolver(yaml.resolver.Resolver):
    """The YAML 1.2 core schema's implicit typing (not PyYAML's YAML 1.1 defaults)."""

    yaml_implicit_resolvers: dict[Any, Any] = {}  # noqa: RUF012 - PyYAML's class-level table


CoreResolver.add_implicit_resolver(
    "tag:yaml.org,2002:null", re.compile(r"^(?:~|null|Null|NULL|)$"), ["~", "n", "N", ""]
)
CoreResolver.add_implicit_resolver(
    "tag:yaml.org,2002:bool",
    re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
    list("tTfF"),
)
CoreResolver.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"),
    list("-+0123456789"),
)
CoreResolver.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)

_Base: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_Base):  # type: ignore[misc]
    """libyaml's parser and composer (when available) with the core-schema resolver."""

    yaml_implicit_resolvers = CoreResolver.yaml_implicit_resolvers


_STR = "tag:yaml.org,2002:str"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_BOOL = "tag:yaml.org,2002:bool"
_NULL = "tag:yaml.org,2002:null"
_MAP = "tag:yaml.org,2002:map"
_SEQ = "tag:yaml.org,2002:seq"


def _scalar(node: yaml.ScalarNode, file: str | None, ptr: str) -> Any:
    tag, value = node.tag, node.value
    if tag == _STR:
        return value
    if tag == _NULL:
        return None
    if tag == _BOOL:
        return value.lower() == "true"
    if tag == _INT:
        v = value.lower().lstrip("+")
        try:
            if v.startswith(("0o", "0x")):
                number = int(v[2:], 8 if v[1] == "o" else 16)
                str(number)  # 0x + 4,000 hex digits reads, but could never be printed
                return number
            number = int(v, 10)
            str(number)  # printable: under Python's limit on digits (4,300)
            return number
        except ValueError:
            raise DocumentError(
                [_issue("syntax", f"{_clip(value)} is not an integer planrun can hold "
                        "(at most 4,300 decimal digits); quote it to make it text",
                        file, node.start_mark, ptr)]
            ) from None
    if tag == _FLOAT:
        try:
            f = float(value)
        except ValueError:
            f = math.nan
        if math.isnan(f) or math.isinf(f):
            raise DocumentError([
                _issue("syntax", f"{value!r} is not a number JSON can hold "
                       "(no .nan or .inf); quote it to make it text",
                       file, node.start_mark, ptr)
            ])
        return f
    raise DocumentError([
        _issue("syntax", f"unsupported YAML tag {tag!r}: only the JSON data model is accepted",
               file, node.start_mark, ptr)
    ])


def _clip(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:37] + "...")


def _expanded_size(root: yaml.Node) -> tuple[int, int, int, int]:
    """(nodes as written, nodes after alias expansion, and the same in characters).

    Aliases share node objects, so the written size counts distinct nodes and the expanded
    size counts every occurrence, memoised per node so a billion-laughs document costs
    only as much as its written size. The characters are those of the scalars (keys
    too), one more for each node: an anchored long string aliased a few thousand times
    is few nodes but gigabytes (a 1 MB plan made 3 GB of strings in `validate`).
    """
    memo: dict[int, tuple[int, int]] = {}
    distinct = chars = 0
    cap = 1 << 62
    # Iterative post-order walk: a deep document must not exhaust the C stack.
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if key in memo and not children_done:
            continue
        if isinstance(node, yaml.ScalarNode):
            size = len(node.value) + 1
            memo[key] = (1, size)
            distinct += 1
            chars += size
            continue
        kids: list[yaml.Node]
        if isinstance(node, yaml.MappingNode):
            kids = [n for kv in node.value for n in kv]
        else:
            kids = list(node.value)
        if not children_done:
            memo[key] = (-1, -1)  # in progress (a recursive alias would loop)
            stack.append((node, True))
            for kid in kids:
                if memo.get(id(kid)) == (-1, -1):
                    raise RecursionError("recursive alias")
                if id(kid) not in memo:
                    stack.append((kid, False))
            continue
        distinct += 1
        chars += 1
        nodes = size = 1
        for kid in kids:
            kid_nodes, kid_size = memo[id(kid)]
            nodes += kid_nodes
            size += kid_size
        memo[key] = (min(nodes, cap), min(size, cap))
    nodes, size = memo[id(root)]
    return distinct, nodes, chars, size


def _construct(root: yaml.Node, file: str | None) -> Any:
    """Turn a composed node graph into JSON data, refusing duplicate and non-text keys."""
    problems: list[Issue] = []

    def build(node: yaml.Node, ptr: str, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise DocumentError([_issue("too_large", f"nesting deeper than {MAX_DEPTH} levels",
                                        file, node.start_mark, ptr)])
        if isinstance(node, yaml.ScalarNode):
            return _scalar(node, file, ptr)
        if isinstance(node, yaml.SequenceNode):
            if node.tag != _SEQ:
                raise DocumentError([_issue("syntax", f"unsupported YAML tag {node.tag!r}",
                                            file, node.start_mark, ptr)])
            return [build(n, f"{ptr}/{i}", depth + 1) for i, n in enumerate(node.value)]
        if isinstance(node, yaml.MappingNode):
            if node.tag != _MAP:
                raise DocumentError([_issue("syntax", f"unsupported YAML tag {node.tag!r}",
                                            file, node.start_mark, ptr)])
            out: dict[str, Any] = {}
            for knode, vnode in node.value:
                if knode.tag == "tag:yaml.org,2002:merge":
                    raise DocumentError([_issue(
                        "syntax", "YAML merge keys (<<) are not part of the JSON data model",
                        file, knode.start_mark, ptr)])
                if not isinstance(knode, yaml.ScalarNode) or knode.tag != _STR:
                    raise DocumentError([_issue(
                        "syntax",
                        f"mapping key {getattr(knode, 'value', '?')!r} must be text; quote it",
                        file, knode.start_mark, ptr)])
                key = knode.value
                kptr = f"{ptr}/{pointer_escape(key)}"
                if key in out:
                    problems.append(_issue(
                        "duplicate_key",
                        f"key {key!r} appears twice in this mapping; keep only one",
                        file, knode.start_mark, kptr))
                    continue
                out[key] = build(vnode, kptr, depth + 1)
            return out
        raise DocumentError([_issue("syntax", "unexpected YAML node", file, None, ptr)])

    data = build(root, "", 0)
    if problems:
        raise DocumentError(problems)
    return data


def compose(text: str, file: str | None) -> yaml.Node | None:
    """The node graph of one YAML document (None when empty), core-schema tags resolved.

    Raises:
        yaml.YAMLError: the text is not YAML (:func:`yaml_error` makes the issue).
    """
    loader = _Loader(text)
    try:
        return loader.get_single_node()  # type: ignore[no-any-return]
    finally:
        loader.dispose()


def yaml_error(exc: yaml.YAMLError, file: str | None) -> Issue:
    """The ``syntax`` issue of a PyYAML error, at its mark."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    msg = f"not valid YAML: {problem}" + (f" ({context})" if context else "")
    return _issue("syntax", msg, file, mark)


def parse_yaml(text: str, file: str | None) -> Document:
    """YAML text (1.2 core typing): alias expansion is bounded, duplicate keys are issues."""
    try:
        root = compose(text, file)
    except yaml.YAMLError as exc:
        raise DocumentError([yaml_error(exc, file)]) from None
    except RecursionError:
        raise DocumentError([Issue(code="too_large", file=file,
                                   message="nesting too deep")]) from None
    if root is None:
        return Document(data=None, file=file, text=text, kind="yaml", _root=None,
                        _composed=True)
    # Aliases need anchors (``&name``): without a ``&`` anywhere there is nothing to expand.
    distinct = expanded = chars = expanded_chars = 0
    if "&" in text:
        try:
            distinct, expanded, chars, expanded_chars = _expanded_size(root)
        except RecursionError:
            raise DocumentError([_issue("syntax", "an alias refers to the node that contains "
                                        "it", file, root.start_mark)]) from None
    if expanded - distinct > MAX_ALIAS_EXPANSION:
        raise DocumentError([_issue(
            "too_large",
            f"aliases would expand this document by {expanded - distinct:,} nodes "
            f"(bound: {MAX_ALIAS_EXPANSION:,}); write the values out or use fewer aliases",
            file, root.start_mark)])
    if expanded_chars - chars > MAX_ALIAS_CHARS:
        raise DocumentError([_issue(
            "too_large",
            f"aliases would expand this document by {expanded_chars - chars:,} characters "
            f"(bound: {MAX_ALIAS_CHARS:,}, 64 Mi); write the values out or use fewer "
            "aliases of long values", file, root.start_mark)])
    data = _construct(root, file)
    # A lone surrogate in the data comes from the text itself or from a \u / \U escape
    # (YAML's other escapes give no surrogate): without either, no string needs a look.
    maybe = has_surrogate(text) or "\\u" in text or "\\U" in text
    bad = not_text(data) if maybe else None
    if bad is not None:  # not expected from YAML's own escapes; kept as a guard
        raise DocumentError([_issue("syntax", "a string holds a lone UTF-16 surrogate, which "
                                    "is not a character", file, root.start_mark, bad)])
    return Document(data=data, file=file, text=text, kind="yaml", _root=root, _composed=True)


#: id of a mapping node → its first (key node, value node) of each scalar key: a node's
#: entries are scanned once, however many issues are located under it (a scan per issue
#: made 20,000 issues under one mapping of 20,000 keys take 28 s). Held by a
#: :class:`planrun.loading.Document`, which keeps the nodes alive.
KeyIndex = dict[int, dict[str, tuple[yaml.Node, yaml.Node]]]


def _entries(node: yaml.MappingNode, keys: KeyIndex) -> dict[str, tuple[yaml.Node, yaml.Node]]:
    found = keys.get(id(node))
    if found is None:
        found = {}
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode) and k.value not in found:
                found[k.value] = (k, v)
        keys[id(node)] = found
    return found


def _child(node: yaml.Node, token: str, keys: KeyIndex) -> yaml.Node | None:
    """The value node under a mapping key / sequence index ``token``, or None."""
    if isinstance(node, yaml.MappingNode):
        entry = _entries(node, keys).get(token)
        return entry[1] if entry is not None else None
    if isinstance(node, yaml.SequenceNode) and token.isdigit():
        idx = int(token)
        return node.value[idx] if idx < len(node.value) else None
    return None


def compose_or_none(text: str, file: str | None) -> yaml.Node | None:
    """The composed node graph of ``text`` (to locate issues), None when it does not compose."""
    try:
        return compose(text, file)
    except (yaml.YAMLError, RecursionError, ValueError):
        return None


def node_position(root: yaml.Node, ptr: str, keys: KeyIndex | None = None
                  ) -> tuple[int, int]:
    """1-based (line, column) of the node at ``ptr``, or of the closest enclosing one.

    ``keys``: the document's :data:`KeyIndex` (kept by the caller across calls).
    """
    keys = {} if keys is None else keys
    node = root
    for token in split_pointer(ptr):
        nxt = _child(node, token, keys)
        if nxt is None:
            break
        node = nxt
    return node.start_mark.line + 1, node.start_mark.column + 1


def key_position(root: yaml.Node, ptr: str, keys: KeyIndex | None = None
                 ) -> tuple[int, int] | None:
    """1-based (line, column) of the mapping key named by ``ptr``'s last token, or None."""
    keys = {} if keys is None else keys
    tokens = split_pointer(ptr)
    node = root
    for token in tokens[:-1]:
        nxt = _child(node, token, keys)
        if nxt is None:
            return None
        node = nxt
    if isinstance(node, yaml.MappingNode):
        entry = _entries(node, keys).get(tokens[-1])
        if entry is not None:
            return entry[0].start_mark.line + 1, entry[0].start_mark.column + 1
    return None
