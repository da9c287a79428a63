"""What a value may become in a command's argv (SPEC §2 "values never become code").

A command tool's ``{name}`` placeholders are checked twice:

- **In ``tools.yaml``** (:func:`check_command`, issues coded ``registry``). The safe form is
  the default: a placeholder is a *whole* argv element. It is refused where a value would
  choose the program (``argv[0]``, the command after ``env``/``timeout``/``sudo``/``xargs``/
  ``find -exec`` …), be an interpreter's option or script operand, or be code: the script of
  ``sh -c`` and every shell (``rbash``, ``su -c``, ``flock -c``, ``script -c``,
  ``sg GROUP``, ``watch``), ``python -c``, ``perl -e``, ``node``/``nodejs -e``, ``awk``/``sed``
  programs, the remote command of ``ssh HOST`` and its ``-o`` values, ``git -c`` values.
  Options are read as each program reads them (:data:`_WRAPPERS`, :data:`_INTERPRETERS`):
  ``timeout --signal KILL 10 {x}`` makes ``{x}`` the program. An option planrun cannot place
  (a long option without ``=`` it does not know, a short letter it does not know at the end
  of its element, ``xargs -0n 1``) is read *both ways*, taking the next element as its value
  and not, and a placeholder that either reading makes the program, code or an interpreter's
  option is refused (:func:`operands`): the message names the option and the fix (its value
  in the same element, ``--signal=KILL``, or ``--`` after the options). A placeholder
  *inside* a larger element (``"echo {x}"``, ``"out-{x}.txt"``) is refused, since the
  program may read the element as anything (an option, a pattern, code) — unless it follows
  the first ``=`` of an ``--option=`` or ``key=`` element of a command in which no program
  known to run code appears (or that is an argument of a script, after its program text: the
  interpreter does not read it), or the tool lists the argument in ``allow_embedded`` (never
  inside code: that stays refused).
- **At run time** (:func:`option_value_problems`, the step fails with code ``arguments``
  before the call; values known at validation are refused there). A value that fills a
  whole element and starts with ``-``, ``+`` or ``@`` would be read as an option (argument
  injection: ``-rf``, ``--output=/etc/passwd``; ``vim +!CMD``, ``less +CMD``, ``more
  +/PATTERN``, ``sort +1``; ``gcc @FILE``, a response file of options, as clang, ld,
  javac, java, dotnet and many Windows-style tools read). It is refused unless the tool
  lists the argument in ``allow_option_values`` (or sets it to ``true``), or, for ``-``
  only, an element ``--`` (the end of options) comes before it *after the program that
  reads it* (``rm -- {x}``; in ``sudo -- rm {x}`` the ``--`` is sudo's). ``--`` does not
  exempt ``+`` or ``@``: gcc and clang expand ``@FILE`` anywhere in argv, and util-linux
  ``more`` reads ``+/PATTERN`` after ``--``. A script's own arguments, after its program
  text (``sh -c '…' sh {x}``), are never checked: the interpreter does not read them.
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

@dataclass(frozen=True)
class Options:
    """How a program reads its options, as far as planrun knows it.

    What is not listed is read *both ways* (:func:`operands`): an unknown short letter may
    take a value (attached, or the next element when it ends its element), an unknown long
    option without ``=`` may take the next ``arity`` elements or none.

    Attributes:
        values: short letters that take a value (attached, or the next element).
        flags: short letters that take none.
        optional: short letters whose value can only be attached (``xargs -i``).
        long_values: long options that take the next element when written without ``=``.
        long_flags: long options that never take the next element (``--null``,
            ``--preserve-env[=LIST]``).
        code: options whose value is code (``env -S``, ``ssh -o``, ``git -c``).
        ends: options whose value is the program or script, after which come its
            arguments (``python -m MODULE``).
        arity: the most elements an unknown long option may take (``bwrap --bind A B``: 2).
        skip: operands before the program or script (``timeout DURATION``).
        plus: ``+o`` is an option too (shells).
        dash: what a lone ``-`` is: ``operand``, ``option`` (``env -``, ``su -``) or
            ``end`` of options (``sh - FILE``).
        assignments: ``NAME=VALUE`` operands come before the program (``env``).
        subcommand: the first operand is a subcommand that may run a program named by
            its own first operand (``uv run CMD``).
    """

    values: str = ""
    flags: str = ""
    optional: str = ""
    long_values: frozenset[str] = frozenset()
    long_flags: frozenset[str] = frozenset({"--help", "--version"})
    code: frozenset[str] = frozenset()
    ends: frozenset[str] = frozenset()
    arity: int = 1
    skip: int = 0
    plus: bool = False
    dash: str = "operand"
    assignments: bool = False
    subcommand: bool = False


def _opts(values: str = "", flags: str = "", long_values: str = "", long_flags: str = "",
          **kw: Any) -> Options:
    """An :class:`Options` with long options given as space-separated names."""
    for key in ("code", "ends"):
        if key in kw:
            kw[key] = frozenset(kw[key].split())
    return Options(values=values, flags=flags, long_values=frozenset(long_values.split()),
                   long_flags=frozenset(("--help --version " + long_flags).split()), **kw)


#: Programs that run a program named by their first operand (after their options, and
#: after ``skip`` leading operands). Sources: the programs' manuals (GNU coreutils, sudo,
#: util-linux, findutils, procps-ng, strace, ltrace, bubblewrap, firejail).
_WRAPPERS: dict[str, Options] = {
    "env": _opts("uCS", "i0v", "--unset --chdir --split-string --argv0",
                 "--ignore-environment --null --debug --default-signal --ignore-signal "
                 "--block-signal --list-signal-handling", code="S --split-string",
                 dash="option", assignments=True),
    "timeout": _opts("sk", "fpv", "--signal --kill-after",
                     "--foreground --preserve-status --verbose", skip=1),
    "nice": _opts("n", "0123456789", "--adjustment"),
    "nohup": _opts(),
    "setsid": _opts("", "cfw", "", "--ctty --fork --wait"),
    "stdbuf": _opts("ioe", "", "--input --output --error"),
    "sudo": _opts("ugCDprtTUR", "AbEeHiKklnPSsVvBN",
                  "--user --group --close-from --chdir --chroot --host --prompt --role "
                  "--type --other-user --command-timeout",
                  "--askpass --background --bell --preserve-env --edit --set-home --login "
                  "--remove-timestamp --reset-timestamp --list --non-interactive "
                  "--preserve-groups --stdin --shell --validate --no-update"),
    "doas": _opts("uC", "nsL"),
    "xargs": _opts("adEILnPs", "0oprtx", "--arg-file --delimiter --max-args --max-procs "
                   "--max-chars --process-slot-var",
                   "--null --open-tty --interactive --no-run-if-empty --verbose --exit "
                   "--show-limits --eof --replace --max-lines", optional="eil"),
    "time": _opts("fo", "apqv", "--format --output", "--append --portability --quiet "
                  "--verbose"),
    "strace": _opts("abeEIoOpPsSuUX", "cCdDfFhiknqrtTvVwxyzZ"),
    "ltrace": _opts("aADeEFlnoOpPsuwX", "bcCfhiLrStTV"),
    "chroot": _opts("", "", "--userspec --groups", "--skip-chdir", skip=1),
    "ionice": _opts("cnpPu", "t"),
    "taskset": _opts("", "acp", "", "--all-tasks --cpu-list --pid", skip=1),
    "chrt": _opts("TPD", "abdfimoprRv", skip=1),
    "unbuffer": _opts("", "p"),
    "fakeroot": _opts("lisb", "uvh", "--lib --faked", "--unknown-is-real"),
    "nsenter": _opts("tSG", "aFZ", "--target --setuid --setgid",
                     "--all --mount --uts --ipc --net --pid --user --cgroup --time --root "
                     "--wd --no-fork --preserve-credentials --follow-context",
                     optional="muinpUCTrw"),
    "unshare": _opts("SGRw", "fmuinpUCTrc", "--setuid --setgid --root --wd",
                     "--fork --mount --uts --ipc --net --pid --user --cgroup --time "
                     "--map-root-user --map-current-user --mount-proc --kill-child "
                     "--keep-caps"),
    "systemd-run": _opts("upEMH", "tPGdqrSh"),
    "firejail": _opts(arity=0),  # every firejail option is --name or --name=VALUE
    "bwrap": _opts(arity=2),     # --bind SRC DEST
    "exec": _opts("a", "cl"),
    "command": _opts("", "pvV"),
    "builtin": _opts(),
    "caffeinate": _opts("tw", "dimsu"),
    "watch": _opts("nq", "bcegptwxhv", "--interval --equexit",
                   "--beep --color --differences --errexit --chgexit --precise --no-title "
                   "--no-wrap --exec", optional="d"),
    "flock": _opts("wE", "sexnuoFhV", "--timeout --wait --conflict-exit-code --command",
                   "--shared --exclusive --unlock --nonblock --nb --close --no-fork "
                   "--verbose", skip=1),
    "busybox": _opts(),
    "parallel": _opts(),
    "npx": _opts("p", "yq", "--package"),
    "uv": _opts(subcommand=True),
    "poetry": _opts(subcommand=True),
    "pipx": _opts(subcommand=True),
}

#: How interpreters read their options before the script operand (keyed by
#: :func:`program`, or by the name itself for ``su``/``runuser``/``script``).
_INTERPRETERS: dict[str, Options] = {
    # any shell: letters that take a value in one of them (fish -C, ksh -R) are not flags
    "sh": _opts("oO", "abehiklmnrstuvxBEHPTV", "--rcfile --init-file --init-command",
                "--login --noprofile --norc --posix --restricted --verbose --debugger "
                "--noediting --dump-strings --dump-po-strings --interactive --no-config",
                plus=True, dash="end"),
    "su": _opts("gGswu", "flmpPT", "--group --supp-group --shell --whitelist-environment "
                "--user --session-command", "--login --preserve-environment --pty "
                "--no-pty --fast", dash="option", skip=1),
    "script": _opts("BcEIOmoT", "aefq", "--log-io --log-in --log-out --log-timing "
                    "--echo --output-limit --command", "--append --return --flush --force "
                    "--quiet", optional="t"),
    "python": _opts("WXmc", "bBdEhiIOPqRsSuvVx", "--check-hash-based-pycs",
                    "--help-env --help-xoptions --help-all", ends="m"),
    "perl": _opts("IeE", "acnpsStTuUvwWX"),
    "ruby": _opts("", "acdhlnpsSvwy"),
    "node": _opts("rC", "civh", "--require --import --loader --experimental-loader "
                  "--inspect-port --title --input-type --conditions",
                  "--check --interactive --no-warnings --enable-source-maps "
                  "--trace-warnings --expose-gc --preserve-symlinks --pending-deprecation "
                  "--throw-deprecation --trace-deprecation --abort-on-uncaught-exception"),
    "php": _opts("cdfzrBRFEtS", "aCehHilmnqsvw"),
    "lua": _opts("el", "ivEW"),
    "Rscript": _opts("e", "", "", "--vanilla --verbose --no-environ --no-site-file "
                     "--no-init-file --restore --no-restore --save --no-save --no-echo "
                     "--quiet --silent --slave"),
    "julia": _opts("eELptJCH", "ivqh"),
    "osascript": _opts("els", "i"),
    "awk": _opts("fvFeilEW", "bcCghkMNnOPrsStV", "--file --assign --field-separator "
                 "--source --include --load --exec"),
    "sed": _opts("efl", "nrEsuz", "--expression --file --line-length",
                 "--quiet --silent --debug --posix --regexp-extended --separate --sandbox "
                 "--unbuffered --null-data --follow-symlinks --in-place"),
}
_INTERPRETERS["pypy"] = _INTERPRETERS["python"]
_INTERPRETERS["runuser"] = _INTERPRETERS["su"]
_INTERPRETERS["luajit"] = _INTERPRETERS["lua"]

_SSH = _opts("bceilmopBDEFIJLOPQRSwW", "1246afgknqstvxACGKMNTVXYy", code="o F J W I")
_GIT = _opts("Cc", "pPvh", "--git-dir --work-tree --namespace --config-env --super-prefix "
             "--list-cmds --attr-source",
             "--paginate --no-pager --bare --no-replace-objects --literal-pathspecs "
             "--glob-pathspecs --noglob-pathspecs --icase-pathspecs --no-optional-locks "
             "--no-advice --html-path --man-path --info-path --exec-path",
             code="c --config-env --exec-path")

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
        uncertain: index → the option that makes it so under one reading only (planrun
            cannot tell whether that option takes the next element as its value).
        starts: where a program or script that reads the elements after it may begin
            (``argv[0]``, every program position, an interpreter's script operand): a
            ``--`` ends the options of the program it follows only.
    """

    programs: set[int] = field(default_factory=set)
    scripts: set[int] = field(default_factory=set)
    options: set[int] = field(default_factory=set)
    uncertain: dict[int, str] = field(default_factory=dict)
    starts: set[int] = field(default_factory=lambda: {0})

    def add(self, kind: str, where: dict[int, str | None]) -> None:
        """Add the indices of ``where`` to ``kind``, noting why each is uncertain."""
        target: set[int] = getattr(self, kind)
        for idx, why in where.items():
            certain = idx in target and idx not in self.uncertain
            target.add(idx)
            if why is None:
                self.uncertain.pop(idx, None)
            elif not certain:
                self.uncertain.setdefault(idx, why)


@dataclass
class Operands:
    """Where a program's operands may start, under every reading of its options.

    Attributes:
        first: index of the first operand after the options (and ``skip`` operands) →
            None when every reading agrees on it, else the option read both ways. The
            index ``len(argv)`` stands for "no operand follows".
        code: elements holding the value of a ``code`` option (or the element itself when
            the value is attached).
    """

    first: dict[int, str | None] = field(default_factory=dict)
    code: dict[int, str | None] = field(default_factory=dict)

    @staticmethod
    def _note(into: dict[int, str | None], idx: int, why: str | None) -> None:
        if why is None or idx not in into:
            into[idx] = why


def _option_reads(element: str, spec: Options) -> tuple[set[int], int | None, bool]:
    """How one option element may be read.

    Returns:
        (the numbers of following elements it may take, the offset of a ``code`` or
        ``ends`` option's value: 0 attached, 1 the next element, or None; whether that
        option ``ends`` the options).
    """
    if element.startswith("--"):
        name, eq, _value = element.partition("=")
        special = 0 if eq else 1
        hit = name in spec.code or name in spec.ends
        if eq:
            return {0}, (0 if hit else None), name in spec.ends
        if name in spec.long_values:
            return {1}, (special if hit else None), name in spec.ends
        if name in spec.long_flags:
            return {0}, None, False
        return set(range(spec.arity + 1)), None, False
    counts: set[int] = set()
    body = element[1:]
    for k, letter in enumerate(body):
        last = k == len(body) - 1
        if letter in spec.values:
            counts.add(1 if last else 0)
            hit = letter in spec.code or letter in spec.ends
            offset = (1 if last else 0) if hit else None
            return counts, offset, letter in spec.ends and counts == {1 if last else 0}
        if letter in spec.optional:
            counts.add(0)
            return counts, None, False
        if letter in spec.flags:
            if last:
                counts.add(0)
            continue
        counts.add(0)  # it may take the rest of the element as its value …
        if last:
            counts.add(1)  # … or the next element
    return counts, None, False


def operands(argv: list[str], start: int, spec: Options) -> Operands:
    """Where the operands after ``argv[start]``'s options may start (see :class:`Options`).

    Every reading is followed: an option planrun cannot place (:class:`Options`) is read
    both as taking the next element and as not taking it, so a caller that refuses a
    placeholder at any of ``first`` refuses it under either reading.
    """
    out = Operands()
    n = len(argv)
    todo: list[tuple[int, int, str | None]] = [(start + 1, spec.skip, None)]
    seen: set[tuple[int, int, str | None]] = set()
    while todo:
        state = todo.pop()
        if state in seen:
            continue
        seen.add(state)
        j, left, why = state
        if j >= n:
            Operands._note(out.first, n, why)
            continue
        element = argv[j]
        if element == "--" or (element == "-" and spec.dash == "end"):
            Operands._note(out.first, min(j + 1 + left, n), why)
            continue
        if element == "-" and spec.dash == "option":
            todo.append((j + 1, left, why))
            continue
        if len(element) > 1 and (element[0] == "-" or (spec.plus and element[0] == "+")):
            counts, offset, ends = _option_reads(element, spec)
            reason = why if why is not None or len(counts) == 1 else element
            if offset is not None and j + offset < n:
                Operands._note(out.code, j + offset, reason)
            if ends and offset is not None:  # python -m MODULE: MODULE is the script
                Operands._note(out.first, min(j + offset, n), reason)
                continue
            for count in counts:
                todo.append((j + 1 + count, left, reason))
            continue
        if spec.assignments and "=" in element and not element.startswith("="):
            todo.append((j + 1, left, why))
            continue
        if left:
            todo.append((j + 1, left - 1, why))
            continue
        Operands._note(out.first, j, why)
    return out


def _raw(element: str) -> str:
    """``/usr/bin/runuser`` → ``runuser`` (the name, before aliases and families)."""
    prog = Path(element).name
    return prog.rstrip("0123456789.") or prog


def _special(argv: list[str], i: int, prog: str, pos: Positions) -> None:
    """Programs whose code positions are not a flag before the code (ssh, git, watch …)."""
    n = len(argv)
    if prog == "ssh":
        # options (-o, -F, -J … values are code); the first operand is the host, the rest
        # a remote command
        ops = operands(argv, i, _SSH)
        pos.add("scripts", ops.code)
        if ops.first:
            host = min(ops.first)
            pos.add("scripts", {k: ops.first[host] for k in range(host + 1, n)})
    elif prog == "git":
        ops = operands(argv, i, _GIT)
        pos.add("scripts", ops.code)
        pos.add("programs", ops.first)  # the subcommand (an alias may run a shell)
    elif prog == "watch":
        exec_form = any(a in ("-x", "--exec") for a in argv[i + 1:])
        ops = operands(argv, i, _WRAPPERS["watch"])
        if exec_form:
            pos.add("programs", ops.first)
        elif ops.first:
            first = min(ops.first)  # joined and given to sh -c
            pos.add("scripts", {k: ops.first[first] for k in range(first, n)})
    elif prog == "sg":
        ops = operands(argv, i, _opts(skip=1, dash="option"))  # sg [-] GROUP [-c] COMMAND
        for first, why in ops.first.items():
            if first < n:
                pos.add("scripts", {first + 1 if argv[first] == "-c" else first: why})
    elif prog == "find":
        for j in range(i + 1, n - 1):
            if argv[j] in ("-exec", "-execdir", "-ok", "-okdir"):
                pos.programs.add(j + 1)


def analyse(argv: list[str]) -> Positions:
    """Where in ``argv`` a value would choose the program, its flags or its code.

    Interpreters are found wherever they appear (after ``env``, ``timeout``, ``sudo``,
    ``xargs``, ``find -exec`` …). Elements after an interpreter's program text are its
    arguments (``$0``, ``$1``, …) and are fine. Options are read as :func:`operands`
    does: one that planrun cannot place is read both ways, and a position that is the
    program, code or an interpreter's option under either reading is one
    (:attr:`Positions.uncertain` says which option).
    """
    pos = Positions()
    n = len(argv)
    for i, element in enumerate(argv):
        prog = program(element)
        _special(argv, i, prog, pos)
        if prog in _WRAPPERS and prog != "watch" and not (prog == "flock" and any(
                _C_FLAG.fullmatch(a) for a in argv[i + 1:])):
            spec = _WRAPPERS[prog]
            ops = operands(argv, i, spec)
            pos.add("scripts", ops.code)
            pos.add("programs", ops.first)
            if spec.subcommand:  # uv run CMD: the subcommand's first operand too
                for sub in list(ops.first):
                    pos.add("programs", operands(argv, sub, spec).first)
        flag = _SCRIPT_FLAG.get(prog)
        if flag is None:
            continue
        found = [j for j in range(i + 1, n) if flag.fullmatch(argv[j])
                 or (argv[j].startswith("--") and "=" in argv[j]
                     and flag.fullmatch(argv[j].split("=", 1)[0]))]
        if found:
            for j in found:
                if "=" in argv[j]:
                    pos.scripts.add(j)
                elif j + 1 < n:
                    pos.scripts.add(j + 1)
            last = max(pos.scripts | set(found))
            pos.options.update(k for k in range(i + 1, last) if k not in pos.scripts)
            break  # what follows the program text are its arguments ($0, $1, …)
        if prog == "flock":
            continue  # flock FILE COMMAND: COMMAND is a program (a wrapper, above)
        # no program-text flag: the options (and their values, under every reading) and
        # the first operand (the script file or program, which is code)
        spec = _INTERPRETERS.get(_raw(element)) or _INTERPRETERS.get(prog) or _opts()
        ops = operands(argv, i, spec)
        ends: dict[int, str | None] = {}
        for k, why in ops.first.items():  # no operand: every element is an option
            Operands._note(ends, min(k, n - 1), why)
        if not ends:
            continue
        certain = max((k for k, why in ends.items() if why is None), default=i)
        last = max(ends)
        pos.add("options", {k: None if k <= certain else ends[last]
                            for k in range(i + 1, last + 1)})
        pos.starts.update(ends)  # the script, which reads its own arguments
    pos.starts |= pos.programs
    for kind in (pos.programs, pos.scripts, pos.options, pos.starts):
        kind.discard(n)  # "no operand follows"
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


def _unsure(pos: Positions, idx: int) -> str:
    """Why ``idx`` is refused under one reading only ("" when every reading agrees)."""
    option = pos.uncertain.get(idx)
    if option is None:
        return ""
    joined = f"{option.split('=')[0]}=VALUE" if option.startswith("--") else f"{option}VALUE"
    return (f" under one reading (planrun cannot tell whether the option {option!r} takes "
            f"the next element as its value, so both readings must be safe: write its "
            f"value in the same element, {joined!r}, or put \"--\" after the options)")


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
        unsure = _unsure(pos, idx)
        if idx == 0 or idx in pos.programs:
            add(where, f"tool {name!r}: {{{found[0]}}} is in the program to run "
                f"({element!r}){unsure}; a value may not choose the program: name the "
                "program in the command and pass the value as a separate argument")
            continue
        if idx in pos.options and idx not in pos.scripts:
            add(where, f"tool {name!r}: {{{found[0]}}} is in an interpreter's option or "
                f"script ({element!r}){unsure}; a value may not choose the program, its "
                "flags or its code: pass it as a separate argument after the script")
            continue
        if idx in pos.scripts:
            before = f"{argv[idx - 1]} " if idx else ""
            add(where, f"tool {name!r}: {{{found[0]}}} is inside shell script text "
                f"({before}{element!r}){unsure}; a value must become exactly one argv "
                "element, never code: pass it as a separate argument and use \"$1\" (or "
                "an environment variable)")
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


def _option_like(argv: list[str], entry: ToolData) -> Iterator[tuple[int, str, int, bool]]:
    """Whole-element placeholders a value could make an option.

    Yields (index, argument name, index of the program that reads it, whether a ``--``
    ends that program's options before it). Not a script's own arguments (after its
    program text), not listed in ``allow_option_values``. A ``--`` counts only after the
    program that reads the element (the last of :attr:`Positions.starts` before it, under
    every reading): in ``sudo -- rm {x}`` it ends sudo's options, not rm's.
    """
    allowed = _allowed(entry, "allow_option_values")
    if allowed is None:
        return
    pos = analyse(argv)
    # after an interpreter's program text come the script's own arguments ($1, …)
    script_args = min(pos.scripts) + 1 if pos.scripts else len(argv)
    for idx, element in enumerate(argv[:script_args]):
        arg = whole(element)
        if arg is None or arg in allowed:
            continue
        reader = max((k for k in pos.starts if k < idx), default=0)
        yield idx, arg, reader, "--" in argv[reader + 1:idx]


#: A value's first character → how a program may read it (:func:`option_value_problems`).
_OPTION_STARTS = {
    "-": "an option",
    "+": "an option or a command (+CMD)",
    "@": "a file of options (@FILE)",
}


def option_value_problems(entry: ToolData, arguments: dict[str, Any]
                          ) -> list[tuple[str, str]]:
    """(JSON Pointer inside arguments, message) per value that cannot go on the command line.

    A value that would become an option (see the module docstring): one that fills a whole
    element and starts with ``-`` (unless ``--`` ends the options of the program reading
    it), ``+`` or ``@`` (whatever comes before it: ``more`` reads ``+/PATTERN`` and ``gcc``
    reads ``@FILE`` after ``--``), unless the tool lists the argument in
    ``allow_option_values``; or a value that holds a NUL character (no argv element can).
    Only concrete values are checked (a value not known yet is checked when it is). The
    step fails with code ``arguments`` (at validation when the value is known then).
    """
    from .params import render

    out: list[tuple[str, str]] = []
    argv = entry.command or []
    for arg in sorted({n for element in argv for n in names(element)}):
        value = arguments.get(arg)
        if isinstance(value, str) and "\x00" in value:
            out.append((pointer(arg), f"argument {arg!r} holds a NUL character, which no "
                        "command line can carry (the arguments are also on stdin as JSON)"))
    for idx, arg, reader, ended in _option_like(argv, entry):
        value = arguments.get(arg)
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            continue
        text = value if isinstance(value, str) else render(value)
        first = text[:1]
        if first not in _OPTION_STARTS or (first == "-" and ended):
            continue
        shown = text if len(text) <= 40 else text[:37] + "..."
        fix = ("The tool can put \"--\" before it in its command, or allow it with "
               "allow_option_values" if first == "-" else "The tool can allow it with "
               "allow_option_values (\"--\" does not help: some programs read '+…' and "
               "'@FILE' after it)")
        out.append((pointer(arg), f"argument {arg!r} is {shown!r}, which starts with "
                    f"{first!r}: {program(argv[reader])} would read it as "
                    f"{_OPTION_STARTS[first]} (argv element {idx}). {fix}"))
    return out
