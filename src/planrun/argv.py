"""What a value may become in a command's argv (SPEC §2 "values never become code").

A command tool's ``{name}`` placeholders are checked twice:

- **In ``tools.yaml``** (:func:`check_command`, issues coded ``registry``). The safe form is
  the default: a placeholder is a *whole* argv element. It is refused where a value would
  choose the program (``argv[0]``, the command after ``env``/``timeout``/``sudo``/``xargs``/
  ``find -exec`` …), be an interpreter's option or script operand, or be code: the script
  of ``sh -c`` and every shell (``rbash``, ``su -c``, ``flock -c``, ``script -c``,
  ``sg GROUP``, ``watch``), ``python -c``, ``perl -e``, ``node``/``nodejs -e``, ``awk``/
  ``sed`` programs, the remote command of ``ssh HOST`` and its ``-o`` values, ``git -c``
  values. A placeholder *inside* a larger element (``"echo {x}"``, ``"out-{x}.txt"``) is
  refused, since the program may read the element as anything (an option, a pattern,
  code) — unless it follows the first ``=`` of an ``--option=`` or ``key=`` element of a
  command in which no program known to run code appears (or that is an argument of a
  script, after its program text: the interpreter does not read it), or the tool lists
  the argument in ``allow_embedded`` (never inside code: that stays refused).
- **At run time** (:func:`option_value_problems`, the step fails with code ``arguments``
  before the call; values known at validation are refused there). A value that fills a
  whole element and starts with ``-`` would be read as an option (argument injection:
  ``-rf``, ``--output=/etc/passwd``). It is refused unless an element ``--`` comes before
  it (the end of options) or the tool lists the argument in ``allow_option_values`` (or
  sets it to ``true``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .pointers import pointer

if TYPE_CHECKING:
    from .formats import ToolData

PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_-]*)\}")
_WHOLE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_-]*)\}")
#: ``--option=`` / ``-o=`` / ``key=`` before the first ``=`` of an element.
_ASSIGNMENT = re.compile(r"(?:--?[A-Za-z0-9][A-Za-z0-9_.-]*|[A-Za-z_][A-Za-z0-9_.-]*)=")


def names(element: str) -> list[str]:
    """The argument names of the ``{name}`` placeholders in one argv element."""
    return [m.group(1) for m in PLACEHOLDER.finditer(element) if m.group(1)]


def whole(element: str) -> str | None:
    """The argument name when ``element`` is exactly one placeholder, else None."""
    m = _WHOLE.fullmatch(element)
    return m.group(1) if m else None


_SH_FAMILY = frozenset({
    "sh", "bash", "rbash", "dash", "zsh", "rzsh", "ksh", "rksh", "mksh", "oksh", "loksh",
    "pdksh", "ash", "fish", "csh", "tcsh", "yash", "posh", "osh", "ysh", "elvish", "xonsh",
    "nu", "rc", "es", "su", "runuser", "script"})
_C_FLAG = re.compile(r"[-+][A-Za-z]*c[A-Za-z]*|--command")
#: Interpreter → a pattern matching its program-text flags (the next element is code).
_SCRIPT_FLAG: dict[str, re.Pattern[str]] = {
    "sh": _C_FLAG,
    "python": re.compile(r"-[A-Za-z]*c[A-Za-z]*"),
    "pypy": re.compile(r"-[A-Za-z]*c[A-Za-z]*"),
    "perl": re.compile(r"-[A-Za-z]*[eE][A-Za-z]*"),
    "ruby": re.compile(r"-[A-Za-z]*e[A-Za-z]*"),
    "node": re.compile(r"-[A-Za-z]*[ep][A-Za-z]*|--eval|--print"),
    "bun": re.compile(r"-e|--eval|-p|--print"),
    "php": re.compile(r"-[rBRFE]"),
    "lua": re.compile(r"-e"),
    "luajit": re.compile(r"-e"),
    "Rscript": re.compile(r"-e"),
    "julia": re.compile(r"-e|-E|--eval|--print"),
    "osascript": re.compile(r"-e"),
    "pwsh": re.compile(r"-c|-Command|-command|-EncodedCommand|-e"),
    "powershell": re.compile(r"-c|-Command|-command|-EncodedCommand|-e"),
    "awk": re.compile(r"-e|--source"),
    "sed": re.compile(r"-e|--expression|-[A-Za-z]*e"),
    "flock": _C_FLAG,
}
_ALIASES = {"nodejs": "node", "gawk": "awk", "mawk": "awk", "nawk": "awk", "gsed": "sed",
            "tclsh": "tcl", "wish": "tcl", "jshell": "java"}

#: Programs that run a program named by their first operand (after their options, and
#: after the number of leading operands given): short options that take a value.
_WRAPPERS: dict[str, tuple[str, int]] = {
    "env": ("uCS", 0), "timeout": ("sk", 1), "nice": ("n", 0), "nohup": ("", 0),
    "setsid": ("", 0), "stdbuf": ("ioe", 0), "sudo": ("ugCDhprtUT", 0), "doas": ("uC", 0),
    "xargs": ("adEILnPs", 0), "time": ("fo", 0), "strace": ("abeEIoOpPsSuX", 0),
    "ltrace": ("aeEnoOpPsuX", 0), "chroot": ("", 1), "ionice": ("cnp", 0),
    "taskset": ("", 1), "chrt": ("", 1), "unbuffer": ("", 0), "fakeroot": ("", 0),
    "nsenter": ("tSGUn", 0), "unshare": ("", 0), "systemd-run": ("upEM", 0),
    "firejail": ("", 0), "bwrap": ("", 0), "exec": ("a", 0), "command": ("", 0),
    "builtin": ("", 0), "caffeinate": ("", 0), "watch": ("dn", 0), "flock": ("wEn", 1),
    "runuser": ("ugl", 0), "busybox": ("", 0), "parallel": ("", 0), "npx": ("p", 0),
    "uv": ("", 0), "poetry": ("", 0), "pipx": ("", 0),
}

#: Programs known to run code given in their arguments or options (a ``key={x}`` element
#: of a command naming any of them is not safe: ``git -c core.pager=…``, ``ssh -o
#: ProxyCommand=…``, ``tar --to-command=…``, ``make CC=…``, ``rsync --rsh=…``).
RUNS_CODE = frozenset(_SH_FAMILY | set(_SCRIPT_FLAG) | set(_ALIASES) | set(_WRAPPERS) | {
    "ssh", "scp", "sftp", "rsync", "git", "make", "gmake", "cmake", "tar", "zip", "unzip",
    "find", "vim", "vi", "nvim", "ex", "emacs", "less", "more", "man", "gdb", "lldb",
    "docker", "podman", "kubectl", "psql", "mysql", "sqlite3", "expect", "tmux", "screen",
    "at", "batch", "crontab", "npm", "yarn", "pnpm", "pip", "pip3", "java", "tcl", "deno",
    "sg", "newgrp", "xdg-open", "open", "eval", "source", "perl", "python", "ruby",
    "dtach", "nohup", "mail", "mutt", "ftp", "nc", "ncat", "socat", "busybox", "toybox",
    "dpkg", "rpm", "apt", "apt-get", "yum", "dnf", "brew", "systemctl", "pkexec", "gpg",
    "m4"})


def program(element: str) -> str:
    """The program an argv element names: ``/usr/bin/python3.11`` → ``python``."""
    prog = Path(element).name
    base = prog.rstrip("0123456789.")  # linear, whatever the name (no regex)
    for name in (prog, base):
        if name in _ALIASES:
            return _ALIASES[name]
        if name in _SH_FAMILY:
            return "sh"
    return base or prog


@dataclass
class Positions:
    """Indices of a command's argv where a value would not be a plain argument.

    Attributes:
        programs: a value there names the program to run.
        scripts: a value there is code (shell text, a program, a remote command).
        options: an interpreter's options or script operand (flags that choose the code).
    """

    programs: set[int] = field(default_factory=set)
    scripts: set[int] = field(default_factory=set)
    options: set[int] = field(default_factory=set)


def _after_options(argv: list[str], start: int, takes_value: str, skip: int,
                   assignments: bool = False) -> int | None:
    """Index of the first operand after ``argv[start]``'s options (and ``skip`` operands)."""
    j = start + 1
    while j < len(argv):
        element = argv[j]
        if element == "--":
            j += 1
            break
        if element.startswith("-") and element != "-":
            letter = element[1:2]
            if not element.startswith("--") and len(element) == 2 and letter in takes_value:
                j += 2
            else:
                j += 1
            continue
        if assignments and "=" in element:
            j += 1
            continue
        if skip:
            skip -= 1
            j += 1
            continue
        return j
    if j < len(argv) and not skip:
        return j
    return None


def _special(argv: list[str], i: int, prog: str, pos: Positions) -> None:
    """Programs whose code positions are not a flag before the code (ssh, git, watch …)."""
    n = len(argv)
    if prog == "ssh":
        # options with a value; the first operand is the host, the rest a remote command
        j = i + 1
        while j < n and argv[j].startswith("-") and argv[j] != "--":
            if argv[j] in ("-o", "-F", "-J", "-W") or argv[j].startswith("-o"):
                if argv[j] == "-o" or len(argv[j]) == 2:
                    pos.scripts.add(j + 1)
                    j += 2
                    continue
                pos.scripts.add(j)  # -oProxyCommand=…
            elif len(argv[j]) == 2 and argv[j][1] in "bcDEeIiLlmOpQRSw":
                j += 2
                continue
            j += 1
        if j < n and argv[j] == "--":
            j += 1
        pos.scripts.update(range(j + 1, n))  # after the host: a shell command line
    elif prog == "git":
        j = i + 1
        while j < n and argv[j].startswith("-"):
            if argv[j] in ("-c", "--config-env") and j + 1 < n:
                pos.scripts.add(j + 1)
                j += 2
            elif argv[j].startswith(("--config-env=", "--exec-path=")):
                pos.scripts.add(j)
                j += 1
            elif argv[j] in ("-C", "--git-dir", "--work-tree", "--namespace") and j + 1 < n:
                j += 2
            else:
                j += 1
        if j < n:
            pos.programs.add(j)  # the subcommand (an alias may run a shell)
    elif prog == "watch":
        exec_form = any(a in ("-x", "--exec") for a in argv[i + 1:])
        first = _after_options(argv, i, _WRAPPERS["watch"][0], 0)
        if first is not None:
            if exec_form:
                pos.programs.add(first)
            else:
                pos.scripts.update(range(first, n))  # joined and given to sh -c
    elif prog == "sg":
        first = _after_options(argv, i, "", 1)  # sg GROUP [-c] COMMAND
        if first is not None:
            pos.scripts.add(first + 1 if argv[first] == "-c" else first)
    elif prog == "find":
        for j in range(i + 1, n - 1):
            if argv[j] in ("-exec", "-execdir", "-ok", "-okdir"):
                pos.programs.add(j + 1)
    elif prog == "env":
        for j in range(i + 1, n):
            if argv[j] in ("-S", "--split-string") and j + 1 < n:
                pos.scripts.add(j + 1)
            elif argv[j].startswith(("--split-string=", "-S")) and argv[j] != "-S":
                pos.scripts.add(j)


def analyse(argv: list[str]) -> Positions:
    """Where in ``argv`` a value would choose the program, its flags or its code.

    Interpreters are found wherever they appear (after ``env``, ``timeout``, ``sudo``,
    ``xargs``, ``find -exec`` …). Elements after an interpreter's program text are its
    arguments (``$0``, ``$1``, …) and are fine.
    """
    pos = Positions()
    for i, element in enumerate(argv):
        prog = program(element)
        _special(argv, i, prog, pos)
        if prog in _WRAPPERS and not (prog == "flock" and any(
                _C_FLAG.fullmatch(a) for a in argv[i + 1:])):
            values, skip = _WRAPPERS[prog]
            if prog != "watch":
                first = _after_options(argv, i, values, skip, assignments=prog == "env")
                if first is not None:
                    pos.programs.add(first)
        flag = _SCRIPT_FLAG.get(prog)
        if flag is None:
            continue
        found = [j for j in range(i + 1, len(argv)) if flag.fullmatch(argv[j])
                 or (argv[j].startswith("--") and "=" in argv[j]
                     and flag.fullmatch(argv[j].split("=", 1)[0]))]
        if found:
            for j in found:
                if "=" in argv[j]:
                    pos.scripts.add(j)
                elif j + 1 < len(argv):
                    pos.scripts.add(j + 1)
            last = max(pos.scripts | set(found))
            pos.options.update(k for k in range(i + 1, last) if k not in pos.scripts)
            break  # what follows the program text are its arguments ($0, $1, …)
        if prog == "flock":
            continue  # flock FILE COMMAND: COMMAND is a program (a wrapper, above)
        # no program-text flag: up to the first operand (the script file or program) is
        # options, and that operand is code
        for k in range(i + 1, len(argv)):
            pos.options.add(k)
            if not argv[k].startswith(("-", "+")) or argv[k] in ("-", "+"):
                break
    return pos


def runs_code(argv: list[str]) -> bool:
    """Whether any element of ``argv`` names a program known to run code it is given."""
    return any(program(element) in RUNS_CODE for element in argv if not names(element))


def _allowed(entry: ToolData, field_name: str) -> set[str] | None:
    """The argument names a tool lists in ``field_name``; None for ``true`` (all)."""
    value = getattr(entry, field_name, None)
    if value is True:
        return None
    return set(value or [])


def check_command(name: str, entry: ToolData, contract: dict[str, Any],
                  add: Callable[[str, str], None]) -> None:
    """Registry issues for a command's placeholders (see the module docstring).

    Args:
        name: the tool's name.
        entry: its ``tools.yaml`` entry (``command``, ``allow_embedded``,
            ``allow_option_values``).
        contract: the JSON Schema of its arguments.
        add: called with (JSON Pointer, message) per issue (code ``registry``).
    """
    argv = entry.command or []
    props = contract.get("properties") if isinstance(contract.get("properties"), dict) else {}
    props = props or {}
    required = set(contract.get("required") or [])
    pos = analyse(argv)
    embedded_ok = _allowed(entry, "allow_embedded")
    for fld in ("allow_embedded", "allow_option_values"):
        listed = _allowed(entry, fld)
        for arg in sorted(listed or []):
            if arg not in props:
                add(pointer("tools", name, fld),
                    f"tool {name!r}: {fld} names {arg!r}, which is not a declared argument")
    for idx, element in enumerate(argv):
        if "\x00" in element:
            add(pointer("tools", name, "command", idx), f"tool {name!r}: command element "
                f"{idx} holds a NUL character, which no command line can carry")
    if entry.cwd is not None and "\x00" in entry.cwd:
        add(pointer("tools", name, "cwd"), f"tool {name!r}: cwd holds a NUL character, "
            "which no path can carry")
    code_anywhere = runs_code(argv)
    # after an interpreter's program text come the script's own arguments ($1, …)
    script_args = min(pos.scripts) + 1 if pos.scripts else len(argv)
    for idx, element in enumerate(argv):
        found = names(element)
        if not found:
            continue
        where = pointer("tools", name, "command", idx)
        if idx == 0 or idx in pos.programs:
            add(where, f"tool {name!r}: {{{found[0]}}} is in the program to run "
                f"({element!r}); a value may not choose the program: name the program in "
                "the command and pass the value as a separate argument")
            continue
        if idx in pos.options and idx not in pos.scripts:
            add(where, f"tool {name!r}: {{{found[0]}}} is in an interpreter's option or "
                f"script ({element!r}); a value may not choose the program, its flags or its "
                "code: pass it as a separate argument after the script")
            continue
        if idx in pos.scripts:
            before = f"{argv[idx - 1]} " if idx else ""
            add(where, f"tool {name!r}: {{{found[0]}}} is inside shell script text "
                f"({before}{element!r}); a value must become exactly one argv element, "
                "never code: pass it as a separate argument and use \"$1\" (or an "
                "environment variable)")
            continue
        if whole(element) is None:
            assignment = _ASSIGNMENT.match(element)
            after_eq = (assignment is not None and not names(element[:assignment.end()])
                        and (not code_anywhere or idx >= script_args))
            for arg in found:
                if after_eq or embedded_ok is None or arg in embedded_ok:
                    continue
                add(where, f"tool {name!r}: {{{arg}}} is embedded in the argv element "
                    f"{element!r}; the program may read a value there as an option, a "
                    "pattern or code. Make it a whole element (\"{" + arg + "}\"), or put "
                    "it after '=' of an --option= or key= element (not allowed when the "
                    "command runs a program known to run code), or list it in "
                    "allow_embedded")
        for arg in found:
            if arg not in props:
                add(where, f"tool {name!r}: command element {element!r} names {{{arg}}}, "
                    "which is not a declared argument")
                continue
            if arg not in required:
                add(where, f"tool {name!r}: {{{arg}}} in the command must be a required "
                    "argument (an absent value cannot fill an argv element)")
            schema = props.get(arg)
            declared = schema.get("type") if isinstance(schema, dict) else None
            types = declared if isinstance(declared, list) else [declared]
            if any(t in ("array", "object") for t in types):
                add(where, f"tool {name!r}: {{{arg}}} is an {types[0]}; only a scalar can "
                    "fill an argv element (the full arguments are on stdin as JSON)")


def _option_like(argv: list[str], entry: ToolData) -> Iterator[tuple[int, str]]:
    """(index, argument name) of whole-element placeholders a value could make an option.

    Not after ``--``, not a script's own arguments, not listed in ``allow_option_values``.
    """
    allowed = _allowed(entry, "allow_option_values")
    if allowed is None:
        return
    scripts = analyse(argv).scripts
    # after an interpreter's program text come the script's own arguments ($1, …)
    script_args = min(scripts) + 1 if scripts else len(argv)
    for idx, element in enumerate(argv):
        if element == "--" or idx >= script_args:
            return
        arg = whole(element)
        if arg is not None and arg not in allowed:
            yield idx, arg


def option_value_problems(entry: ToolData, arguments: dict[str, Any]
                          ) -> list[tuple[str, str]]:
    """(JSON Pointer inside arguments, message) per value that cannot go on the command line.

    A value that would become an option (see the module docstring), or that holds a NUL
    character (no argv element can). Only concrete values are checked (a value not known
    yet is checked when it is).
    """
    from .params import render

    out: list[tuple[str, str]] = []
    argv = entry.command or []
    for arg in sorted({n for element in argv for n in names(element)}):
        value = arguments.get(arg)
        if isinstance(value, str) and "\x00" in value:
            out.append((pointer(arg), f"argument {arg!r} holds a NUL character, which no "
                        "command line can carry (the arguments are also on stdin as JSON)"))
    for idx, arg in _option_like(argv, entry):
        value = arguments.get(arg)
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            continue
        text = value if isinstance(value, str) else render(value)
        if text.startswith("-"):
            shown = text if len(text) <= 40 else text[:37] + "..."
            out.append((pointer(arg), f"argument {arg!r} is {shown!r}, which starts with "
                        f"'-': {program(argv[0])} would read it as an option (argv element "
                        f"{idx}). The tool can put \"--\" before it in its command, or allow "
                        "it with allow_option_values"))
    return out
