"""Packaging: the wheel installs only the name ``convmem``, and the dependency lock is current.

The wheel test builds convmem's wheel and a small distribution that ships its
own top-level ``tools`` package (both without build isolation, so nothing is
downloaded), installs both into a fresh virtual environment with ``--no-deps
--no-index``, and runs the installed ``convmem`` there. The dependencies
(mcp, uvicorn, ...) are not reinstalled: the fresh environment reaches the
test environment's site-packages through a plain path entry placed after its
own, which does not run that directory's ``.pth`` files, so the checkout
(installed there in editable mode) stays invisible. Set
``CONVMEM_FULL_WHEEL_TEST=1`` to install the real dependencies from the
package index instead (slower; uses pip's cache).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / ".ci"))
import lockfile  # noqa: E402

sys.path.remove(str(REPO / ".ci"))

#: Build a wheel with the test environment's setuptools: nothing is downloaded.
PIP_WHEEL = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]


def test_lock_matches_pyproject() -> None:
    assert lockfile.lock_problem(str(REPO)) is None, lockfile.lock_problem(str(REPO))


def test_stale_lock_is_reported(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text())
    (tmp_path / "requirements.lock").write_text((REPO / "requirements.lock").read_text())
    assert lockfile.lock_problem(str(tmp_path)) is None
    text = (tmp_path / "pyproject.toml").read_text().replace('"xxhash>=3.4",', '"xxhash>=3.4",\n    "psycopg>=3",')
    (tmp_path / "pyproject.toml").write_text(text)
    problem = lockfile.lock_problem(str(tmp_path))
    assert problem is not None and "run `make lock`" in problem
    (tmp_path / "requirements.lock").unlink()
    assert "missing" in (lockfile.lock_problem(str(tmp_path)) or "")


def _run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)  # type: ignore[call-overload]
    assert res.returncode == 0, f"{cmd} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}"
    return res


def _other_tools_wheel(tmp_path: Path, out: Path) -> None:
    src = tmp_path / "othertools"
    (src / "tools").mkdir(parents=True)
    (src / "tools" / "__init__.py").write_text('OWNER = "othertools"\n')
    (src / "pyproject.toml").write_text(
        textwrap.dedent(
            """\
            [build-system]
            requires = ["setuptools>=68"]
            build-backend = "setuptools.build_meta"
            [project]
            name = "othertools"
            version = "1.0"
            [tool.setuptools]
            packages = ["tools"]
            """
        )
    )
    _run([*PIP_WHEEL, "-w", str(out), str(src)])


def test_wheel_installs_only_convmem_beside_another_tools(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    src = tmp_path / "src"  # a copy: a build leaves build/ behind, and stale files there would enter the wheel
    src.mkdir()
    for name in ("pyproject.toml", "MANIFEST.in", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, src / name)
    for name in ("convmem", "logstore", "mcp_adapter", "tools"):
        # symlinks=True: convmem/logstore etc. stay links to the copied top-level directories, as in the checkout.
        shutil.copytree(REPO / name, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    _run([*PIP_WHEEL, "-w", str(wheels), str(src)])
    _other_tools_wheel(tmp_path, wheels)
    (ours,) = wheels.glob("convmem-*.whl")
    with zipfile.ZipFile(ours) as z:
        tops = {n.split("/")[0] for n in z.namelist()}
    assert tops == {"convmem", ours.name.split("-")[0] + "-" + ours.name.split("-")[1] + ".dist-info"}, tops

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    py = venv / "bin" / "python"
    full = os.environ.get("CONVMEM_FULL_WHEEL_TEST") == "1"
    install = [sys.executable, "-m", "pip", "--python", str(py), "install", "--quiet"]
    if full:
        _run([*install, str(ours), *wheels.glob("othertools-*.whl")])
    else:
        _run([*install, "--no-deps", "--no-index", *map(str, wheels.glob("*.whl"))])
        site = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip())
        # Last on sys.path, and not a site dir: the test env's .pth files (the editable checkout) are not run.
        (site / "zz_test_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "CONVMEM_"))}
    work = tmp_path / "cwd"
    work.mkdir()
    run_kw = {"cwd": work, "env": env}
    probe = textwrap.dedent(
        """\
        import importlib.util, tools, convmem.logstore, convmem.mcp_adapter, convmem.tools
        print(tools.OWNER)
        for name in ("logstore", "mcp_adapter", "bench"):
            print(name, importlib.util.find_spec(name))
        print(convmem.logstore.__file__)
        """
    )
    out = _run([str(py), "-c", probe], **run_kw).stdout.splitlines()
    assert out[0] == "othertools"
    assert out[1:4] == ["logstore None", "mcp_adapter None", "bench None"]
    assert out[4].startswith(str(venv))

    convmem = str(venv / "bin" / "convmem")
    helptext = _run([convmem, "--help"], **run_kw).stdout
    for command in ("serve", "site", "fsck", "export", "stats"):
        assert command in helptext
    data = work / "data"
    smoke = textwrap.dedent(
        f"""\
        from convmem.logstore import Range, open_store
        with open_store({str(data)!r}) as store:
            seqs = store.append("smoke-site", "smoke-conv", [{{"role": "user", "text": "hello"}}])
            items = store.read("smoke-site", "smoke-conv", Range(0, 10))
            print(seqs.first, seqs.last, [i.payload for i in items])
        """
    )
    assert _run([str(py), "-c", smoke], **run_kw).stdout.strip() == "0 0 [{'role': 'user', 'text': 'hello'}]"
    _run([convmem, "fsck", str(data)], **run_kw)
    stats = _run([convmem, "stats", str(data), "--json"], **run_kw).stdout
    assert "smoke-site" in stats
