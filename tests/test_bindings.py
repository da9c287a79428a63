"""Approvals and grants bind to what actually runs (SPEC §6, issue 9 §6).

Through the real ``planrun`` process:

- an approval decision is bound to the arguments *and* the tool as registered (contract,
  command argv or python target): a tool whose registration changed after a crash is
  asked about again on resume;
- grants are checked again on resume against the policy and clock of that moment;
- ``policy check`` warns (fails under ``--strict``) about a grant that clears an
  irreversible tool with no bound;
- an ``accepts`` model with Decimal, datetime, UUID and Enum fields validates from JSON
  the same way at validation and at call time;
- a ``when`` naming anything but ``params`` and ``steps`` is refused at validation, and a
  condition failing at run time gets a short message.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta

import pexpect
import pytest

from planrun_cli import CliProject, Result

MODULE = '''
from crashtools import _call


def wipe(**kwargs):
    return _call({"version": 1, **kwargs})


def wipe2(**kwargs):
    return _call({"version": 2, **kwargs})
'''

TOOLS = """
tools:
  once:
    python: crashtools:record
    arguments:
      type: object
      properties: {label: {type: string}}
      additionalProperties: false
  wipe:
    python: atools:wipe
    irreversible: true
    arguments:
      type: object
      properties: {label: {type: string}}
      additionalProperties: false
  pay:
    python: crashtools:record
    irreversible: true
    arguments:
      type: object
      properties: {label: {type: string}, amount: {type: number}}
      required: [amount]
      additionalProperties: false
  shred:
    command: [{PY}, crashtools.py, record]
    irreversible: true
    output: json
    arguments:
      type: object
      properties: {label: {type: string}}
      additionalProperties: false
"""

WIPE = """
planrun: 1
goal: Something ordinary, then something that cannot be undone
steps:
  - {id: a, tool: once, arguments: {label: a}}
  - {id: z, tool: wipe, depends_on: [a], arguments: {label: z}}
"""

SHRED = """
planrun: 1
goal: Something ordinary, then an irreversible command
steps:
  - {id: a, tool: once, arguments: {label: a}}
  - {id: z, tool: shred, depends_on: [a], arguments: {label: z}}
"""

PAY = """
planrun: 1
goal: Two payments
steps:
  - {id: a, tool: once, arguments: {label: a}}
  - {id: p1, tool: pay, depends_on: [a], arguments: {label: p1, amount: 60}}
  - {id: p2, tool: pay, depends_on: [p1], arguments: {label: p2, amount: 30}}
"""


@pytest.fixture
def proj(cli: CliProject) -> CliProject:
    cli.write("atools.py", MODULE)
    cli.tools(TOOLS)
    cli.plan("wipe", WIPE)
    cli.plan("shred", SHRED)
    cli.plan("pay", PAY)
    return cli


def last_run(proj: CliProject) -> str:
    return proj.probe().run_ids()[0]


def crash_after(proj: CliProject, plan: str, step: str, *extra: str) -> str:
    r = proj.run("execute", plan, *extra, crash=f"outcome:{step}")
    assert r.returncode == -9, r
    return last_run(proj)


def edit_tools(proj: CliProject, old: str, new: str) -> None:
    path = proj.root / "tools.yaml"
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


def asked_again(r: Result, step: str) -> None:
    assert r.returncode == 4, r
    assert "error[approval_required]" in r.stderr, r
    assert f"--approve {step}" in r.stderr
    assert "Traceback" not in r.stderr


# --- approvals bound to the tool as registered ----------------------------------------------


def test_a_changed_python_target_is_asked_about_again(proj: CliProject) -> None:
    run_id = crash_after(proj, "wipe", "a", "--approve", "z")
    edit_tools(proj, "python: atools:wipe\n", "python: atools:wipe2\n")

    r = proj.run("resume", run_id)
    asked_again(r, "z")
    assert proj.counts() == {"a": 1}  # the new code did not run on the old decision
    r = proj.run("resume", run_id, "--approve", "z", "--json")
    assert r.returncode == 0, r
    assert [c["output"]["args"]["version"] for c in proj.calls("z")] == [2]
    decisions = [(a.step_id, a.digest, a.method) for a in proj.probe().approvals(run_id)]
    assert [(s, m) for s, _, m in decisions] == [("z", "flag"), ("z", "flag")]
    assert decisions[0][1] != decisions[1][1]  # bound to different registrations


def test_an_unchanged_tool_reuses_the_decision(proj: CliProject) -> None:
    run_id = crash_after(proj, "wipe", "a", "--approve", "z")
    r = proj.run("resume", run_id, "--json")
    assert r.returncode == 0, r
    assert [c["output"]["args"]["version"] for c in proj.calls("z")] == [1]


def test_a_changed_contract_is_asked_about_again(proj: CliProject) -> None:
    run_id = crash_after(proj, "wipe", "a", "--approve", "z")
    text = (proj.root / "tools.yaml").read_text()
    head, _, tail = text.partition("  wipe:\n")
    tail = tail.replace("properties: {label: {type: string}}",
                        "properties: {label: {type: string}, force: {type: boolean}}", 1)
    (proj.root / "tools.yaml").write_text(f"{head}  wipe:\n{tail}")
    asked_again(proj.run("resume", run_id), "z")
    assert proj.counts() == {"a": 1}


def test_a_changed_command_is_asked_about_again(proj: CliProject) -> None:
    run_id = crash_after(proj, "shred", "a", "--approve", "z")
    edit_tools(proj, "crashtools.py, record]", "crashtools.py, record, --twice]")
    asked_again(proj.run("resume", run_id), "z")
    assert proj.counts() == {"a": 1}


def test_a_changed_irreversible_tool_is_asked_about_on_a_terminal_too(
        proj: CliProject) -> None:
    """On a terminal the person is asked again, and a no stops the resume."""
    run_id = crash_after(proj, "wipe", "a", "--approve", "z")
    edit_tools(proj, "python: atools:wipe\n", "python: atools:wipe2\n")
    child = pexpect.spawn(sys.executable, ["-m", "planrun", "resume", run_id],
                          cwd=str(proj.root), env=proj.env(), encoding="utf-8", timeout=30,
                          dimensions=(50, 200))
    child.expect(r"Approve z \(wipe\)\? \[y/N\]")
    child.sendline("n")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 4
    assert proj.counts() == {"a": 1}


# --- grants checked again on resume ------------------------------------------------------------


def grant(expires: datetime | None = None, *, extra: str = "",
          tool: str = "wipe") -> str:
    when = (expires or datetime.now(UTC) + timedelta(days=30)).isoformat()
    return (f'[[policy.grants]]\nid = "g1"\ntool = "{tool}"\nexpires = "{when}"\n'
            f'granted_by = "ops"\n{extra}')


BOUNDED = 'arguments = {type = "object", properties = {label = {enum = ["z"]}}}\n'


def test_a_grant_removed_after_a_crash_no_longer_clears(proj: CliProject) -> None:
    proj.write("planrun.toml", "[policy]\n" + grant(extra=BOUNDED))
    run_id = crash_after(proj, "wipe", "a")  # the grant cleared z, no --approve
    granted = [(a.method, a.decided_by) for a in proj.probe().approvals(run_id)]
    assert granted == [("grant", "g1")]
    proj.write("planrun.toml", "[policy]\n")

    asked_again(proj.run("resume", run_id), "z")
    assert proj.counts() == {"a": 1}


def test_a_grant_expired_since_the_crash_no_longer_clears(proj: CliProject) -> None:
    proj.write("planrun.toml", "[policy]\n" + grant(extra=BOUNDED))
    run_id = crash_after(proj, "wipe", "a")
    # the clock of the moment: it is now past the grant's expiry
    proj.write("planrun.toml", "[policy]\n" + grant(datetime.now(UTC) - timedelta(seconds=1),
                                                  extra=BOUNDED))
    r = proj.run("resume", run_id)
    asked_again(r, "z")
    assert proj.counts() == {"a": 1}
    log = proj.run("log", run_id, "--json").json
    escalated = [e for e in log if e["kind"] == "autonomy_escalated"]
    assert "expired" in escalated[-1]["data"]["why"]


def test_a_grant_narrowed_since_the_crash_no_longer_clears(proj: CliProject) -> None:
    proj.write("planrun.toml", "[policy]\n" + grant(extra=BOUNDED))
    run_id = crash_after(proj, "wipe", "a")
    narrowed = 'arguments = {type = "object", properties = {label = {enum = ["y"]}}}\n'
    proj.write("planrun.toml", "[policy]\n" + grant(extra=narrowed))
    asked_again(proj.run("resume", run_id), "z")
    assert proj.counts() == {"a": 1}


def test_a_lowered_max_total_counts_what_the_run_already_spent(proj: CliProject) -> None:
    total = 'max_total = 100\namount_field = "amount"\n'
    proj.write("planrun.toml", "[policy]\n" + grant(tool="pay", extra=total))
    run_id = crash_after(proj, "pay", "p1")  # p1 (60) ran; p2 (30) is left
    assert proj.counts() == {"a": 1, "p1": 1}
    proj.write("planrun.toml", "[policy]\n" + grant(
        tool="pay", extra='max_total = 80\namount_field = "amount"\n'))
    asked_again(proj.run("resume", run_id), "p2")  # 60 + 30 is over 80
    assert proj.counts() == {"a": 1, "p1": 1}
    proj.write("planrun.toml", "[policy]\n" + grant(tool="pay", extra=total))
    r = proj.run("resume", run_id, "--json")  # 90 is within 100 again
    assert r.returncode == 0, r
    assert proj.counts() == {"a": 1, "p1": 1, "p2": 1}


def test_a_grant_still_valid_clears_again_and_is_journaled_again(proj: CliProject) -> None:
    proj.write("planrun.toml", "[policy]\n" + grant(extra=BOUNDED))
    run_id = crash_after(proj, "wipe", "a")
    r = proj.run("resume", run_id, "--json")
    assert r.returncode == 0, r
    assert proj.counts() == {"a": 1, "z": 1}
    decisions = [(a.method, a.decided_by) for a in proj.probe().approvals(run_id)]
    assert decisions == [("grant", "g1"), ("grant", "g1")]


def test_a_persons_decision_is_not_a_grant_and_stands(proj: CliProject) -> None:
    """Only grant decisions are re-checked: a person's --approve stands (same digest)."""
    run_id = crash_after(proj, "wipe", "a", "--approve", "z")
    proj.write("planrun.toml", "[policy]\n" + grant(datetime.now(UTC) - timedelta(days=1)))
    r = proj.run("resume", run_id, "--json")
    assert r.returncode == 0, r
    assert proj.counts() == {"a": 1, "z": 1}


# --- policy check: grants with no bound ---------------------------------------------------------


def policy_check(proj: CliProject, toml: str, *args: str) -> Result:
    proj.write("planrun.toml", toml)
    return proj.run("policy", "check", *args)


def test_an_unbounded_grant_on_an_irreversible_tool_is_a_warning(proj: CliProject) -> None:
    toml = "[policy]\n" + grant(tool="pay")
    r = policy_check(proj, toml)
    assert r.returncode == 0, r
    assert "grant 'g1' clears irreversible tool(s) pay with no bound" in r.stdout, r
    strict = policy_check(proj, toml, "--strict")
    assert strict.returncode == 3, strict
    js = policy_check(proj, toml, "--strict", "--format", "json")
    assert js.returncode == 3
    [issue] = [i for i in js.json["issues"] if "no bound" in i["message"]]
    assert (issue["code"], issue["severity"]) == ("config", "warning")


def test_an_empty_arguments_schema_is_no_bound(proj: CliProject) -> None:
    toml = "[policy]\n" + grant(tool="pay", extra='arguments = {type = "object", '
                                 'required = ["amount"]}\n')
    r = policy_check(proj, toml, "--strict")
    assert r.returncode == 3, r
    assert "grant 'g1' clears irreversible tool(s) pay with no bound" in r.stdout, r


@pytest.mark.parametrize("extra", [
    'max_total = 500\namount_field = "amount"\n',
    'arguments = {type = "object", properties = {amount = {type = "number", '
    'maximum = 100}}}\n',
    'arguments = {type = "object", properties = {label = {enum = ["p1", "p2"]}}}\n',
])
def test_a_bounded_grant_passes_strict(proj: CliProject, extra: str) -> None:
    r = policy_check(proj, "[policy]\n" + grant(tool="pay", extra=extra), "--strict")
    assert "no bound" not in r.stdout, r
    assert "grant 'g1'" not in r.stdout, r  # (other irreversible tools have no grant)


def test_a_class_grant_covering_an_irreversible_tool_is_checked_too(
        proj: CliProject) -> None:
    toml = ('[policy.classes.money]\ntools = ["pay"]\nlevel = "act"\n'
            '[[policy.grants]]\nid = "g1"\nclass = "money"\n'
            f'expires = "{(datetime.now(UTC) + timedelta(days=3)).isoformat()}"\n'
            'granted_by = "ops"\n')
    r = policy_check(proj, toml, "--strict")
    assert r.returncode == 3, r
    assert "clears irreversible tool(s) pay with no bound" in r.stdout


def test_an_unbounded_grant_on_a_reversible_tool_is_fine(proj: CliProject) -> None:
    r = policy_check(proj, "[policy]\nrequire_approval = [\"once\"]\n" + grant(tool="once")
                     + grant(tool="pay", extra='max_total = 5\namount_field = "amount"\n'
                             ).replace('"g1"', '"g2"'), "--strict")
    assert "no bound" not in r.stdout, r


# --- accepts: pydantic models validated from JSON ------------------------------------------------

MODEL = '''
import datetime
import decimal
import enum
import uuid

from pydantic import BaseModel


class Colour(enum.Enum):
    red = "red"
    blue = "blue"


class Order(BaseModel):
    price: decimal.Decimal
    at: datetime.datetime
    ref: uuid.UUID
    colour: Colour
    count: int = 1


def book(price, at, ref, colour, count):
    assert isinstance(price, decimal.Decimal), type(price)
    assert isinstance(at, datetime.datetime), type(at)
    assert isinstance(ref, uuid.UUID), type(ref)
    assert isinstance(colour, Colour), type(colour)
    return {"price": str(price), "at": at.isoformat(), "ref": str(ref),
            "colour": colour.value, "count": count}


def source():
    return {"price": "19.99", "at": "2026-12-01T10:00:00+00:00",
            "ref": "12345678-1234-5678-1234-567812345678", "colour": "blue"}
'''

MODEL_TOOLS = """
tools:
  book:
    python: orders:book
    accepts: orders:Order
  source:
    python: orders:source
    arguments: {type: object, additionalProperties: false}
"""

STATIC = """
planrun: 1
goal: Book an order
steps:
  - id: b
    tool: book
    arguments:
      price: "12.50"
      at: "2026-12-01T10:00:00Z"
      ref: "12345678-1234-5678-1234-567812345678"
      colour: red
"""

RUNTIME = """
planrun: 1
goal: Book what a step found
steps:
  - {id: s, tool: source}
  - id: b
    tool: book
    depends_on: [s]
    arguments:
      price: "{steps.s.output.price}"
      at: "{steps.s.output.at}"
      ref: "{steps.s.output.ref}"
      colour: "{steps.s.output.colour}"
      count: 2
"""


@pytest.fixture
def orders(cli: CliProject) -> CliProject:
    cli.write("orders.py", MODEL)
    cli.tools(MODEL_TOOLS)
    cli.plan("static", STATIC)
    cli.plan("runtime", RUNTIME)
    return cli


def test_a_model_with_rich_types_validates_and_runs(orders: CliProject) -> None:
    v = orders.run("validate", "static", "--format", "json")
    assert v.returncode == 0, v
    r = orders.run("execute", "static", "--json")
    assert r.returncode == 0, r
    out = orders.run("output", r.json["run_id"], "b")
    assert out.json == {"price": "12.50", "at": "2026-12-01T10:00:00+00:00",
                        "ref": "12345678-1234-5678-1234-567812345678", "colour": "red",
                        "count": 1}


def test_a_model_with_rich_types_takes_run_time_arguments(orders: CliProject) -> None:
    r = orders.run("execute", "runtime", "--json")
    assert r.returncode == 0, r
    out = orders.run("output", r.json["run_id"], "b")
    assert out.json["price"] == "19.99"
    assert out.json["colour"] == "blue"
    assert out.json["count"] == 2


def test_a_number_is_a_decimal_too(orders: CliProject) -> None:
    orders.plan("num", STATIC.replace('price: "12.50"', "price: 12.5"))
    r = orders.run("execute", "num", "--json")
    assert r.returncode == 0, r


@pytest.mark.parametrize(("old", "new", "where"), [
    ('ref: "12345678-1234-5678-1234-567812345678"', 'ref: "not-a-uuid"', "/ref"),
    ("colour: red", "colour: green", "/colour"),
    ('at: "2026-12-01T10:00:00Z"', 'at: "yesterday"', "/at"),
    ('price: "12.50"', 'price: "twelve"', "/price"),
    ("colour: red", 'colour: red\n      count: "2"', "/count"),
])
def test_what_the_model_refuses_is_refused_at_validation(orders: CliProject, old: str,
                                                         new: str, where: str) -> None:
    orders.plan("bad", STATIC.replace(old, new))
    r = orders.run("validate", "bad", "--format", "json")
    assert r.returncode == 3, r
    issues = r.json["plans"][0]["issues"]
    assert {i["code"] for i in issues} == {"arguments"}, issues
    assert any(i["path"].endswith(where) for i in issues), issues
    x = orders.run("execute", "bad")
    assert x.returncode == 3, x
    assert orders.counts() == {}


def test_a_run_time_value_the_model_refuses_fails_the_step_with_arguments(
        orders: CliProject) -> None:
    orders.write("orders.py", MODEL.replace('"colour": "blue"', '"colour": "green"'))
    r = orders.run("execute", "runtime", "--json")
    assert r.returncode == 1, r
    b = next(s for s in r.json["steps"] if s["id"] == "b")
    assert b["error"]["code"] == "arguments"
    assert "Traceback" not in r.stderr


# --- when: params and steps only; short run-time messages ---------------------------------------

WHEN = """
planrun: 1
goal: A condition
steps:
  - {id: a, tool: once, arguments: {label: a}}
  - {id: b, tool: once, depends_on: [a], when: 'WHEN', arguments: {label: b}}
"""


@pytest.mark.parametrize(("when", "fragment"), [
    ('ctx.status == "ok"', "reads 'ctx'"),
    ('stpes.a.output.label == "a"', "reads 'stpes'"),
    ('steps.a.output.label == label', "reads 'label'"),
    ("lookup(1) == 1", "calls lookup()"),
    ('steps.a.output.args.label.all(c, c == other)', "reads 'other'"),
])
def test_a_when_naming_anything_else_is_refused_at_validation(
        proj: CliProject, when: str, fragment: str) -> None:
    proj.plan("w", WHEN.replace("WHEN", when))
    r = proj.run("validate", "w", "--format", "json")
    assert r.returncode == 3, r
    [issue] = r.json["plans"][0]["issues"]
    assert issue["code"] == "condition"
    assert issue["path"] == "/steps/1/when"
    assert fragment in issue["message"], issue
    x = proj.run("execute", "w")
    assert x.returncode == 3, x
    assert proj.counts() == {}


@pytest.mark.parametrize("when", [
    'steps.a.output.args.label == "a"',
    "has(steps.a.output.args) && size(steps.a.output.args) > 0",
    'steps.a.output.args.label.startsWith("a")',
    "[1, 2].all(n, n > 0) && [1].exists(m, m == 1)",
    "type(steps.a.output.args.label) == string",
    'int(1.0) == 1 && string(1) == "1"',
])
def test_conditions_over_params_and_steps_pass(proj: CliProject, when: str) -> None:
    proj.plan("w", WHEN.replace("WHEN", when))
    r = proj.run("execute", "w", "--json")
    assert r.returncode == 0, r
    assert proj.counts() == {"a": 1, "b": 1}


def test_a_condition_failing_at_run_time_has_a_short_message(proj: CliProject) -> None:
    proj.write("big.py", '''
        def big(**kwargs):
            return {"rows": ["row-%d-payload" % i for i in range(2000)], "n": 1}
    ''')
    proj.tools(TOOLS + """
  big:
    python: big:big
    arguments: {type: object}
""")
    for when in ("steps.a.output.rows", "steps.a.output.rows + 1 == 2",
                 "steps.a.output.nothing == 1"):
        proj.plan("w", f"""
            planrun: 1
            goal: A condition over a big output
            steps:
              - {{id: a, tool: big}}
              - {{id: b, tool: once, depends_on: [a], when: '{when}', arguments: {{label: b}}}}
        """)
        r = proj.run("execute", "w", "--json")
        assert r.returncode == 1, r
        b = next(s for s in r.json["steps"] if s["id"] == "b")
        assert b["error"]["code"] == "condition"
        assert len(b["error"]["message"]) <= 400, b["error"]["message"]
        assert "row-1-payload" not in b["error"]["message"]
        assert "row-1-payload" not in r.stderr


def test_json_and_dates_in_payloads_survive(orders: CliProject) -> None:
    """The output of a model tool is stored as JSON data."""
    r = orders.run("execute", "static", "--json")
    assert r.returncode == 0, r
    assert orders.probe().step("b", r.json["run_id"]).output["at"].startswith("2026-12-01")
