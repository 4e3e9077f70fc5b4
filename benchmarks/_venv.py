"""Make sure a Python entry point runs inside its own pinned virtualenv.

Every benchmark entry point (run.py, gen.py, test_duckdb_formulation.py) calls
``ensure_venv()`` before importing duckdb/pyarrow; the Delta reader interop check
(tests/interop/check_readers.py) calls ``ensure_venv(its_dir)``.  If the current
interpreter is not the venv's, the venv ``<dir>/.venv`` is created (``python3 -m venv``),
the pinned ``<dir>/requirements.txt`` is installed into it, and the script re-executes
itself with the venv's interpreter.  Pure standard library, so it works from a bare
``python3``.  ``STRATA_BENCH_NO_VENV=1`` leaves the environment to the caller.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent


class _Venv:
    def __init__(self, home: Path):
        self.dir = home / ".venv"
        self.requirements = home / "requirements.txt"
        self.stamp = self.dir / ".requirements-installed"
        self.tag = home.name

    def python(self) -> Path:
        return self.dir / "bin" / "python"

    def active(self) -> bool:
        try:
            return Path(sys.prefix).resolve() == self.dir.resolve()
        except OSError:
            return False

    def current(self) -> bool:
        try:
            return self.stamp.read_text() == self.requirements.read_text()
        except OSError:
            return False

    def install(self) -> None:
        if not self.python().exists():
            print(f"[{self.tag}] creating virtualenv {self.dir}", file=sys.stderr)
            subprocess.check_call([sys.executable, "-m", "venv", str(self.dir)])
        print(f"[{self.tag}] installing {self.requirements.name} into {self.dir}", file=sys.stderr)
        subprocess.check_call(
            [str(self.python()), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
             "-r", str(self.requirements)]
        )
        self.stamp.write_text(self.requirements.read_text())


def _skip() -> bool:
    return os.environ.get("STRATA_BENCH_NO_VENV") == "1"


def ensure_venv(home: Path = BENCH_DIR) -> None:
    """Re-exec the running script inside HOME/.venv (creating it if needed)."""
    if _skip():
        return  # the caller manages its own environment
    venv = _Venv(Path(home).resolve())
    if not venv.current():
        venv.install()
    if venv.active():
        return
    args = [str(venv.python()), sys.argv[0], *sys.argv[1:]]
    os.execv(args[0], args)


def add_venv_to_path(home: Path = BENCH_DIR) -> None:
    """For imports under a foreign interpreter (e.g. a system-wide pytest):
    install the venv if needed and put its site-packages on sys.path."""
    venv = _Venv(Path(home).resolve())
    if venv.active() or _skip():
        return
    if not venv.current():
        venv.install()
    for sp in sorted((venv.dir / "lib").glob("python*/site-packages")):
        if str(sp) not in sys.path:
            sys.path.insert(0, str(sp))
