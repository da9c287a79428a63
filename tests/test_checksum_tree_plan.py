"""The repository's own ``checksum-tree`` plan: end to end through planrun, and its tools.

The end-to-end tests run the real plan (``plans/checksum-tree.yaml`` + ``tools.yaml`` at
the repository root) in a ``planrun`` subprocess (``-C`` the repository root, the journal
in ``tmp_path``) on a temporary tree; the unit tests call ``tree_tools`` directly.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
HAS_SHA256SUM = shutil.which("sha256sum") is not None


def _load_tree_tools() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tree_tools", ROOT / "tree_tools.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tt = _load_tree_tools()

#: The regular files of the test tree, by path relative to its root.
TREE_FILES: dict[str, bytes] = {
    "a.txt": b"hello\n",
    "empty.dat": b"",
    "sub/b.bin": bytes(range(256)) * 40,
    "sub/deeper/c.json": b'{"x": 1}\n',
    "z.py": b"print('z')\n",
}
#: Their relative paths in report (and listing) order.
ORDER = sorted(TREE_FILES)


def make_tree(base: Path) -> Path:
    """TREE_FILES under ``base/tree``, plus symlinks (to a file, a folder, nowhere)."""
    tree = base / "tree"
    for rel, data in TREE_FILES.items():
        path = tree / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    (tree / "link-to-a.txt").symlink_to("a.txt")
    (tree / "link-to-sub").symlink_to("sub", target_is_directory=True)
    (tree / "sub" / "dangling").symlink_to("no-such-file")
    return tree


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def expected_report() -> str:
    return "".join(f"{sha(TREE_FILES[rel])}  {rel}\n" for rel in ORDER)


def planrun(tmp_path: Path, *args: str, crash: str | None = None
            ) -> subprocess.CompletedProcess[str]:
    """Run ``python -m planrun ARGS`` on the repository's project, journal in tmp_path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLANRUN_")}
    env.update(PLANRUN_JOURNAL=str(tmp_path / "journal.sqlite3"), NO_COLOR="1")
    if crash is not None:
        env["PLANRUN_TEST_CRASH"] = crash
    return subprocess.run(
        [sys.executable, "-m", "planrun", *args], cwd=tmp_path, env=env,
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, check=False)


def execute(tmp_path: Path, *params: str, crash: str | None = None,
            extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    args = ["execute", "checksum-tree", "-C", str(ROOT), "--json", *extra]
    for p in params:
        args += ["-p", p]
    return planrun(tmp_path, *args, crash=crash)


def manifest_of(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(proc.stdout)
    except ValueError:
        pytest.fail(f"no JSON on stdout (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return data


def steps_of(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["id"]: s for s in manifest["steps"]}


# --- end to end through planrun -----------------------------------------------------------


def test_plan_writes_report_summary_and_verifies(tmp_path: Path) -> None:
    tree = make_tree(tmp_path)
    report = tmp_path / "out" / "report.sha256"  # its folder does not exist yet
    before = datetime.now(UTC).replace(microsecond=0)

    proc = execute(tmp_path, f"root={tree}", f"report={report}", "verify=true")

    run = manifest_of(proc)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert run["status"] == "completed"
    steps = steps_of(run)
    assert {sid: s["status"] for sid, s in steps.items()} == {
        "list": "succeeded", "hash": "succeeded", "report": "succeeded",
        "verify": "succeeded"}
    n = len(TREE_FILES)
    assert steps["hash"]["items"] == {"total": n, "succeeded": n, "failed": 0}

    # the report: one line per regular file (no symlink), sorted, digests as hashlib's
    assert report.read_text(encoding="utf-8") == expected_report()
    summary = json.loads(Path(f"{report}.json").read_text(encoding="utf-8"))
    generated = datetime.strptime(summary.pop("generated_at"), "%Y-%m-%dT%H:%M:%SZ")
    assert before <= generated.replace(tzinfo=UTC) <= datetime.now(UTC)
    assert summary == {"root": str(tree.resolve()), "report": str(report.resolve()),
                       "count": n, "total_bytes": sum(map(len, TREE_FILES.values()))}
    if HAS_SHA256SUM:
        check = subprocess.run(["sha256sum", "--check", "--strict", str(report)], cwd=tree,
                               capture_output=True, text=True, check=False)
        assert check.returncode == 0, check.stdout + check.stderr
        assert check.stdout.splitlines() == [f"{rel}: OK" for rel in ORDER]

    # one fan-out item's output, and the whole (ordered) fan-out output
    item = planrun(tmp_path, "output", run["run_id"], "hash", "--item", "1", "-C", str(ROOT))
    assert item.returncode == 0, item.stderr
    rel = ORDER[1]
    assert json.loads(item.stdout) == {"path": str(tree.resolve() / rel),
                                       "sha256": sha(TREE_FILES[rel]),
                                       "bytes": len(TREE_FILES[rel])}
    whole = planrun(tmp_path, "output", run["run_id"], "hash", "-C", str(ROOT))
    assert whole.returncode == 0, whole.stderr
    assert [d["sha256"] for d in json.loads(whole.stdout)] == [
        sha(TREE_FILES[r]) for r in ORDER]


def test_crash_mid_fan_out_then_resume_hashes_each_file_once(tmp_path: Path) -> None:
    tree = make_tree(tmp_path)
    report = tree / "SHA256SUMS"  # inside the tree: the plan leaves it out of the listing

    # One call at a time, so items run in index order: items 0 and 1 have succeeded
    # (outcomes committed) when the process kills itself; the rest never started.
    crashed = execute(tmp_path, f"root={tree}", f"report={report}",
                      crash="outcome:hash#1", extra=("--max-parallel", "1"))
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout + crashed.stderr
    assert not report.exists()

    # no run id: the most recent interrupted or running run (the only one here)
    resumed = planrun(tmp_path, "resume", "--json", "-C", str(ROOT))

    run = manifest_of(resumed)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert run["status"] == "completed"
    run_id = run["run_id"]
    steps = steps_of(run)
    assert steps["hash"]["status"] == "succeeded"
    assert steps["verify"]["status"] == "skipped"  # verify defaults to false
    assert report.read_text(encoding="utf-8") == expected_report()

    log = planrun(tmp_path, "log", run_id, "--json", "-C", str(ROOT))
    assert log.returncode == 0, log.stderr
    events = json.loads(log.stdout)
    kinds = [e["kind"] for e in events]
    assert kinds.count("run_resumed") == 1
    resumed_at = kinds.index("run_resumed")
    item_events = [(i, e) for i, e in enumerate(events)
                   if e["step"] == "hash" and e["item"] is not None]
    started = Counter(e["item"] for _i, e in item_events if e["kind"] == "step_started")
    succeeded = Counter(e["item"] for _i, e in item_events if e["kind"] == "step_succeeded")
    every = dict.fromkeys(range(len(TREE_FILES)), 1)
    # each file was hashed exactly once over the crash and the resume
    assert started == every
    assert succeeded == every
    assert not [e for _i, e in item_events if e["kind"] == "step_failed"]
    # items 0 and 1 before the crash only; the others after the resume only
    before = {e["item"] for i, e in item_events if i < resumed_at}
    after = {e["item"] for i, e in item_events if i > resumed_at}
    assert before == {0, 1}
    assert after == set(range(2, len(TREE_FILES)))
    assert events[-1]["kind"] == "run_finished"
    skipped = next(e for e in events if e["kind"] == "step_skipped" and e["step"] == "verify")
    assert skipped["data"]["reason"] == "condition"


@pytest.mark.skipif(not HAS_SHA256SUM, reason="needs GNU sha256sum")
def test_verify_step_fails_when_a_file_changed_after_the_report(tmp_path: Path) -> None:
    tree = make_tree(tmp_path)
    report = tmp_path / "report.sha256"
    crashed = execute(tmp_path, f"root={tree}", f"report={report}", "verify=true",
                      crash="outcome:report")
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout + crashed.stderr
    assert report.read_text(encoding="utf-8") == expected_report()
    (tree / "sub" / "b.bin").write_bytes(b"tampered")

    resumed = planrun(tmp_path, "resume", "--json", "-C", str(ROOT))

    run = manifest_of(resumed)
    assert resumed.returncode == 1, resumed.stdout + resumed.stderr
    assert run["status"] == "failed"
    steps = steps_of(run)
    assert [steps[s]["status"] for s in ("list", "hash", "report")] == ["succeeded"] * 3
    verify = steps["verify"]
    assert verify["status"] == "failed"
    assert verify["error"]["code"] == "exit_status"
    assert "did NOT match" in verify["error"]["message"]


# --- list_files ---------------------------------------------------------------------------


def test_list_files_skips_symlinks_and_special_files_and_sorts(tmp_path: Path) -> None:
    tree = make_tree(tmp_path)
    os.mkfifo(tree / "sub" / "pipe")
    (tree / "sub" / "empty-dir").mkdir()

    out = tt.list_files(root=str(tree))

    base = tree.resolve()
    assert out == {
        "root": str(base),
        "files": [{"path": str(base / rel), "bytes": len(TREE_FILES[rel])} for rel in ORDER],
        "count": len(TREE_FILES),
    }


def test_list_files_sorts_by_relative_path(tmp_path: Path) -> None:
    # "a-b" < "a.c" < "a/z" < "a0" in code point order ('-' < '.' < '/' < '0')
    for rel in ("a0", "a/z", "a.c", "a-b", "B"):
        path = tmp_path / "t" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(rel)
    out = tt.list_files(root=str(tmp_path / "t"))
    rels = [Path(f["path"]).relative_to(out["root"]).as_posix() for f in out["files"]]
    assert rels == ["B", "a-b", "a.c", "a/z", "a0"]


def test_list_files_pattern_matches_names_at_any_depth(tmp_path: Path) -> None:
    tree = make_tree(tmp_path)
    (tree / "sub" / "UPPER.JSON").write_text("{}")

    def rels(pattern: str) -> list[str]:
        out = tt.list_files(root=str(tree), pattern=pattern)
        return [Path(f["path"]).relative_to(out["root"]).as_posix() for f in out["files"]]

    assert rels("*.json") == ["sub/deeper/c.json"]  # case-sensitive
    assert rels("[az].*") == ["a.txt", "z.py"]
    assert rels("?.*") == ["a.txt", "sub/b.bin", "sub/deeper/c.json", "z.py"]
    assert rels("*.none") == []
    with pytest.raises(ValueError, match="file names only"):
        tt.list_files(root=str(tree), pattern="sub/*.bin")


def test_list_files_exclude_and_refusals(tmp_path: Path) -> None:
    tree = make_tree(tmp_path)
    out = tt.list_files(root=str(tree), exclude=[str(tree / "a.txt"),
                                                 str(tree / "no-such-file")])
    assert out["count"] == len(TREE_FILES) - 1
    assert str(tree.resolve() / "a.txt") not in [f["path"] for f in out["files"]]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        tt.list_files(root=str(tmp_path / "missing"))
    with pytest.raises(NotADirectoryError):
        tt.list_files(root=str(tree / "a.txt"))


def test_list_files_refuses_non_utf8_names(tmp_path: Path) -> None:
    tree = tmp_path / "t"
    tree.mkdir()
    try:
        with open(os.path.join(os.fsencode(tree), b"bad-\xff"), "wb"):
            pass
    except OSError:
        pytest.skip("this file system refuses names that are not UTF-8")
    with pytest.raises(ValueError, match="not valid UTF-8"):
        tt.list_files(root=str(tree))


# --- file_sha256 --------------------------------------------------------------------------


def test_file_sha256_matches_hashlib(tmp_path: Path) -> None:
    tree = make_tree(tmp_path)
    for rel, data in TREE_FILES.items():
        path = str(tree / rel)
        assert tt.file_sha256(path=path) == {"path": path, "sha256": sha(data),
                                             "bytes": len(data)}


def test_file_sha256_refuses_what_is_not_a_regular_file(tmp_path: Path) -> None:
    tree = make_tree(tmp_path)
    os.mkfifo(tree / "pipe")
    with pytest.raises(ValueError, match="symbolic link"):
        tt.file_sha256(path=str(tree / "link-to-a.txt"))
    with pytest.raises(ValueError, match="not a regular file"):
        tt.file_sha256(path=str(tree / "sub"))
    with pytest.raises(ValueError, match="not a regular file"):
        tt.file_sha256(path=str(tree / "pipe"))  # and does not block on it
    with pytest.raises(FileNotFoundError):
        tt.file_sha256(path=str(tree / "gone"))


# --- the report ---------------------------------------------------------------------------


def test_report_line_escapes_like_gnu_sha256sum(tmp_path: Path) -> None:
    digest = "0" * 64
    assert tt.report_line(digest, "sub/a b.txt") == f"{digest}  sub/a b.txt\n"
    assert tt.report_line(digest, "back\\slash") == f"\\{digest}  back\\\\slash\n"
    assert tt.report_line(digest, "new\nline\r") == f"\\{digest}  new\\nline\\r\n"
    if not HAS_SHA256SUM:
        return
    names = ["plain", "back\\slash", "new\nline", "sp ace"]
    for name in names:
        (tmp_path / name).write_text(name)
    gnu = subprocess.run(["sha256sum", "--", *sorted(names)], cwd=tmp_path,
                         capture_output=True, text=True, check=True).stdout
    ours = "".join(tt.report_line(sha(n.encode()), n) for n in sorted(names))
    assert ours == gnu


def listing_and_hashes(tree: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    base = tree.resolve()
    listing = [{"path": str(base / rel), "bytes": len(TREE_FILES[rel])} for rel in ORDER]
    hashes = [{"path": e["path"], "sha256": sha(TREE_FILES[rel]), "bytes": e["bytes"]}
              for rel, e in zip(ORDER, listing, strict=True)]
    return listing, hashes


def test_write_report_format_and_summary(tmp_path: Path) -> None:
    tree = make_tree(tmp_path)
    listing, hashes = listing_and_hashes(tree)
    report = tmp_path / "new" / "dir" / "sums"
    before = datetime.now(UTC).replace(microsecond=0)

    # given in another order, still written sorted by path
    summary = tt.write_report(root=str(tree.resolve()), report=str(report),
                              hashes=hashes[::-1], listing=listing[::-1])

    assert report.read_text(encoding="utf-8") == expected_report()
    assert json.loads(Path(f"{report}.json").read_text(encoding="utf-8")) == summary
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", summary["generated_at"])
    stamp = datetime.strptime(summary["generated_at"], "%Y-%m-%dT%H:%M:%SZ")
    assert before <= stamp.replace(tzinfo=UTC) <= datetime.now(UTC)
    assert {k: v for k, v in summary.items() if k != "generated_at"} == {
        "root": str(tree.resolve()), "report": str(report.resolve()),
        "count": len(TREE_FILES), "total_bytes": sum(map(len, TREE_FILES.values()))}
    assert sorted(p.name for p in report.parent.iterdir()) == ["sums", "sums.json"]

    empty = tt.write_report(root=str(tree.resolve()), report=str(report), hashes=[],
                            listing=[])
    assert report.read_bytes() == b""
    assert (empty["count"], empty["total_bytes"]) == (0, 0)


def test_write_report_refuses_mismatches(tmp_path: Path) -> None:
    tree = make_tree(tmp_path)
    root = str(tree.resolve())
    listing, hashes = listing_and_hashes(tree)
    report = str(tmp_path / "sums")

    with pytest.raises(ValueError, match="digests for"):
        tt.write_report(root=root, report=report, hashes=hashes[:-1], listing=listing)
    with pytest.raises(ValueError, match="where"):
        tt.write_report(root=root, report=report, hashes=hashes[::-1], listing=listing)
    grown = [dict(h, bytes=h["bytes"] + 1) if i == 0 else h for i, h in enumerate(hashes)]
    with pytest.raises(ValueError, match="changed during the run"):
        tt.write_report(root=root, report=report, hashes=grown, listing=listing)
    with pytest.raises(ValueError, match="not under root"):
        tt.write_report(root=str(tree.resolve() / "sub"), report=report, hashes=hashes,
                        listing=listing)
    with pytest.raises(ValueError, match="would overwrite"):
        tt.write_report(root=root, report=listing[0]["path"], hashes=hashes,
                        listing=listing)
    with pytest.raises(IsADirectoryError):
        tt.write_report(root=root, report=str(tree / "sub"), hashes=hashes, listing=listing)
    assert not Path(report).exists()
    assert (tree / "a.txt").read_bytes() == TREE_FILES["a.txt"]
