"""Make sure the benchmark scripts run inside benchmarks/.venv.

Every entry point (run.py, gen.py, test_duckdb_formulation.py) calls
``ensure_venv()`` before importing duckdb/pyarrow.  If the current interpreter
is not the venv's, the venv is created (``python3 -m venv``), the pinned
requirements are installed into it, and the script re-executes itself with
the venv's interpreter.  Pure standard library, so it works from a bare
``python3``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
VENV_DIR = BENCH_DIR / ".venv"
REQUIREMENTS = BENCH_DIR / "requirements.txt"
_STAMP = VENV_DIR / ".requirements-installed"


def _venv_python() -> Path:
    return VENV_DIR / "bin" / "python"


def _in_venv() -> bool:
    try:
        return Path(sys.prefix).resolve() == VENV_DIR.resolve()
    except OSError:
        return False


def _requirements_current() -> bool:
    try:
        return _STAMP.read_text() == REQUIREMENTS.read_text()
    except OSError:
        return False


def _install() -> None:
    if not _venv_python().exists():
        print(f"[bench] creating virtualenv {VENV_DIR}", file=sys.stderr)
        subprocess.check_call([sys.executable, "-m", "venv", str(VENV_DIR)])
    print(f"[bench] installing {REQUIREMENTS.name} into {VENV_DIR}", file=sys.stderr)
    subprocess.check_call(
        [str(_venv_python()), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "-r", str(REQUIREMENTS)]
    )
    _STAMP.write_text(REQUIREMENTS.read_text())


def ensure_venv() -> None:
    """Re-exec the running script inside benchmarks/.venv (creating it if needed)."""
    if os.environ.get("STRATA_BENCH_NO_VENV") == "1":
        return  # the caller manages its own environment
    if not _requirements_current():
        _install()
    if _in_venv():
        return
    args = [str(_venv_python()), sys.argv[0], *sys.argv[1:]]
    os.execv(args[0], args)


def add_venv_to_path() -> None:
    """For imports under a foreign interpreter (e.g. a system-wide pytest):
    install the venv if needed and put its site-packages on sys.path."""
    if _in_venv() or os.environ.get("STRATA_BENCH_NO_VENV") == "1":
        return
    if not _requirements_current():
        _install()
    for sp in sorted((VENV_DIR / "lib").glob("python*/site-packages")):
        if str(sp) not in sys.path:
            sys.path.insert(0, str(sp))
