"""The production install (packaging/install.sh, docs/operations/install.md): a venv under
PREFIX, `jobd` linked into BINDIR, the units and the sysusers file; here into a temporary
prefix, from a copy of this checkout (pip builds it there: nothing is written here). pip
takes the dependencies from its configured index, as on a server."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from jobd import __version__

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "packaging" / "install.sh"
LEFT_OUT = (".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".jobd", "*.so",
            ".pytest_cache", ".ruff_cache", ".hypothesis", "test-artifacts")  # fmt: skip


def default_link() -> str:
    """Where the script links `jobd` unless told otherwise: BINDIR's default, /jobd."""
    found = re.search(r'^BINDIR="\$\{BINDIR:-([^}]+)\}"$', SCRIPT.read_text(), re.MULTILINE)
    assert found, "install.sh sets BINDIR with a default"
    return f"{found[1]}/jobd"


def test_every_units_exec_lines_run_the_scripts_link() -> None:
    units = sorted((ROOT / "systemd").glob("*.service"))
    assert units
    for unit in units:
        lines = re.findall(r"^(ExecStart(?:Pre)?)=(\S+)", unit.read_text(), re.MULTILINE)
        assert {kind for kind, _ in lines} == {"ExecStart", "ExecStartPre"}, unit.name
        assert {program for _, program in lines} == {default_link()}, unit.name


def test_the_install_script_into_a_temporary_prefix(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    shutil.copytree(ROOT, checkout, ignore=shutil.ignore_patterns(*LEFT_OUT))
    prefix, bindir = tmp_path / "opt" / "jobd", tmp_path / "bin"
    env = {**os.environ, "PREFIX": str(prefix), "BINDIR": str(bindir),
           "UNITDIR": str(tmp_path / "units"), "SYSUSERSDIR": str(tmp_path / "sysusers"),
           "MANDIR": str(tmp_path / "man"), "COMPLETIONDIR": str(tmp_path / "completions"),
           "PYTHON": sys.executable}  # fmt: skip
    env.pop("PYTHONPATH", None)  # the installed jobd, not this checkout's
    result = subprocess.run(
        [str(checkout / "packaging" / "install.sh"), "--units"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    jobd = bindir / "jobd"
    assert jobd.is_symlink() and jobd.resolve() == (prefix / "bin" / "jobd").resolve()
    version = subprocess.run([str(jobd), "--version"], env=env, capture_output=True, text=True)
    assert version.stdout.strip() == f"jobd {__version__}", version.stderr
    validate = subprocess.run(
        [str(jobd), "validate", str(checkout / "config" / "example.yaml")],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert validate.returncode == 0, validate.stdout + validate.stderr
    where = subprocess.run(
        [str(prefix / "bin" / "python"), "-c", "import jobd; print(jobd.__file__)"],
        env=env, capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert where.stdout.startswith(str(prefix)), where.stdout  # the venv's copy, not a checkout
    for unit in ("jobd.service", "jobd@.service"):
        text = (tmp_path / "units" / unit).read_text()
        assert f"ExecStart={jobd} run " in text and "/usr/local/bin" not in text
    assert (tmp_path / "sysusers" / "jobd.conf").read_text().endswith("/var/lib/jobd\n")
    assert (tmp_path / "man" / "man1" / "jobd.1").read_text().count(".TH JOBD 1 ") == 1
    assert (tmp_path / "man" / "man5" / "jobd.yaml.5").read_text().count(".TH JOBD.YAML 5 ") == 1
    assert "complete -F" in (tmp_path / "completions" / "jobd").read_text()


def test_the_install_script_with_a_space_in_bindir_writes_units_that_run_its_link(
    tmp_path: Path,
) -> None:
    """The units' Exec lines get BINDIR/jobd by sed: a space there made systemd split the line
    (and run a program that does not exist), a '&' or '|' broke sed's replacement, a '%' or
    '$' systemd expands. Such a BINDIR (or PREFIX) is refused before anything is written
    (exit 2, the variable named), as is a relative one."""
    script = tmp_path / "packaging" / "install.sh"
    script.parent.mkdir()
    shutil.copy(SCRIPT, script)  # alone: should it run on, pip finds nothing to install
    base = tmp_path / "made"
    good = str(base / "bin")
    for name, value in [("BINDIR", str(base / "my bin")), ("BINDIR", str(base / "a&b")),
                        ("BINDIR", str(base / "a|b")), ("BINDIR", str(base / "50%")),
                        ("BINDIR", "relative/bin"), ("PREFIX", str(base / "opt jobd"))]:  # fmt: skip
        env = {**os.environ, "PREFIX": str(base / "opt"), "BINDIR": good,
               "UNITDIR": str(base / "units"), "SYSUSERSDIR": str(base / "sysusers"),
               "MANDIR": str(base / "man"), "COMPLETIONDIR": str(base / "completions"),
               "PYTHON": sys.executable, name: value}  # fmt: skip
        result = subprocess.run([str(script), "--units"], env=env, capture_output=True,
                                text=True, timeout=600)  # fmt: skip
        assert result.returncode == 2, (value, result.stdout + result.stderr)
        assert f"install.sh: {name} must be an absolute path" in result.stderr
        assert not base.exists(), value  # refused before anything was made
