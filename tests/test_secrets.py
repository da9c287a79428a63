"""Secrets (SPEC §7, issue 9 §1): references in stored data, masks only in printed text.

The acceptance test greps every byte planrun writes — the journal and its WAL, stdout,
stderr with ``-v``, every read command, the environment a command tool sees — for a
secret and its base64/hex/JSON-escaped/repr forms (secrets of 1, 4 and 40 characters), and
shows that resume, retry and replay give later steps exactly what a clean run gives.
Every other test is an example of the issue or a sibling of one. Real processes, real
SQLite files, real SIGKILL (the ``PLANRUN_TEST_CRASH`` seam).
"""

from __future__ import annotations

import base64
import html
import json
import os
import re
import shutil
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness import run_planrun
from planrun import masking, redact
from planrun.canonical import digest
from planrun.params import ResolveError

MODULE = '''
import json, logging, os, subprocess, sys

_log = logging.getLogger("stools")
_log.addHandler(logging.StreamHandler())  # holds the sys.stderr of import time
_log.setLevel(logging.INFO)
_log.propagate = False


def src(token):
    print("stdout says " + str(token))
    text = str(token)
    sys.stderr.write("stderr says " + text[:2])  # a secret written in two pieces
    sys.stderr.write(text[2:] + "\\n")
    sys.stderr.flush()
    _log.info("logging says %s", text)
    os.write(2, ("fd says " + text + "\\n").encode())
    subprocess.run(["sh", "-c", 'printf "child says %s\\\\n" "$1" >&2', "sh", text])
    return {"word": token, "n": 42, "list": [token, "plain"],
            "quoted": json.dumps({"t": token}, ensure_ascii=False),
            "ascii": json.dumps({"t": token}), "banana": "banana", "status": "ok"}


def same(value):
    return value


def numbers(pin):
    return {"float": float(pin), "text": str(pin), "other": pin + 1}


def boom(token):
    raise RuntimeError("cannot log in with %r" % (token,))


def environ():
    return sorted(k for k in os.environ if k.startswith("PLANRUN_PARAM"))
'''

TOOLS = """
tools:
  src:
    python: stools:src
    arguments: {type: object, properties: {token: {}}, required: [token],
                additionalProperties: false}
  same:
    python: stools:same
    idempotent: true
    arguments: {type: object, properties: {value: {}}, required: [value],
                additionalProperties: false}
  keep:
    command: ["sh", "-c", 'cat > "$1.in"; env > "$1.env"; cat "$1.in"', "sh", "{name}"]
    output: json
    idempotent: true
    arguments: {type: object, properties: {name: {type: string}, value: {}},
                required: [name], additionalProperties: false}
  short:
    command: ["sh", "-c", 'cat > "$1.in"', "sh", "{name}"]
    output: none
    arguments: {type: object, properties: {name: {type: string},
                value: {type: string, maxLength: 3}},
                required: [name], additionalProperties: false}
  fail:
    command: ["sh", "-c",
              'printf "%s|" "$1" >> fail.arg; printf "failing with %s\\\\n" "$1" >&2; exit 3',
              "sh", "{value}"]
    output: none
    arguments: {type: object, properties: {value: {type: string}}, required: [value],
                additionalProperties: false}
  numbers:
    python: stools:numbers
    arguments: {type: object, properties: {pin: {type: integer}}, required: [pin],
                additionalProperties: false}
  boom:
    python: stools:boom
    arguments: {type: object, properties: {token: {}}, required: [token],
                additionalProperties: false}
  environ:
    python: stools:environ
    arguments: {type: object, additionalProperties: false}
"""

ACCEPTANCE = """
planrun: 1
goal: Carry a secret through every path planrun has
params:
  token: {type: string, secret: true}
steps:
  - id: a
    tool: src
    arguments: {token: "{params.token}"}
  - id: b
    tool: keep
    depends_on: [a]
    arguments:
      name: b
      value: {word: "{steps.a.output.word}", n: "{steps.a.output.n}",
              q: "{steps.a.output.quoted}", asc: "{steps.a.output.ascii}",
              text: "x-{params.token}-y"}
  - id: fan
    tool: keep
    depends_on: [a]
    for_each: "{steps.a.output.list}"
    arguments: {name: "fan{index}", value: "{item}"}
  - id: check
    tool: keep
    depends_on: [b]
    when: 'steps.b.output.value.word == params.token'
    arguments: {name: check, value: "{steps.b.output.value.text}"}
  - id: env
    tool: environ
  - id: badwhen
    tool: keep
    depends_on: [a]
    when: 'steps.a.output.word'
    arguments: {name: badwhen}
  - id: boom
    tool: boom
    depends_on: [check]
    arguments: {token: "{params.token}"}
  - id: fail
    tool: fail
    depends_on: [check]
    arguments: {value: "{steps.a.output.word}"}
"""


class Proj:
    """A project folder driven through the real planrun process."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "plans").mkdir(parents=True)
        (root / "stools.py").write_text(MODULE)
        (root / "tools.yaml").write_text(TOOLS)
        self.journal = root / "journal.sqlite3"
        self.texts: list[tuple[str, bytes]] = []

    def plan(self, name: str, text: str) -> None:
        (self.root / "plans" / f"{name}.yaml").write_text(text)

    def run(self, *args: str, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
        full = dict(os.environ, PLANRUN_JOURNAL=str(self.journal), **(env or {}))
        res = run_planrun(*args, cwd=self.root, env=full, timeout=120)
        what = " ".join(args)
        self.texts += [(f"stdout of {what}", res.stdout.encode()),
                       (f"stderr of {what}", res.stderr.encode())]
        return res

    def journal_files(self, when: str) -> None:
        for p in sorted(self.root.iterdir()):
            if p.name.startswith("journal.sqlite3"):
                self.texts.append((f"{p.name} {when}", p.read_bytes()))

    def db(self, sql: str, *args: Any) -> list[Any]:
        with sqlite3.connect(self.journal) as conn:
            return conn.execute(sql, args).fetchall()

    def read(self, name: str) -> Any:
        return json.loads((self.root / name).read_text())


@pytest.fixture
def proj(tmp_path: Path) -> Proj:
    return Proj(tmp_path / "p")


def spellings(secret: str) -> set[bytes]:
    """Every spelling of ``secret`` the acceptance test looks for."""
    raw = secret.encode()
    forms = {secret, json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1],
             repr(secret)[1:-1], raw.hex(), raw.hex().upper(),
             base64.b64encode(raw).decode().rstrip("="),
             base64.urlsafe_b64encode(raw).decode().rstrip("=")}
    return {f.encode() for f in forms}


def assert_nowhere(secret: str, texts: list[tuple[str, bytes]]) -> None:
    found = [(what, form) for what, blob in texts for form in spellings(secret)
             if form in blob]
    assert not found, found


# 1, 4 and 40 characters; the long one has a quote, a backslash and non-ASCII so that its
# JSON and repr spellings differ from it. Letters no id, digest or word of planrun has.
SECRETS = ["\U0001f511", "pQ7z", 'Zq"\\wörd-' + "kXjY" * 7 + "-Zz"]


@pytest.mark.slow
@pytest.mark.parametrize("secret", SECRETS, ids=["len1", "len4", "len40"])
def test_no_byte_planrun_writes_holds_the_secret(tmp_path: Path, secret: str) -> None:
    """The acceptance test of issue 9 §1."""
    assert len(secret) in (1, 4, 40)
    # a clean run, for what later steps must get
    clean = Proj(tmp_path / "clean")
    clean.plan("acc", ACCEPTANCE)
    res = clean.run("execute", "acc", "-p", f"token={secret}", "--keep-going", "-v")
    assert res.returncode == 1, res.stderr
    proj = Proj(tmp_path / "p")
    proj.plan("acc", ACCEPTANCE)
    res = proj.run("execute", "acc", "-p", f"token={secret}", "--keep-going", "-v",
                   env={"PLANRUN_TEST_CRASH": "dispatch:b"})
    assert res.returncode == -9
    proj.journal_files("after a crash")
    assert any(w.startswith("journal.sqlite3-wal") for w, _ in proj.texts)
    (run_id,), = proj.db("SELECT run_id FROM runs")
    for extra in ([], ["--json"], ["-p", f"token={secret}"]):
        assert proj.run("resume", "--explain", run_id, *extra, "-v").returncode == 0
    res = proj.run("resume", run_id, "-v", env={"PLANRUN_PARAM_token": secret})
    assert res.returncode == 1, res.stderr
    # replay and resume gave b, the fan-out and check exactly what a clean run gave them
    for name in ("b.in", "fan0.in", "fan1.in", "check.in"):
        assert proj.read(name) == clean.read(name), name
    assert proj.read("b.in")["value"]["word"] == secret
    assert proj.read("check.in")["value"] == f"x-{secret}-y"
    # the environment of a command: no PLANRUN_PARAM_*, no secret
    for name in ("b.env", "fan0.env", "check.env"):
        env_text = (proj.root / name).read_bytes()
        assert b"PLANRUN_PARAM_" not in env_text
        proj.texts.append((name, env_text))
    # retry: the failed steps again, with the real value and the same keys
    res = proj.run("retry", run_id, "-v", "--keep-going",
                   env={"PLANRUN_PARAM_token": secret})
    assert res.returncode == 1, res.stderr
    assert (proj.root / "fail.arg").read_text() == f"{secret}|{secret}|"
    child = next(r for (r,) in proj.db("SELECT run_id FROM runs") if r != run_id)
    keys = {(r, s): k for r, s, k in proj.db(
        "SELECT run_id, step_id, idempotency_key FROM steps WHERE step_id = 'fail'")}
    assert keys[(run_id, "fail")] == keys[(child, "fail")] is not None
    for ref in (run_id, child):
        for cmd in (["status", ref], ["status", ref, "--json"], ["log", ref],
                    ["log", ref, "--tracebacks"], ["log", ref, "--json", "--tracebacks"],
                    ["output", ref, "a"], ["output", ref, "b"], ["output", ref, "fan"],
                    ["output", ref, "fan", "--item", "0"], ["output", ref, "env"]):
            assert proj.run(*cmd, "-v").returncode in (0, 2, 5), cmd  # an inherited
            # fan-out step of the child run has no items of its own (unknown_step, 2)
        # issue 18: the report page, as written and as a browser reads it (unescaped)
        page = proj.run("report", ref, "-o", "-", "-v")
        assert page.returncode == 0, page.stderr
        assert "***" in page.stdout
        proj.texts.append((f"report of {ref}, HTML unescaped",
                           html.unescape(page.stdout).encode()))
    for cmd in (["runs"], ["runs", "--json"], ["validate", "acc", "-p", f"token={secret}"],
                ["show", "acc", "-p", f"token={secret}"],
                ["execute", "acc", "--dry-run", "-p", f"token={secret}"]):
        assert proj.run(*cmd, "-v").returncode == 0, cmd
    proj.journal_files("at the end")
    assert_nowhere(secret, proj.texts)
    # what was printed where a secret was: masks, and planrun's own words intact
    shown = b"".join(b for w, b in proj.texts if w.startswith("stderr of execute"))
    for line in (b"stdout says ***", b"stderr says ***", b"logging says ***",
                 b"fd says ***", b"child says ***"):
        assert line in shown, line
    status = json.loads(proj.run("status", run_id, "--json").stdout)
    assert status["params"] == {"token": "***"}
    errors = {s["id"]: s["error"] for s in status["steps"] if s["error"]}
    assert errors["fail"]["message"].startswith("sh exited with status 3: failing with ***")
    assert errors["boom"]["message"] == "RuntimeError: cannot log in with '***'"
    assert errors["badwhen"]["code"] == "condition"
    # a condition's run-time message names what it read, never the values (SPEC §5)
    assert "word" in errors["badwhen"]["message"]
    assert json.loads(proj.run("output", run_id, "env").stdout) == []
    # the positive control: the tools did receive the secret
    received = (proj.root / "b.in").read_bytes() + (proj.root / "fail.arg").read_bytes()
    assert all(form in received for form in {secret.encode(), json.dumps(secret).encode()})


def test_resume_and_retry_feed_later_steps_the_real_value(proj: Proj) -> None:
    """The repro of issue 9 §1: an output holding a secret, a crash at ``dispatch:b``."""
    secret = "s3cret-Word"
    proj.plan("r", """
        planrun: 1
        goal: An output that holds the secret feeds step b
        params:
          token: {type: string, secret: true}
        steps:
          - id: a
            tool: same
            arguments: {value: {word: "{params.token}", n: 42}}
          - id: b
            tool: keep
            depends_on: [a]
            arguments: {name: b, value: {word: "{steps.a.output.word}"}}
          - id: c
            tool: fail
            depends_on: [b]
            arguments: {value: "{steps.b.output.value.word}"}
        """.replace("\n        ", "\n"))
    res = proj.run("execute", "r", "-p", f"token={secret}",
                   env={"PLANRUN_TEST_CRASH": "dispatch:b"})
    assert res.returncode == -9
    (a_out,), = proj.db("SELECT output_json FROM steps WHERE step_id = 'a'")
    assert json.loads(a_out) == {"word": redact.reference("token"), "n": 42}
    assert "***" not in a_out
    res = proj.run("resume", "-p", f"token={secret}")
    assert res.returncode == 1, res.stderr  # c fails on purpose
    assert proj.read("b.in") == {"name": "b", "value": {"word": secret}}
    assert (proj.root / "fail.arg").read_text() == f"{secret}|"
    (run_id,), = proj.db("SELECT run_id FROM runs")
    res = proj.run("retry", run_id, "-p", f"token={secret}")
    assert res.returncode == 1
    assert (proj.root / "fail.arg").read_text() == f"{secret}|{secret}|"
    keys = proj.db("SELECT DISTINCT idempotency_key FROM steps WHERE step_id = 'c'")
    assert len(keys) == 1  # the retry's key is the parent's
    # replay of an idempotency key: b again from a resumed crash after its outcome
    proj.plan("r2", (proj.root / "plans" / "r.yaml").read_text().replace("tool: fail",
                                                                        "tool: keep")
              .replace('arguments: {value: "{steps.b.output.value.word}"}',
                       'arguments: {name: c, value: "{steps.b.output.value.word}"}'))
    res = proj.run("execute", "r2", "-p", f"token={secret}",
                   env={"PLANRUN_TEST_CRASH": "outcome:b"})
    assert res.returncode == -9
    res = proj.run("resume", env={"PLANRUN_PARAM_token": secret})
    assert res.returncode == 0, res.stderr
    assert proj.read("c.in") == {"name": "c", "value": secret}


@pytest.mark.parametrize(("schema", "given", "value"), [
    ("{type: string, secret: true}", "a", "a"),
    ("{type: integer, secret: true}", "7", 7),
])
def test_a_one_character_secret_garbles_no_key_id_or_command(proj: Proj, schema: str,
                                                             given: str, value: Any) -> None:
    proj.plan("pin", f"""
        planrun: 1
        goal: A very short secret
        params:
          pin: {schema}
        steps:
          - id: a
            tool: src
            arguments: {{token: "{{params.pin}}"}}
          - id: b
            tool: keep
            depends_on: [a]
            arguments: {{name: b, value: "{{steps.a.output.word}}"}}
          - id: c
            tool: fail
            depends_on: [b]
            arguments: {{value: "x{{params.pin}}"}}
        """.replace("\n        ", "\n"))
    res = proj.run("execute", "pin", "-p", f"pin={given}", "--json",
                   env={"PLANRUN_TEST_CRASH": "dispatch:b"})
    assert res.returncode == -9
    res = proj.run("resume", "-p", f"pin={given}", "--json")
    assert res.returncode == 1, res.stderr
    assert proj.read("b.in") == {"name": "b", "value": value}  # the real value, its type
    m = json.loads(res.stdout)
    run_id = m["run_id"]
    assert set(m) >= {"run_id", "root_run_id", "plan", "goal", "status", "params", "steps",
                      "counts", "resumable", "next"}
    assert m["status"] == "failed"
    assert m["params"] == {"pin": "***"}
    assert m["next"] == f"planrun retry {run_id}"
    assert [s["id"] for s in m["steps"]] == ["a", "b", "c"]
    assert m["steps"][2]["error"]["message"].startswith("sh exited with status 3: ")
    quoted = '{"t": ***}' if value == 7 else '{"t": "***"}'
    assert json.loads(proj.run("output", run_id, "a").stdout) == {
        "word": "***", "n": 42, "list": ["***", "pl***in" if value == "a" else "plain"],
        "quoted": quoted, "ascii": quoted,
        "banana": "b***n***n***" if value == "a" else "banana", "status": "ok"}
    text = proj.run("status", run_id).stdout
    assert f"run {run_id} (pin r1): failed" in text
    assert f"next: planrun retry {run_id}" in text
    assert "failed        c (fail)" in text
    kinds = [e["kind"] for e in json.loads(proj.run("log", run_id, "--json").stdout)]
    assert kinds[0] == "planned"
    assert "run_resumed" in kinds
    runs = json.loads(proj.run("runs", "--json").stdout)
    assert runs[0]["run_id"] == run_id
    assert runs[0]["status"] == "failed"
    # the journal stores planrun's own keys as they are, and the value as a reference
    for (data,) in proj.db("SELECT data_json FROM events WHERE data_json IS NOT NULL"):
        assert "***" not in data
    (params,), = proj.db("SELECT params_json FROM runs")
    assert json.loads(params) == {"pin": redact.reference("pin")}
    starts = proj.db("SELECT data_json FROM events WHERE kind = 'step_started'")
    assert all(set(json.loads(d)) == {"attempt", "key", "arguments_digest"} for (d,) in starts)
    assert all(re.fullmatch("[0-9a-f]{64}", json.loads(d)["arguments_digest"]) for (d,) in starts)


def test_number_structured_and_fan_out_secrets_round_trip(proj: Proj) -> None:
    proj.plan("kinds", """
        planrun: 1
        goal: Secrets that are numbers, objects and lists
        params:
          pin: {type: integer, secret: true}
          cred: {type: object, secret: true}
          hosts: {type: array, secret: true}
        steps:
          - id: a
            tool: same
            arguments: {value: {pin: "{params.pin}", cred: "{params.cred}",
                                text: "pin={params.pin}"}}
          - id: n
            tool: numbers
            arguments: {pin: "{params.pin}"}
          - id: b
            tool: keep
            depends_on: [a, n]
            arguments:
              name: b
              value: {pin: "{steps.a.output.pin}", float: "{steps.n.output.float}",
                      str: "{steps.n.output.text}", other: "{steps.n.output.other}",
                      password: "{steps.a.output.cred.password}",
                      whole: "{steps.a.output.cred}", text: "{steps.a.output.text}"}
          - id: fan
            tool: keep
            depends_on: [b]
            for_each: "{params.hosts}"
            arguments: {name: "h{index}", value: "{item.name}"}
        """.replace("\n        ", "\n"))
    cred = {"user": "bob", "password": "hunter2XYZ"}
    hosts = [{"name": "alpha.internal"}, {"name": "beta.internal"}]
    args = ["-p", "pin=98765432", "-p", f"cred={json.dumps(cred)}",
            "-p", f"hosts={json.dumps(hosts)}"]
    res = proj.run("execute", "kinds", *args, env={"PLANRUN_TEST_CRASH": "dispatch:b"})
    assert res.returncode == -9
    (a_out,), = proj.db("SELECT output_json FROM steps WHERE step_id = 'a'")
    for text in ("98765432", "hunter2XYZ", "bob"):
        assert text not in a_out
    res = proj.run("resume", *args)
    assert res.returncode == 0, res.stderr
    b = proj.read("b.in")["value"]
    assert b == {"pin": 98765432, "float": 98765432.0, "str": "98765432",
                 "other": 98765433, "password": "hunter2XYZ", "whole": cred,
                 "text": "pin=98765432"}
    assert isinstance(b["pin"], int)
    assert isinstance(b["float"], float)
    assert [proj.read(f"h{i}.in")["value"] for i in (0, 1)] == ["alpha.internal",
                                                                 "beta.internal"]
    proj.journal_files("end")
    for text in ("98765432", "hunter2XYZ", "alpha.internal"):
        assert_nowhere(text, proj.texts)


def test_refusals_never_quote_a_secret(proj: Proj) -> None:
    secret = "Hidden-Value-77"
    proj.plan("pat", """
        planrun: 1
        goal: A secret that fails its schema
        params:
          token: {type: string, secret: true, pattern: "^x"}
        steps:
          - {id: a, tool: same, arguments: {value: "{params.token}"}}
        """.replace("\n        ", "\n"))
    proj.plan("num", """
        planrun: 1
        goal: A secret that does not parse
        params:
          pin: {type: integer, secret: true}
        steps:
          - {id: a, tool: same, arguments: {value: "{params.pin}"}}
        """.replace("\n        ", "\n"))
    proj.plan("long", """
        planrun: 1
        goal: A secret too long for the contract
        params:
          token: {type: string, secret: true}
        steps:
          - {id: a, tool: short, arguments: {name: a, value: "{params.token}"}}
          - {id: b, tool: same, arguments: {value: "{params.token}"}}
          - id: c
            tool: short
            depends_on: [b]
            arguments: {name: c, value: "{steps.b.output}"}
        """.replace("\n        ", "\n"))
    res = proj.run("execute", "pat", "-p", f"token={secret}", "-v")
    assert res.returncode == 3
    assert "'pattern'" in res.stderr
    assert "not shown" in res.stderr
    res = proj.run("execute", "num", "-p", f"pin={secret}", "--json")
    assert res.returncode == 3
    assert "does not parse" in res.stdout
    res = proj.run("validate", "long", "-p", f"token={secret}", "--format", "json")
    assert res.returncode == 3
    assert "'maxLength'" in res.stdout
    assert "holds a secret" in res.stdout
    # at run time too: the value came from an output that echoes the secret
    proj.plan("long", (proj.root / "plans" / "long.yaml").read_text().replace(
        "  - {id: a, tool: short, arguments: {name: a, value: \"{params.token}\"}}\n", ""))
    res = proj.run("execute", "long", "-p", f"token={secret}", "--json", "-v")
    assert res.returncode == 1
    step = json.loads(res.stdout)["steps"][1]
    assert step["error"]["code"] == "arguments"
    assert "holds a secret" in step["error"]["message"]
    proj.journal_files("end")
    assert_nowhere(secret, proj.texts)


def test_a_secret_default_is_not_journaled_and_is_asked_for_again(proj: Proj) -> None:
    proj.plan("dflt", """
        planrun: 1
        goal: A secret with a default
        params:
          pin: {type: string, secret: true, default: "Default-Secret-1"}
        steps:
          - {id: a, tool: same, arguments: {value: "{params.pin}"}}
          - id: b
            tool: keep
            depends_on: [a]
            arguments: {name: b, value: "{steps.a.output}"}
        """.replace("\n        ", "\n"))
    res = proj.run("execute", "dflt", env={"PLANRUN_TEST_CRASH": "dispatch:b"})
    assert res.returncode == -9
    res = proj.run("resume")
    assert res.returncode == 3
    assert "param_missing" in res.stderr
    res = proj.run("resume", "-p", "pin=Default-Secret-1")
    assert res.returncode == 0, res.stderr
    assert proj.read("b.in")["value"] == "Default-Secret-1"
    assert "Default-Secret-1" not in proj.run("show", "dflt").stdout
    proj.journal_files("end")
    assert_nowhere("Default-Secret-1", proj.texts)
    (options,), = proj.db("SELECT options_json FROM runs")
    assert json.loads(options)["file_sha256"] is None  # a digest of the bytes would tell


def test_keys_and_digests_do_not_depend_on_the_secret(proj: Proj) -> None:
    """A 4-digit secret cannot be brute-forced from the journal: nothing depends on it."""
    proj.plan("pin", """
        planrun: 1
        goal: Keys over references
        params:
          pin: {type: integer, secret: true}
        steps:
          - {id: a, tool: keep, arguments: {name: a, value: "{params.pin}"}}
        """.replace("\n        ", "\n"))
    for pin in ("1234", "9876"):
        assert proj.run("execute", "pin", "-p", f"pin={pin}").returncode == 0
    rows = proj.db("SELECT r.root_run_id, s.idempotency_key FROM runs r JOIN steps s "
                   "USING (run_id) ORDER BY r.rowid")
    from types import SimpleNamespace

    from planrun.executor import idempotency_key

    step: Any = SimpleNamespace(id="a", tool=SimpleNamespace(
        name="keep", entry=SimpleNamespace(key_arguments=None, dedupe="run")))
    for root, key in rows:
        assert key == idempotency_key(plan="pin", root_run_id=root, step=step, item=None,
                                      arguments={"name": "a",
                                                 "value": redact.reference("pin")})
    blob = b"".join(p.read_bytes() for p in proj.root.iterdir()
                    if p.name.startswith("journal.sqlite3"))
    # Run ids, keys and digests are random or hash hex: a 4-digit run inside one is chance,
    # not a leak (it made this test flaky); search what is left.
    blob = re.sub(rb"[0-9a-f]{16,}", b"", blob)
    for pin in ("1234", "9876"):
        assert pin.encode() not in blob


def test_tools_never_see_planrun_param_variables(proj: Proj) -> None:
    proj.plan("env", """
        planrun: 1
        goal: The environment of tools
        params:
          token: {type: string, secret: true}
        steps:
          - {id: a, tool: environ}
          - {id: b, tool: keep, arguments: {name: b, value: "{params.token}"}}
        """.replace("\n        ", "\n"))
    res = proj.run("execute", "env", "--json",
                   env={"PLANRUN_PARAM_token": "From-The-Env-9", "PLANRUN_PARAM_OTHER": "x"})
    assert res.returncode == 0, res.stderr
    run_id = json.loads(res.stdout)["run_id"]
    assert json.loads(proj.run("output", run_id, "a").stdout) == []
    env_text = (proj.root / "b.env").read_text()
    assert "PLANRUN_PARAM_" not in env_text
    assert "From-The-Env-9" not in env_text
    assert "PLANRUN_RUN_ID=" in env_text
    assert proj.read("b.in")["value"] == "From-The-Env-9"  # given as the argument it is


def test_the_journal_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    proj = Proj(tmp_path / "p")
    proj.plan("one", "planrun: 1\ngoal: one\nsteps:\n"
              "  - {id: a, tool: keep, arguments: {name: a}}\n"
              "  - {id: b, tool: keep, depends_on: [a], arguments: {name: b}}\n")
    journal = tmp_path / "new" / "deeper" / "journal.sqlite3"
    proj.journal = journal
    res = proj.run("execute", "one", env={"PLANRUN_TEST_CRASH": "dispatch:b"})
    assert res.returncode == -9

    def mode(p: Path) -> int:
        return stat.S_IMODE(p.stat().st_mode)

    assert mode(tmp_path / "new") == 0o700
    assert mode(tmp_path / "new" / "deeper") == 0o700
    files = [p for p in journal.parent.iterdir()]
    assert {p.name for p in files} >= {"journal.sqlite3", "journal.sqlite3-wal",
                                       "journal.sqlite3-shm", "journal.sqlite3.setup-lock"}
    for p in files:
        assert mode(p) == 0o600, p.name
    # a folder planrun did not create keeps its mode
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o755)
    os.chmod(mine, 0o755)
    proj.journal = mine / "j.sqlite3"
    assert proj.run("execute", "one").returncode == 0
    assert mode(mine) == 0o755
    assert mode(mine / "j.sqlite3") == 0o600


# --- the reference form ---------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False,
                                                           allow_infinity=False)
    | st.text(alphabet=st.sampled_from("ab7\"\\é\ufdd0\ufdd1\ufdd2x'\n")),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.text(alphabet=st.sampled_from("ab7\ufdd0\ufdd2"), max_size=3), inner, max_size=4),
    max_leaves=12)


@given(value=json_values, secret=st.one_of(
    st.text(alphabet=st.sampled_from("ab7\"\\é'\ufdd0"), min_size=1, max_size=3),
    st.integers(), st.floats(allow_nan=False, allow_infinity=False),
    st.dictionaries(st.sampled_from(["k", "a/b"]), st.text(min_size=1, max_size=2)
                    | st.integers(), max_size=2)))
def test_conceal_then_reveal_gives_back_exactly_the_value(value: Any, secret: Any) -> None:
    secrets = redact.Secrets({"s": secret})
    stored = secrets.conceal(value)
    back = redact.reveal(stored, {"s": secret})
    assert json.dumps(back, sort_keys=True) == json.dumps(value, sort_keys=True)
    assert back == value
    if isinstance(secret, str):  # what is printed holds no trace of it
        def strings(v: Any) -> list[str]:
            if isinstance(v, str):
                return [v]
            if isinstance(v, dict):
                return [t for x in v.values() for t in strings(x)]  # keys: field names
            return [t for x in v for t in strings(x)] if isinstance(v, list) else []

        assert not [t for t in strings(redact.display(stored)) if secret in t]


def test_a_value_that_looks_like_a_reference_stays_a_value() -> None:
    fake = redact.reference("token")
    stored = redact.Secrets({"token": "t0ken"}).conceal({"v": fake, "w": "t0ken"})
    assert stored["v"] != fake
    assert redact.reference_name(stored["v"]) is None
    assert stored["w"] == fake
    assert redact.reveal(stored, {"token": "t0ken"}) == {"v": fake, "w": "t0ken"}
    assert redact.display(stored) == {"v": fake, "w": "***"}


def test_reveal_keeps_types_and_spellings() -> None:
    values = {"pin": 7, "s": 'a"b'}
    stored = redact.Secrets(values).conceal(
        {"n": 7, "f": 7.0, "t": "7", "x": "pin 7", "j": json.dumps('a"b'), "r": repr('a"b')})
    assert stored["n"] == redact.reference("pin")
    assert redact.reveal(stored, values) == {"n": 7, "f": 7.0, "t": "7", "x": "pin 7",
                                             "j": json.dumps('a"b'), "r": repr('a"b')}
    with pytest.raises(redact.SecretMissing, match="PLANRUN_PARAM_pin"):
        redact.reveal(stored, {})


def test_a_cut_never_splits_a_reference() -> None:
    secrets = redact.Secrets({"s": "SECRET"})
    text = secrets.conceal_text("x" * 10 + "SECRET" + "y" * 5)
    ref = redact.reference("s")
    for size in range(1, len(text) + 1):
        tail = redact.cut_tail(text, size)
        assert text.endswith(tail)
        assert len(tail) <= size
        rest = tail.replace(ref, "")
        assert "\ufdd0" not in rest
        assert "\ufdd1" not in rest


def test_follow_reaches_into_a_whole_secret() -> None:
    values = {"c": {"a": [1, {"b": "x"}]}}
    ref = redact.reference("c")
    leaf = redact.follow({"v": ref}, ("v", "a", "1", "b"), "item", values)
    assert redact.reveal(leaf, values) == "x"
    with pytest.raises(ResolveError, match=r"item\.v\.a has no '7'"):
        redact.follow({"v": ref}, ("v", "a", "7"), "item", values)
    items = redact.expand(redact.reference("c", "", "/a"), values)
    assert [redact.reveal(i, values) for i in items] == [1, {"b": "x"}]


def test_printing_masks_values_not_words() -> None:
    stored = redact.Secrets({"pin": "a"}).conceal({"status": "banana", "a": 1})
    assert redact.display(stored) == {"status": "b***n***n***", "***": 1}
    assert digest(stored) == digest(redact.Secrets({"pin": "a"}).conceal(
        {"status": "banana", "a": 1}))


def test_the_masker_holds_back_a_secret_written_in_pieces() -> None:
    masker = masking.Masker(redact.Secrets({"s": "abcd"}))
    out = masker.feed("x ab") + masker.feed("cd y ab") + masker.feed("X") + masker.flush()
    assert out == "x *** y abX"


@pytest.mark.sqlite
def test_copying_a_journal_to_another_place_copies_no_secret(proj: Proj) -> None:
    """What a backup of the journal holds: references, nothing to guess a secret from."""
    proj.plan("s", "planrun: 1\ngoal: s\nparams:\n  t: {type: string, secret: true}\n"
              "steps:\n  - {id: a, tool: same, arguments: {value: \"{params.t}\"}}\n")
    assert proj.run("execute", "s", "-p", "t=Copy-Me-Not-5").returncode == 0
    copy = proj.root / "copy.sqlite3"
    shutil.copy(proj.journal, copy)
    with sqlite3.connect(copy) as conn:
        dump = "\n".join(conn.iterdump())
    assert "Copy-Me-Not-5" not in dump
    assert redact.reference("t") in dump


def test_in_process_runs_mask_what_tools_print(tmp_path: Path,
                                               capfd: pytest.CaptureFixture[str]) -> None:
    """Through the API in this process too: a tool's prints reach stderr masked."""
    from planrun import api
    from planrun.paths import load_settings
    from planrun.validation import ParamInput

    proj = Proj(tmp_path / "p")
    proj.plan("s", "planrun: 1\ngoal: s\nparams:\n  t: {type: string, secret: true}\n"
              "steps:\n  - {id: a, tool: src, arguments: {token: \"{params.t}\"}}\n")
    os.chdir(proj.root)
    settings = load_settings(project=str(proj.root), journal=str(proj.journal))
    outcome = api.execute(settings, "s", ParamInput(cli={"t": "In-Process-Secret-3"}))
    assert isinstance(outcome, api.RunOutcome)
    result = outcome.manifest
    assert result["status"] == "completed"
    assert result["params"] == {"t": redact.reference("t")}  # the API returns stored data
    captured = capfd.readouterr()
    assert "In-Process-Secret-3" not in captured.out
    # The one documented limit: embedded under an in-memory sys.stderr (this harness), a
    # stream object a tool took before the run (its logging handler) is not planrun's to
    # mask. Run as a program (the acceptance test), that handler writes to fd 2: masked.
    leaked = [line for line in captured.err.splitlines() if "In-Process-Secret-3" in line]
    assert leaked == ["logging says In-Process-Secret-3"]
    assert "stdout says ***" in captured.err
    assert "fd says ***" in captured.err
    assert sys.stderr is not None
    assert not isinstance(sys.stderr, masking._MaskedWriter)  # given back after the run
