"""The repository's own ``nightly-backup`` plan: end to end through planrun, and its tools.

The end-to-end tests run the real plan (``plans/nightly-backup.yaml`` + ``tools.yaml`` at
the repository root) in a ``planrun`` subprocess on a temporary source directory; the unit
tests call ``backup_tools`` directly on temporary folders.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARCHIVE_RE = re.compile(r"^backup-([0-9]{8}T[0-9]{6}Z)\.tar\.gz$")


def _load_backup_tools() -> ModuleType:
    spec = importlib.util.spec_from_file_location("backup_tools", ROOT / "backup_tools.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bt = _load_backup_tools()

SOURCE_FILES: dict[str, bytes] = {
    "a.txt": b"hello\n",
    "empty.dat": b"",
    "sub/b.bin": bytes(range(256)) * 40,
    "sub/deeper/c.json": b'{"x": 1}\n',
}


def planrun(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PLANRUN_JOURNAL=str(tmp_path / "journal.sqlite3"), NO_COLOR="1")
    env.pop("PLANRUN_PROJECT", None)
    return subprocess.run(
        [sys.executable, "-m", "planrun", *args], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=60, check=False)


def run_backup(tmp_path: Path, source: Path, dest: Path, keep: int | None = None
               ) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    args = ["execute", "nightly-backup", "-C", str(ROOT), "-p", f"source={source}",
            "-p", f"dest={dest}", "--approve", "prune", "--json"]
    if keep is not None:
        args += ["-p", f"keep={keep}"]
    proc = planrun(tmp_path, *args)
    try:
        manifest = json.loads(proc.stdout)
    except ValueError:
        pytest.fail(f"no JSON manifest (exit {proc.returncode}): {proc.stdout}\n{proc.stderr}")
    return proc, manifest


def make_source(tmp_path: Path) -> Path:
    source = tmp_path / "source"
    for rel, data in SOURCE_FILES.items():
        path = source / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return source


def step_status(manifest: dict[str, Any]) -> dict[str, str]:
    return {s["id"]: s["status"] for s in manifest["steps"]}


def fake_archive(folder: Path, stamp: str, sidecars: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    archive = folder / f"backup-{stamp}.tar.gz"
    archive.write_bytes(b"old archive " + stamp.encode())
    if sidecars:
        (folder / f"{archive.name}.sha256").write_text(f"{'0' * 64}  {archive.name}\n")
        (folder / f"{archive.name}.manifest.json").write_text("{}\n")
    return archive


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """An empty folder of its own (``tmp_path`` may hold other fixtures' files)."""
    path = tmp_path / "folder"
    path.mkdir()
    return path


# --- end to end through planrun -----------------------------------------------------------


def test_validate_all_plans_is_clean(tmp_path: Path) -> None:
    proc = planrun(tmp_path, "validate", "-C", str(ROOT), "--format", "json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] is True
    assert report["issues"] == []
    assert any(p["file"].endswith("nightly-backup.yaml") and p["ok"] for p in report["plans"])


def test_plan_makes_archive_checksum_and_manifest(tmp_path: Path) -> None:
    source = make_source(tmp_path)
    dest = tmp_path / "backups" / "nightly"  # does not exist yet: the plan creates it
    dest.parent.mkdir()  # (its parent, the backup disk, must be there)
    before = datetime.now(UTC).replace(microsecond=0)

    proc, run = run_backup(tmp_path, source, dest)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert run["status"] == "completed"
    status = step_status(run)
    # the notify step runs only after a failure (run_if: failure): skipped by condition
    assert status.pop("notify_failure") == "skipped"
    assert set(status.values()) == {"succeeded"}
    assert not (dest / bt.FAILURE_MARKER).exists()
    archives = [p for p in dest.iterdir() if ARCHIVE_RE.match(p.name)]
    assert len(archives) == 1
    archive = archives[0]
    assert sorted(p.name for p in dest.iterdir()) == sorted(
        [archive.name, f"{archive.name}.sha256", f"{archive.name}.manifest.json"])

    # the archive holds exactly the source files, byte for byte
    with tarfile.open(archive, "r:gz") as tar:
        files = {m.name.removeprefix("./"): tar.extractfile(m).read()  # type: ignore[union-attr]
                 for m in tar.getmembers() if m.isreg()}
    assert files == SOURCE_FILES
    listing = subprocess.run(["tar", "-tzf", str(archive)], capture_output=True, text=True,
                             check=True).stdout.split()
    assert "./sub/deeper/c.json" in listing

    # the checksum file is right and in sha256sum format
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    sidecar = dest / f"{archive.name}.sha256"
    assert sidecar.read_text() == f"{digest}  {archive.name}\n"
    if shutil.which("sha256sum"):
        check = subprocess.run(["sha256sum", "-c", sidecar.name], cwd=dest,
                               capture_output=True, text=True, check=False)
        assert check.returncode == 0, check.stdout + check.stderr
        assert check.stdout.strip() == f"{archive.name}: OK"

    # the manifest describes it
    manifest = json.loads((dest / f"{archive.name}.manifest.json").read_text())
    stamp = ARCHIVE_RE.match(archive.name).group(1)  # type: ignore[union-attr]
    created = datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    assert manifest == {
        "source": str(source.resolve()),
        "archive": str(archive.resolve()),
        "bytes": archive.stat().st_size,
        "sha256": digest,
        "created_at": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "source_files": len(SOURCE_FILES),
        "source_bytes": sum(len(d) for d in SOURCE_FILES.values()),
    }
    assert before <= created <= datetime.now(UTC)

    # the step output is the same object
    out = planrun(tmp_path, "output", run["run_id"], "manifest")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == manifest


def test_plan_prunes_old_archives_and_nothing_else(tmp_path: Path) -> None:
    source = make_source(tmp_path)
    dest = tmp_path / "dest"
    oldest = fake_archive(dest, "20200101T000000Z")
    older = fake_archive(dest, "20210101T000000Z")
    newer = fake_archive(dest, "20220101T000000Z")
    others = ["notes.txt", "backup-latest.tar.gz", "backup-20190101T000000Z.tar.gz.bak",
              "backup-20190101T000000Z.tar", "backup-20190101T000000Z.tar.gz.sha256"]
    for name in others:
        (dest / name).write_text("keep me")

    proc, run = run_backup(tmp_path, source, dest, keep=2)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert step_status(run)["prune"] == "succeeded"
    archives = sorted(p.name for p in dest.iterdir() if ARCHIVE_RE.match(p.name))
    assert len(archives) == 2
    assert archives[0] == newer.name  # the newest old one, then this run's
    assert archives[1] > newer.name
    for gone in (oldest, older):
        for path in (gone, dest / f"{gone.name}.sha256", dest / f"{gone.name}.manifest.json"):
            assert not path.exists(), path
    for kept in archives:
        assert (dest / f"{kept}.sha256").exists()
        assert (dest / f"{kept}.manifest.json").exists()
    for name in others:
        assert (dest / name).read_text() == "keep me"

    out = planrun(tmp_path, "output", run["run_id"], "prune")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {
        "kept": [archives[1], archives[0]],
        "deleted": [f"{oldest.name}.sha256", f"{oldest.name}.manifest.json", oldest.name,
                    f"{older.name}.sha256", f"{older.name}.manifest.json", older.name],
        "incomplete": [],
    }


def test_plan_refuses_dest_inside_source(tmp_path: Path) -> None:
    source = make_source(tmp_path)
    dest = source / "backups"

    proc, run = run_backup(tmp_path, source, dest)

    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert run["status"] == "failed"
    status = step_status(run)
    assert status["prepare"] == "failed"
    assert {status[s] for s in ("archive", "checksum", "manifest", "prune")} == {"skipped"}
    prepare = next(s for s in run["steps"] if s["id"] == "prepare")
    assert "inside source" in prepare["error"]["message"]
    # the notify step refuses to write its marker into the source directory
    notify = next(s for s in run["steps"] if s["id"] == "notify_failure")
    assert notify["status"] == "failed"
    assert "inside source" in notify["error"]["message"]
    assert not dest.exists()
    assert sorted(p.relative_to(source).as_posix() for p in source.rglob("*")
                  if p.is_file()) == sorted(SOURCE_FILES)


def test_failed_run_writes_the_failure_marker_and_stays_failed(tmp_path: Path) -> None:
    # forced failure: the source does not exist, so prepare fails; notify_failure
    # (run_if: failure) writes the marker; the run is still failed with exit status 1
    dest = tmp_path / "backups"

    proc, run = run_backup(tmp_path, tmp_path / "no-such-source", dest)

    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert run["status"] == "failed"
    status = step_status(run)
    assert status["prepare"] == "failed"
    assert {status[s] for s in ("archive", "checksum", "manifest", "prune")} == {"skipped"}
    assert status["notify_failure"] == "succeeded"
    mark = json.loads((dest / bt.FAILURE_MARKER).read_text())
    assert mark["run_id"] == run["run_id"]
    assert mark["marker"] == str((dest / bt.FAILURE_MARKER).resolve())
    assert sorted(p.name for p in dest.iterdir()) == [bt.FAILURE_MARKER]


# --- prune --------------------------------------------------------------------------------


def test_prune_keeps_newest_by_name_not_mtime(folder: Path) -> None:
    stamps = ["20240101T000000Z", "20240301T120000Z", "20240301T120001Z", "20250101T000000Z"]
    paths = [fake_archive(folder, s) for s in stamps]
    # mtimes in the opposite order, so ordering by mtime would keep the wrong ones
    for i, path in enumerate(paths):
        os.utime(path, (10_000_000 - i * 1000, 10_000_000 - i * 1000))

    result = bt.prune(dest=str(folder), keep=2)

    assert result["kept"] == [paths[3].name, paths[2].name]
    assert result["deleted"] == [
        f"{paths[0].name}.sha256", f"{paths[0].name}.manifest.json", paths[0].name,
        f"{paths[1].name}.sha256", f"{paths[1].name}.manifest.json", paths[1].name]
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        n for p in paths[2:] for n in (p.name, f"{p.name}.sha256", f"{p.name}.manifest.json"))


def test_prune_touches_only_exact_archive_names(folder: Path) -> None:
    fake_archive(folder, "20240101T000000Z")
    newest = fake_archive(folder, "20240102T000000Z")
    untouchable = [
        "notes.txt",
        "backup-20200101T000000Z.tar.gz.bak",
        "backup-20200101T000000Z.tar.gz~",
        "xbackup-20200101T000000Z.tar.gz",
        "backup-20200101T000000.tar.gz",  # no Z
        "backup-20201301T000000Z.tar.gz",  # month 13: not a real stamp
        "backup-20200101T000000Z.tgz",
        "Backup-20200101T000000Z.tar.gz",
        "backup-20190101T000000Z.tar.gz.sha256",  # orphan sidecar
        "backup-20190101T000000Z.tar.gz.manifest.json",
    ]
    for name in untouchable:
        (folder / name).write_text("x")
    subdir = folder / "backup-20000101T000000Z.tar.gz"  # a directory with an archive name
    subdir.mkdir()
    (subdir / "inside").write_text("x")
    target = folder / "target.bin"
    target.write_text("x")
    link = folder / "backup-20000102T000000Z.tar.gz"  # a symlink with an archive name
    link.symlink_to(target)

    result = bt.prune(dest=str(folder), keep=1)

    assert result["kept"] == [newest.name]
    old = "backup-20240101T000000Z.tar.gz"
    assert result["deleted"] == [f"{old}.sha256", f"{old}.manifest.json", old]
    for name in untouchable:
        assert (folder / name).read_text() == "x", name
    assert (subdir / "inside").exists()
    assert link.is_symlink()
    assert target.exists()


def test_prune_is_idempotent_and_keeps_all_when_few(folder: Path) -> None:
    for s in ("20240101T000000Z", "20240102T000000Z", "20240103T000000Z"):
        fake_archive(folder, s, sidecars=s != "20240101T000000Z")

    first = bt.prune(dest=str(folder), keep=2)
    assert first["deleted"] == ["backup-20240101T000000Z.tar.gz"]  # had no sidecars
    second = bt.prune(dest=str(folder), keep=2)
    assert second == {"kept": first["kept"], "deleted": [], "incomplete": []}
    assert bt.prune(dest=str(folder), keep=10)["deleted"] == []
    assert len(list(folder.iterdir())) == 6


def test_prune_never_counts_an_archive_cut_short(folder: Path) -> None:
    """A truncated archive (a full disk mid-tar: no checksum, no manifest) counted as one
    of the ``keep`` backups and pushed a good one out (found by a fresh operator)."""
    for s in ("20240101T000000Z", "20240102T000000Z", "20240104T000000Z"):
        fake_archive(folder, s)
    fake_archive(folder, "20240103T000000Z", sidecars=False)  # newer than two good ones
    fake_archive(folder, "20240105T000000Z", sidecars=False)  # the newest: cut short
    out = bt.prune(dest=str(folder), keep=2)
    assert out["kept"] == ["backup-20240104T000000Z.tar.gz", "backup-20240102T000000Z.tar.gz"]
    assert out["incomplete"] == ["backup-20240105T000000Z.tar.gz",
                                 "backup-20240103T000000Z.tar.gz"]
    assert [d for d in out["deleted"] if d.endswith(".tar.gz")] == [
        "backup-20240101T000000Z.tar.gz"]
    assert (folder / "backup-20240103T000000Z.tar.gz").exists()


def test_prune_refuses_bad_arguments(folder: Path) -> None:
    fake_archive(folder, "20240101T000000Z")
    with pytest.raises(ValueError, match="at least 1"):
        bt.prune(dest=str(folder), keep=0)
    with pytest.raises(NotADirectoryError):
        bt.prune(dest=str(folder / "missing"), keep=1)
    assert (folder / "backup-20240101T000000Z.tar.gz").exists()


# --- the other tools ----------------------------------------------------------------------


def test_utc_stamp_is_current_utc() -> None:
    before = datetime.now(UTC).replace(microsecond=0)
    stamp = bt.utc_stamp()
    after = datetime.now(UTC)
    assert re.fullmatch(r"[0-9]{8}T[0-9]{6}Z", stamp)
    when = datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    assert before <= when <= after + timedelta(seconds=1)


def test_check_dirs_creates_dest_and_reserves_name(tmp_path: Path) -> None:
    source = make_source(tmp_path)
    dest = tmp_path / "a" / "b"
    name = "backup-20240101T000000Z.tar.gz"
    # A missing parent is a backup disk that is not mounted: nothing is created there
    # (the backup landed on the disk under the mount point; found by a fresh operator).
    with pytest.raises(FileNotFoundError, match=r"does not exist \(a backup disk"):
        bt.check_dirs(source=str(source), dest=str(dest), name=name)
    with pytest.raises(FileNotFoundError, match=r"does not exist \(a backup disk"):
        bt.mark_failed(source=str(source), dest=str(dest))
    assert not (tmp_path / "a").exists()
    (tmp_path / "a").mkdir()

    out = bt.check_dirs(source=str(source), dest=str(dest), name=name)

    assert out == {"source": str(source.resolve()), "dest": str(dest.resolve()),
                   "archive": str(dest.resolve() / name)}
    assert dest.is_dir()
    assert (dest / name).is_file()  # the reservation


def test_check_dirs_never_overwrites_a_same_second_archive(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    source = make_source(tmp_path)
    dest = tmp_path / "dest"
    name = "backup-20240101T000000Z.tar.gz"
    bt.check_dirs(source=str(source), dest=str(dest), name=name)
    (dest / name).write_bytes(b"first run's archive")

    # Issue 10, bug 5: the next free second is taken instead of failing (a retry of a
    # run that failed here would have reused the same stamp forever).
    out = bt.check_dirs(source=str(source), dest=str(dest), name=name)
    assert out["archive"] == str(dest.resolve() / "backup-20240101T000001Z.tar.gz")
    assert (dest / name).read_bytes() == b"first run's archive"
    # Every name of the window taken: refused, nothing overwritten.
    monkeypatch.setattr(bt, "MAX_STAMP_SHIFT_S", 2)
    (dest / "backup-20240101T000002Z.tar.gz").write_bytes(b"x")
    with pytest.raises(FileExistsError, match="refusing to overwrite"):
        bt.check_dirs(source=str(source), dest=str(dest), name=name)
    assert (dest / name).read_bytes() == b"first run's archive"


def test_check_dirs_accepts_its_own_reservation(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    source = make_source(tmp_path)
    name = "backup-20240101T000000Z.tar.gz"
    monkeypatch.setattr(bt, "_reservation_marker", lambda: "reservation of call K\n")
    first = bt.check_dirs(source=str(source), dest=str(tmp_path / "dest"), name=name)
    again = bt.check_dirs(source=str(source), dest=str(tmp_path / "dest"), name=name)
    assert again == first
    monkeypatch.setattr(bt, "_reservation_marker", lambda: "reservation of call L\n")
    other = bt.check_dirs(source=str(source), dest=str(tmp_path / "dest"), name=name)
    assert other["archive"] != first["archive"]  # another call's reservation is kept


@pytest.mark.parametrize("where", ["same", "inside", "symlink"])
def test_check_dirs_refuses_dest_in_source(tmp_path: Path, where: str) -> None:
    source = make_source(tmp_path)
    if where == "same":
        dest = source
    elif where == "inside":
        dest = source / "sub" / "new"
    else:
        dest = tmp_path / "link"
        dest.symlink_to(source / "sub")
    with pytest.raises(ValueError, match="inside source"):
        bt.check_dirs(source=str(source), dest=str(dest), name="backup-20240101T000000Z.tar.gz")
    assert not (source / "sub" / "new").exists()
    assert not list(source.rglob("backup-*"))


def test_check_dirs_refuses_bad_source_and_name(tmp_path: Path) -> None:
    source = make_source(tmp_path)
    name = "backup-20240101T000000Z.tar.gz"
    with pytest.raises(FileNotFoundError, match="does not exist"):
        bt.check_dirs(source=str(tmp_path / "missing"), dest=str(tmp_path / "d"), name=name)
    with pytest.raises(NotADirectoryError):
        bt.check_dirs(source=str(source / "a.txt"), dest=str(tmp_path / "d"), name=name)
    with pytest.raises(NotADirectoryError):
        bt.check_dirs(source=str(source), dest=str(source / "a.txt"), name=name)
    with pytest.raises(ValueError, match="not backup-"):
        bt.check_dirs(source=str(source), dest=str(tmp_path / "d"), name="../evil.tar.gz")
    assert not (tmp_path / "d").exists()


def test_checksum_writes_sha256sum_file(folder: Path) -> None:
    data = b"some archive bytes" * 1000
    file = folder / "backup-20240101T000000Z.tar.gz"
    file.write_bytes(data)

    out = bt.checksum(path=str(file))

    digest = hashlib.sha256(data).hexdigest()
    assert out == {"path": str(file.resolve()), "sha256": digest, "bytes": len(data)}
    assert (folder / f"{file.name}.sha256").read_text() == f"{digest}  {file.name}\n"
    assert sorted(p.name for p in folder.iterdir()) == [file.name, f"{file.name}.sha256"]


def test_manifest_refuses_size_mismatch(tmp_path: Path) -> None:
    source = make_source(tmp_path)
    archive = tmp_path / "backup-20240101T000000Z.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(source, arcname=".")
    size = archive.stat().st_size
    with pytest.raises(ValueError, match="changed after it was checksummed"):
        bt.manifest(source=str(source), archive=str(archive), sha256="0" * 64,
                    archive_bytes=size + 1)
    assert not (tmp_path / f"{archive.name}.manifest.json").exists()
