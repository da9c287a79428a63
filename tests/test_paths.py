"""planrun.paths: project discovery, settings precedence, plan lookup."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import Project
from planrun.errors import Refused, UsageError
from planrun.issues import Report
from planrun.paths import (
    PlanLookupError,
    default_journal,
    find_config,
    find_plan,
    load_settings,
    plan_names,
)


def test_isolation_fixture(tmp_path: Path) -> None:
    import os

    assert os.environ["HOME"] == str(tmp_path / "home")
    assert os.environ["PLANRUN_JOURNAL"] == str(tmp_path / "journal.sqlite3")
    assert os.environ["NO_COLOR"] == "1"
    assert os.environ["COLUMNS"] == "200"
    assert Path.cwd() == tmp_path
    assert [k for k in os.environ if k.startswith("PLANRUN_")] == ["PLANRUN_JOURNAL"]


# --- discovery and defaults ---------------------------------------------------------------


def test_defaults_without_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PLANRUN_JOURNAL")
    settings = load_settings()
    assert settings.project == tmp_path.resolve()
    assert settings.config_file is None
    assert settings.plans_dir == tmp_path.resolve() / "plans"
    assert settings.registry == tmp_path.resolve() / "tools.yaml"
    assert settings.journal == tmp_path / "home" / ".local/share/planrun/journal.sqlite3"
    assert settings.journal == default_journal()
    assert (settings.max_parallel, settings.max_steps) == (4, 500)
    assert (settings.policy, settings.pools) == ({}, {})


def test_config_found_in_a_parent_folder(project: Project) -> None:
    project.write_config('plans_dir = "flows"\nregistry = "conf/tools.yaml"\nmax_parallel = 8\n'
                         "max_steps = 10\n[pools]\ndb = 2\n[policy]\nrequire_approval = []\n")
    deep = project.root / "a" / "b"
    deep.mkdir(parents=True)
    assert find_config(deep) == project.root / "planrun.toml"
    settings = load_settings(cwd=deep)
    assert settings.project == project.root.resolve()
    assert settings.config_file == project.root / "planrun.toml"
    assert settings.plans_dir == project.root / "flows"
    assert settings.registry == project.root / "conf/tools.yaml"
    assert (settings.max_parallel, settings.max_steps) == (8, 10)
    assert settings.pools == {"db": 2}
    assert settings.policy == {"require_approval": []}


def test_find_config_none(tmp_path: Path) -> None:
    assert find_config(tmp_path / "home") is None


def test_project_flag_beats_environment_beats_discovery(
        project: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "planrun.toml").write_text('plans_dir = "elsewhere"\n', encoding="utf-8")
    project.write_config('plans_dir = "mine"\n')
    monkeypatch.chdir(project.root)
    assert load_settings().plans_dir == project.root / "mine"
    monkeypatch.setenv("PLANRUN_PROJECT", str(other))
    assert load_settings().project == other.resolve()
    assert load_settings().plans_dir == other.resolve() / "elsewhere"
    assert load_settings(project=project.root).plans_dir == project.root / "mine"


def test_project_folder_without_config(tmp_path: Path) -> None:
    folder = tmp_path / "bare"
    folder.mkdir()
    settings = load_settings(project="bare")
    assert settings.project == folder.resolve()
    assert settings.config_file is None


def test_missing_project_folder_is_a_usage_error() -> None:
    with pytest.raises(UsageError) as info:
        load_settings(project="nope")
    assert info.value.exit_code == 2


def test_journal_precedence(project: Project, tmp_path: Path,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    project.write_config('journal = "state/j.sqlite3"\n')
    # flag > environment > planrun.toml > default
    assert project.settings(journal="/x/flag.sqlite3").journal == Path("/x/flag.sqlite3")
    assert project.settings().journal == tmp_path / "journal.sqlite3"  # PLANRUN_JOURNAL
    monkeypatch.delenv("PLANRUN_JOURNAL")
    assert project.settings().journal == project.root.resolve() / "state/j.sqlite3"
    (project.root / "planrun.toml").write_text("", encoding="utf-8")
    assert project.settings().journal == tmp_path / "home/.local/share/planrun/journal.sqlite3"


def test_relative_journal_flag_is_from_the_current_folder(project: Project, tmp_path: Path
                                                          ) -> None:
    assert project.settings(journal="j.sqlite3").journal == tmp_path.resolve() / "j.sqlite3"
    assert project.settings(journal="~/j.sqlite3").journal == tmp_path / "home/j.sqlite3"


@pytest.mark.parametrize("toml", [
    "plans_dir = [",
    "colour = 'red'\n",
    "plans_dir = 3\n",
    "registry = true\n",
    "journal = 1\n",
    "max_parallel = 0\n",
    "max_parallel = true\n",
    "max_parallel = '4'\n",
    "max_steps = -1\n",
    "max_steps = 2.0\n",
    "policy = 3\n",
    "pools = []\n",
    "[pools]\ndb = 0\n",
    "[pools]\ndb = true\n",
])
def test_bad_config_is_refused_with_code_config(project: Project, toml: str) -> None:
    project.write_config(toml)
    with pytest.raises(Refused) as info:
        project.settings()
    assert info.value.code == "config"
    assert info.value.exit_code == 3
    report = info.value.report
    assert isinstance(report, Report)
    assert [i.code for i in report.issues] == ["config"]
    # shown relative to the current folder (the test runs in tmp_path), as annotations want
    assert report.issues[0].file == "project/planrun.toml"


def test_non_utf8_config_is_refused(project: Project) -> None:
    project.write("planrun.toml", b"plans_dir = '\xff'\n")
    with pytest.raises(Refused) as info:
        project.settings()
    assert info.value.code == "config"


# --- plan lookup ---------------------------------------------------------------------


def test_lookup_order_yaml_yml_json(project: Project) -> None:
    for suffix in (".json", ".yml", ".yaml"):
        project.write_plan("p", "{}", suffix=suffix)
    assert find_plan("p", project.plans).name == "p.yaml"
    (project.plans / "p.yaml").unlink()
    assert find_plan("p", project.plans).name == "p.yml"
    (project.plans / "p.yml").unlink()
    assert find_plan("p", project.plans).name == "p.json"
    assert find_plan("p.json", project.plans).name == "p.json"


def test_unknown_name_lists_the_plans(project: Project) -> None:
    for name in ("backup", "prune", "archive"):
        project.write_plan(name, "{}")
    project.write_plan("backup", "{}", suffix=".json")
    project.write("plans/notes.txt", "x")
    assert plan_names(project.plans) == ["archive", "backup", "prune"]
    with pytest.raises(PlanLookupError) as info:
        find_plan("bakup", project.plans)
    issue = info.value.issue
    assert issue.code == "not_found"
    assert "Did you mean 'backup'?" in issue.message
    assert "archive, backup, prune" in issue.message


def test_unknown_name_without_plans(project: Project) -> None:
    assert plan_names(project.plans) == []
    with pytest.raises(PlanLookupError) as info:
        find_plan("x", project.plans)
    assert info.value.issue.code == "not_found"
    assert "there is no plans folder" in info.value.issue.message
    assert "planrun init" in info.value.issue.message
    project.plans.mkdir()
    with pytest.raises(PlanLookupError) as info:
        find_plan("x", project.plans)
    assert "Plans: none" in info.value.issue.message


@pytest.mark.parametrize("name", ["../secret", "a/b", "a\\b", "..", "x..y", "/etc/passwd-nope",
                                  "plans/../../x"])
def test_names_escaping_the_plans_folder_are_refused(project: Project, name: str) -> None:
    project.write_plan("x", "{}")
    with pytest.raises(PlanLookupError) as info:
        find_plan(name, project.plans, cwd=project.root)
    assert info.value.issue.code == "bad_name"


def test_existing_file_path_is_accepted(project: Project, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    plan = elsewhere / "x.yaml"
    plan.write_text("{}", encoding="utf-8")
    found = find_plan("./elsewhere/x.yaml", project.plans, cwd=tmp_path)
    assert found == tmp_path / "elsewhere/x.yaml"
    assert find_plan(str(plan), project.plans) == plan
    with pytest.raises(PlanLookupError):
        find_plan("./elsewhere", project.plans, cwd=tmp_path)  # a folder is not a plan file
