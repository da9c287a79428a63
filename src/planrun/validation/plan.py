"""What validation returns: a checked plan and its steps, and what it is given."""

from __future__ import annotations

import graphlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from .. import graph
from ..loading import Document
from ..registry import ToolSpec


class PlanLimits(Protocol):
    """The project settings a plan is checked against (``planrun.paths.Settings`` has them).

    Attributes:
        max_steps: the most steps a plan may have.
        pools: ``[pools]`` of ``planrun.toml``: pool name → limit.
    """

    @property
    def max_steps(self) -> int: ...  # noqa: D102

    @property
    def pools(self) -> Mapping[str, int]: ...  # noqa: D102


@dataclass(eq=False)
class CheckedStep:
    """A step that passed every check.

    Attributes:
        index: position in the plan file (0-based; breaks ties between ready steps).
        id: the step id.
        tool: the registry entry it calls.
        arguments: arguments with parameters substituted, in reference form
            (:mod:`planrun.redact`: a secret parameter's value is a reference, what is stored,
            keyed and shown; :func:`planrun.redact.reveal` gives the values to call with);
            strings still holding run-time references are :class:`~planrun.params.Template`.
        for_each: the fan-out source (a list, or a Template) or None, in reference form.
        depends_on: ids this step waits on.
        raw: the step mapping as written.
        approval_reason: why the step needs a person (``irreversible`` …) or None.
    """

    index: int
    id: str
    tool: ToolSpec
    arguments: dict[str, Any]
    for_each: Any
    depends_on: list[str]
    raw: dict[str, Any]
    approval_reason: str | None = None
    #: arguments hold no run-time placeholder: fully known and checked at validation.
    static: bool = False

    @property
    def intent(self) -> str | None:
        """The step's ``intent`` (for people)."""
        value = self.raw.get("intent")
        return value if isinstance(value, str) else None

    @property
    def when(self) -> str | None:
        """The step's CEL condition, if any."""
        value = self.raw.get("when")
        return value if isinstance(value, str) else None

    @property
    def run_if(self) -> str:
        """``success`` (default) | ``failure`` | ``always``: which ancestors' outcome runs it."""
        value = self.raw.get("run_if")
        return value if isinstance(value, str) else "success"

    @property
    def approve_resolved(self) -> bool:
        """The step (or its tool) has ``approve: resolved``: cleared at dispatch."""
        return self.raw.get("approve") == "resolved" or self.tool.entry.approve == "resolved"

    @property
    def deferred_approval(self) -> bool:
        """Cleared at dispatch with its resolved arguments, not before the run.

        The step needs clearance, has ``approve: resolved`` (or its tool has), its
        arguments hold a run-time placeholder, it does not fan out and it is not a
        clean-up step (``run_if: failure | always``): such steps with a tool's ``approve:
        resolved`` are cleared before the run as usual.
        """
        return (bool(self.approval_reason) and self.approve_resolved and not self.static
                and self.for_each is None and self.run_if == "success")

    @property
    def timeout(self) -> float | None:
        """Seconds per call: the step's ``timeout``, else the tool's, else None."""
        value = self.raw.get("timeout")
        return float(value) if value is not None else self.tool.entry.timeout

    @property
    def retries(self) -> dict[str, Any]:
        """The effective retry policy: the step's ``retries`` over the tool's."""
        out = {"max_attempts": 1, "backoff_s": 0.0, "on_exit_codes": None}
        if self.tool.entry.retries is not None:
            out.update(self.tool.entry.retries.model_dump())
        if isinstance(self.raw.get("retries"), dict):
            out.update(self.raw["retries"])
        return out


@dataclass(eq=False)
class CheckedPlan:
    """A plan that passed validation, with parameters substituted.

    Attributes:
        file: the plan file as shown to users.
        name: the plan name (``name:`` or the file stem).
        revision: the plan's revision.
        goal: the plan's goal.
        document: the plan as written (JSON data; what the journal stores), a secret
            parameter's ``default`` replaced by a reference (:func:`planrun.redact.stored_plan`).
        digest: SHA-256 of the canonical JSON of ``document``.
        params: parameter values, defaults applied (secret ones too: never store these).
        secret_params: names of parameters marked ``secret: true``.
        steps: the steps, in the order written.
        deps: step id → ids it depends on.
        max_parallel: the plan's ``max_parallel`` or None.
        timeout: the plan's whole-run ``timeout`` in seconds, or None.
    """

    file: str
    name: str
    revision: int
    goal: str
    document: dict[str, Any]
    digest: str
    params: dict[str, Any]
    secret_params: set[str]
    steps: list[CheckedStep]
    deps: dict[str, list[str]]
    max_parallel: int | None = None
    timeout: float | None = None
    #: the policy it was checked against (``planrun.policy.Policy``), if any.
    policy: Any = None
    by_id: dict[str, CheckedStep] = field(default_factory=dict)
    #: The dependency graph's prepared sorter that validation built to find cycles, until
    #: a run takes it (:meth:`take_sorter`); not copied by ``dataclasses.replace``.
    _sorter: graphlib.TopologicalSorter[str] | None = field(
        default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.by_id = {s.id: s for s in self.steps}

    def give_sorter(self, sorter: graphlib.TopologicalSorter[str]) -> None:
        """Keep ``sorter`` (prepared, nothing taken from it, over exactly :attr:`deps`)."""
        self._sorter = sorter

    def take_sorter(self) -> graphlib.TopologicalSorter[str]:
        """A prepared :class:`graphlib.TopologicalSorter` of :attr:`deps` for one run.

        The one validation built, the first time (building it is linear in the plan's
        steps and edges: a 10,000-step plan's resume built it twice); a new one after
        that, since a run's scheduler uses its sorter up.

        Raises:
            graphlib.CycleError: the steps wait on each other (a plan that did not pass).
        """
        sorter, self._sorter = self._sorter, None
        if sorter is None:
            sorter = graphlib.TopologicalSorter(self.deps)
            sorter.prepare()
        return sorter

    def order(self) -> list[str]:
        """Step ids in one-at-a-time dispatch order."""
        return graph.run_order([s.id for s in self.steps], self.deps)


@dataclass(eq=False)
class ParamInput:
    """Parameter values as given.

    ``-p`` texts (parsed by declared type), a params file (native values), and environment
    values (``PLANRUN_PARAM_<NAME>``, texts).
    """

    cli: dict[str, str] = field(default_factory=dict)
    file_values: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def given(self) -> bool:
        """True when any value was given on the command line or in a file."""
        return bool(self.cli or self.file_values)


def plan_name(path: Path, doc: Document) -> str:
    """The plan's ``name`` field, else the file stem."""
    data = doc.data
    if isinstance(data, dict) and isinstance(data.get("name"), str):
        return str(data["name"])
    return path.stem
