"""Installed like a Python package: ``python -m build`` gives an sdist and, built from it, a wheel
that carry the dashboard and the sample traces; the wheel installs offline into a fresh virtual
environment with the ``store`` extra and ``treellm demo --no-dashboard`` runs from it, from a
folder outside the repository.

Offline: the build runs without isolation (hatchling and build come with ``.[dev]``), and the
dependencies come from the wheelhouse the Makefile fills (``make wheelhouse``, pinned by
constraints.txt), which this test builds when it is missing instead of skipping.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import venv
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WHEELHOUSE = ROOT / ".wheelhouse"


def _ensure_wheelhouse() -> None:
    if not (WHEELHOUSE / ".complete").exists():
        subprocess.run(["make", "-C", str(ROOT), "wheelhouse"], check=True)


def _tracked(*folders: str) -> set[str]:
    """The files git tracks under ``folders`` (what a clone has)."""
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--", *folders], capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    return {line for line in out.splitlines() if line and (ROOT / line).is_file()}


def _clean_env() -> dict[str, str]:
    """This environment without what would let the repository's own code leak in."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", NO_COLOR="1", TERM="dumb", COLUMNS="200")
    env.pop("TREELLM_DB", None)
    return env


def test_the_built_wheel_installs_offline_and_runs_the_demo_from_another_folder(tmp_path: Path) -> None:
    _ensure_wheelhouse()
    dist = tmp_path / "dist"
    built = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(ROOT)],
        capture_output=True, text=True, check=False, env=_clean_env(),
    )  # fmt: skip
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (sdist,) = dist.glob("treellm-*.tar.gz")
    (wheel,) = dist.glob("treellm-*-py3-none-any.whl")

    # the sdist holds the package, the dashboard and the sample traces; the wheel (built from the
    # sdist) puts the sample traces inside the package
    with tarfile.open(sdist) as archive:
        in_sdist = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    shipped = _tracked("treellm", "dashboard", "sample_traces")
    assert shipped and shipped <= in_sdist, sorted(shipped - in_sdist)[:10]
    assert not any(name.startswith("tests/") for name in in_sdist)
    with zipfile.ZipFile(wheel) as archive:
        in_wheel = set(archive.namelist())
    expected = {name.replace("sample_traces/", "treellm/sample_traces/", 1) for name in shipped}
    assert expected <= in_wheel, sorted(expected - in_wheel)[:10]
    assert "dashboard/app.py" in in_wheel and "treellm/sample_traces/branch_local_loop.jsonl" in in_wheel

    env_dir = tmp_path / "env"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--no-index", "--find-links", str(WHEELHOUSE),
         "-c", str(ROOT / "constraints.txt"), f"{wheel}[store]"],
        capture_output=True, text=True, check=False, env=_clean_env(), cwd=tmp_path,
    )  # fmt: skip
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = subprocess.run(
        [str(python), "-c", "import dashboard, treellm, treellm.simulate as s; "
         "print(treellm.__file__); print(dashboard.__file__); print(s.sample_traces_dir())"],
        capture_output=True, text=True, check=True, env=_clean_env(), cwd=elsewhere,
    )  # fmt: skip
    site = env_dir.resolve()
    package, dashboard_init, samples = (Path(line).resolve() for line in where.stdout.splitlines())
    assert site in package.parents and site in dashboard_init.parents and site in samples.parents, where.stdout
    assert (dashboard_init.parent / "app.py").is_file()

    demo = subprocess.run(
        [str(env_dir / "bin" / "treellm"), "demo", "--no-dashboard"],
        capture_output=True, text=True, check=False, env=_clean_env(), cwd=elsewhere, timeout=600,
    )  # fmt: skip
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "Traceback" not in demo.stderr
    db = elsewhere / "treellm.duckdb"
    assert db.is_file() and db.stat().st_size > 0  # the default store, in the folder it ran from
    ingested = re.search(r"ingested into (\S+): (\d+) new span\(s\), (\d+) new run\(s\)", demo.stdout)
    assert ingested is not None and Path(elsewhere, ingested[1]).resolve() == db.resolve(), demo.stdout[:500]
    runs = int(ingested[3])
    assert runs > 0 and f"{runs} runs, " in demo.stdout  # the report of the store it just filled
    assert "next: `treellm dashboard`" in demo.stdout

    # the store it wrote holds those runs, read through the installed package
    count = subprocess.run(
        [str(python), "-c", "from treellm.store import open_store; con = open_store('treellm.duckdb', read_only=True); "
         "print(con.execute('SELECT count(*) FROM runs').fetchone()[0])"],
        capture_output=True, text=True, check=True, env=_clean_env(), cwd=elsewhere,
    )  # fmt: skip
    assert int(count.stdout.strip()) == runs


def test_make_demo_passes_args_to_run_headless_and_installs_with_pip_progress(tmp_path: Path) -> None:
    dry = subprocess.run(["make", "-C", str(ROOT), "-n", "-B", "demo", "ARGS=--no-dashboard"], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    install = [line for line in dry.splitlines() if "pip install" in line and "'.[dev]'" in line]
    assert install and all("--quiet" not in line and " -q " not in line for line in install), install
    db = tmp_path / "demo.duckdb"
    done = subprocess.run(
        ["make", "-s", "-C", str(ROOT), "demo", f"ARGS=--no-dashboard --db {db}"],
        capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL, env=_clean_env(), timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"ingested into {db}" in done.stdout and "next: `treellm dashboard`" in done.stdout
    assert "treellm dashboard on http" not in done.stdout  # it never served
