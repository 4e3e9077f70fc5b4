"""What the benchmark scripts share besides run.py: their failure list, log lines, SQL string
literals, and run.py itself imported once the venv is active (run.py imports duckdb and
pyarrow at its top)."""

from __future__ import annotations

FAILURES: list[str] = []
_RUN = None


def R():
    """run.py, imported on first use (after ensure_venv)."""
    global _RUN
    if _RUN is None:
        import run as _run
        _RUN = _run
    return _RUN


def log(msg: str = "") -> None:
    print(msg, flush=True)


def fail(msg: str) -> None:
    """Records a failure (the script exits 1 at its end) and says it."""
    FAILURES.append(msg)
    log(f"  FAILURE: {msg}")


def sql_str(s) -> str:
    """`s` as an SQL string literal."""
    return "'" + str(s).replace("'", "''") + "'"
