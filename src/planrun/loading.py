"""Reading plan, registry and parameter files as the JSON data model (SPEC §3 "Reading files").

YAML is read with YAML 1.2 *core* typing: only ``true``/``false`` (any case variant the
core schema lists) are booleans, ``yes``/``no``/``on``/``off``, dates and ``1:30`` stay
strings, ``012`` is the decimal 12 and octal needs ``0o``. Duplicate keys are refused
(``duplicate_key``) in YAML and JSON. Aliases are allowed but bounded: a document whose
aliases would expand past :data:`MAX_ALIAS_EXPANSION` nodes, or past
:data:`MAX_ALIAS_CHARS` characters, is refused (``too_large``) without being expanded.
Files over :data:`MAX_FILE_BYTES` are refused (``too_large``).

Every loaded :class:`Document` can point a JSON Pointer back at the line and column of its
node (:meth:`Document.locate`), computed only when an issue needs it.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .issues import Issue
from .jsontext import JsonIndex as _JsonIndex
from .jsontext import Lines
from .jsontext import NotFinite as _NotFinite
from .jsontext import finite_float as _finite_float
from .jsontext import index_json as _index_json
from .jsontext import json_issue as _json_issue
from .jsontext import json_pairs as _json_pairs
from .jsontext import reject_constant as _reject_constant

# re-exported: loading.pointer & co. were defined here before pointers.py
from .pointers import pointer as pointer
from .pointers import pointer_escape as pointer_escape
from .pointers import split_pointer as split_pointer

if TYPE_CHECKING:
    import yaml

#: Files larger than this are refused (``too_large``), in bytes.
MAX_FILE_BYTES = 64 * 1024 * 1024
#: Nodes that alias expansion may add to a document beyond what is written in it.
MAX_ALIAS_EXPANSION = 100_000
#: Characters (of scalars and keys, one more a node) that alias expansion may add: a long
#: anchored string aliased a few thousand times is few nodes but gigabytes.
MAX_ALIAS_CHARS = 64 * 1024 * 1024
#: Deepest nesting of mappings/sequences accepted.
MAX_DEPTH = 200




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


@dataclass(eq=False)
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
    #: where the lines of :attr:`text` start (JSON issues located in log time)
    _lines: Lines | None = field(default=None, repr=False)
    #: mapping entries by key, for YAML issues (:data:`planrun.yamltext.KeyIndex`)
    _keys: dict[int, Any] = field(default_factory=dict, repr=False)
    #: writes :attr:`text` when it is first needed (:meth:`of_data`), else None
    _render: Callable[[], str] | None = field(default=None, repr=False)
    #: False for :meth:`of_data`: no file anyone can open holds the text, so an issue has
    #: no line or column (SPEC §4: null where the problem has no node in the file), only
    #: its JSON Pointer.
    _located: bool = field(default=True, repr=False)

    @classmethod
    def of_data(cls, data: Any, file: str) -> Document:
        """A JSON document made from data (a plan the journal holds), not read from a file.

        Its issues have no line or column: the journaled plan is no file a person could
        open at that line (the plan file may have changed since, or be gone), so they are
        located by their JSON Pointer alone (``path``). Its text, the data as indented
        JSON, is written only when asked for (:meth:`source`): Python writes indented JSON
        without its C encoder, which for a 10,000-step plan took 156 ms of a resume's
        start (issue 16).
        """
        return cls(data=data, file=file, text="", kind="json",
                   _render=lambda: json.dumps(data, indent=2), _located=False)

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
                if self._lines is None:
                    self._lines = Lines(self.source())
                return self._lines.at(key_at if key and key_at is not None else at)
            if not tokens:
                return None, None
            tokens = tokens[:-1]
            key = False

    def _node(self) -> yaml.Node | None:
        if not self._composed:
            from .yamltext import compose_or_none

            self._composed = True
            self._root = compose_or_none(self.source(), self.file)
        return self._root  # type: ignore[no-any-return]

    def locate(self, ptr: str | None) -> tuple[int | None, int | None]:
        """1-based (line, column) of the node at JSON Pointer ``ptr``.

        Walks down as far as the pointer resolves, so a pointer at a missing key points at
        the closest enclosing node. Returns (None, None) if the text cannot be composed.
        """
        if ptr is None or not self._located:
            return None, None
        if self.kind == "json":
            return self._json_at(ptr, key=False)
        node = self._node()
        if node is None:
            return None, None
        from .yamltext import node_position

        return node_position(node, ptr, self._keys)

    def locate_key(self, ptr: str) -> tuple[int | None, int | None]:
        """Like :meth:`locate`, but at the mapping *key* of the last token.

        For issues about a key itself, e.g. an undeclared argument.
        """
        if not self._located:
            return None, None
        if self.kind == "json":
            return self._json_at(ptr, key=True)
        tokens = split_pointer(ptr)
        if not tokens:
            return self.locate(ptr)
        node = self._node()
        if node is None:
            return None, None
        from .yamltext import key_position

        return key_position(node, ptr, self._keys) or self.locate(ptr)


_SURROGATE = re.compile("[\ud800-\udfff]")


def utf8_text(text: str) -> str:
    r"""``text`` with each lone surrogate written as its escape (``\udce9``), else as it is.

    A lone surrogate (half of a UTF-16 pair, or a byte of an undecodable file name kept by
    ``surrogateescape``) has no UTF-8 form: a tool's message holding one is journaled as
    a JSON escape, and whatever writes that text out as UTF-8 (the report file, the MCP
    server's answers) must escape it or fail.
    """
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


#: Unicode's bidirectional controls (embeddings, overrides, isolates, marks): text a plan or
#: a tool wrote that holds one could reorder what a person reads next to it (a plan named
#: ``nightly\u202e`` showed ``completed`` reversed; found by attack).
_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
#: Control characters other than tab and line feed (C0, DEL, C1), and a carriage return
#: not followed by a line feed: a tool's error message holding ``ESC ] 0 ; … BEL`` set
#: the terminal's title from ``planrun status``, ``ESC [ 2 J`` cleared the screen, and a
#: lone ``\r`` or backspaces wrote over what came before them (found by attack).
_CONTROLS = "\x00-\x08\x0b-\x0c\x0e-\x1f\x7f-\x9f"
_NOT_SHOWN = re.compile(f"[{_BIDI}{_CONTROLS}]|\r(?!\n)")


def visible(text: str) -> str:
    r"""``text`` with each character that would not show as itself written as its escape.

    Bidirectional controls (``\u202e``), control characters other than tab and line feed
    (``\u001b``, ``\u0000``, DEL, C1) and a carriage return not followed by a line feed
    (``\u000d``) are escaped; letters of right-to-left scripts and every other character
    are left as they are. For what a person reads (a terminal, the report), never for
    what is journaled or given to a program (``--json`` keeps the value). Also
    :func:`utf8_text`.
    """
    if _NOT_SHOWN.search(text) is None:
        return text if text.isascii() else utf8_text(text)
    return utf8_text(_NOT_SHOWN.sub(lambda m: f"\\u{ord(m.group()):04x}", text))


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
    if kind == "json":
        return _parse_json(text, file)
    from .yamltext import parse_yaml

    return parse_yaml(text, file)


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
        lines = Lines(text)
        raise DocumentError([
            _json_issue("duplicate_key", f"key {split_pointer(ptr)[-1]!r} appears twice "
                        "in this mapping; keep only one", text, file, at, ptr, lines)
            for ptr, at in found] or [Issue(code="duplicate_key", file=file, message=(
                f"key {dups[0]!r} appears twice in a mapping"))])
    return Document(data=data, file=file, text=text, kind="json")


def kind_of(path: Path) -> str:
    """``json`` for ``.json`` files, else ``yaml``."""
    return "json" if path.suffix.lower() == ".json" else "yaml"


def _regular(mode: int, shown: str) -> None:
    """Raise DocumentError (``syntax``) unless ``mode`` is a regular file's."""
    if stat.S_ISREG(mode):
        return
    kind = "a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else \
        "a socket" if stat.S_ISSOCK(mode) else "a device"
    raise DocumentError([Issue(code="syntax", file=shown, message=f"cannot read file: it is "
                               f"{kind}, not a regular file")])


def read_text(path: Path, shown: str) -> str:
    """The UTF-8 text of the regular file at ``path`` (``shown``: its name in issues).

    A FIFO, a socket, a device or a folder is refused, never opened for a wait (``stat``
    first, then ``O_NONBLOCK`` and ``fstat``: a FIFO put in the file's place meanwhile is
    refused too); a file over :data:`MAX_FILE_BYTES` (64 MiB) is refused before it is read.

    Raises:
        DocumentError: ``syntax`` (missing, unreadable, not a regular file, not UTF-8),
            ``too_large``.
    """
    try:
        _regular(os.stat(path).st_mode, shown)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise DocumentError([Issue(code="syntax", file=shown,
                                   message=f"cannot read file: {exc.strerror}")]) from None
    with open(fd, "rb", closefd=True) as f:
        st = os.fstat(fd)
        _regular(st.st_mode, shown)
        if st.st_size > MAX_FILE_BYTES:
            raise DocumentError([Issue(code="too_large", file=shown,
                                       message=f"file is {st.st_size:,} bytes, over the "
                                       f"bound of {MAX_FILE_BYTES:,}")])
        try:
            raw = f.read(MAX_FILE_BYTES + 1)  # a file that grew since: refused below
        except OSError as exc:
            raise DocumentError([Issue(code="syntax", file=shown,
                                       message=f"cannot read file: {exc.strerror}")]) from None
    if len(raw) > MAX_FILE_BYTES:
        raise DocumentError([Issue(code="too_large", file=shown, message="file is over the "
                                   f"bound of {MAX_FILE_BYTES:,} bytes")])
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DocumentError([Issue(code="syntax", file=shown,
                                   message=f"not UTF-8 text (byte {exc.start})")]) from None


def load_file(path: Path, *, display: str | None = None, keep: bool = False) -> Document:
    """Read (:func:`read_text`) and parse one file (kind by suffix).

    ``keep`` (a plan or the registry, never a parameters file): the data of a YAML text
    parsed before by the same code is read back from :mod:`planrun.parse_cache`, and a
    text parsed now is kept there.

    Raises:
        DocumentError: ``syntax`` (also for unreadable or non-UTF-8 files), ``duplicate_key``,
            ``too_large``.
    """
    shown = display or str(path)
    text = read_text(path, shown)
    kind = kind_of(path)
    if not keep or kind != "yaml":
        return parse_text(text, kind=kind, file=shown)
    from . import parse_cache

    kept, data = parse_cache.get(text)
    if data is not parse_cache.MISSING:
        return Document(data=data, file=shown, text=text, kind="yaml")
    doc = parse_text(text, kind=kind, file=shown)
    if kept is not None:
        parse_cache.put(kept, text, doc.data)
    return doc


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

