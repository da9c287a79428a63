"""``planrun import``: a seed-format execution plan (AI-Parrot style JSON) → a planrun plan.

The seed format::

    {"name": "nightly", "objective": "Do the nightly work",
     "nodes": [{"id": "fetch", "tool": "fetch_url", "args": {"url": "{artifacts.url}"},
                "depends_on": [], "for_each": "{nodes.list.output}", "when": true,
                "retry": {"max_attempts": 3}, "timeout": 60}]}

Nothing is guessed (SPEC principles 1 and 3): each construct either maps to exactly one
planrun construct with the same meaning, or is reported ``unmappable`` at its JSON Pointer
in the seed file (``/nodes/3/when``). A plan is produced only when everything maps.

The mapping (also in ``docs/plans.md``, "Importing a seed plan"):

==========================  =================================================
seed                        planrun
==========================  =================================================
``name``                    ``name`` (default: the seed file's stem)
``objective``               ``goal`` (required)
``nodes[].id``              ``steps[].id`` (must already be a valid step id)
``nodes[].tool``            ``steps[].tool``
``nodes[].args``            ``steps[].arguments`` (placeholders translated)
``nodes[].depends_on``      ``steps[].depends_on``
``nodes[].for_each``        ``steps[].for_each`` (a list, or one placeholder)
``nodes[].when``            ``steps[].when`` only for ``true``/``false``
``nodes[].retry``           ``steps[].retries: {max_attempts: N}`` (the same N)
``nodes[].timeout``         ``steps[].timeout`` (seconds, a positive number)
``{nodes.ID.output…}``      ``{steps.ID.output…}``
``{artifacts.NAME}``        ``{params.NAME}`` plus a required parameter ``NAME``
``{item…}``, ``{index}``    the same, inside a node with ``for_each`` only
==========================  =================================================

Anything else — another field, a ``when`` expression, ``retry`` fields other than
``max_attempts``, ``{{``/``}}`` (the seed's escaping is not known), text that planrun
would read as a placeholder (``{params.x}``, ``<params.x>``, ``{steps.x}``) — is
unmappable.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .formats import MAX_ATTEMPTS, MAX_SECONDS, PARAM_NAME_PATTERN, STEP_ID_PATTERN
from .issues import Issue, PlanReport, Report
from .loading import Document, DocumentError, kind_of, load_file, parse_text
from .pointers import pointer

if TYPE_CHECKING:
    from .paths import Settings

#: The seed fields of a node that map (everything else is unmappable).
NODE_FIELDS = ("id", "tool", "args", "depends_on", "for_each", "when", "retry", "timeout")
#: The seed's top-level fields that map.
TOP_FIELDS = ("name", "objective", "nodes")

#: ``{root.rest}`` or ``{root}``: any brace group holding a dotted name.
_BRACED = re.compile(r"\{([A-Za-z_][A-Za-z0-9_-]*)((?:\.[A-Za-z0-9_-]+)*)\}")
#: planrun's other spelling of a parameter placeholder: never let seed text become one.
_ANGLED = re.compile(r"<params\.[^>]*>")
_STEP_ID = re.compile(STEP_ID_PATTERN)
_PARAM = re.compile(PARAM_NAME_PATTERN)


@dataclass
class Imported:
    """What :func:`convert` made of a seed document.

    Attributes:
        report: the mapping report: one ``PlanReport`` for the seed file whose issues are
            ``syntax``/``duplicate_key``/``too_large`` (unreadable), ``schema`` (not the
            seed format's shape) or ``unmappable`` (no planrun equivalent), each at its
            JSON Pointer in the seed file with line and column.
        plan: the planrun plan (a JSON object), or None when anything did not map.
    """

    report: Report
    plan: dict[str, Any] | None = None


@dataclass
class _Mapper:
    doc: Document
    issues: list[Issue] = field(default_factory=list)
    artifacts: dict[str, str] = field(default_factory=dict)  # name -> first pointer

    def add(self, code: str, ptr: str, message: str, *, step: str | None = None,
            key: bool = False) -> None:
        line, col = self.doc.locate_key(ptr) if key else self.doc.locate(ptr)
        self.issues.append(Issue(code=code, message=message, step=step, path=ptr,
                                 file=self.doc.file, line=line, column=col))

    def unmappable(self, ptr: str, message: str, *, step: str | None = None,
                   key: bool = False) -> None:
        self.add("unmappable", ptr, message, step=step, key=key)

    # --- placeholders -------------------------------------------------------------------

    def text(self, value: str, ptr: str, step: str | None, fan_out: bool) -> str | None:
        """A seed string with its placeholders translated, or None (reported)."""
        ok = True
        if "{{" in value or "}}" in value:
            self.unmappable(ptr, "'{{' or '}}' in seed text: the seed format's escaping is "
                            "not known, so its meaning cannot be kept; write the plan "
                            "by hand", step=step)
            ok = False
        if _ANGLED.search(value):
            self.unmappable(ptr, "'<params.…>' would be a placeholder in planrun; the seed "
                            "text cannot be kept as it is", step=step)
            ok = False
        out: list[str] = []
        last = 0
        for m in _BRACED.finditer(value):
            out.append(value[last:m.start()])
            last = m.end()
            root, rest = m.group(1), m.group(2)
            parts = rest[1:].split(".") if rest else []
            new = self._placeholder(m.group(0), root, parts, ptr, step, fan_out)
            if new is None:
                ok = False
            else:
                out.append(new)
        out.append(value[last:])
        return "".join(out) if ok else None

    def _placeholder(self, whole: str, root: str, parts: list[str], ptr: str,
                     step: str | None, fan_out: bool) -> str | None:
        if root == "nodes":
            if len(parts) >= 2 and parts[1] == "output" and _STEP_ID.fullmatch(parts[0]):
                return "{steps." + ".".join(parts) + "}"
            self.unmappable(ptr, f"{whole}: only {{nodes.ID.output}} (optionally with a "
                            "path after it) has a planrun equivalent ({steps.ID.output})",
                            step=step)
            return None
        if root == "artifacts":
            if len(parts) == 1 and _PARAM.fullmatch(parts[0]):
                self.artifacts.setdefault(parts[0], ptr)
                return "{params." + parts[0] + "}"
            self.unmappable(ptr, f"{whole}: an artifact maps to a parameter, which is "
                            "referenced whole ({artifacts.NAME}, NAME matching "
                            f"{PARAM_NAME_PATTERN}); a path into it has no equivalent",
                            step=step)
            return None
        if root in ("item", "index") and fan_out and (root == "item" or not parts):
            return whole
        if root in ("item", "index"):
            self.unmappable(ptr, f"{whole} outside a node with 'for_each' has no meaning",
                            step=step)
            return None
        if not parts:
            return whole  # `{word}`: literal text in both formats
        self.unmappable(ptr, f"{whole}: not a seed placeholder ({{nodes.ID.output}}, "
                        "{artifacts.NAME}); planrun would read it as a placeholder, so the "
                        "text cannot be kept as it is", step=step)
        return None

    def value(self, value: Any, ptr: str, step: str | None, fan_out: bool) -> Any:
        """A JSON value with every string translated; None-safe via ``self.issues``."""
        if isinstance(value, str):
            return self.text(value, ptr, step, fan_out)
        if isinstance(value, list):
            return [self.value(v, f"{ptr}/{i}", step, fan_out) for i, v in enumerate(value)]
        if isinstance(value, dict):
            out = {}
            for k, v in value.items():
                sub = pointer_join(ptr, k)
                if _BRACED.search(k) or "{{" in k or "}}" in k or _ANGLED.search(k):
                    self.unmappable(sub, f"placeholder-like text in the key {k!r}: keys "
                                    "are never substituted", step=step, key=True)
                out[k] = self.value(v, sub, step, fan_out)
            return out
        return value

    # --- the document -------------------------------------------------------------------

    def plan(self, default_name: str) -> dict[str, Any] | None:
        data = self.doc.data
        if not isinstance(data, dict):
            self.add("schema", "", "a seed plan is a JSON object with 'objective' and "
                     f"'nodes', not {_kind(data)}")
            return None
        for k in data:
            if k not in TOP_FIELDS:
                self.unmappable(pointer(k), f"seed field {k!r} has no planrun equivalent "
                                f"(mapped: {', '.join(TOP_FIELDS)})", key=True)
        name = data.get("name", default_name)
        if not isinstance(name, str) or not name:
            self.add("schema", "/name", "'name' must be a non-empty string")
        goal = data.get("objective")
        if "objective" not in data:
            self.add("schema", "", "'objective' is missing: it becomes the plan's 'goal', "
                     "which planrun requires")
        elif not isinstance(goal, str):
            self.add("schema", "/objective", f"'objective' must be a string, not "
                     f"{_kind(goal)}")
        nodes = data.get("nodes")
        if "nodes" not in data:
            self.add("schema", "", "'nodes' is missing: a seed plan lists its nodes there")
            return None
        if not isinstance(nodes, list):
            self.add("schema", "/nodes", f"'nodes' must be a list, not {_kind(nodes)}")
            return None
        steps = [self.node(n, i) for i, n in enumerate(nodes)]
        plan: dict[str, Any] = {"planrun": 1, "name": name, "goal": goal}
        if self.artifacts:
            plan["params"] = {a: {"description": f"artifact {a!r} of the seed plan"}
                              for a in self.artifacts}
        plan["steps"] = steps
        return plan

    def node(self, node: Any, i: int) -> dict[str, Any]:
        base = pointer("nodes", i)
        if not isinstance(node, dict):
            self.add("schema", base, f"node {i} must be an object, not {_kind(node)}")
            return {}
        sid = node.get("id")
        label = sid if isinstance(sid, str) else None
        for k in node:
            if k not in NODE_FIELDS:
                self.unmappable(pointer_join(base, k), f"node field {k!r} has no planrun "
                                f"equivalent (mapped: {', '.join(NODE_FIELDS)})",
                                step=label, key=True)
        if not isinstance(sid, str) or not _STEP_ID.fullmatch(sid):
            self.add("schema" if not isinstance(sid, str) else "unmappable",
                     base + "/id", f"node id {sid!r} is not a planrun step id "
                     f"({STEP_ID_PATTERN}); ids are never renamed")
        tool = node.get("tool")
        if not isinstance(tool, str) or not tool:
            self.add("schema", base + ("/tool" if "tool" in node else ""),
                     "'tool' must be a non-empty string", step=label)
        step: dict[str, Any] = {"id": sid, "tool": tool}
        fan_out = "for_each" in node
        args = node.get("args", {})
        if not isinstance(args, dict):
            self.add("schema", base + "/args", f"'args' must be an object, not "
                     f"{_kind(args)}", step=label)
        else:
            step["arguments"] = self.value(args, base + "/args", label, fan_out)
        if "depends_on" in node:
            deps = node["depends_on"]
            if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
                self.add("schema", base + "/depends_on", "'depends_on' must be a list of "
                         "node ids", step=label)
            elif deps:
                step["depends_on"] = list(deps)
        if fan_out:
            step["for_each"] = self._for_each(node["for_each"], base + "/for_each", label)
        if "when" in node:
            self._when(node["when"], base + "/when", label, step)
        if "retry" in node:
            self._retry(node["retry"], base + "/retry", label, step)
        if "timeout" in node:
            t = node["timeout"]
            if isinstance(t, int | float) and not isinstance(t, bool) and 0 < t <= MAX_SECONDS:
                step["timeout"] = t
            else:
                self.unmappable(base + "/timeout", f"timeout {t!r}: only a positive number "
                                f"of seconds (at most {MAX_SECONDS:.0f}) maps to planrun's "
                                "'timeout'", step=label)
        return step

    def _for_each(self, value: Any, ptr: str, step: str | None) -> Any:
        if isinstance(value, list):
            return self.value(value, ptr, step, False)
        if isinstance(value, str) and _BRACED.fullmatch(value):
            return self.text(value, ptr, step, False)
        self.unmappable(ptr, f"for_each {value!r}: only a list or one placeholder "
                        "({nodes.ID.output…}, {artifacts.NAME}) maps", step=step)
        return None

    def _when(self, value: Any, ptr: str, step: str | None, out: dict[str, Any]) -> None:
        if isinstance(value, bool) or value in ("true", "false"):
            out["when"] = "true" if value in (True, "true") else "false"
            return
        self.unmappable(ptr, f"when {value!r}: the seed's condition language is not "
                        "CEL; only true/false map. Write the condition in CEL by hand "
                        "(e.g. steps.ID.output.ok == true)", step=step)

    def _retry(self, value: Any, ptr: str, step: str | None, out: dict[str, Any]) -> None:
        if not isinstance(value, dict):
            self.unmappable(ptr, f"retry {value!r}: only {{max_attempts: N}} maps (a bare "
                            "number could count attempts or retries)", step=step)
            return
        for k in value:
            if k != "max_attempts":
                self.unmappable(pointer_join(ptr, k), f"retry field {k!r} has no planrun "
                                "equivalent whose meaning is known (only max_attempts maps)",
                                step=step, key=True)
        n = value.get("max_attempts")
        if "max_attempts" not in value:
            self.unmappable(ptr, "retry without max_attempts", step=step)
        elif isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_ATTEMPTS:
            out["retries"] = {"max_attempts": n}
        else:
            self.unmappable(ptr + "/max_attempts", f"max_attempts {n!r}: a whole number "
                            f"from 1 to {MAX_ATTEMPTS}", step=step)


def pointer_join(base: str, key: str) -> str:
    """``base`` + ``/key`` with ``key`` escaped (RFC 6901)."""
    from .pointers import pointer_escape

    return f"{base}/{pointer_escape(key)}"


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
             int: "a number", float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def load_seed(path: Path, shown: str) -> Document:
    """Read a seed file: JSON (a ``.yaml``/``.yml`` name: YAML, aliases bounded).

    Raises:
        DocumentError: ``not_found``, ``syntax``, ``duplicate_key`` or ``too_large``
            issues, located in the file.
    """
    from .paths import present

    if not present(path):  # else: load_file says what it is (a FIFO, a folder …)
        raise DocumentError([Issue(code="not_found", file=shown, path="",
                                   message=f"no seed file {shown}: give the path of an "
                                   "execution-plan JSON file")])
    return load_file(path, display=shown)


def convert(doc: Document, default_name: str) -> Imported:
    """Map a loaded seed document to a planrun plan (see the module docstring).

    Returns:
        :class:`Imported`: ``plan`` is set only when the report has no error.
    """
    mapper = _Mapper(doc)
    plan = mapper.plan(default_name)
    report = Report(plans=[PlanReport(file=doc.file, issues=mapper.issues)])
    return Imported(report=report, plan=plan if plan is not None and not mapper.issues
                    else None)


def import_file(path: Path, shown: str, default_name: str | None = None) -> Imported:
    """Load and convert the seed file at ``path`` (``shown``: its name in reports).

    ``default_name``: the plan's name when the seed has none (default: the file's stem).
    Unreadable input is in the report, never raised.
    """
    try:
        doc = load_seed(path, shown)
    except DocumentError as exc:
        return Imported(report=Report(plans=[PlanReport(file=shown,
                                                        issues=list(exc.issues))]))
    return convert(doc, default_name or path.stem)


#: How the converted plan is named in the report when it goes to stdout.
CONVERTED_NAME = "<imported>"


@dataclass
class ImportOutcome:
    """The result of :func:`import_plan`.

    Attributes:
        report: one report: the seed file's mapping issues, then (when everything mapped)
            the registry issues and the converted plan's validation issues, as
            ``planrun validate`` reports them.
        text: the plan as file text (YAML, or JSON for an ``--out`` ending ``.json``),
            or None when something did not map.
    """

    report: Report
    text: str | None = None

    @property
    def ok(self) -> bool:
        """True when everything mapped and the converted plan validates."""
        return self.text is not None and self.report.ok()


def import_plan(settings: Settings, source: Path, out: Path | None = None) -> ImportOutcome:
    """Convert the seed file ``source`` and validate the result against the registry.

    Nothing is written here: the caller writes :attr:`ImportOutcome.text` (to ``out`` or
    stdout). The converted plan is checked like ``planrun validate`` checks a plan given
    without parameter values (registry problems first: code ``registry``/``config``).

    Args:
        settings: the project (registry, policy, ``max_steps``, pools).
        source: the seed file (JSON; ``.yaml``/``.yml`` read as YAML).
        out: where the plan will be written (its suffix picks JSON or YAML, its stem is
            the name of a seed plan without ``name``), or None for stdout (YAML).

    Returns:
        The outcome; unreadable or unmappable input is in its report, never raised.
    """
    from .checking import load_registry
    from .errors import Refused
    from .paths import shown_path
    from .planning import render
    from .validation import check_plan

    imported = import_file(source, shown_path(source),
                           default_name=out.stem if out is not None else None)
    report = imported.report
    if imported.plan is None:
        return ImportOutcome(report)
    text = render(imported.plan, out.suffix.lower() if out is not None else ".yaml")
    shown = shown_path(out) if out is not None else CONVERTED_NAME
    try:
        registry = load_registry(settings)
    except Refused as exc:
        if isinstance(exc.report, Report):
            report.issues.extend(exc.report.issues)
        return ImportOutcome(report, text)
    doc = parse_text(text, kind=kind_of(out) if out is not None else "yaml", file=shown)
    checked, _plan = check_plan(doc, registry, settings, None, concrete=False)
    report.plans.append(checked)
    return ImportOutcome(report, text)


__all__ = ["CONVERTED_NAME", "ImportOutcome", "Imported", "convert", "import_file",
           "import_plan", "load_seed"]
