"""``when`` conditions in CEL, via the ``cel-python`` package (SPEC §3).

An expression sees ``params`` (the plan's parameter values), ``steps.ID.output`` and
``steps.ID.status`` and ``steps.ID.facets`` (:mod:`planrun.facets`) for the step's
ancestors. It is compiled at validation (``condition`` issues) and evaluated just before
the step would be dispatched: false skips the step and its dependents (reason
``condition``); an evaluation error or a non-boolean result fails the step.

Nothing here is imported for a plan without ``when``. cel-python builds its LALR parser
(lark) from its grammar in every process (~0.3 s on a 2-core machine). planrun has lark
keep the analysed parser in a file (lark's own ``cache`` option) in the user cache folder,
``platformdirs.user_cache_path("planrun")`` (e.g. ``~/.cache/planrun/``), one file per
cel-python, lark and Python version; later processes load it in a few milliseconds
(:func:`install_cel_parser`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

from .paths import private_dir


class ConditionError(ValueError):
    """A condition that does not compile, fails to evaluate, or is not a boolean."""


class ConditionTooLarge(ConditionError):
    """A condition that compiles but is beyond the limits of a condition.

    Too long (:data:`MAX_LENGTH`), nested too deep (:data:`MAX_DEPTH`) or with macros
    nested too deep (:data:`MAX_MACRO_NESTING`): refused at validation.
    """


class ConditionStopped(Exception):
    """The evaluation was cut because the run is stopping (``poll`` of :func:`evaluate`)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


#: The longest condition, in characters.
MAX_LENGTH = 4096
#: How deep a condition's parse tree may nest. cel-python evaluates by recursion, about
#: four Python frames a level, under the recursion limit it sets (2,500): measured, a
#: tree of ~500 levels is the most it evaluates (490 ``true && …``, 54 ``(``, 47 nested
#: lists); 200 leaves room for the frames of the run around it. A plain comparison is
#: ~12 levels, each ``&&`` or ``+`` one more, each ``(``, ``[``, call or macro ~10.
MAX_DEPTH = 200
#: How many comprehension macros (``map``, ``filter``, ``all``, ``exists``,
#: ``exists_one``) may nest inside one another: each multiplies the work by the size of
#: its list (seven over ten items each: 10^7 evaluations).
MAX_MACRO_NESTING = 3
#: The most steps one evaluation may take: each node of the expression cel-python's
#: interpreter visits, a macro's body once an item of its list. Measured on a slow
#: 2-core machine: 35,000 to 110,000 a second (names cost more than literals), so at
#: most a few seconds; ``x.all(f, f.size < 1024)`` takes ~13 an item (~15,000 items).
#: An evaluation that needs more fails the step (``condition``), whatever the machine.
COST_LIMIT = 200_000
#: The most steps a condition that reads ``steps`` other than by name (``steps[x]``,
#: ``size(steps)``) may depend on: it is given all of them each time it is evaluated, so
#: a chain of N steps with such a condition cost N x N (2,000 took 51 s).
MAX_DYNAMIC_ANCESTORS = 1000
#: The most seconds one evaluation may take, however few its steps (one step over large
#: data, ``x in list``, can be slow): past it the step fails (``condition``).
TIME_LIMIT_S = 20.0
#: Steps between two looks at the clock and at ``poll`` (:func:`evaluate`).
POLL_EVERY = 1024


def cel_parser_cache(cache_dir: Path | None = None) -> Path:
    """The file lark keeps cel-python's parser in (see :func:`install_cel_parser`).

    ``cache_dir`` defaults to ``platformdirs.user_cache_path("planrun")``. The name holds
    the cel-python, lark and Python versions, so an upgrade of any of them uses a new file.
    """
    import sys
    from importlib import metadata

    import lark

    if cache_dir is None:
        from .paths import user_cache_folder

        found = user_cache_folder()
        if found is None:
            raise OSError("no user cache folder (no home folder)")
        cache_dir = found
    try:
        celpy_version = metadata.version("cel-python")
    except metadata.PackageNotFoundError:
        celpy_version = "unknown"
    py = "{}{}".format(*sys.version_info[:2])
    return cache_dir / f"cel-parser-celpy{celpy_version}-lark{lark.__version__}-py{py}.lark"


def install_cel_parser(cache_dir: Path | None = None) -> Path | None:
    """Give cel-python its parser when it has none, built by lark with lark's cache.

    cel-python holds one parser per process, the class attribute
    ``celpy.celparser.CELParser.CEL_PARSER``: ``CELParser()`` builds it (``lark.Lark``
    with cel-python's grammar and options) only while it is None, and every
    ``Environment.compile`` reads it then ("No grammar loaded" when it is None). So this is
    called before every compile, not once: whoever set it back to None (a test, another
    library), the next compile has a parser again.

    The parser is built by cel-python's own ``CELParser()`` — its grammar, its options —
    with lark's ``cache`` option added: lark loads the file when its first line (lark's
    hash of the grammar, options and lark version) matches, giving back the options that
    are not kept in the file (the lexer callback, the tree class) from the call, and
    builds and rewrites it otherwise — also when the file is unreadable or damaged (lark
    writes it in place: a process that reads it half-written gets a pickle error, which
    lark catches, and builds its own). The file is a pickle: it is used only in a folder
    of this user that nobody else may write; elsewhere, or on any error, the parser is
    built as cel-python builds it.

    Args:
        cache_dir: where the file goes (default: the user cache folder of planrun).

    Returns:
        The cache file used, or None (a parser was there already, or no cache was used).
    """
    from celpy import InterpretedRunner, celparser

    if celparser.CELParser.CEL_PARSER is not None:
        return None
    tree_class = InterpretedRunner.tree_node_class
    path: Path | None = None
    with contextlib.suppress(Exception):  # no cache folder: built without one
        kept = cel_parser_cache(cache_dir)
        kept.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if private_dir(kept.parent):
            path = kept
    if path is None:
        celparser.CELParser(tree_class=tree_class)
        return None
    import functools

    module: Any = celparser  # CELParser() calls lark's ``Lark`` by this module's name
    lark_class = module.Lark
    # lark's hash of the options includes the cache's file name: always the same one
    module.Lark = functools.partial(lark_class, cache=str(path))
    try:
        celparser.CELParser(tree_class=tree_class)
    except Exception:  # lark could not write the file (a full disk...): built without it
        celparser.CELParser.CEL_PARSER = None
        path = None
    finally:
        module.Lark = lark_class
    if celparser.CELParser.CEL_PARSER is None:
        celparser.CELParser(tree_class=tree_class)
    return path


@lru_cache(maxsize=1)
def _environment() -> Any:
    import celpy

    install_cel_parser()
    return celpy.Environment()


@lru_cache(maxsize=4096)
def _tree(expr: str) -> Any:
    import celpy.celparser

    if len(expr) > MAX_LENGTH:
        raise ConditionTooLarge(f"it is {len(expr):,} characters long; a condition may be "
                                f"at most {MAX_LENGTH:,}")
    environment = _environment()
    install_cel_parser()  # cel-python's parser may have been reset since (see there)
    try:
        tree = environment.compile(expr)
    except celpy.celparser.CELParseError as exc:
        raise ConditionError(" ".join(str(exc).split())) from None
    except Exception as exc:  # cel-python raises assorted errors on odd input
        raise ConditionError(f"{type(exc).__name__}: {exc}") from None
    _check_size(tree)
    return tree


def _check_size(tree: Any) -> None:
    """Refuse a parse tree past :data:`MAX_DEPTH` or :data:`MAX_MACRO_NESTING`.

    Walked without recursion: the tree may be deep.
    """
    from lark import Tree

    deepest = nested = 0
    stack: list[tuple[Any, int, int]] = [(tree, 1, 0)]
    while stack:
        node, depth, macros = stack.pop()
        deepest = max(deepest, depth)
        inner = macros
        if node.data == "member_dot_arg" and len(node.children) >= 3 \
                and str(node.children[1]) in _BINDING_MACROS:
            inner = macros + 1  # its arguments run once an item; its list (first) once
            nested = max(nested, inner)
        for i, child in enumerate(node.children):
            if isinstance(child, Tree):
                stack.append((child, depth + 1, macros if i == 0 else inner))
    if deepest > MAX_DEPTH:
        raise ConditionTooLarge(f"it nests {deepest} levels deep (parentheses, operators, "
                                f"lists, calls); a condition may nest at most {MAX_DEPTH}")
    if nested > MAX_MACRO_NESTING:
        raise ConditionTooLarge(f"it nests {nested} macros (map, filter, all, exists, "
                                "exists_one) inside one another; at most "
                                f"{MAX_MACRO_NESTING} may nest")


def _root_ident(member: Any) -> str | None:
    """``params`` for the CEL subtree ``member > primary > ident params``."""
    from lark import Tree

    node = member
    for kind in ("member", "primary", "ident"):
        if not isinstance(node, Tree) or node.data != kind or not node.children:
            return None
        if kind == "ident":
            return str(node.children[0])
        node = node.children[0]
    return None


def _string_literal(expr: Any) -> str | None:
    """The text of an index expression that is one string literal, else None."""
    import json

    from lark import Token, Tree

    node = expr
    while isinstance(node, Tree) and len(node.children) == 1:
        if node.data == "literal":
            tok = node.children[0]
            if isinstance(tok, Token) and tok.startswith(('"', "'")):
                try:
                    return str(json.loads('"' + str(tok)[1:-1] + '"'))
                except ValueError:
                    return str(tok)[1:-1]
            return None
        node = node.children[0]
    return None


@lru_cache(maxsize=4096)
def references(expr: str) -> tuple[frozenset[str], frozenset[str]]:
    """(parameter names, step ids) that ``expr`` reads.

    ``params.X`` / ``params["X"]`` and ``steps.ID`` / ``steps["ID"]``, found in the parsed
    expression (text inside string literals is not a reference).

    Raises:
        ConditionError: the expression does not compile.
    """
    from lark import Tree

    found: dict[str, set[str]] = {"params": set(), "steps": set()}
    for node in _tree(expr).iter_subtrees():
        if node.data not in ("member_dot", "member_index") or len(node.children) < 2:
            continue
        root = _root_ident(node.children[0])
        if root not in found:
            continue
        key = node.children[1]
        name = str(key) if node.data == "member_dot" and not isinstance(key, Tree) \
            else _string_literal(key)
        if name is not None:
            found[root].add(name)
    return frozenset(found["params"]), frozenset(found["steps"])


def _key_of(node: Any) -> str | None:
    """The name ``node`` (a ``member_dot`` or ``member_index``) selects, if literal."""
    from lark import Tree

    if not isinstance(node, Tree) or node.data not in ("member_dot", "member_index") \
            or len(node.children) < 2:
        return None
    key = node.children[1]
    if node.data == "member_dot":
        return None if isinstance(key, Tree) else str(key)
    return _string_literal(key)


def _inner(node: Any) -> Any:
    """The ``member_dot``/``member_index`` a member chain continues from, or None."""
    from lark import Tree

    first = node.children[0] if isinstance(node, Tree) and node.children else None
    if isinstance(first, Tree) and first.data == "member" and len(first.children) == 1:
        inner = first.children[0]
        if isinstance(inner, Tree) and inner.data in ("member_dot", "member_index"):
            return inner
    return None


@lru_cache(maxsize=4096)
def _step_uses(expr: str) -> tuple[dict[str, frozenset[str | None]], frozenset[
        tuple[str, str | None]], bool]:
    """What ``expr`` reads of each step, and which facets.

    Returns: step id → the fields read (``output``, ``facets``; None: the whole
    ``steps.ID``), the (step id, facet name or None) of each ``steps.ID.facets…``, and
    whether ``steps`` is also read otherwise (``steps[x]``, ``"a" in steps``): then any
    step may be read.

    Raises:
        ConditionError: the expression does not compile.
    """
    from lark import Tree

    tree = _tree(expr)
    step_nodes: dict[int, str] = {}
    for node in tree.iter_subtrees():
        if isinstance(node, Tree) and node.data in ("member_dot", "member_index") \
                and _root_ident(node.children[0]) == "steps":
            sid = _key_of(node)
            if sid is not None:
                step_nodes[id(node)] = sid
    fields: dict[str, set[str | None]] = {sid: set() for sid in step_nodes.values()}
    covered: set[int] = set()
    facet_nodes: dict[int, str] = {}
    for node in tree.iter_subtrees():
        inner = _inner(node)
        if inner is None or id(inner) not in step_nodes:
            continue
        sid, name = step_nodes[id(inner)], _key_of(node)
        covered.add(id(inner))
        fields[sid].add(name)
        if name == "facets":
            facet_nodes[id(node)] = sid
    for nid, sid in step_nodes.items():
        if nid not in covered:
            fields[sid].add(None)
    facets: set[tuple[str, str | None]] = set()
    named: set[int] = set()
    for node in tree.iter_subtrees():
        inner = _inner(node)
        if inner is not None and id(inner) in facet_nodes:
            named.add(id(inner))
            facets.add((facet_nodes[id(inner)], _key_of(node)))
    facets.update((sid, None) for nid, sid in facet_nodes.items() if nid not in named)
    roots = sum(1 for node in tree.iter_subtrees() if node.data == "ident"
                and node.children and str(node.children[0]) == "steps")
    return ({k: frozenset(v) for k, v in fields.items()}, frozenset(facets),
            roots > len(step_nodes))


def facet_reads(expr: str) -> frozenset[tuple[str, str | None]]:
    """(step id, facet name) of each ``steps.ID.facets.NAME`` in ``expr``.

    The name is None where the facets are read whole (``steps.ID.facets``) or by an
    expression (``steps.ID.facets[x]``).

    Raises:
        ConditionError: the expression does not compile.
    """
    return _step_uses(expr)[1]


#: What a condition may read of an ancestor: ``steps.ID.output``, ``.status``, ``.facets``.
STEP_FIELDS = ("output", "status", "facets")


def step_field_reads(expr: str) -> dict[str, frozenset[str | None]]:
    """Step id → the names ``expr`` reads of it (``steps.ID.NAME``; None: read whole).

    Raises:
        ConditionError: the expression does not compile.
    """
    return _step_uses(expr)[0]


def named_steps(expr: str) -> frozenset[str] | None:
    """The ids of the steps ``expr`` reads, or None when it may read any (``steps[x]``).

    Raises:
        ConditionError: the expression does not compile.
    """
    fields, _facets, dynamic = _step_uses(expr)
    return None if dynamic else frozenset(fields)


def reads_output(expr: str, sid: str) -> bool:
    """Whether ``expr`` may read ``steps.ID.output`` (anything but its facets and status).

    A condition that reads only ``steps.ID.facets`` or ``steps.ID.status`` needs no output
    loaded, however large.

    Raises:
        ConditionError: the expression does not compile.
    """
    fields, _facets, dynamic = _step_uses(expr)
    return dynamic or bool(fields.get(sid, frozenset()) - {"facets", "status"})


def reads_facets(expr: str, sid: str) -> bool:
    """Whether ``expr`` may read ``steps.ID.facets`` (or the whole ``steps.ID``).

    Raises:
        ConditionError: the expression does not compile.
    """
    fields, _facets, dynamic = _step_uses(expr)
    return dynamic or bool(fields.get(sid, frozenset()) & {"facets", None})


#: The names a condition may start from (SPEC §3): nothing else is data to it.
ROOTS = frozenset({"params", "steps"})
#: CEL macros that bind a variable (``list.all(x, x > 0)``).
_BINDING_MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})
#: CEL's type names, usable as values (``type(x) == int``).
_TYPE_NAMES = frozenset({"int", "uint", "double", "bool", "string", "bytes", "list", "map",
                         "null_type", "type", "dyn"})


def _bound_name(exprlist: Any) -> str | None:
    """The variable a macro binds: its first argument, when that is a bare name."""
    from lark import Tree

    if not isinstance(exprlist, Tree) or not exprlist.children:
        return None
    node = exprlist.children[0]
    while isinstance(node, Tree) and len(node.children) == 1 and node.data != "ident":
        node = node.children[0]
    if isinstance(node, Tree) and node.data == "ident" and node.children:
        return str(node.children[0])
    return None


@lru_cache(maxsize=4096)
def unknown_names(expr: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(names, functions) ``expr`` uses that a condition cannot have.

    A condition reads only ``params`` and ``steps`` (SPEC §3): any other name (a typo,
    ``ctx.status``) would only fail at run time. Variables bound by a macro
    (``.all(x, …)``, ``.exists``, ``.map``, ``.filter``) and CEL's type names are fine;
    a global function must be one CEL defines.

    Raises:
        ConditionError: the expression does not compile.
    """
    import celpy.evaluation
    from lark import Tree

    tree = _tree(expr)
    bound: set[str] = set()
    for node in tree.iter_subtrees():
        if (node.data == "member_dot_arg" and len(node.children) >= 3
                and str(node.children[1]) in _BINDING_MACROS):
            name = _bound_name(node.children[2])
            if name is not None:
                bound.add(name)
    functions = set(celpy.evaluation.base_functions) | {"has", "dyn"}
    names: list[str] = []
    calls: list[str] = []
    for node in tree.iter_subtrees_topdown():
        if not node.children or isinstance(node.children[0], Tree):
            continue
        word = str(node.children[0])
        if node.data in ("ident", "dot_ident"):
            if word not in ROOTS | bound | _TYPE_NAMES and word not in names:
                names.append(word)
        elif node.data in ("ident_arg", "dot_ident_arg") and word not in functions \
                and word not in calls:
            calls.append(word)
    return tuple(names), tuple(calls)


#: Longest message of a condition that fails at run time (the values it read are not
#: dumped into the journal and the terminal).
MESSAGE_LIMIT = 300


def _short(text: str, limit: int = MESSAGE_LIMIT) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


@lru_cache(maxsize=4096)
def compile_condition(expr: str) -> Any:
    """The compiled CEL program of ``expr``.

    Raises:
        ConditionError: the expression does not compile.
    """
    tree = _tree(expr)
    try:
        return _environment().program(tree)
    except Exception as exc:  # cel-python raises assorted errors on odd input
        raise ConditionError(f"{type(exc).__name__}: {exc}") from None


class _Cut(BaseException):
    """Ends cel-python's evaluation from inside it.

    A BaseException: nothing there keeps it as an error value. ``why``: the step
    failure's message, a :class:`ConditionStopped`, or an exception ``poll`` raised.
    """

    def __init__(self, why: str | BaseException) -> None:
        super().__init__(why)
        self.why = why


class _Meter:
    """The steps an evaluation has left (:data:`COST_LIMIT`), its clock and its ``poll``."""

    def __init__(self, poll: Callable[[], str | None] | None) -> None:
        import time

        self.left = COST_LIMIT
        self.next_look = COST_LIMIT - POLL_EVERY
        self.clock = time.monotonic
        self.until = self.clock() + TIME_LIMIT_S
        self.poll = poll

    def charge(self, steps: int) -> None:
        self.left -= steps
        if self.left <= self.next_look:
            self.look()

    def look(self) -> None:
        self.next_look = self.left - POLL_EVERY
        if self.left < 0:
            raise _Cut(f"it needs more than {COST_LIMIT:,} evaluation steps (the limit of "
                       "a condition)")
        if self.clock() > self.until:
            raise _Cut(f"it ran longer than {TIME_LIMIT_S:g} s (the limit of a condition)")
        if self.poll is not None:
            try:
                reason = self.poll()
            except BaseException as exc:  # re-raised by evaluate, outside cel-python
                raise _Cut(exc) from None
            if reason:
                raise _Cut(ConditionStopped(reason))


@lru_cache(maxsize=1)
def _metered_evaluator() -> type:
    """cel-python's tree interpreter, each node it visits charged to a :class:`_Meter`.

    ``Evaluator`` (a ``lark`` ``Interpreter``) reaches every node by ``visit`` (the root,
    and the children its rules walk themselves) or ``visit_children``; a macro's body is
    evaluated by a ``sub_evaluator`` once an item, which shares the meter.
    """
    from celpy.evaluation import Evaluator

    class Metered(Evaluator):
        meter: _Meter

        def visit(self, tree: Any) -> Any:
            self.meter.charge(1)
            return super().visit(tree)

        def visit_children(self, tree: Any) -> Any:
            self.meter.charge(len(tree.children))
            return super().visit_children(tree)

        def sub_evaluator(self, ast: Any) -> Any:
            sub = Metered(ast, activation=self.activation)
            sub.meter = self.meter
            return sub

    return Metered


#: CEL's ``int``: what an integer of the data must fit in.
_INT_RANGE = (-(2 ** 63), 2 ** 63 - 1)


def _to_cel(value: Any, where: str) -> Any:
    """``value`` (JSON data) as CEL values; what CEL cannot hold becomes an error value.

    cel-python's ``json_to_cel`` raises on an integer beyond 64 bits (``overflow``), and
    by recursion on data nested deeper than Python's limit: one such value of any
    parameter or step then failed every condition, even one that does not read it. Here
    it becomes an error in place (a ``CELEvalError``, which CEL carries as a value): a
    condition that reads it fails (``condition``, the message naming ``where``), the
    others never see it.
    """
    from celpy import celtypes
    from celpy.evaluation import CELEvalError

    low, high = _INT_RANGE

    def convert(v: Any) -> Any:
        if isinstance(v, bool):
            return celtypes.BoolType(v)
        if isinstance(v, int):
            if low <= v <= high:
                return celtypes.IntType(v)
            return CELEvalError(f"{where} holds an integer beyond CEL's 64-bit int range")
        if isinstance(v, float):
            return celtypes.DoubleType(v)
        if isinstance(v, str):
            return celtypes.StringType(v)
        if v is None:
            return None
        if isinstance(v, (list, tuple)):
            return celtypes.ListType([convert(item) for item in v])
        if isinstance(v, dict):
            return celtypes.MapType({convert(k): convert(item) for k, item in v.items()})
        return CELEvalError(f"{where} holds a {type(v).__name__}, which CEL cannot read")

    try:
        return convert(value)
    except RecursionError:
        return CELEvalError(f"{where} is nested too deeply for a condition to read")


def evaluate(expr: str, params: dict[str, Any], outputs: dict[str, Any],
             statuses: dict[str, str] | None = None,
             facets: dict[str, Any] | None = None, *,
             poll: Callable[[], str | None] | None = None) -> bool:
    """Evaluate ``expr`` with ``params``, ``steps.ID.output``, ``.status`` and ``.facets``.

    ``steps.ID.output`` is ``outputs[ID]``; ``steps.ID.status`` is ``statuses[ID]`` (a
    step status word of SPEC §5, e.g. ``"failed"``); ``steps.ID.facets`` is
    ``facets[ID]``. A step that did not succeed (or end ``partial``) has no ``output``.

    The evaluation takes at most :data:`COST_LIMIT` steps and :data:`TIME_LIMIT_S`
    seconds. Every :data:`POLL_EVERY` steps it calls ``poll`` (on the caller's thread):
    a reason it returns ends the evaluation (:class:`ConditionStopped`); an exception it
    raises is raised from here as it is.

    Raises:
        ConditionError: evaluation failed, went past a limit, or the result is not a
            boolean.
        ConditionStopped: ``poll`` asked to stop.
    """
    from celpy import celtypes

    program = compile_condition(expr)
    steps: dict[str, dict[str, Any]] = {sid: {"status": celtypes.StringType(st)}
                                        for sid, st in (statuses or {}).items()}
    for sid, out in outputs.items():
        steps.setdefault(sid, {})["output"] = _to_cel(out, f"steps.{sid}.output")
    for sid, values in (facets or {}).items():
        steps.setdefault(sid, {})["facets"] = _to_cel(values, f"steps.{sid}.facets")
    activation = {
        "params": celtypes.MapType({celtypes.StringType(name): _to_cel(v, f"params.{name}")
                                    for name, v in params.items()}),
        "steps": celtypes.MapType({celtypes.StringType(sid): celtypes.MapType(
            {celtypes.StringType(k): v for k, v in fields.items()})
            for sid, fields in steps.items()})}
    evaluator = _metered_evaluator()(program.ast, activation=program.new_activation())
    evaluator.meter = _Meter(poll)
    try:
        result = evaluator.evaluate(activation)
    except _Cut as cut:
        if isinstance(cut.why, BaseException):
            raise cut.why from None
        raise ConditionError(f"cannot evaluate {_short(expr, 120)!r}: {cut.why}") from None
    except Exception as exc:  # CELEvalError and friends, RecursionError
        raise ConditionError(f"cannot evaluate {_short(expr, 120)!r}: {_why(exc)}") from None
    if isinstance(result, Exception):
        raise ConditionError(f"cannot evaluate {_short(expr, 120)!r}: {_why(result)}")
    if not isinstance(result, celtypes.BoolType):
        raise ConditionError(f"{_short(expr, 120)!r} gave {_short(type(result).__name__)}, "
                             "not true or false")
    return bool(result)


def _why(exc: BaseException) -> str:
    """What went wrong, without the values CEL puts in its messages, at most a line long.

    cel-python's errors repeat the whole activation (every output the condition could
    read); only the first argument of the error, cut short, is kept.
    """
    args = getattr(exc, "args", ())
    first = str(args[0] if args else exc)
    return _short(first.split(" (in activation", 1)[0])
