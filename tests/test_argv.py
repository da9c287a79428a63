"""Values from a plan never become code or an option (SPEC §2, issue 9 §5).

The registry refuses a placeholder embedded in a larger argv element unless it follows
``=`` of an ``--option=``/``key=`` element of a command that runs no code, or the tool opts
in (``allow_embedded``); a whole-element placeholder is refused where it would be the
program or code, with options read as the program reads them (one planrun cannot place
read both ways). At run time a value that would become an option (starts with ``-``, ``+``
or ``@``) fails the step with ``arguments`` before the call, unless the tool allows it
(``allow_option_values``) or, for ``-`` only, ``--`` comes first after the program that
reads it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from harness import PLANRUN, run_planrun
from planrun.issues import Issue
from planrun.registry import ToolRegistry, load_registry

CONTRACT = {"type": "object",
            "properties": {"x": {"type": "string"}, "h": {"type": "string"}},
            "required": ["x", "h"], "additionalProperties": False}

#: Each validated before issue 9, and `-p 'x=; touch pwned'` ran the injected command.
ISSUE_EXAMPLES = [
    ["rbash", "-c", "echo {x}"],
    ["flock", "LOCKFILE", "-c", "echo {x}"],
    ["script", "-qec", "echo {x}", "/dev/null"],
    ["nodejs", "-e", 'console.log("{x}")'],
    ["watch", "-g", "echo {x}"],
    ["ssh", "host", "echo {x}"],
    ["sg", "GROUP", "-c", "echo {x}"],
    ["git", "-c", "core.pager={x}", "log"],
]

#: Siblings: the same kinds reached another way.
SIBLINGS = [
    # the value is the whole code argument
    ["ssh", "host", "{x}"],
    ["ssh", "-o", "{x}", "host", "true"],
    ["ssh", "-oProxyCommand={x}", "host"],
    ["ssh", "-p", "22", "{h}", "ls", "{x}"],
    ["watch", "{x}"],
    ["sg", "GROUP", "{x}"],
    ["git", "-c", "{x}", "log"],
    ["git", "--config-env={x}", "log"],
    ["flock", "LOCKFILE", "--command", "{x}"],
    ["awk", "{x}", "file"],
    ["gawk", "-e", "{x}"],
    ["sed", "-e", "{x}", "file"],
    ["sed", "{x}", "file"],
    ["node", "-p", "{x}"],
    ["php", "-r", "{x}"],
    ["su", "-c", "{x}"],
    ["runuser", "-u", "nobody", "--", "sh", "-c", "{x}"],
    ["busybox", "sh", "-c", "{x}"],
    # the value chooses the program
    ["env", "{x}"],
    ["env", "A=1", "{x}", "arg"],
    ["timeout", "5", "{x}"],
    ["nice", "-n", "5", "{x}"],
    ["sudo", "-u", "root", "{x}"],
    ["xargs", "-n", "1", "{x}"],
    ["find", ".", "-exec", "{x}", ";"],
    ["git", "{x}"],
    ["flock", "LOCKFILE", "{x}"],
    # embedded: read by a program known to run code, or not after '='
    ["tar", "--to-command={x}", "-xf", "a.tar"],
    ["rsync", "--rsh={x}", "a", "b"],
    ["make", "CC={x}"],
    ["ssh", "-o", "ProxyCommand={x}", "host"],
    ["env", "LD_PRELOAD={x}", "ls"],
    ["cp", "a", "out-{x}.txt"],
    ["grep", "-e", "^{x}$", "file"],
    ["mytool", "{h}={x}"],
    ["mytool", "--{h}", "x"],
]

ALLOWED = [
    ["sh", "-c", 'echo "$1"', "sh", "{x}"],
    ["find", ".", "-exec", "sh", "-c", 'echo "$1"', "sh", "{x}", ";"],
    ["tar", "-czf", "{x}", "-C", "{h}", "."],
    ["python3", "script.py", "{x}"],
    ["grep", "-e", "{x}", "file.txt"],
    ["curl", "--data-urlencode=q={x}", "https://example.com/{{path}}"],
    ["mytool", "key={x}", "--opt={h}"],
    ["env", "-C", "{h}", "sha256sum", "--check", "{x}"],
    ["git", "-C", "{h}", "status", "--", "{x}"],
    ["ssh", "{h}", "uptime"],
    ["sh", "-c", 'cp -- "$1" "$2"', "sh", "{x}", "--dest={h}"],
    ["timeout", "5", "cat", "{x}"],
    ["watch", "-x", "ls", "{x}"],
]


#: Options whose value is a separate element: each validated before, and a plan value then
#: chose the program or script (``evil.sh`` ran).
GAP1_EXAMPLES = [
    ["timeout", "--signal", "KILL", "10", "{x}", "{h}"],
    ["env", "--unset", "FOO", "{x}"],
    ["nice", "--adjustment", "5", "{x}"],
    ["sudo", "--user", "root", "{x}"],
    ["env", "--chdir", "/tmp", "{x}"],
    ["xargs", "-0n", "1", "{x}"],
    ["python3", "-I", "-W", "ignore", "{x}"],
    ["bash", "-o", "posix", "{x}"],
]
#: Siblings: every family that parses options, with a value planrun knows, one it cannot
#: place (read both ways), a cluster, a lone ``-``, or a letter it read wrongly.
GAP1_SIBLINGS = [
    ["timeout", "--sig", "KILL", "10", "{x}"],
    ["timeout", "-vs", "KILL", "10", "{x}"],
    ["timeout", "--kill-after", "5", "10", "{x}"],
    ["env", "-", "{x}"],
    ["env", "-iu", "FOO", "{x}"],
    ["env", "--argv0", "name", "{x}"],
    ["env", "--frob", "x", "{x}"],
    ["nice", "--adj", "5", "{x}"],
    ["sudo", "-iu", "root", "{x}"],
    ["sudo", "--chdir", "/", "{x}"],
    ["xargs", "-0I", "X", "{x}"],
    ["xargs", "--max-args", "1", "{x}"],
    ["nohup", "--frob", "x", "{x}"],
    ["stdbuf", "--output", "L", "{x}"],
    ["setsid", "--frob", "x", "{x}"],
    ["ionice", "--class", "2", "{x}"],
    ["chroot", "--userspec", "u", "/root", "{x}"],
    ["flock", "-n", "LOCKFILE", "{x}"],
    ["flock", "--timeout", "5", "LOCKFILE", "{x}"],
    ["nsenter", "-n", "{x}"],
    ["nsenter", "--target", "1", "{x}"],
    ["unshare", "--setuid", "0", "{x}"],
    ["systemd-run", "--unit", "u", "{x}"],
    ["bwrap", "--ro-bind", "/", "/", "{x}"],
    ["fakeroot", "--lib", "l", "{x}"],
    ["strace", "-fo", "log", "{x}"],
    ["time", "--output", "t", "{x}"],
    ["uv", "run", "{x}"],
    ["watch", "-d", "{x}"],
    ["watch", "-x", "--interval", "1", "{x}"],
    ["ssh", "-vo", "{x}", "host"],
    ["git", "--frob", "x", "{x}"],
    ["sg", "-", "GROUP", "{x}"],
    ["python3", "-X", "dev", "{x}"],
    ["python3", "--check-hash-based-pycs", "always", "{x}"],
    ["python3", "-IW", "ignore", "{x}"],
    ["bash", "-O", "extglob", "{x}"],
    ["bash", "+O", "extglob", "{x}"],
    ["bash", "--rcfile", "/dev/null", "{x}"],
    ["sh", "-", "{x}"],
    ["zsh", "-o", "posix", "{x}"],
    ["perl", "-I", "/tmp", "{x}"],
    ["node", "-r", "mod", "{x}"],
    ["node", "--require", "mod", "{x}"],
    ["node", "--title", "t", "{x}"],
    ["ruby", "-I", "lib", "{x}"],
    ["php", "-d", "a=b", "{x}"],
    ["lua", "-l", "mod", "{x}"],
    ["julia", "-L", "f.jl", "{x}"],
    ["osascript", "-l", "JavaScript", "{x}"],
    ["awk", "-F", ":", "{x}", "file"],
    ["awk", "-v", "a=1", "{x}"],
    ["sed", "-l", "5", "{x}", "file"],
    ["sed", "--line-length", "5", "{x}", "file"],
    ["su", "root", "{x}"],
    ["su", "-s", "/bin/sh", "root", "{x}"],
    ["runuser", "-u", "nobody", "{x}"],
    ["env", "timeout", "--signal", "KILL", "10", "{x}"],
]
#: The same programs, written so that every reading agrees: still accepted.
GAP1_ALLOWED = [
    ["timeout", "--signal=KILL", "10", "cat", "{x}"],
    ["timeout", "-s", "KILL", "10", "cat", "{x}"],
    ["timeout", "--signal", "KILL", "10", "cat", "{x}"],
    ["env", "--unset=FOO", "ls", "{x}"],
    ["env", "--unset", "FOO", "ls", "{x}"],
    ["env", "--frob", "--", "ls", "{x}"],
    ["nice", "--adjustment=5", "ls", "{x}"],
    ["nice", "-10", "ls", "{x}"],
    ["sudo", "--user=root", "ls", "{x}"],
    ["sudo", "-u", "root", "ls", "{x}"],
    ["xargs", "-0n", "1", "grep", "{x}"],
    ["xargs", "-0", "grep", "{x}"],
    ["flock", "-n", "LOCKFILE", "ls", "{x}"],
    ["python3", "-I", "-W", "ignore", "script.py", "{x}"],
    ["python3", "-m", "mod", "{x}"],
    ["bash", "-o", "posix", "script.sh", "{x}"],
    ["node", "--no-warnings", "s.js", "{x}"],
    ["git", "--no-pager", "log", "{x}"],
    ["awk", "-F", ":", "{print $1}", "{x}"],
]


def _write(tmp_path: Path, argv: list[str], **extra: Any) -> tuple[ToolRegistry, list[Issue]]:
    tools = {"tools": {"t": {"command": argv, "arguments": CONTRACT, **extra}}}
    path = tmp_path / "tools.yaml"
    path.write_text(json.dumps(tools, indent=1))  # JSON is YAML; one element per line
    return load_registry(path)


@pytest.mark.parametrize("argv", ISSUE_EXAMPLES + SIBLINGS,
                         ids=[" ".join(a) for a in ISSUE_EXAMPLES + SIBLINGS])
def test_values_that_could_become_code_are_registry_errors(tmp_path: Path,
                                                           argv: list[str]) -> None:
    registry, issues = _write(tmp_path, argv)
    assert issues, argv
    assert {i.code for i in issues} == {"registry"}
    assert all(i.line is not None and i.file for i in issues)
    assert all(i.path and i.path.startswith("/tools/t/command/") for i in issues)
    assert "t" not in registry


@pytest.mark.parametrize("argv", ALLOWED, ids=[" ".join(a) for a in ALLOWED])
def test_safe_forms_are_accepted(tmp_path: Path, argv: list[str]) -> None:
    registry, issues = _write(tmp_path, argv)
    assert issues == []
    assert "t" in registry


@pytest.mark.parametrize("argv", GAP1_EXAMPLES + GAP1_SIBLINGS,
                         ids=[" ".join(a) for a in GAP1_EXAMPLES + GAP1_SIBLINGS])
def test_an_option_value_in_the_next_element_does_not_hide_the_program(
        tmp_path: Path, argv: list[str]) -> None:
    registry, issues = _write(tmp_path, argv)
    assert issues, argv
    assert {i.code for i in issues} == {"registry"}
    assert {i.path for i in issues} == {f"/tools/t/command/{argv.index('{x}')}"}
    assert "a value may not choose the program" in issues[0].message \
        or "never code" in issues[0].message
    assert "t" not in registry


@pytest.mark.parametrize("argv", GAP1_ALLOWED, ids=[" ".join(a) for a in GAP1_ALLOWED])
def test_options_every_reading_agrees_on_are_accepted(tmp_path: Path,
                                                      argv: list[str]) -> None:
    registry, issues = _write(tmp_path, argv)
    assert issues == []
    assert "t" in registry


@pytest.mark.parametrize(("argv", "option", "fix"), [
    (["timeout", "--sig", "KILL", "10", "{x}", "{h}"], "--sig", "--sig=VALUE"),
    (["xargs", "-q", "1", "{x}", "{h}"], "-q", "-qVALUE"),
    (["python3", "--frob", "x", "{x}", "{h}"], "--frob", "--frob=VALUE"),
])
def test_an_option_read_both_ways_is_named_with_the_fix(tmp_path: Path, argv: list[str],
                                                        option: str, fix: str) -> None:
    _registry, issues = _write(tmp_path, argv)
    assert [i.path for i in issues] == [f"/tools/t/command/{argv.index('{x}')}"]
    message = issues[0].message
    assert f"cannot tell whether the option {option!r} takes the next element" in message
    assert repr(fix) in message
    assert '"--"' in message
    # the certain case says no such thing
    _registry, issues = _write(tmp_path, ["timeout", "--signal", "KILL", "10", "{x}", "{h}"])
    assert issues
    assert "cannot tell" not in issues[0].message


def test_allow_embedded_opts_in_outside_code_only(tmp_path: Path) -> None:
    _registry, issues = _write(tmp_path, ["cp", "a", "out-{x}.txt"], allow_embedded=["x"])
    assert issues == []
    _registry, issues = _write(tmp_path, ["env", "NAME={x}", "sh", "-c", 'echo "$NAME"'],
                               allow_embedded=["x"])
    assert issues == []
    # never inside code, whatever the tool says
    _registry, issues = _write(tmp_path, ["sh", "-c", "echo {x}"], allow_embedded=["x"])
    assert [i.code for i in issues] == ["registry"]
    assert "shell script text" in issues[0].message
    _registry, issues = _write(tmp_path, ["cp", "a", "out-{x}-{h}.txt"],
                               allow_embedded=["x"])
    assert len(issues) == 1
    assert "{h}" in issues[0].message


@pytest.mark.parametrize("field", ["allow_embedded", "allow_option_values"])
def test_opt_in_fields_name_declared_arguments(tmp_path: Path, field: str) -> None:
    _registry, issues = _write(tmp_path, ["echo", "{x}", "{h}"], **{field: ["nope"]})
    assert [i.code for i in issues] == ["registry"]
    assert issues[0].path == f"/tools/t/{field}"
    assert "'nope'" in issues[0].message


def test_opt_in_fields_are_for_command_tools(tmp_path: Path) -> None:
    (tmp_path / "mod.py").write_text("def f(**kw):\n    return kw\n")
    path = tmp_path / "tools.yaml"
    path.write_text(json.dumps({"tools": {"p": {"python": "mod:f", "arguments": CONTRACT,
                                                "allow_embedded": ["x"]}}}))
    _registry, issues = load_registry(path)
    assert [i.code for i in issues] == ["registry"]
    assert "command tools only" in issues[0].message


# --- end to end: the attack of the issue, and argument injection at run time -------------


RECORD = '''
import json, sys
with open("called.jsonl", "a") as fh:
    fh.write(json.dumps(sys.argv[1:]) + "\\n")
'''

MODULE = '''
def give(value):
    return value
'''


def _project(root: Path, tools: dict[str, Any]) -> Path:
    (root / "plans").mkdir(parents=True)
    (root / "record.py").write_text(RECORD)
    (root / "mod.py").write_text(MODULE)
    base = {"give": {"python": "mod:give", "arguments": {
        "type": "object", "properties": {"value": {"type": "string"}},
        "required": ["value"], "additionalProperties": False}}}
    (root / "tools.yaml").write_text(json.dumps({"tools": {**base, **tools}}, indent=1))
    return root


def _run(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_planrun(*args, cwd=root, timeout=120,
                       env=dict(os.environ, PLANRUN_JOURNAL=str(root / "j.sqlite3")))


X_CONTRACT = {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"],
              "additionalProperties": False}


@pytest.mark.parametrize("argv", ISSUE_EXAMPLES[:4], ids=[a[0] for a in ISSUE_EXAMPLES[:4]])
def test_the_issue_attack_no_longer_runs(tmp_path: Path, argv: list[str]) -> None:
    argv = [a.replace("LOCKFILE", str(tmp_path / "lock")) for a in argv]
    root = _project(tmp_path / "p", {"t": {"command": argv, "arguments": X_CONTRACT}})
    (root / "plans" / "attack.yaml").write_text(
        "planrun: 1\ngoal: g\nparams:\n  x: {type: string}\n"
        "steps:\n  - {id: s, tool: t, arguments: {x: '{params.x}'}}\n")
    res = _run(root, "execute", "attack", "-p", f"x=; touch {tmp_path / 'pwned'}")
    assert res.returncode == 3, res.stderr
    assert "error[registry]" in res.stderr
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "pwned").exists()


EVIL = "#!/bin/sh\ntouch \"$(dirname \"$0\")/pwned\"\n"


@pytest.mark.parametrize("argv", [GAP1_EXAMPLES[0], GAP1_EXAMPLES[5], ["env", "-", "{x}"]],
                         ids=["timeout --signal", "xargs -0n", "env -"])
def test_a_program_behind_an_option_value_never_runs(tmp_path: Path,
                                                     argv: list[str]) -> None:
    root = _project(tmp_path / "p", {"t": {"command": [a.replace("{h}", "f") for a in argv],
                                           "arguments": X_CONTRACT, "output": "none"}})
    evil = root / "evil.sh"
    evil.write_text(EVIL)
    evil.chmod(0o755)
    (root / "plans" / "attack.yaml").write_text(
        "planrun: 1\ngoal: g\nparams:\n  x: {type: string}\n"
        "steps:\n  - {id: s, tool: t, arguments: {x: '{params.x}'}}\n")
    res = _run(root, "execute", "attack", "-p", f"x={evil}")
    assert res.returncode == 3, res.stdout + res.stderr
    assert "error[registry]" in res.stderr
    assert "a value may not choose the program" in res.stderr
    assert not (root / "pwned").exists()
    # the control: the shell script does run when the tool itself names it
    subprocess.run([str(evil)], check=True, timeout=30)
    assert (root / "pwned").exists()


def _injection_project(root: Path, **extra: Any) -> Path:
    command = extra.pop("command", ["python3", "record.py", "{x}"])
    root = _project(root, {"rec": {"command": command, "arguments": X_CONTRACT,
                                   "output": "none", **extra}})
    (root / "plans" / "inj.yaml").write_text(
        "planrun: 1\ngoal: g\nparams:\n  v: {type: string}\nsteps:\n"
        "  - {id: a, tool: give, arguments: {value: '{params.v}'}}\n"
        "  - {id: b, tool: rec, depends_on: [a], arguments: {x: '{steps.a.output}'}}\n")
    (root / "plans" / "static.yaml").write_text(
        "planrun: 1\ngoal: g\nparams:\n  v: {type: string}\nsteps:\n"
        "  - {id: b, tool: rec, arguments: {x: '{params.v}'}}\n")
    return root


def _called(root: Path) -> list[list[str]]:
    path = root / "called.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("value", ["-rf", "--output=/etc/passwd", "-"])
def test_a_run_time_value_starting_with_dash_fails_the_step_before_the_call(
        tmp_path: Path, value: str) -> None:
    root = _injection_project(tmp_path / "p")
    res = _run(root, "execute", "inj", "-p", f"v={value}", "--json")
    assert res.returncode == 1, res.stderr
    steps = {s["id"]: s for s in json.loads(res.stdout)["steps"]}
    assert steps["a"]["status"] == "succeeded"
    assert steps["b"]["status"] == "failed"
    assert steps["b"]["error"]["code"] == "arguments"
    assert "starts with '-'" in steps["b"]["error"]["message"]
    assert _called(root) == []


def test_a_known_value_starting_with_dash_is_refused_at_validation(tmp_path: Path) -> None:
    root = _injection_project(tmp_path / "p")
    res = _run(root, "validate", "static", "-p", "v=-rf", "--format", "json")
    assert res.returncode == 3
    issues = json.loads(res.stdout)["plans"][0]["issues"]
    assert [(i["code"], i["path"]) for i in issues] == [("arguments", "/steps/0/arguments/x")]
    res = _run(root, "execute", "static", "-p", "v=-rf")
    assert res.returncode == 3
    assert _called(root) == []


@pytest.mark.parametrize("extra", [
    {"command": ["python3", "record.py", "--", "{x}"]},
    {"allow_option_values": ["x"]},
    {"allow_option_values": True},
], ids=["double-dash", "listed", "all"])
def test_dash_values_pass_after_double_dash_or_when_allowed(tmp_path: Path,
                                                            extra: dict[str, Any]) -> None:
    root = _injection_project(tmp_path / "p", **extra)
    res = _run(root, "execute", "inj", "-p", "v=-rf", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    assert _called(root)[-1][-1] == "-rf"


#: Option injection without a leading '-': (command, value). Each passed the run-time
#: check before, and the program read the value as an option, a command or a file of
#: options (vim ran the shell command; gcc read ``-wrapper /bin/sh,e.sh`` from the file).
NO_DASH = [
    (["vim", "-es", "-u", "NONE", "{x}"], "+!echo PWNED > x"),
    (["gcc", "-c", "-o", "/dev/null", "{x}"], "@evil.rsp"),
    (["less", "{x}"], "+!sh"),
    (["more", "{x}"], "+/pattern"),
    (["tail", "{x}"], "+1"),
    (["sort", "{x}", "file"], "+1"),
    (["clang", "{x}"], "@args"),
    (["g++", "-c", "{x}"], "@args"),
    (["cc", "{x}"], "@args"),
    (["ld", "{x}"], "@args"),
    (["javac", "{x}"], "@args"),
    (["java", "-jar", "app.jar", "{x}"], "@args"),
    (["dotnet", "build", "{x}"], "@args"),
    # '--' does not help: gcc expands @FILE anywhere, more reads +/PATTERN after it
    (["gcc", "-c", "--", "{x}"], "@evil.rsp"),
    (["more", "--", "{x}"], "+/pattern"),
    (["vim", "--", "{x}"], "+!sh"),
    # a '--' before the program that reads the value ends another program's options
    (["env", "--", "rm", "{x}"], "-rf"),
    (["timeout", "5", "--", "rm", "{x}"], "-rf"),
    (["python3", "--", "record.py", "{x}"], "-rf"),
    (["sudo", "-u", "root", "--", "rm", "{x}"], "--no-preserve-root"),
]


def _problems(tmp_path: Path, argv: list[str], value: str,
              **extra: Any) -> list[tuple[str, str]]:
    from planrun.argv import option_value_problems

    contract = {"type": "object", "properties": {"x": {"type": "string"}},
                "required": ["x"], "additionalProperties": False}
    path = tmp_path / "tools.yaml"
    path.write_text(json.dumps({"tools": {"t": {"command": argv, "arguments": contract,
                                                **extra}}}))
    registry, issues = load_registry(path)
    assert issues == []
    return option_value_problems(registry["t"].entry, {"x": value})


@pytest.mark.parametrize(("argv", "value"), NO_DASH,
                         ids=[f"{' '.join(a)} <- {v}" for a, v in NO_DASH])
def test_a_value_read_as_an_option_without_a_dash_is_refused(
        tmp_path: Path, argv: list[str], value: str) -> None:
    problems = _problems(tmp_path, argv, value)
    assert [p for p, _m in problems] == ["/x"]
    message = problems[0][1]
    assert f"is {value!r}, which starts with {value[0]!r}: " in message
    assert f"(argv element {argv.index('{x}')})" in message
    assert "allow_option_values" in message
    assert _problems(tmp_path, argv, value, allow_option_values=["x"]) == []
    assert _problems(tmp_path, argv, value, allow_option_values=True) == []


@pytest.mark.parametrize(("argv", "value"), [
    (["rm", "--", "{x}"], "-rf"),
    (["env", "rm", "--", "{x}"], "-rf"),
    (["git", "-C", "/r", "status", "--", "{x}"], "-x"),
    (["python3", "record.py", "--", "{x}"], "-rf"),
    (["sh", "-c", 'vim -- "$1"', "sh", "{x}"], "+x"),  # the script's own argument
    (["vim", "{x}"], "a+b@c"),
    (["gcc", "-c", "{x}"], "x@y.c"),
])
def test_values_an_option_reader_cannot_take_as_options_pass(
        tmp_path: Path, argv: list[str], value: str) -> None:
    assert _problems(tmp_path, argv, value) == []


@pytest.mark.parametrize("value", ["+x", "@f"])
def test_a_plus_or_at_value_fails_the_step_before_the_call(tmp_path: Path,
                                                           value: str) -> None:
    for command in (["python3", "record.py", "{x}"], ["python3", "record.py", "--", "{x}"]):
        root = _injection_project(tmp_path / f"p{len(command)}", command=command)
        res = _run(root, "execute", "inj", "-p", f"v={value}", "--json")
        assert res.returncode == 1, res.stderr
        steps = {s["id"]: s for s in json.loads(res.stdout)["steps"]}
        assert steps["b"]["error"]["code"] == "arguments"
        assert f"starts with {value[0]!r}" in steps["b"]["error"]["message"]
        assert _called(root) == []


VIM_ATTACK = ["vim", "-es", "-u", "NONE", "-i", "NONE", "{x}"]
GCC_ATTACK = ["gcc", "-c", "-o", "/dev/null", "{x}"]


@pytest.mark.parametrize(("command", "value"), [
    pytest.param(VIM_ATTACK, "+!touch pwned", id="vim",
                 marks=pytest.mark.skipif(not shutil.which("vim"), reason="no vim")),
    pytest.param(GCC_ATTACK, "@evil.rsp", id="gcc",
                 marks=pytest.mark.skipif(not shutil.which("gcc"), reason="no gcc")),
])
def test_the_no_dash_attack_never_reaches_the_program(tmp_path: Path, command: list[str],
                                                      value: str) -> None:
    for allowed, ran in ((False, False), (True, True)):
        root = _injection_project(tmp_path / f"p{allowed}", command=command,
                                  **({"allow_option_values": ["x"]} if allowed else {}))
        (root / "e.sh").write_text("touch pwned\nexec \"$@\"\n")
        (root / "x.c").write_text("int x;\n")
        (root / "evil.rsp").write_text("-wrapper /bin/sh,e.sh x.c\n")
        res = _run(root, "execute", "inj", "-p", f"v={value}", "--json")
        step = json.loads(res.stdout)["steps"][1]
        if not allowed:
            assert res.returncode == 1, res.stderr
            assert step["error"]["code"] == "arguments"
        # the control: allowed, the program does read the value as a command or options
        assert (root / "pwned").exists() is ran, (allowed, res.stdout, res.stderr)


def test_values_not_starting_with_dash_run(tmp_path: Path) -> None:
    root = _injection_project(tmp_path / "p")
    res = _run(root, "execute", "inj", "-p", "v=a-b", "--json")
    assert res.returncode == 0, res.stderr
    assert _called(root) == [["a-b"]]


def test_script_arguments_after_program_text_are_positional(tmp_path: Path) -> None:
    root = _injection_project(tmp_path / "p", command=[
        "sh", "-c", 'printf "%s\\n" "$1" > called.txt', "sh", "{x}"])
    res = _run(root, "execute", "inj", "-p", "v=-rf", "--json")
    assert res.returncode == 0, res.stderr
    assert (root / "called.txt").read_text() == "-rf\n"


def test_shipped_registry_and_plans_validate() -> None:
    repo = Path(__file__).resolve().parents[1]
    res = subprocess.run([*PLANRUN, "validate"], cwd=repo, text=True, capture_output=True,
                         timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


def test_a_nul_in_a_command_or_cwd_is_a_registry_error(tmp_path: Path) -> None:
    _registry, issues = _write(tmp_path, ["ec\x00ho", "{x}", "{h}"])
    assert [(i.code, i.path) for i in issues] == [("registry", "/tools/t/command/0")]
    _registry, issues = _write(tmp_path, ["echo", "{x}", "{h}"], cwd="a\x00b")
    assert [(i.code, i.path) for i in issues] == [("registry", "/tools/t/cwd")]


def test_a_nul_in_a_run_time_value_fails_the_step_before_the_call(tmp_path: Path) -> None:
    root = _injection_project(tmp_path / "p")
    (root / "plans" / "nul.json").write_text(json.dumps({
        "planrun": 1, "goal": "g", "steps": [
            {"id": "a", "tool": "give", "arguments": {"value": "a\x00b"}},
            {"id": "b", "tool": "rec", "depends_on": ["a"],
             "arguments": {"x": "{steps.a.output}"}}]}))
    res = _run(root, "execute", "nul", "--json")
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr
    step = json.loads(res.stdout)["steps"][1]
    assert step["error"]["code"] == "arguments"
    assert "NUL" in step["error"]["message"]
    assert _called(root) == []
