"""Tools' writes while a run is driven: secrets masked on the way out (``planrun.masking``).

The masker is fed text in pieces (a secret may be split across two writes); the stream
redirection is exercised in a real child python process (real file descriptors 1 and 2,
a real child process of it), as a tool's writes reach planrun's stderr.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from planrun.masking import Masker
from planrun.redact import MASK, Secrets


def feed_all(masker: Masker, pieces: list[str]) -> str:
    return "".join(masker.feed(p) for p in pieces) + masker.flush()


def test_no_secret_passes_text_through_untouched() -> None:
    masker = Masker(Secrets({}))
    assert masker.forms == []
    assert masker.feed("abc") == "abc"
    assert masker.held == ""
    assert masker.flush() == ""
    empty = Masker(Secrets({"e": ""}))
    assert empty.feed("abc") == "abc"


def test_a_whole_secret_in_one_piece() -> None:
    masker = Masker(Secrets({"s": "hunter2"}))
    assert masker.feed("pw=hunter2;\n") == f"pw={MASK};\n"
    assert masker.held == ""


@pytest.mark.parametrize("cut", range(1, 7))
def test_a_secret_split_across_two_writes_is_masked(cut: int) -> None:
    masker = Masker(Secrets({"s": "hunter2"}))
    first = masker.feed("pw=" + "hunter2"[:cut])
    assert first == "pw="
    assert masker.held == "hunter2"[:cut]
    assert masker.feed("hunter2"[cut:] + " ok") + masker.flush() == f"{MASK} ok"


def test_the_longest_possible_start_is_held_back() -> None:
    masker = Masker(Secrets({"s": "abab"}))
    assert masker.feed("xaba") == "x"
    assert masker.held == "aba"
    assert masker.feed("b!") == f"{MASK}!"


def test_a_start_that_turns_out_not_to_be_a_secret_is_given_back() -> None:
    masker = Masker(Secrets({"s": "hunter2"}))
    assert masker.feed("hunt") == ""
    assert masker.feed("ing\n") == "hunting\n"
    assert masker.feed("hun") == ""
    assert masker.flush() == "hun"
    assert masker.held == ""
    assert masker.flush() == ""


def test_a_text_ending_inside_no_secret_is_not_held() -> None:
    masker = Masker(Secrets({"s": "hunter2"}))
    assert masker.feed("abc") == "abc"
    assert masker.feed("h") == ""  # one character: a possible start
    assert masker.feed("x") == "hx"


def test_every_spelling_and_overlapping_secrets() -> None:
    masker = Masker(Secrets({"short": "abc", "long": "abcdef", "q": 'a"b'}))
    assert feed_all(masker, ["abcdef abc ", 'a\\"b a"b']) == f"{MASK} {MASK} {MASK} {MASK}"
    assert feed_all(masker, ["abcd", "ef"]) == MASK


CHILD = textwrap.dedent('''
    import os, subprocess, sys
    from planrun import masking
    from planrun.redact import Secrets

    secrets = Secrets({"s": "hunter2"})
    keep = sys.argv[1] == "keep"
    with masking.masked_output(secrets, (lambda: True) if keep else None):
        print("print hunter2")
        sys.stdout.write("split hun")
        sys.stdout.write("ter2\\n")
        sys.stderr.write("err hunter2\\n")
        os.write(1, b"fd1 hunter2\\n")
        os.write(2, b"fd2 hunter2\\n")
        sys.stdout.flush()
        subprocess.run([sys.executable, "-c", "print('child hunter2', flush=True)"])
        masking.diagnostics().write("own hunter2\\n")
        masking.diagnostics().flush()
        assert not sys.stdout.isatty()
        assert sys.stderr.fileno() == 2
    print("after-out hunter2", flush=True)
    print("after-err hunter2", file=sys.stderr, flush=True)
    os.write(2, b"after-fd2 hunter2\\n")
''')


def run_child(mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True,
                          text=True, timeout=60, check=True)


def test_masked_output_masks_every_way_a_tool_writes() -> None:
    done = run_child("give-back")
    # the pipe's thread and planrun's own direct writes interleave: look for pieces
    for piece in ("print ***", "split ***", "err ***", "fd1 ***", "fd2 ***", "child ***",
                  "own hunter2", "after-err hunter2", "after-fd2 hunter2"):
        assert piece in done.stderr, done.stderr
    assert done.stdout == "after-out hunter2\n"
    assert done.stderr.count("hunter2") == 3, done.stderr  # own words, and after


def test_masked_output_kept_until_exit_when_calls_are_abandoned() -> None:
    done = run_child("keep")
    assert done.stdout == "after-out hunter2\n"  # stdout is given back
    assert "after-err ***" in done.stderr, done.stderr  # stderr stays masked
    assert done.stderr.count("hunter2") == 1, done.stderr  # only planrun's own words


def test_masked_output_without_secrets_changes_nothing() -> None:
    code = textwrap.dedent('''
        import sys
        from planrun import masking
        from planrun.redact import Secrets
        out = sys.stdout
        with masking.masked_output(Secrets({})):
            assert sys.stdout is out
            assert masking.diagnostics() is sys.stderr
            print("plain hunter2")
    ''')
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout == "plain hunter2\n"


def test_a_short_secret_that_starts_a_longer_one_is_held_not_masked_early() -> None:
    """Item 9 in a stream: ``abcd`` then ``ef`` is ``abcdef``, one whole mask."""
    masker = Masker(Secrets({"short": "abc", "long": "abcdef"}))
    assert masker.feed("x abcd") == "x "
    assert masker.feed("ef y") == f"{MASK} y"
    assert masker.feed("abcd") == ""
    assert masker.flush() == f"{MASK}d"  # the stream ends: the short secret is masked
    assert masker.feed("zab") == "z"  # "ab" may start "abcdef"
    assert masker.feed("cx") == f"{MASK}x"


def test_a_secret_ending_where_a_longer_one_could_start() -> None:
    masker = Masker(Secrets({"a": "zab", "b": "abcdef"}))
    assert masker.feed("zab") == ""  # "ab" may start "abcdef"; "zab" waits with it
    assert masker.feed("x") == f"{MASK}x"
    assert feed_all(masker, ["zabcdef"]) == f"{MASK}cdef"


def _child(body: str) -> subprocess.CompletedProcess[str]:
    """Run ``body`` in a real python child with ``masking``, ``Secrets`` and ``secrets``
    (the one secret ``hunter2``) in scope; its stdout and stderr captured."""
    code = textwrap.dedent('''
        import os, sys
        from planrun import masking
        from planrun.redact import Secrets
        secrets = Secrets({"s": "hunter2"})
    ''') + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)


def test_a_held_back_tail_is_written_when_the_masking_ends() -> None:
    """The last write ends with what could start a secret (``hunt``): held back while more
    could follow, then written as it is when the pipe closes — never lost."""
    done = _child('''
        with masking.masked_output(secrets):
            os.write(2, b"last words hunt")
    ''')
    assert done.stderr.endswith("last words hunt"), done.stderr
    assert "Traceback" not in done.stderr


def test_own_words_go_to_a_stderr_that_is_not_file_descriptor_2(tmp_path: Path) -> None:
    """``sys.stderr`` replaced by a file (another descriptor): planrun's own lines go
    there, not to descriptor 2; a tool's writes are masked either way."""
    log = tmp_path / "stderr.txt"
    done = _child(f'''
        sys.stderr = open({str(log)!r}, "w", buffering=1)
        with masking.masked_output(secrets):
            masking.diagnostics().write("own words\\n")
            masking.diagnostics().flush()
            print("tool hunter2")
        sys.stderr.close()
    ''')
    assert log.read_text() == "own words\ntool ***\n"
    assert "own words" not in done.stderr
    assert "hunter2" not in done.stderr


def test_without_file_descriptor_1_python_writes_are_still_masked() -> None:
    """A closed descriptor 1 (no pipe can be made): masking at the Python level only."""
    done = _child('''
        os.close(1)
        with masking.masked_output(secrets):
            sys.stderr.write("err hunter2\\n")
            sys.stderr.flush()
    ''')
    assert done.stderr == "err ***\n"


def test_a_shorter_secret_inside_the_held_tail_waits_for_the_longer_one() -> None:
    """Secrets ``bc`` and ``abcdef``: ``xabc`` holds ``abc`` back (it may start
    ``abcdef``) although ``bc`` is complete inside it; ``def`` then masks it whole."""
    masker = Masker(Secrets({"s": "bc", "t": "abcdef"}))
    assert masker.feed("xabc") == "x"
    assert masker.feed("def") + masker.flush() == MASK


def test_writes_after_a_quiet_moment_are_still_masked_and_copied() -> None:
    """The pipe's thread waits through quiet moments until the masking ends."""
    done = _child('''
        import time
        with masking.masked_output(secrets):
            os.write(2, b"first hunter2\\n")
            time.sleep(0.3)
            os.write(2, b"second hunter2\\n")
    ''')
    assert "first ***" in done.stderr, done.stderr
    assert "second ***" in done.stderr, done.stderr
    assert "hunter2" not in done.stderr


@pytest.mark.parametrize("secret", ["ab", "abc", "abcd", "hunter22"])
def test_a_whole_secret_at_the_end_of_a_write_is_masked_at_once(secret: str) -> None:
    """Only a *start* of a longer spelling is held back: a complete secret that no longer
    spelling begins with is masked in the same write (odd and even lengths)."""
    assert Masker(Secrets({"s": secret})).feed("say " + secret) == "say " + MASK
