"""The tools registry: ``tools.yaml`` → contracts and callables (SPEC §2).

Every tool has a contract (a JSON Schema 2020-12 of its arguments object, or a pydantic
model named by ``accepts``). Contracts are checked with *strict* types: ``integer`` accepts
only integers (``60.0`` is refused), booleans are never numbers, strings are never numbers.

A registry problem (unknown field, no contract, malformed schema, a pattern that is not
linear-time, unimportable callable, a ``{name}`` in an argv element that cannot be filled
or could become code, see :mod:`planrun.argv`) is an :class:`~planrun.issues.Issue` coded
``registry`` with file/line; all of them are reported before any plan is looked at.
"""

from __future__ import annotations

import contextlib
import importlib
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .issues import Issue, closest
from .loading import Document, DocumentError, load_file
from .pointers import pointer, pointer_escape, pointer_of

if TYPE_CHECKING:
    from jsonschema.protocols import Validator

    from .formats import ToolData


def _strict_validator_class() -> Any:
    from jsonschema import Draft202012Validator, validators

    def is_integer(_checker: Any, instance: Any) -> bool:
        return isinstance(instance, int) and not isinstance(instance, bool)

    def is_number(_checker: Any, instance: Any) -> bool:
        return isinstance(instance, int | float) and not isinstance(instance, bool)

    from .patterns import KEYWORDS
    from .schema_limits import keywords

    checker = Draft202012Validator.TYPE_CHECKER.redefine_many(
        {"integer": is_integer, "number": is_number})
    return validators.extend(  # type: ignore[no-untyped-call]
        Draft202012Validator, validators={**keywords(Draft202012Validator), **KEYWORDS},
        type_checker=checker)


def _format_checker() -> Any:
    """2020-12's format checker with ``regex`` meaning "a pattern planrun can use" (RE2)."""
    import copy

    from jsonschema import Draft202012Validator

    from .patterns import PatternError, is_regex

    checker = copy.copy(Draft202012Validator.FORMAT_CHECKER)
    checker.checkers = dict(checker.checkers)
    checker.checks("regex", raises=PatternError)(is_regex)
    return checker


_STRICT_CLASS: Any = None
_FORMAT_CHECKER: Any = None


def strict_validator(schema: dict[str, Any] | bool) -> Validator:
    """A JSON Schema 2020-12 validator with strict types and format checking.

    The schema must already have passed :func:`schema_problems`. Its ``$schema``
    declarations are not followed (:func:`_without_dialects`): every level is checked
    the same strict way. Its checks are bounded and never raise
    (:class:`planrun.schema_limits.Guarded`): ``uniqueItems`` in linear time,
    ``multipleOf`` exact, a budget of references, any exception a violation.
    """
    from .schema_limits import Guarded

    global _STRICT_CLASS, _FORMAT_CHECKER
    if _STRICT_CLASS is None:
        _STRICT_CLASS = _strict_validator_class()
        _FORMAT_CHECKER = _format_checker()
    v: Validator = Guarded(_STRICT_CLASS(  # type: ignore[assignment]
        _without_dialects(schema), format_checker=_FORMAT_CHECKER, registry=_no_retrieval()))
    return v


@lru_cache(maxsize=1)
def _no_retrieval() -> Any:
    """A ``referencing`` registry that fetches nothing: a reference is local or unresolved.

    jsonschema's default registry retrieves any URI it does not know with ``urlopen``
    (``file://`` and ``http://`` included): a plan's parameter schema with
    ``$dynamicRef: "file:///…"`` made ``validate`` read the file into its message, or
    send a request (found by attack). :func:`schema_problems` refuses such references
    before a schema is used; this registry makes sure none is ever fetched.
    """
    from referencing import Registry
    from referencing.exceptions import NoSuchResource

    def retrieve(uri: str) -> Any:
        raise NoSuchResource(ref=uri)  # type: ignore[call-arg]

    return Registry(retrieve=retrieve)  # type: ignore[call-arg]


#: Keywords whose value is data, never a subschema (a ``$schema`` key there is data).
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})


def _without_dialects(schema: Any) -> Any:
    """``schema`` without its ``$schema`` keywords (the same object when it has none).

    jsonschema switches to the validator class a ``$schema`` names whenever it enters a
    subschema holding one — also a plain 2020-12 one, and also the root's again through
    ``$ref: "#"`` — and that class has none of planrun's strictness: ``2.0`` passes as an
    ``integer``, and patterns are matched by Python's backtracking ``re``, not RE2
    (``^(a+)+$`` would hang on ``"aaa…a!"``). planrun checks every schema as 2020-12
    (SPEC "Strict types"), so the declaration has nothing left to say.
    """
    if isinstance(schema, list):
        items = [_without_dialects(v) for v in schema]
        return schema if all(a is b for a, b in zip(items, schema, strict=True)) else items
    if not isinstance(schema, dict):
        return schema
    out = {k: v if k in _DATA_KEYWORDS else _without_dialects(v) for k, v in schema.items()
           if not (k == "$schema" and isinstance(v, str))}
    same = len(out) == len(schema) and all(out[k] is v for k, v in schema.items())
    return schema if same else out


@lru_cache(maxsize=1)
def _meta_validator() -> Any:
    """The metaschema's validator, with planrun's bounded keywords (the schema is data)."""
    from jsonschema import Draft202012Validator, validators

    from .schema_limits import Guarded, keywords

    cls = validators.extend(  # type: ignore[no-untyped-call]
        Draft202012Validator, validators=keywords(Draft202012Validator))
    return Guarded(cls(Draft202012Validator.META_SCHEMA))


def schema_problems(schema: Any, *, keep: bool = True) -> list[tuple[str, str]]:
    """(JSON Pointer inside the schema, message) for each way ``schema`` breaks 2020-12.

    Besides the metaschema: every ``$ref`` resolves inside the schema, no chain of
    ``$ref``/``allOf``/``anyOf``/``oneOf``/``not``/``if`` leads back to itself (it would
    never finish), and every ``pattern``/``patternProperties`` compiles as a linear-time
    pattern (:mod:`planrun.patterns`).

    A schema this code found valid before is not checked again (:mod:`planrun.fits`):
    jsonschema is then not even imported. ``keep=False`` (a schema that may hold a
    secret's value: a secret parameter's ``default``, ``enum`` or ``const``): its verdict
    is neither looked up nor kept, so no line of the cache folder depends on the secret
    (SPEC §7: nothing to guess a secret from).
    """
    if not isinstance(schema, dict | bool):
        return [("", f"a JSON Schema must be an object, not {type(schema).__name__}")]
    from . import fits
    from .jsontext import plain_json_text

    text = plain_json_text(schema) if keep else None
    line = None if text is None else fits.key("schema", text)
    if line is not None and fits.known(line):
        return []
    problems = _schema_problems(schema)
    if line is not None and not problems:
        fits.learn(line)
    return problems


def _schema_problems(schema: dict[str, Any] | bool) -> list[tuple[str, str]]:
    from jsonschema.exceptions import best_match

    from .patterns import pattern_problems
    from .schema_limits import MAX_SCHEMA_DEPTH, too_deep

    deep = too_deep(schema)
    if deep is not None:
        return [(deep, f"this schema is nested more than {MAX_SCHEMA_DEPTH} levels deep, "
                 "too deep to check; move parts into $defs and refer to them with $ref")]
    errors = list(_meta_validator().iter_errors(schema))
    if errors:
        err = best_match(errors)
        ptr = pointer_of(err.path)
        return [(ptr, f"not a valid JSON Schema: {err.message}")]
    problems = _unresolvable_refs(schema) + pattern_problems(schema)
    return problems or _ref_loops(schema) or _too_large(schema)


#: Keywords whose value is a reference to a schema (``$recursiveRef``: 2019-09's, which
#: 2020-12 ignores; refused all the same if it leads elsewhere).
_REF_KEYWORDS = ("$ref", "$dynamicRef", "$recursiveRef")


def _scopes(schema: dict[str, Any]) -> Iterator[tuple[dict[str, Any], str, Any]]:
    """(subschema, its JSON Pointer, the resolver of its base URI) for every subschema.

    The resolver moves into each ``$id`` met on the way down, as jsonschema's does when
    it validates: a reference resolves against the nearest ``$id``, not the root's (a
    nested ``$id`` passed the check from the root and then failed at validation with a
    traceback, or left a tool's call ``indeterminate``; found by attack). Data keywords
    (``const``, ``enum``, ``default``, ``examples``) are not schemas and are not entered.
    """
    from referencing import Registry
    from referencing.jsonschema import DRAFT202012

    root = Registry().resolver_with_root(DRAFT202012.create_resource(schema))
    stack: list[tuple[Any, str, Any]] = [(schema, "", root)]
    while stack:
        node, ptr, resolver = stack.pop()
        if isinstance(node, dict):
            if node is not schema and isinstance(node.get("$id"), str):
                resolver = resolver.in_subresource(DRAFT202012.create_resource(node))
            yield node, ptr, resolver
            stack.extend((v, f"{ptr}/{pointer_escape(k)}", resolver)
                         for k, v in node.items() if k not in _DATA_KEYWORDS)
        elif isinstance(node, list):
            stack.extend((v, f"{ptr}/{i}", resolver) for i, v in enumerate(node))


def _unresolvable_refs(schema: Any) -> list[tuple[str, str]]:
    """Every reference must resolve inside the schema: nothing is fetched from elsewhere.

    ``$ref``, ``$dynamicRef`` and ``$recursiveRef`` alike (no file, no network), each from
    its own base URI (:func:`_scopes`).
    """
    from referencing.exceptions import Unresolvable

    if not isinstance(schema, dict):
        return []
    out: list[tuple[str, str]] = []
    for node, ptr, resolver in _scopes(schema):
        for kw in _REF_KEYWORDS:
            ref = node.get(kw)
            if isinstance(ref, str):
                try:
                    resolver.lookup(ref)
                except Unresolvable:
                    out.append((f"{ptr}/{kw}", f"{kw} {ref!r} does not resolve inside "
                                "this schema (only local references like #/$defs/NAME)"))
    return out


#: Keywords that apply a subschema to the *same* instance (no descent into it).
_IN_PLACE_ONE = ("not", "if", "then", "else")
_IN_PLACE_LIST = ("allOf", "anyOf", "oneOf")


def _ref_loops(schema: Any) -> list[tuple[str, str]]:
    """A ``$ref`` that leads back to where it started without descending into the instance.

    ``{"$ref": "#"}`` or two definitions that refer to each other would make validation
    recurse forever (a RecursionError); they are refused instead. A reference reached
    through ``properties``/``items`` is fine (each step goes one level into the instance).
    Each reference is followed from its own base URI (:func:`_scopes`).
    """
    from referencing.exceptions import Unresolvable

    if not isinstance(schema, dict):
        return []
    where: dict[int, str] = {}
    scope: dict[int, Any] = {}
    for node, ptr, resolver in _scopes(schema):
        where.setdefault(id(node), ptr)
        scope.setdefault(id(node), resolver)

    def edges(node: dict[str, Any]) -> list[tuple[Any, str]]:
        ptr = where.get(id(node), "")
        out: list[tuple[Any, str]] = []
        resolver = scope.get(id(node))
        for kw in ("$ref", "$dynamicRef"):
            ref = node.get(kw)
            if isinstance(ref, str) and resolver is not None:
                with contextlib.suppress(Unresolvable):
                    out.append((resolver.lookup(ref).contents, f"{ptr}/{kw}"))
        out.extend((node[kw], f"{ptr}/{kw}") for kw in _IN_PLACE_ONE if kw in node)
        for kw in _IN_PLACE_LIST:
            if isinstance(node.get(kw), list):
                out.extend((v, f"{ptr}/{kw}/{i}") for i, v in enumerate(node[kw]))
        deps = node.get("dependentSchemas")
        if isinstance(deps, dict):
            out.extend((v, f"{ptr}/dependentSchemas") for v in deps.values())
        return out

    state: dict[int, int] = {}  # 1: on the current path, 2: done
    for start in [schema]:
        path: list[tuple[dict[str, Any], list[tuple[Any, str]]]] = [(start, edges(start))]
        state[id(start)] = 1
        while path:
            node, todo = path[-1]
            if not todo:
                state[id(node)] = 2
                path.pop()
                continue
            nxt, via = todo.pop()
            if not isinstance(nxt, dict):
                continue
            if state.get(id(nxt)) == 1:
                return [(via, "this reference leads back to the schema it is in without "
                         "descending into the value (validation would never finish); "
                         "refer to a definition that checks something first")]
            if id(nxt) not in state:
                state[id(nxt)] = 1
                path.append((nxt, edges(nxt)))
    return []


def _too_large(schema: Any) -> list[tuple[str, str]]:
    """A schema whose check may apply more than ``MAX_SCHEMA_SIZE`` subschemas.

    References expanded (:func:`planrun.schema_limits.expanded_size`), each from its own
    base URI (:func:`_scopes`). Runs after :func:`_ref_loops`: every reference resolves and
    none loops without descending into the value.
    """
    from referencing.exceptions import Unresolvable

    from .schema_limits import MAX_SCHEMA_SIZE, expanded_size

    if not isinstance(schema, dict):
        return []
    where: dict[int, str] = {}
    targets: dict[int, list[Any]] = {}
    for node, ptr, resolver in _scopes(schema):
        where.setdefault(id(node), ptr)
        for kw in ("$ref", "$dynamicRef"):
            ref = node.get(kw)
            if isinstance(ref, str):
                with contextlib.suppress(Unresolvable):
                    targets.setdefault(id(node), []).append(resolver.lookup(ref).contents)
    _size, over = expanded_size(schema, targets)
    if over is None:
        return []
    return [(where.get(over, ""), f"this schema is too large once its references are expanded: "
             f"checking a value could apply more than {MAX_SCHEMA_SIZE:,} subschemas "
             "(each $ref counts its target again, so allOf/anyOf/oneOf branches that refer "
             "to the same definition at every level multiply); refer to each definition "
             "from one place, or merge the branches")]


@dataclass
class ToolSpec:
    """A registered tool, ready to check arguments and to be called.

    Attributes:
        name: the registry key.
        entry: the parsed ``tools.yaml`` entry.
        contract: JSON Schema of the arguments object.
        func: the python callable (python tools), else None.
        model: the pydantic model of ``accepts`` (python tools), else None.
        folder: the registry's folder (import path of python tools).
    """

    name: str
    entry: ToolData
    contract: dict[str, Any]
    func: Callable[..., Any] | None = None
    model: Any = None
    folder: Path | None = None

    @property
    def kind(self) -> str:
        """``python`` or ``command``."""
        return "command" if self.entry.command is not None else "python"

    @property
    def output_mode(self) -> str:
        """How a command's stdout becomes the output: ``none`` | ``text`` | ``json``."""
        return self.entry.output or "text"

    @property
    def dedupe_ttl_s(self) -> float | None:
        """``dedupe_ttl`` in seconds (a duration string converted), or None for no expiry."""
        ttl = self.entry.dedupe_ttl
        if isinstance(ttl, str):
            from .formats import duration_s

            return duration_s(ttl)
        return ttl

    @cached_property
    def validator(self) -> Validator:
        """The strict validator of :attr:`contract` (built on first use)."""
        return strict_validator(self.contract)

    @cached_property
    def contract_key(self) -> str | None:
        """SHA-256 (hex) of what an argument check depends on: name, entry and contract.

        Another ``tools.yaml`` entry (another schema, command, ``accepts``...) gives
        another key, so arguments found to fit one are checked again against the other.
        The text hashed is the JSON as written, nothing normalised (not the canonical JSON
        of digests): ``maximum: 9223372036854775809`` and ``…809.0`` (2^63 as a float), or a
        ``const`` in either Unicode form,
        are different contracts to jsonschema. None when the entry is not plain JSON data
        (then no check of it is memoized).
        """
        import hashlib

        from .jsontext import plain_json_text

        text = plain_json_text({"name": self.name, "entry": self.entry.model_dump(mode="json"),
                                "contract": self.contract})
        if text is None:
            return None
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()

    @cached_property
    def output_validator(self) -> Validator | None:
        """The strict validator of ``output_schema``, if the tool declares one."""
        if self.entry.output_schema is None:
            return None
        return strict_validator(self.entry.output_schema)


@dataclass(eq=False)
class ToolRegistry:
    """All tools of ``tools.yaml`` (possibly none when the file does not exist)."""

    file: Path
    tools: dict[str, ToolSpec] = field(default_factory=dict)
    document: Document | None = None
    #: the ``[policy]`` of planrun.toml (``planrun.policy.Policy``), when there is one.
    policy: Any = None

    def __contains__(self, name: object) -> bool:
        return name in self.tools

    def __getitem__(self, name: str) -> ToolSpec:
        return self.tools[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.tools)

    def suggest(self, name: str) -> str | None:
        """The registered tool name closest to ``name``, if any is close."""
        return closest(name, self.tools)


def _import(target: str) -> Any:
    from .streams import stdout_to_stderr

    module_name, _, attr = target.partition(":")
    with stdout_to_stderr():  # a module that prints when imported must not reach stdout
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    return obj


def load_registry(path: Path, pools: dict[str, int] | None = None) -> tuple[
        ToolRegistry, list[Issue]]:
    """Load ``tools.yaml`` and check every entry.

    A missing file is an empty registry (every tool a plan names is then ``unknown_tool``).
    Python tool modules are imported with the registry's folder on ``sys.path``.

    Args:
        path: the registry file.
        pools: declared concurrency pools (``[pools]`` of ``planrun.toml``).

    Returns:
        The registry (tools that failed their checks are left out) and the ``registry``
        issues, each with file, line and column.
    """
    from .formats import tool_data
    from .paths import shown_path

    reg = ToolRegistry(file=path)
    shown = shown_path(path)
    from .paths import probe

    if not probe(path):
        return reg, []
    try:
        doc = load_file(path, display=shown, keep=True)
    except DocumentError as exc:
        return reg, [Issue(code="registry", message=f"{i.code}: {i.message}", file=i.file,
                           line=i.line, column=i.column, path=i.path) for i in exc.issues]
    reg.document = doc
    issues: list[Issue] = []

    def add(ptr: str, message: str, key: bool = False) -> None:
        line, col = doc.locate_key(ptr) if key else doc.locate(ptr)
        issues.append(Issue(code="registry", message=message, file=shown, path=ptr,
                            line=line, column=col))

    data = doc.data
    if not isinstance(data, dict) or not isinstance(data.get("tools"), dict):
        add("", "tools.yaml must be a mapping with a 'tools' mapping of tool names")
        return reg, issues
    for key in data:
        if key != "tools":
            add(pointer(key), f"unknown top-level field {key!r} (only 'tools')", key=True)
    folder = path.parent.resolve()
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    for name, raw in data["tools"].items():
        base = pointer("tools", name)
        if not isinstance(raw, dict):
            add(base, f"tool {name!r} must be a mapping")
            continue
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]*", name):
            add(base, f"tool name {name!r} must match [A-Za-z_][A-Za-z0-9_.-]*", key=True)
            continue
        entry = tool_data(raw) or _tool_by_model(name, raw, base, add)
        if entry is None:
            continue
        before = len(issues)
        spec = _check_tool(name, entry, base, folder, pools, add)
        if spec is not None and len(issues) == before:
            reg.tools[name] = spec
    return reg, issues


def _tool_by_model(name: str, raw: dict[str, Any], base: str, add: Callable[..., None]
                   ) -> ToolData | None:
    """``raw`` validated by ``models.Tool`` (what the fast path could not accept), or None.

    Each pydantic error is one ``registry`` issue; this is the only place that loads
    pydantic for an entry (:mod:`planrun.formats`).
    """
    from pydantic import ValidationError

    from .formats import ToolData
    from .models import Tool, error_message, loc_pointer

    try:
        return ToolData.of_model(Tool.model_validate(raw))
    except ValidationError as exc:
        for err in exc.errors():
            loc = _real_loc(raw, err["loc"])
            unknown = err["type"] == "extra_forbidden"
            add(loc_pointer(base, loc), f"tool {name!r}: {error_message(err, Tool)}",
                key=unknown)
        return None


def _real_loc(data: Any, loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """The prefix of a pydantic location that exists in ``data`` (drops union tags)."""
    out: list[int | str] = []
    cur = data
    for part in loc:
        in_dict = isinstance(cur, dict) and part in cur
        in_list = isinstance(cur, list) and isinstance(part, int) and 0 <= part < len(cur)
        if in_dict or in_list:
            cur = cur[part]
        elif isinstance(cur, dict) and isinstance(part, str) and len(out) == len(loc) - 1:
            out.append(part)  # a missing or unknown key: point at it
            break
        else:
            break
        out.append(part)
    return tuple(out)


def _check_tool(name: str, entry: ToolData, base: str, folder: Path,
                pools: dict[str, int] | None, add: Callable[..., None]) -> ToolSpec | None:
    if not _shape_ok(name, entry, base, pools, add):
        return None
    contract: dict[str, Any] = {}
    model = None
    if entry.arguments is not None:
        for ptr, msg in schema_problems(entry.arguments):
            add(pointer("tools", name, "arguments") + ptr, f"tool {name!r}: arguments {msg}")
            return None
        contract = entry.arguments
    if entry.output_schema is not None:
        for ptr, msg in schema_problems(entry.output_schema):
            add(pointer("tools", name, "output_schema") + ptr,
                f"tool {name!r}: output_schema {msg}")
            return None
    func = None
    if entry.python is not None:
        try:
            func = _import(entry.python)
        except (Exception, SystemExit) as exc:  # any import-time failure of user code
            add(pointer("tools", name, "python"),
                f"tool {name!r}: cannot import {entry.python!r} from {folder}: "
                f"{type(exc).__name__}: {exc}")
            return None
        if not callable(func):
            add(pointer("tools", name, "python"),
                f"tool {name!r}: {entry.python!r} is not callable")
            return None
    if entry.accepts is not None:
        found = _model_contract(name, entry.accepts, add)
        if found is None:
            return None
        model, contract = found
    if entry.command is not None:
        from .argv import check_command

        check_command(name, entry, contract, add)
    _check_keys(name, entry, contract, add)
    return ToolSpec(name=name, entry=entry, contract=contract, func=func, model=model,
                    folder=folder)


def _check_keys(name: str, entry: ToolData, contract: dict[str, Any],
                add: Callable[..., None]) -> None:
    """``key_arguments``, ``dedupe`` and ``dedupe_ttl`` fit the contract (SPEC §7).

    Each key argument must be declared (``properties``) and ``required`` at the top of
    the contract, so that no call can leave it out and turn it into a silent null in its
    key. ``dedupe_ttl`` needs ``dedupe: plan`` and is seconds or a duration (``12h``).
    """
    props = contract.get("properties") if isinstance(contract, dict) else None
    required = contract.get("required") if isinstance(contract, dict) else None
    for i, arg in enumerate(entry.key_arguments or []):
        if not isinstance(props, dict) or arg not in props:
            add(pointer("tools", name, "key_arguments", i),
                f"tool {name!r}: key argument {arg!r} is not a declared argument")
        elif not isinstance(required, list) or arg not in required:
            add(pointer("tools", name, "key_arguments", i),
                f"tool {name!r}: key argument {arg!r} is not required by the arguments "
                f"schema: add it to 'required' (a call without it would have no value to "
                "key on)")
    ttl = entry.dedupe_ttl
    if ttl is None:
        return
    if entry.dedupe != "plan":
        add(pointer("tools", name, "dedupe_ttl"),
            f"tool {name!r}: 'dedupe_ttl' applies to 'dedupe: plan' only (keys of "
            "'dedupe: run' belong to one run and never expire)")
    else:
        from .formats import MAX_SECONDS, duration_s

        seconds = duration_s(ttl) if isinstance(ttl, str) else ttl
        if seconds is None or not 0 < seconds <= MAX_SECONDS:
            add(pointer("tools", name, "dedupe_ttl"),
                f"tool {name!r}: dedupe_ttl {ttl!r} is not a duration: give seconds (a "
                f"number above 0, at most {MAX_SECONDS:.0f}) or a whole number and a "
                "unit, e.g. 45s, 90m, 12h, 30d, 2w")


def _shape_ok(name: str, entry: ToolData, base: str, pools: dict[str, int] | None,
              add: Callable[..., None]) -> bool:
    """The entry's fields fit together: one of command/python, one contract, a known pool."""
    if (entry.command is None) == (entry.python is None):
        add(base, f"tool {name!r} needs exactly one of 'command' (argv list) or "
            "'python' (module:callable)")
        return False
    if entry.arguments is None and entry.accepts is None:
        add(base, f"tool {name!r} has no contract: declare 'arguments' (a JSON Schema) "
            "or, for a python tool, 'accepts' (a pydantic model)")
        return False
    if entry.arguments is not None and entry.accepts is not None:
        add(pointer("tools", name, "accepts"),
            f"tool {name!r}: give 'arguments' or 'accepts', not both")
        return False
    if entry.accepts is not None and entry.command is not None:
        add(pointer("tools", name, "accepts"),
            f"tool {name!r}: 'accepts' is for python tools; a command tool declares "
            "'arguments'")
        return False
    if entry.python is not None:
        for fld in ("output", "cwd", "allow_embedded", "allow_option_values"):
            if getattr(entry, fld) is not None:
                add(pointer("tools", name, fld),
                    f"tool {name!r}: {fld!r} applies to command tools only")
    elif entry.blocking is not None:
        add(pointer("tools", name, "blocking"),
            f"tool {name!r}: 'blocking' applies to python tools only")
    if pools is not None and entry.pool is not None and entry.pool not in pools:
        add(pointer("tools", name, "pool"),
            f"tool {name!r}: pool {entry.pool!r} is not declared in [pools] of planrun.toml")
    return True


def _model_contract(name: str, accepts: str, add: Callable[..., None]
                    ) -> tuple[Any, dict[str, Any]] | None:
    """(the ``accepts`` pydantic model, its JSON Schema), or None (reported)."""
    try:
        model = _import(accepts)
        from pydantic import BaseModel

        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            raise TypeError("not a pydantic BaseModel subclass")
        from .streams import stdout_to_stderr

        with stdout_to_stderr():  # user code (schema hooks) may print
            contract: dict[str, Any] = model.model_json_schema()
    except (Exception, SystemExit) as exc:  # any import-time failure of user code
        add(pointer("tools", name, "accepts"),
            f"tool {name!r}: cannot use {accepts!r} as a contract: "
            f"{type(exc).__name__}: {exc}")
        return None
    for ptr, msg in schema_problems(contract):
        add(pointer("tools", name, "accepts"),
            f"tool {name!r}: the JSON Schema of {accepts!r} (at {ptr or '/'}) {msg}")
        return None
    return model, contract
