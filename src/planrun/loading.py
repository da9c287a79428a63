"""Reading plan, registry and parameter files as the JSON data model (SPEC §3 "Reading files").

YAML is read with YAML 1.2 *core* typing: only ``true``/``false`` (any case variant the
core schema lists) are booleans, ``yes``/``no``/``on``/``off``, dates and ``1:30`` stay
strings, ``012`` is the decimal 12 and octal needs ``0o``. Duplicate keys are refused
(``duplicate_key``) in YAML and JSON. Aliases are allowed but bounded: a document whose
aliases would expand past :data:`MAX_ALIAS_EXPANSION` nodes is refused (``too_large``)
without being expanded. Files over :data:`MAX_FILE_BYTES` are refused (``too_large``).

Every loaded :class:`Document` can point a JSON Pointer back at the line and column of its
node (:meth:`Document.locate`), computed only when an issue needs it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .issues import Issue
from .jsontext import JsonIndex as _JsonIndex
from .jsontext import NotFinite as _NotFinite
from .jsontext import finite_float as _finite_float
from .jsontext import index_json as _index_json
from .jsontext import json_issue as _json_issue
from .jsontext import json_pairs as _json_pairs
from .jsontext import line_col as _line_col
from .jsontext import reject_constant as _reject_constant

# re-exported: loading.pointer & co. were defined here before pointers.py
from .pointers import pointer as pointer
from .pointers import pointer_escape as pointer_escape
from .pointers import split_pointer as split_pointer

#: Files larger than this are refused (``too_large``), in bytes.
MAX_FILE_BYTES = 64 * 1024 * 1024
#: Nodes that alias expansion may add to a document beyond what is written in it.
MAX_ALIAS_EXPANSION = 100_000
#: Deepest nesting of mappings/sequences accepted.
MAX_DEPTH = 200


class _CoreResolver(yaml.resolver.Resolver):
    """The YAML 1.2 core schema's implicit typing (not PyYAML's YAML 1.1 defaults)."""

    yaml_implicit_resolvers: dict[Any, Any] = {}  # noqa: RUF012 - PyYAML's class-level table


_CoreResolver.add_implicit_resolver(
    "tag:yaml.org,2002:null", re.compile(r"^(?:~|null|Null|NULL|)$"), ["~", "n", "N", ""]
)
_CoreResolver.add_implicit_resolver(
    "tag:yaml.org,2002:bool",
    re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
    list("tTfF"),
)
_CoreResolver.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"),
    list("-+0123456789"),
)
_CoreResolver.add_implicit_resolver(
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

    yaml_implicit_resolvers = _CoreResolver.yaml_implicit_resolvers


_STR = "tag:yaml.org,2002:str"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_BOOL = "tag:yaml.org,2002:bool"
_NULL = "tag:yaml.org,2002:null"
_MAP = "tag:yaml.org,2002:map"
_SEQ = "tag:yaml.org,2002:seq"


class DocumentError(Exception):
    """A file could not be read as the JSON data model; ``issues`` says why (one or more)."""

    def __init__(self, issues: list[Issue]) -> None:
        super().__init__("; ".join(f"{i.code}: {i.message}" for i in issues))
        self.issues = issues


def _issue(code: str, message: str, file: str | None, mark: Any = None,
           path: str | None = None) -> Issue:
    line = column = None
    if mark is not None:
        line, column = mark.line + 1, mark.column + 1
    return Issue(code=code, message=message, file=file, line=line, column=column, path=path)


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


def _expanded_size(root: yaml.Node) -> tuple[int, int]:
    """(nodes as written, nodes after alias expansion); stops counting past the bound.

    Aliases share node objects, so the written size counts distinct nodes and the expanded
    size counts every occurrence, memoised per node so a billion-laughs document costs
    only as much as its written size.
    """
    memo: dict[int, int] = {}
    distinct = 0
    # Iterative post-order walk: a deep document must not exhaust the C stack.
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if key in memo and not children_done:
            continue
        if isinstance(node, yaml.ScalarNode):
            memo[key] = 1
            distinct += 1
            continue
        kids: list[yaml.Node]
        if isinstance(node, yaml.MappingNode):
            kids = [n for kv in node.value for n in kv]
        else:
            kids = list(node.value)
        if not children_done:
            memo[key] = -1  # in progress (a recursive alias would loop)
            stack.append((node, True))
            for kid in kids:
                if memo.get(id(kid)) == -1:
                    raise RecursionError("recursive alias")
                if id(kid) not in memo:
                    stack.append((kid, False))
            continue
        distinct += 1
        total = 1
        for kid in kids:
            total += memo[id(kid)]
        memo[key] = min(total, 1 << 62)
    return distinct, memo[id(root)]


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


def _compose(text: str, file: str | None) -> yaml.Node | None:
    loader = _Loader(text)
    try:
        return loader.get_single_node()  # type: ignore[no-any-return]
    finally:
        loader.dispose()


def _yaml_error(exc: yaml.YAMLError, file: str | None) -> Issue:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    msg = f"not valid YAML: {problem}" + (f" ({context})" if context else "")
    return _issue("syntax", msg, file, mark)


@dataclass
class Document:
    """A file read as JSON data, able to locate a JSON Pointer back to its line/column.

    Attributes:
        data: the JSON value (dict, list, str, int, float, bool, None).
        file: the path as given (for messages), or None for text not from a file.
        text: the source text (kept to locate nodes lazily); see :meth:`of_data`.
        kind: ``yaml`` or ``json``.
    """

    data: Any
    file: str | None
    text: str
    kind: str
    _root: Any = field(default=None, repr=False)
    _composed: bool = field(default=False, repr=False)

    _json: _JsonIndex | None = field(default=None, repr=False)
    #: writes :attr:`text` when it is first needed (:meth:`of_data`), else None
    _render: Callable[[], str] | None = field(default=None, repr=False)

    @classmethod
    def of_data(cls, data: Any, file: str) -> Document:
        """A JSON document made from data (a plan the journal holds), not read from a file.

        Its text — the data as indented JSON, only for locating issues — is written when
        an issue is first located: Python writes indented JSON without its C encoder,
        which for a 10,000-step plan took 156 ms of a resume's start (issue 16).
        """
        return cls(data=data, file=file, text="", kind="json",
                   _render=lambda: json.dumps(data, indent=2))

    def source(self) -> str:
        """The source text (written first for :meth:`of_data`)."""
        if self._render is not None:
            self.text, self._render = self._render(), None
        return self.text

    def may_hold_marks(self) -> bool:
        """False when no string of the document can hold a marker character (redact)."""
        from .redact import text_may_hold_marks

        if self._render is not None:  # the same strings, spelt the same way, on one line
            return text_may_hold_marks(json.dumps(self.data))
        return text_may_hold_marks(self.text)

    def _json_at(self, ptr: str, key: bool) -> tuple[int | None, int | None]:
        if self._json is None:
            self._json = _index_json(self.source(), MAX_DEPTH)
        tokens = split_pointer(ptr)
        while True:
            cur = "".join("/" + pointer_escape(t) for t in tokens)
            if cur in self._json.where:
                at, key_at = self._json.where[cur]
                return _line_col(self.source(), key_at if key and key_at is not None else at)
            if not tokens:
                return None, None
            tokens = tokens[:-1]
            key = False

    def _node(self) -> yaml.Node | None:
        if not self._composed:
            self._composed = True
            try:
                self._root = _compose(self.source(), self.file)
            except (yaml.YAMLError, RecursionError, ValueError):
                self._root = None
        return self._root  # type: ignore[no-any-return]

    def locate(self, ptr: str | None) -> tuple[int | None, int | None]:
        """1-based (line, column) of the node at JSON Pointer ``ptr``.

        Walks down as far as the pointer resolves, so a pointer at a missing key points at
        the closest enclosing node. Returns (None, None) if the text cannot be composed.
        """
        if ptr is None:
            return None, None
        if self.kind == "json":
            return self._json_at(ptr, key=False)
        node = self._node()
        if node is None:
            return None, None
        for token in split_pointer(ptr):
            nxt = _child(node, token)
            if nxt is None:
                break
            node = nxt
        return node.start_mark.line + 1, node.start_mark.column + 1

    def locate_key(self, ptr: str) -> tuple[int | None, int | None]:
        """Like :meth:`locate`, but at the mapping *key* of the last token.

        For issues about a key itself, e.g. an undeclared argument.
        """
        if self.kind == "json":
            return self._json_at(ptr, key=True)
        tokens = split_pointer(ptr)
        if not tokens:
            return self.locate(ptr)
        parent = "".join("/" + pointer_escape(t) for t in tokens[:-1])
        node = self._node()
        if node is None:
            return None, None
        for token in split_pointer(parent):
            nxt = _child(node, token)
            if nxt is None:
                return self.locate(ptr)
            node = nxt
        if isinstance(node, yaml.MappingNode):
            for k, _v in node.value:
                if getattr(k, "value", None) == tokens[-1]:
                    return k.start_mark.line + 1, k.start_mark.column + 1
        return self.locate(ptr)


def _child(node: yaml.Node, token: str) -> yaml.Node | None:
    """The value node under a mapping key / sequence index ``token``, or None."""
    if isinstance(node, yaml.MappingNode):
        return next((v for k, v in node.value
                     if isinstance(k, yaml.ScalarNode) and k.value == token), None)
    if isinstance(node, yaml.SequenceNode) and token.isdigit():
        idx = int(token)
        return node.value[idx] if idx < len(node.value) else None
    return None


_SURROGATE = re.compile("[\ud800-\udfff]")


def has_surrogate(text: str) -> bool:
    """Whether ``text`` holds a lone UTF-16 surrogate (not a character; cannot be UTF-8)."""
    return not text.isascii() and _SURROGATE.search(text) is not None


def not_text(data: Any) -> str | None:
    r"""JSON Pointer of the first string (value or key) in ``data`` that is not Unicode text.

    A JSON escape such as ``"\ud800"`` (half of a surrogate pair) decodes to a lone
    surrogate, which no UTF-8 output, journal or tool can take; such a file is refused
    when it is read (``syntax``). None when every string is text.
    """
    stack: list[tuple[Any, str]] = [(data, "")]
    while stack:
        node, ptr = stack.pop()
        if isinstance(node, str):
            if has_surrogate(node):
                return ptr
        elif isinstance(node, dict):
            for k in node:
                if has_surrogate(k):
                    return f"{ptr}/{pointer_escape(k)}"
            # reversed: the first string in document order is reported
            stack.extend((v, f"{ptr}/{pointer_escape(k)}") for k, v in reversed(node.items()))
        elif isinstance(node, list):
            stack.extend((node[i], f"{ptr}/{i}") for i in reversed(range(len(node))))
    return None


def too_deep(data: Any) -> bool:
    """Whether JSON-shaped ``data`` nests deeper than :data:`MAX_DEPTH` (200) levels.

    Iterative (no recursion of its own): what planrun's recursive walks over a value
    (masking, facets, canonical JSON) can take safely is checked before any of them runs.
    """
    stack: list[tuple[Any, int]] = [(data, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            return True
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
    return False


def parse_text(text: str, *, kind: str, file: str | None = None) -> Document:
    """Parse ``text`` as ``kind`` (``yaml`` or ``json``) into a :class:`Document`.

    Raises:
        DocumentError: with issues coded ``syntax``, ``duplicate_key`` or ``too_large``.
    """
    if len(text.encode("utf-8", "surrogatepass")) > MAX_FILE_BYTES:
        raise DocumentError([Issue(code="too_large", file=file, line=None, column=None,
                                   message=f"file is over {MAX_FILE_BYTES} bytes")])
    return _parse_json(text, file) if kind == "json" else _parse_yaml(text, file)


def _parse_json(text: str, file: str | None) -> Document:
    """JSON text: duplicate keys, non-finite numbers, lone surrogates, depth are issues."""
    dups: list[str] = []
    try:
        data = json.loads(text, object_pairs_hook=_json_pairs(dups),
                          parse_constant=_reject_constant, parse_float=_finite_float)
    except json.JSONDecodeError as exc:
        raise DocumentError([Issue(code="syntax", message=f"not valid JSON: {exc.msg}",
                                   file=file, line=exc.lineno, column=exc.colno)]) from None
    except _NotFinite as exc:
        where = _index_json(text, MAX_DEPTH).not_finite
        raise DocumentError([_json_issue(
            "syntax", f"not valid JSON: {exc}", text, file,
            where[0] if where else None)]) from None
    except RecursionError:
        raise DocumentError([Issue(code="too_large", file=file,
                                   message=f"nesting deeper than {MAX_DEPTH} levels")]
                            ) from None
    except ValueError as exc:  # e.g. an integer over Python's 4,300-digit limit
        raise DocumentError([Issue(code="syntax", file=file,
                                   message=f"not valid JSON: {exc}")]) from None
    if too_deep(data):
        raise DocumentError([Issue(code="too_large", file=file,
                                   message=f"nesting deeper than {MAX_DEPTH} levels")])
    bad = not_text(data)
    if bad is not None:
        at = _index_json(text, MAX_DEPTH).where.get(bad)
        raise DocumentError([_json_issue(
            "syntax", "not valid JSON text: a \\uD800-\\uDFFF escape that is not half of "
            "a surrogate pair is not a character; write the character itself or a "
            "complete pair", text, file, at[0] if at else None, bad)])
    if dups:
        found = _index_json(text, MAX_DEPTH).duplicates
        raise DocumentError([
            _json_issue("duplicate_key", f"key {split_pointer(ptr)[-1]!r} appears twice "
                        "in this mapping; keep only one", text, file, at, ptr)
            for ptr, at in found] or [Issue(code="duplicate_key", file=file, message=(
                f"key {dups[0]!r} appears twice in a mapping"))])
    return Document(data=data, file=file, text=text, kind="json")


def _parse_yaml(text: str, file: str | None) -> Document:
    """YAML text (1.2 core typing): alias expansion is bounded, duplicate keys are issues."""
    try:
        root = _compose(text, file)
    except yaml.YAMLError as exc:
        raise DocumentError([_yaml_error(exc, file)]) from None
    except RecursionError:
        raise DocumentError([Issue(code="too_large", file=file,
                                   message="nesting too deep")]) from None
    if root is None:
        return Document(data=None, file=file, text=text, kind="yaml", _root=None,
                        _composed=True)
    # Aliases need anchors (``&name``): without a ``&`` anywhere there is nothing to expand.
    distinct = expanded = 0
    if "&" in text:
        try:
            distinct, expanded = _expanded_size(root)
        except RecursionError:
            raise DocumentError([_issue("syntax", "an alias refers to the node that contains "
                                        "it", file, root.start_mark)]) from None
    if expanded - distinct > MAX_ALIAS_EXPANSION:
        raise DocumentError([_issue(
            "too_large",
            f"aliases would expand this document by {expanded - distinct:,} nodes "
            f"(bound: {MAX_ALIAS_EXPANSION:,}); write the values out or use fewer aliases",
            file, root.start_mark)])
    data = _construct(root, file)
    # A lone surrogate in the data comes from the text itself or from a \u / \U escape
    # (YAML's other escapes give no surrogate): without either, no string needs a look.
    maybe = has_surrogate(text) or "\\u" in text or "\\U" in text
    bad = not_text(data) if maybe else None
    if bad is not None:  # not expected from YAML's own escapes; kept as a guard
        raise DocumentError([_issue("syntax", "a string holds a lone UTF-16 surrogate, which "
                                    "is not a character", file, root.start_mark, bad)])
    return Document(data=data, file=file, text=text, kind="yaml", _root=root, _composed=True)


def kind_of(path: Path) -> str:
    """``json`` for ``.json`` files, else ``yaml``."""
    return "json" if path.suffix.lower() == ".json" else "yaml"


def load_file(path: Path, *, display: str | None = None) -> Document:
    """Read and parse one file (kind by suffix).

    Raises:
        DocumentError: ``syntax`` (also for unreadable or non-UTF-8 files), ``duplicate_key``,
            ``too_large``.
    """
    shown = display or str(path)
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise DocumentError([Issue(code="too_large", file=shown,
                                       message=f"file is {size:,} bytes, over the bound of "
                                       f"{MAX_FILE_BYTES:,}")])
        raw = path.read_bytes()
    except OSError as exc:
        raise DocumentError([Issue(code="syntax", file=shown,
                                   message=f"cannot read file: {exc.strerror}")]) from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DocumentError([Issue(code="syntax", file=shown,
                                   message=f"not UTF-8 text (byte {exc.start})")]) from None
    return parse_text(text, kind=kind_of(path), file=shown)


#: How a plan read from standard input is named in reports (``planrun validate -``).
STDIN_NAME = "<stdin>"


def load_stdin(raw: bytes) -> Document:
    """One plan read from standard input (``planrun validate -``), named ``<stdin>``.

    JSON when the text starts (after blanks) with ``{`` or ``[``, else YAML — the rule for
    a planner's output (SPEC §10).

    Raises:
        DocumentError: ``empty`` (nothing was given), ``too_large``, ``syntax`` (also for
            text that is not UTF-8), ``duplicate_key``.
    """
    if len(raw) > MAX_FILE_BYTES:
        raise DocumentError([Issue(code="too_large", file=STDIN_NAME,
                                   message=f"standard input is over the bound of "
                                   f"{MAX_FILE_BYTES:,} bytes")])
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DocumentError([Issue(code="syntax", file=STDIN_NAME,
                                   message=f"not UTF-8 text (byte {exc.start})")]) from None
    if not text.strip():
        raise DocumentError([Issue(code="empty", file=STDIN_NAME, path="",
                                   message="standard input is empty: pipe one plan (YAML "
                                   "or JSON) into 'planrun validate -'")])
    kind = "json" if text.lstrip()[:1] in ("{", "[") else "yaml"
    return parse_text(text, kind=kind, file=STDIN_NAME)


#: Suffixes tried for a plan name, in order (SPEC §3 "Plan lookup").

