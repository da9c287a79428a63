"""No schema makes planrun read a file or send a request (found by attack).

jsonschema's default registry fetches any reference it does not know with ``urlopen``
(``file://`` and ``http://`` too). ``$ref`` was refused unless local, but ``$dynamicRef``
was not: a plan's parameter ``{"$dynamicRef": "file:///…/leak.json#meta"}`` made
``validate`` print the file's content in its message, and an ``http://`` one sent a
request (an agent could probe the network through the MCP server's ``validate_plan``).

Every reference keyword that leads outside its schema is now a ``schema`` issue wherever
a schema is written (a plan's parameters, a tool's ``arguments`` and ``output_schema``),
and planrun's validators use a registry that fetches nothing. A real HTTP listener
counts the requests; real ``planrun`` processes.
"""

from __future__ import annotations

import http.server
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import run_planrun

SECRET = "TOPSECRET-FROM-FILE"


@pytest.fixture
def listener() -> Iterator[tuple[str, list[str]]]:
    """An HTTP server on 127.0.0.1: (its base URL, the paths it was asked for)."""
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            body = json.dumps({"$dynamicAnchor": "meta", "const": SECRET}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def _targets(tmp_path: Path, base: str) -> list[str]:
    leak = tmp_path / "leak.json"
    leak.write_text(json.dumps({"$dynamicAnchor": "meta", "$anchor": "meta",
                                "const": SECRET}))
    return [f"{leak.as_uri()}#meta", f"{base}/dyn#meta"]


def _project(root: Path, contract: object, param: object, output: object = None) -> None:
    (root / "plans").mkdir(parents=True)
    (root / "t.py").write_text("def echo(text):\n    return text\n")
    tool = {"python": "t:echo", "arguments": contract}
    if output is not None:
        tool["output_schema"] = output
    (root / "tools.yaml").write_text(json.dumps({"tools": {"echo": tool}}))
    params = {"p": param} if param is not None else {}
    (root / "plans" / "p.json").write_text(json.dumps({
        "planrun": 1, "goal": "g", "params": params,
        "steps": [{"id": "a", "tool": "echo",
                   "arguments": {"text": "{params.p}" if params else "x"}}]}))


CONTRACT = {"type": "object", "properties": {"text": {"type": "string"}},
            "required": ["text"]}


@pytest.mark.parametrize("keyword", ["$dynamicRef", "$ref", "$recursiveRef"])
@pytest.mark.parametrize("where", ["param", "arguments", "output_schema"])
def test_a_reference_outside_the_schema_is_refused_and_never_fetched(
        tmp_path: Path, listener: tuple[str, list[str]], keyword: str, where: str) -> None:
    base, seen = listener
    for i, target in enumerate(_targets(tmp_path, base)):
        root = tmp_path / f"p{i}"
        ref = {keyword: target}
        if where == "param":
            _project(root, CONTRACT, {**ref, "default": "x"})
        elif where == "arguments":
            _project(root, {**CONTRACT, "properties": {"text": ref}}, None)
        else:
            _project(root, CONTRACT, None, output=ref)
        env = dict(os.environ, PLANRUN_JOURNAL=str(root / "j.sqlite3"))
        res = run_planrun("validate", "p", "--json", cwd=root, env=env)
        assert res.returncode == 3, res
        assert SECRET not in res.stdout + res.stderr
        assert "Traceback" not in res.stderr
        report = json.loads(res.stdout)
        issues = report["issues"] + [i for p in report["plans"] for i in p["issues"]]
        # a plan's parameter is the plan's issue; a tool's schema, the registry's
        assert {i["code"] for i in issues} == {"schema" if where == "param" else "registry"}
        assert any(keyword in (i["path"] or "") + i["message"] for i in issues), issues
    assert seen == []  # no request reached the listener


def test_a_local_dynamic_reference_still_works(tmp_path: Path) -> None:
    _project(tmp_path, CONTRACT, {"$defs": {"s": {"$dynamicAnchor": "meta",
                                                  "type": "string"}},
                                  "$dynamicRef": "#meta", "default": "x"})
    env = dict(os.environ, PLANRUN_JOURNAL=str(tmp_path / "j.sqlite3"))
    res = run_planrun("validate", "p", cwd=tmp_path, env=env)
    assert res.returncode == 0, res


def test_planruns_validators_fetch_nothing(listener: tuple[str, list[str]]) -> None:
    """The second wall: even a schema that skipped the check fetches nothing."""
    from planrun.registry import strict_validator

    base, seen = listener
    validator = strict_validator({"$ref": f"{base}/x"})
    # an unresolvable reference is a violation of the value (a check never raises)
    [err] = list(validator.iter_errors("anything"))
    assert "cannot be checked against its schema" in err.message
    assert "in the keyword 'ref'" in err.message
    assert seen == []


def _nested_id(base: str, good: bool) -> dict[str, object]:
    """A ``$ref`` inside a subschema with an ``$id`` of its own: it resolves against that
    ``$id``, as validation resolves it, not against the root (found by attack: checked
    from the root it passed, then validation raised: a traceback, or a tool's call left
    indeterminate by an output check that failed)."""
    inner: dict[str, object] = {"$id": f"{base}/sub/", "$ref": "#/$defs/i"}
    if good:
        inner["$defs"] = {"i": {"type": "string"}}
    return {"$defs": {"s": inner, "i": {"type": "string"}}, "$ref": "#/$defs/s"}


@pytest.mark.parametrize("where", ["param", "arguments", "output_schema"])
def test_a_reference_under_a_nested_id_is_checked_from_that_id(
        tmp_path: Path, listener: tuple[str, list[str]], where: str) -> None:
    base, seen = listener
    for good in (False, True):
        root = tmp_path / f"{where}-{good}"
        schema = _nested_id(base, good)
        if where == "param":
            _project(root, CONTRACT, {**schema, "default": "x"})
        elif where == "arguments":  # "#" is the contract's root: the $defs go there
            _project(root, {**CONTRACT, "$defs": schema["$defs"],
                            "properties": {"text": {"$ref": "#/$defs/s"}}}, None)
        else:
            _project(root, CONTRACT, None, output=schema)
        env = dict(os.environ, PLANRUN_JOURNAL=str(root / "j.sqlite3"))
        res = run_planrun("validate", "p", "--json", cwd=root, env=env)
        assert "Traceback" not in res.stderr, res
        if not good:
            assert res.returncode == 3, res
            continue
        assert res.returncode == 0, res
        ran = run_planrun("execute", "p", cwd=root, env=env)
        assert ran.returncode == 0, ran  # checked and called as validated
    assert seen == []
