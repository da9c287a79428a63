"""The operator's policy: allowlist, approval ladder, grants (SPEC §6).

``[policy]`` in ``planrun.toml``::

    allowed_tools = ["archive_dir", "prune_backups"]   # others: not_allowed
    require_approval = ["send_mail"]                     # a person even if reversible
    [policy.classes.money]
    tools = ["pay_invoice"]
    level = "act"            # act: a matching grant clears it, else escalate
                             # escalate: a person (or --approve) must clear it
                             # refuse: validation refuses the plan (code refused)
    [[policy.grants]]
    id = "nightly-payments"
    class = "money"          # or tool = "pay_invoice"
    arguments = {type = "object", properties = {amount = {type = "number", maximum = 100}}}
    expires = 2026-12-31T00:00:00Z
    granted_by = "ops@example.com"
    max_total = 500          # optional, with amount_field: the sum of that argument over
    amount_field = "amount"  # every covered step (fan-out items too) of one run

Autonomy only adds gates: nothing lets an irreversible step run without a person, a flag
or a grant. A grant clears a step only when it names the step's tool (or its class), has
not expired, the step's arguments (every fan-out item's too) are known before the run and
satisfy its ``arguments`` schema, and the run's total stays within ``max_total``. Steps of
an ``escalate`` class are never cleared by a grant.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from .issues import Issue, did_you_mean

LEVELS = ("act", "escalate", "refuse")
_POLICY_KEYS = {"allowed_tools", "require_approval", "classes", "grants"}
_GRANT_KEYS = {"id", "tool", "class", "arguments", "expires", "granted_by", "max_total",
               "amount_field"}


@dataclass(frozen=True)
class Grant:
    """A bounded, expiring permission to act without a person (SPEC §6).

    Attributes:
        id: the grant's name (recorded as ``decided_by``).
        tool: the tool it covers, or None when it names a class.
        cls: the class it covers, or None.
        arguments: JSON Schema the step's arguments must satisfy, or None (any).
        expires: when it stops clearing steps (aware datetime, UTC).
        granted_by: who granted it.
        max_total: the most the run's covered steps may add up to, or None.
        amount_field: the argument summed for ``max_total``.
    """

    id: str
    tool: str | None
    cls: str | None
    arguments: dict[str, Any] | None
    expires: datetime
    granted_by: str
    max_total: float | None = None
    amount_field: str | None = None

    def expired(self, at: datetime | None = None) -> bool:
        """True when ``at`` (default: now) is past :attr:`expires`."""
        return (at or datetime.now(UTC)) >= self.expires


@dataclass
class Policy:
    """The parsed ``[policy]`` table."""

    allowed_tools: set[str] | None = None
    require_approval: set[str] = field(default_factory=set)
    classes: dict[str, tuple[set[str], str]] = field(default_factory=dict)
    grants: list[Grant] = field(default_factory=list)

    def class_of(self, tool: str) -> tuple[str, str] | None:
        """(class name, level) of the class listing ``tool``, or None."""
        for name, (tools, level) in self.classes.items():
            if tool in tools:
                return name, level
        return None

    def allows(self, tool: str) -> bool:
        """True when a plan may use ``tool``.

        That is: in ``allowed_tools`` (when set) and in no class the policy refuses outright
        (a step of it would be ``not_allowed`` or ``refused``).
        """
        if self.allowed_tools is not None and tool not in self.allowed_tools:
            return False
        cls = self.class_of(tool)
        return cls is None or cls[1] != "refuse"

    def clearance(self, tool: str, irreversible: bool) -> str | None:
        """Why a step of ``tool`` needs clearing, or None when it does not.

        One of ``irreversible``, ``policy`` (require_approval), ``act``, ``escalate``.
        """
        cls = self.class_of(tool)
        if cls is not None and cls[1] == "escalate":
            return "escalate"
        if irreversible:
            return "irreversible"
        if tool in self.require_approval:
            return "policy"
        if cls is not None and cls[1] == "act":
            return "act"
        return None


def _parse_time(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value if value.tzinfo is not None else None
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
        return parsed if parsed.tzinfo is not None else None
    return None


def load_policy(raw: dict[str, Any], tools: set[str], file: str | None
                ) -> tuple[Policy, list[Issue]]:
    """Parse and check ``[policy]`` against the registered tools.

    Every problem is a ``config`` issue (exit 3): unknown keys, an entry naming a tool the
    registry does not have (a typo there would silently drop a gate), a bad level, a grant
    without ``expires`` (or one without an offset), a grant naming an unknown tool/class.
    """
    issues: list[Issue] = []

    def bad(message: str) -> None:
        issues.append(Issue(code="config", message=f"[policy] {message}", file=file))

    policy = Policy()
    for key in sorted(set(raw) - _POLICY_KEYS):
        bad(f"unknown key {key!r} (known: {', '.join(sorted(_POLICY_KEYS))})."
            + did_you_mean(key, _POLICY_KEYS))
    if "allowed_tools" in raw:
        policy.allowed_tools = _tool_list("allowed_tools", raw["allowed_tools"], tools, bad)
    if "require_approval" in raw:
        policy.require_approval = _tool_list("require_approval", raw["require_approval"],
                                             tools, bad)
    _read_classes(raw.get("classes", {}), tools, policy, bad)
    grants = raw.get("grants", [])
    if not isinstance(grants, list):
        bad("grants must be an array of tables ([[policy.grants]])")
        grants = []
    ids: set[str] = set()
    for n, g in enumerate(grants):
        grant = _read_grant(f"grants[{n}]", g, tools, policy, ids, bad)
        if grant is not None:
            policy.grants.append(grant)
    return policy, issues


def _tool_list(key: str, value: Any, tools: set[str], bad: Callable[[str], None]) -> set[str]:
    """A list of registered tool names (each name the registry lacks is reported)."""
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        bad(f"{key} must be a list of tool names")
        return set()
    for t in value:
        if t not in tools:
            bad(f"{key} names {t!r}, which is not a registered tool")
    return set(value)


def _read_classes(classes: Any, tools: set[str], policy: Policy,
                  bad: Callable[[str], None]) -> None:
    """``[policy.classes.NAME]`` into ``policy.classes``: a tool may be in one class only."""
    if not isinstance(classes, dict):
        bad("classes must be a table of [policy.classes.NAME]")
        return
    seen: dict[str, str] = {}
    for name, spec in classes.items():
        if not isinstance(spec, dict) or set(spec) - {"tools", "level"}:
            bad(f"classes.{name} takes tools = [...] and level = act|escalate|refuse")
            continue
        level = spec.get("level")
        if level not in LEVELS:
            bad(f"classes.{name}.level must be one of act, escalate, refuse (not {level!r})")
            continue
        members = _tool_list(f"classes.{name}.tools", spec.get("tools", []), tools, bad)
        for t in members:
            if t in seen:
                bad(f"tool {t!r} is in two classes ({seen[t]} and {name})")
            seen[t] = name
        policy.classes[name] = (members, str(level))


def _read_grant(where: str, g: Any, tools: set[str], policy: Policy, ids: set[str],
                bad: Callable[[str], None]) -> Grant | None:
    """One ``[[policy.grants]]`` table, or None when it cannot be used (reported)."""
    if not isinstance(g, dict):
        bad(f"{where} must be a table")
        return None
    for key in sorted(set(g) - _GRANT_KEYS):
        bad(f"{where}: unknown key {key!r}." + did_you_mean(key, _GRANT_KEYS))
    gid = g.get("id")
    if not isinstance(gid, str) or not gid:
        bad(f"{where} needs an id")
        return None
    if gid in ids:
        bad(f"grant id {gid!r} is used twice")
    ids.add(gid)
    tool, cls = g.get("tool"), g.get("class")
    if (tool is None) == (cls is None):
        bad(f"grant {gid!r} names exactly one of tool or class")
        return None
    if tool is not None and tool not in tools:
        bad(f"grant {gid!r} names tool {tool!r}, which is not registered")
    if cls is not None and cls not in policy.classes:
        bad(f"grant {gid!r} names class {cls!r}, which [policy.classes] does not define")
    expires = _parse_time(g.get("expires"))
    if expires is None:
        bad(f"grant {gid!r} needs expires: a date-time with an offset "
            "(TOML 2026-12-31T00:00:00Z or an RFC 3339 string)")
        return None
    schema = g.get("arguments")
    if schema is not None:
        from .registry import schema_problems

        for _ptr, msg in schema_problems(schema):
            bad(f"grant {gid!r} arguments: {msg}")
    max_total, amount = g.get("max_total"), g.get("amount_field")
    if (max_total is None) != (amount is None):
        bad(f"grant {gid!r}: max_total and amount_field go together")
    if max_total is not None and (isinstance(max_total, bool)
                                  or not isinstance(max_total, int | float)
                                  or abs(max_total) > 2**63 - 1):
        bad(f"grant {gid!r}: max_total must be a number of at most 2^63-1")
        max_total = None
    granted_by = g.get("granted_by")
    if not isinstance(granted_by, str) or not granted_by:
        bad(f"grant {gid!r} needs granted_by (who granted it)")
        return None
    return Grant(
        id=gid, tool=tool, cls=cls, arguments=schema, expires=expires.astimezone(UTC),
        granted_by=granted_by,
        max_total=float(max_total) if isinstance(max_total, int | float) else None,
        amount_field=amount if isinstance(amount, str) else None)


@dataclass(frozen=True)
class Covered:
    """What a grant would cover in one step: its (per-item) argument objects.

    ``calls`` is None when some argument is only known at run time.
    """

    step_id: str
    tool: str
    calls: list[dict[str, Any]] | None


#: How :func:`grant_for` says a grant could not check what it bounds (the arguments are
#: known only when the step is reached): the fix is to make them known, not other values.
UNCHECKABLE = ("cannot check arguments only known at run time", "is not known before the run")


def grant_for(policy: Policy, covered: list[Covered], step_id: str,
              at: datetime | None = None) -> tuple[Grant | None, str]:
    """The grant that clears ``step_id``, or (None, why none does).

    ``covered`` lists every step of the run that needs clearing (for ``max_total``, which
    sums over all steps a grant covers).
    """
    from .registry import strict_validator

    target = next(c for c in covered if c.step_id == step_id)
    cls = policy.class_of(target.tool)
    reasons: list[str] = []
    for g in policy.grants:
        if not (g.tool == target.tool or (cls is not None and g.cls == cls[0])):
            continue
        if g.expired(at):
            reasons.append(f"grant {g.id!r} expired at {g.expires.isoformat()}")
            continue
        if target.calls is None:
            reasons.append(f"grant {g.id!r} {UNCHECKABLE[0]}")
            continue
        if g.arguments is not None:
            validator = strict_validator(g.arguments)
            errors = [e.message for call in target.calls
                      for e in validator.iter_errors(call)]
            if errors:
                reasons.append(f"arguments leave grant {g.id!r}: {errors[0]}")
                continue
        if g.max_total is not None and g.amount_field is not None:
            total = 0.0
            unknown = False
            for c in covered:
                c_cls = policy.class_of(c.tool)
                if not (g.tool == c.tool or (c_cls is not None and g.cls == c_cls[0])):
                    continue
                for call in c.calls or [{}]:
                    amount = call.get(g.amount_field)
                    if c.calls is None or isinstance(amount, bool) or not isinstance(
                            amount, int | float):
                        unknown = True
                    else:
                        total += float(amount)
            if unknown:
                reasons.append(f"grant {g.id!r}: the run's total of {g.amount_field!r} "
                               f"{UNCHECKABLE[1]}")
                continue
            if total > g.max_total:
                reasons.append(f"grant {g.id!r}: the run's total {g.amount_field} {total:g} "
                               f"is over max_total {g.max_total:g}")
                continue
        return g, f"grant {g.id!r} (granted by {g.granted_by})"
    return None, "; ".join(reasons) or "no grant covers this tool"


#: JSON Schema keywords that bound a value (a range, a length, a fixed set, a form): a
#: grant whose ``arguments`` schema uses none of them anywhere puts no limit on what it
#: clears. ``type``, ``required`` and ``additionalProperties`` alone bound nothing.
BOUNDING_KEYWORDS = frozenset({"maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",
                               "maxLength", "maxItems", "maxProperties", "enum", "const",
                               "pattern"})


def bounds_arguments(schema: Any) -> bool:
    """True when a grant's ``arguments`` schema bounds some argument value.

    That is, when a keyword of :data:`BOUNDING_KEYWORDS` appears anywhere in it (under
    ``properties``, ``items``, ``allOf`` …). ``false`` (nothing matches) bounds too.
    """
    if schema is False:
        return True
    if isinstance(schema, dict):
        if BOUNDING_KEYWORDS & set(schema):
            return True
        return any(bounds_arguments(v) for k, v in schema.items()
                   if k not in ("description", "title", "examples", "default"))
    if isinstance(schema, list):
        return any(bounds_arguments(v) for v in schema)
    return False


def lint(policy: Policy, registry_tools: dict[str, bool], file: str | None) -> list[Issue]:
    """Warnings about a policy that parses.

    Classes without tools, expired grants, irreversible tools that nothing can clear
    unattended, and grants that clear an irreversible tool without any bound (no
    ``max_total`` and no bounding keyword in ``arguments``, see :func:`bounds_arguments`):
    such a grant clears any amount, however large. ``registry_tools`` maps each tool name
    to whether it is irreversible. ``planrun policy check --strict`` fails on any warning.
    """
    out: list[Issue] = []

    def warn(message: str) -> None:
        out.append(Issue(code="config", severity="warning", message=f"[policy] {message}",
                         file=file))

    for name, (tools, _level) in policy.classes.items():
        if not tools:
            warn(f"class {name!r} lists no tools")
    for g in policy.grants:
        if g.expired():
            warn(f"grant {g.id!r} expired at {g.expires.isoformat()}; it clears nothing")
            continue
        if g.max_total is not None or bounds_arguments(g.arguments):
            continue
        members = ({g.tool} if g.tool is not None else
                   policy.classes.get(g.cls or "", (set(), ""))[0])
        unbounded = sorted(t for t in members if registry_tools.get(t))
        if unbounded:
            warn(f"grant {g.id!r} clears irreversible tool(s) {', '.join(unbounded)} with no "
                 "bound: give it max_total (with amount_field) or an arguments schema that "
                 "limits the values (maximum, maxLength, enum …)")
    for tool, irreversible in sorted(registry_tools.items()):
        if not irreversible:
            continue
        if policy.allowed_tools is not None and tool not in policy.allowed_tools:
            continue
        cls = policy.class_of(tool)
        if cls is not None and cls[1] == "refuse":
            continue
        live = [g for g in policy.grants if not g.expired() and (
            g.tool == tool or (cls is not None and cls[1] != "escalate" and g.cls == cls[0]))]
        if not live:
            warn(f"irreversible tool {tool!r} has no live grant: an unattended run (cron, "
                 "CI) using it stops with exit 4 unless given --approve")
    return out
