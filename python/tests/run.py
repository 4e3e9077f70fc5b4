#!/usr/bin/env python3
"""Runs the Python package's tests against the engine of the workspace's debug build.

    python3 python/tests/run.py [--lib PATH/libstrata_python.so] [pytest args ...]

The native module comes from ``cargo build --workspace`` (the same debug build as every
other test: maturin would run cargo on this one package, whose features can differ from the
workspace's and rebuild dependencies). It is staged with the package's Python sources into
``$CARGO_TARGET_DIR/python/strata/`` as ``_native.abi3.so``; pytest then runs
python/tests/ inside python/tests/.venv (created here, the pins of requirements.txt).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def main() -> int:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import _venv

    _venv.ensure_venv(HERE)  # may re-exec this script in python/tests/.venv
    args = sys.argv[1:]
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    lib = target / "debug" / "libstrata_python.so"
    if args[:1] == ["--lib"]:
        lib, args = Path(args[1]), args[2:]
    if not lib.is_file():
        print(f"error: {lib} not found: build it with cargo build --workspace", file=sys.stderr)
        return 2
    stage = target / "python"
    pkg = stage / "strata"
    if pkg.exists():
        shutil.rmtree(pkg)
    shutil.copytree(ROOT / "python" / "strata", pkg,
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copy2(lib, pkg / "_native.abi3.so")
    env = dict(os.environ, PYTHONPATH=str(stage), STRATA_REPO=str(ROOT))
    return subprocess.call([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                            str(HERE), *args], env=env)


if __name__ == "__main__":
    sys.exit(main())
