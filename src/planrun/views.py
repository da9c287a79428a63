"""Looking at plans and tools without running them: show, graph, tools, schema, init (SPEC §8).

Pure data in, data (or text) out; the CLI renders it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import UsageError
from .validation import CheckedPlan


def describe_plan(plan: CheckedPlan) -> dict[str, Any]:
    """``planrun show``: parameters, steps in run order, approvals and fan-out.

    Returns ``{"name", "revision", "goal", "file", "digest", "params": [...],
    "steps": [...]}``; each step has ``id``, ``tool``, ``depends_on``, ``intent``,
    ``approval`` (why it needs clearing, or None), ``run_if`` (``success`` | ``failure`` |
    ``always``), ``approve_at_dispatch`` (``approve: resolved``: cleared when it is
    reached), ``fan_out``, ``when`` (the condition,
    or None), ``for_each`` (as written, or None).
    """
    from .params import shown_as_written

    declared = plan.document.get("params") or {}
    params = []
    for name, schema in declared.items():
        schema = schema if isinstance(schema, dict) else {}
        params.append({
            "name": name, "type": schema.get("type"), "required": "default" not in schema,
            "default": schema.get("default"), "description": schema.get("description"),
            "secret": bool(schema.get("secret")),
        })
    steps = []
    for sid in plan.order():
        step = plan.by_id[sid]
        steps.append({
            "id": sid, "tool": step.tool.name, "depends_on": step.depends_on,
            "intent": step.intent, "approval": step.approval_reason,
            "fan_out": step.for_each is not None, "when": step.when,
            "run_if": step.run_if, "approve_at_dispatch": step.deferred_approval,
            "for_each": None if step.for_each is None else shown_as_written(
                step.for_each, step.raw.get("for_each")),
            "idempotent": step.tool.entry.idempotent,
        })
    return {"name": plan.name, "revision": plan.revision, "goal": plan.goal,
            "file": plan.file, "digest": plan.digest, "params": params, "steps": steps}


def _dot_id(text: str) -> str:
    return json.dumps(text)


def render_graph(plan: CheckedPlan, fmt: str) -> str:
    """The dependency graph as Mermaid (``flowchart TD``) or Graphviz DOT text.

    Arrows point from a step to the steps that wait on it; steps that need approval are
    marked (irreversible ones with ``⚠``), fan-out steps drawn as stacks, and arrows into
    a step with a ``when`` condition are dotted/dashed and labelled ``when``.

    Raises:
        UsageError: an unknown format (exit 2).
    """
    order = plan.order()
    if fmt == "mermaid":
        lines = ["flowchart TD"]
        for sid in order:
            step = plan.by_id[sid]
            label = f"{sid}<br/><small>{step.tool.name}</small>"
            if step.approval_reason == "irreversible":
                label = "⚠ " + label
            shape = ("[[", "]]") if step.for_each is not None else ("[", "]")
            safe = label.replace('"', "#quot;")
            lines.append(f'    {sid}{shape[0]}"{safe}"{shape[1]}')
        for sid in order:
            # An edge into a step with `when` is conditional: dotted, labelled "when".
            arrow = " -.->|when| " if plan.by_id[sid].when else " --> "
            for dep in plan.by_id[sid].depends_on:
                lines.append(f"    {dep}{arrow}{sid}")
        marked = [sid for sid in order if plan.by_id[sid].approval_reason]
        if marked:
            lines.append("    classDef approval stroke:#c00,stroke-width:3px")
            lines.append(f"    class {','.join(marked)} approval")
        return "\n".join(lines) + "\n"
    if fmt == "dot":
        lines = [f"digraph {_dot_id(plan.name)} {{", "    rankdir=TB;",
                 "    node [shape=box, fontname=\"Helvetica\"];"]
        for sid in order:
            step = plan.by_id[sid]
            attrs = [f"label={_dot_id(sid + chr(10) + step.tool.name)}"]
            if step.approval_reason:
                attrs.append("color=red, penwidth=2")
            if step.approval_reason == "irreversible":
                attrs.append("style=bold")
            if step.for_each is not None:
                attrs.append("shape=box3d")
            lines.append(f"    {_dot_id(sid)} [{', '.join(attrs)}];")
        for sid in order:
            cond = plan.by_id[sid].when
            edge = (f" [style=dashed, label={_dot_id('when')}, "
                    f"tooltip={_dot_id('when ' + cond)}]" if cond else "")
            for dep in plan.by_id[sid].depends_on:
                lines.append(f"    {_dot_id(dep)} -> {_dot_id(sid)}{edge};")
        lines.append("}")
        return "\n".join(lines) + "\n"
    raise UsageError(f"unknown graph format {fmt!r}; use mermaid or dot")


def describe_tools(registry: Any, *, allowed: bool = False) -> list[dict[str, Any]]:
    """``planrun tools``: each tool's kind, flags and arguments summary.

    ``allowed``: only the tools the policy lets a plan use (``tools --allowed``: the
    registry ∩ ``allowed_tools``, less the classes it refuses outright); without a policy,
    every tool.
    """
    policy = registry.policy
    out = []
    for name in sorted(registry.tools):
        if allowed and policy is not None and not policy.allows(name):
            continue
        spec = registry.tools[name]
        props = spec.contract.get("properties") or {}
        required = set(spec.contract.get("required") or [])
        args = [{"name": arg, "type": (schema or {}).get("type") if isinstance(schema, dict)
                 else None, "required": arg in required} for arg, schema in props.items()]
        out.append({
            "name": name, "kind": spec.kind, "description": spec.entry.description,
            "irreversible": spec.entry.irreversible, "idempotent": spec.entry.idempotent,
            "timeout": spec.entry.timeout, "arguments": args,
            "blocking": spec.entry.blocking is not False,
            "command": spec.entry.command, "python": spec.entry.python,
        })
    return out


def json_schema(kind: str) -> dict[str, Any]:
    """The JSON Schema of the plan format (``plan``) or of ``tools.yaml`` (``tools``).

    Generated from the pydantic models, for editors (yaml-language-server, VS Code).

    Raises:
        UsageError: an unknown kind (exit 2).
    """
    from pydantic import BaseModel

    from .models import Plan, Registry

    models: dict[str, type[BaseModel]] = {"plan": Plan, "tools": Registry}
    if kind not in models:
        raise UsageError(f"unknown schema {kind!r}; use plan or tools")
    schema: dict[str, Any] = json.loads(
        json.dumps(models[kind].model_json_schema()).replace("``", "`"))
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = {"plan": "planrun plan", "tools": "planrun tools registry"}[kind]
    return schema


STARTER = {
    "planrun.toml": """\
# planrun settings. Every key is optional; the values below are the defaults.
# Help that comes with planrun: `planrun --help`, `planrun COMMAND --help`, and
# `planrun schema plan|tools` (the file formats, as JSON Schema for editors).
plans_dir = "plans"          # folder of plan files (NAME.yaml | NAME.yml | NAME.json)
registry = "tools.yaml"      # the tools plans may call, with their contracts
max_parallel = 4             # calls running at once
# max_steps = 500            # the most steps a plan may have (longer plans are refused)
# journal = "journal.sqlite3"  # default: one journal per user, in the user data folder;
#                              # this project's own file keeps its runs apart
#
# [pools]                    # at most N calls at once of steps/tools with `pool: NAME`
# slow_api = 2
#
# [policy]                   # what plans may do without a person (cron, CI)
# allowed_tools = ["say"]    # any other tool is refused (not_allowed)
# require_approval = []      # reversible tools that still need a person
# [[policy.grants]]          # a bounded, expiring permission; `planrun policy check` lints
# id = "nightly"
# tool = "say"
# arguments = {type = "object", properties = {text = {type = "string"}}}
# expires = 2030-01-01T00:00:00Z
# granted_by = "you@example.com"
""",
    "tools.yaml": """\
# The tools plans may call. Each has a contract: a JSON Schema of its arguments.
tools:
  say:
    description: Print a line of text
    command: ["echo", "{text}"]
    output: text
    idempotent: true
    timeout: 10
    arguments:
      type: object
      properties:
        text: {type: string}
      required: [text]
      additionalProperties: false
""",
    "plans/hello.yaml": """\
# yaml-language-server: $schema=../plan.schema.json
planrun: 1
goal: Say hello, then say who said it
params:
  who: {type: string, default: planrun, description: Who says hello}
steps:
  - id: hello
    tool: say
    arguments: {text: "hello"}
    intent: Greet
  - id: signature
    tool: say
    depends_on: [hello]
    arguments: {text: "{steps.hello.output}, from {params.who}"}
    intent: Sign the greeting with the first step's output
""",
}


def init_project(folder: Path) -> list[Path]:
    """Write a starter project into ``folder``; returns the files written.

    ``planrun.toml``, ``tools.yaml``, ``plans/hello.yaml`` and ``plan.schema.json`` (for
    editors).

    Raises:
        UsageError: a starter file already exists (nothing is written then; exit 2).
    """
    files = dict(STARTER)
    files["plan.schema.json"] = json.dumps(json_schema("plan"), indent=2) + "\n"
    targets = {folder / rel: text for rel, text in files.items()}
    from .paths import probe

    existing = [str(p) for p in targets if probe(p)]
    if existing:
        raise UsageError(f"refusing to overwrite {', '.join(existing)}",
                         hint="Run planrun init in an empty folder (or move those aside).")
    written = []
    for path, text in targets.items():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot write {path}: {exc.strerror}",
                             hint="Give planrun init a folder you can write.") from None
        written.append(path)
    return written
