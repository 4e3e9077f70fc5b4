"""strata from Python: run Lakeflow-style pipelines on Delta Lake, read the results as Arrow.

    import strata
    from strata import pipelines as dp

    report = strata.run("pipeline.py", warehouse="/tmp/wh")     # .py, .sql, .yaml, or a list
    users = strata.query("SELECT * FROM users", warehouse="/tmp/wh")   # a pyarrow.Table
    strata.as_of("users", "2024-02-15", warehouse="/tmp/wh")
    strata.events(warehouse="/tmp/wh")

Errors raise ``strata.StrataError``; its message is the engine's and names the place
(``pipeline.py:12 (@dp.table users): ...``, ``flow users_flow: ...``); ``.kind`` is
``pipeline``, ``conflict``, ``storage`` or ``internal``. See docs/python.md.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
import runpy
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from . import _native
from . import pipelines
from .pipelines import Pipeline, SNAPSHOT_VERSION_COLUMN

__all__ = ["run", "query", "as_of", "events", "plan", "StrataError", "pipelines", "Pipeline"]
__version__ = _native.__version__


# One class for every error of strata, raised by the engine and by this package alike:
# StrataError(message, kind).
StrataError = _native.StrataError
pipelines.StrataError = StrataError  # type: ignore[attr-defined]


def _kind(self: BaseException) -> str:
    return self.args[1] if len(self.args) > 1 else "pipeline"


def _str(self: BaseException) -> str:
    return str(self.args[0]) if self.args else ""


StrataError.kind = property(_kind)  # type: ignore[attr-defined]
StrataError.__str__ = _str  # type: ignore[assignment]

PipelineArg = Union[str, "os.PathLike[str]", Pipeline, Sequence[Union[str, "os.PathLike[str]"]], None]


def _warehouse(warehouse: Optional[Union[str, "os.PathLike[str]"]]) -> str:
    if warehouse is not None:
        return os.fspath(warehouse)
    return os.environ.get("STRATA_WAREHOUSE", "warehouse")


def _progress(progress: Union[bool, Callable, None]) -> Optional[Callable]:
    if progress is None or progress is False:
        return None
    if callable(progress):
        return progress

    def show(event: str, node: str, detail: str, elapsed: float) -> None:
        if event == "finished":
            print(f"{node}: {detail} ({elapsed:.1f} s)", flush=True)

    return show


def _full_refresh(full_refresh: Union[bool, Sequence[str], str, None]) -> Optional[List[str]]:
    if full_refresh is None or full_refresh is False:
        return None
    if full_refresh is True:
        return []
    if isinstance(full_refresh, str):
        return [t.strip() for t in full_refresh.split(",") if t.strip()]
    if isinstance(full_refresh, (list, tuple)) and all(isinstance(t, str) for t in full_refresh):
        return list(full_refresh)
    raise TypeError("full_refresh is True, a table name, or a list of table names")


def _load_python(path: Path) -> Pipeline:
    """Executes a pipeline file with its declarations going to a fresh Pipeline."""
    p = Pipeline()
    p.runs_now = True
    with p:
        sys.path.insert(0, str(path.parent))
        try:
            runpy.run_path(str(path), run_name="__strata_pipeline__")
        finally:
            sys.path.remove(str(path.parent))
    return p


_VERSION_FILE = re.compile(r"^(\d{6})-(int|date|timestamp)-(-?\d+)\.parquet$")


def _staged_versions(folder: Path) -> List[tuple]:
    """(sequence number, version) of the snapshots already staged in folder."""
    out = []
    if folder.is_dir():
        for f in folder.iterdir():
            m = _VERSION_FILE.match(f.name)
            if m:
                kind, n = m.group(2), int(m.group(3))
                out.append((int(m.group(1)), _version_value(kind, n)))
    return sorted(out)


_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)


def _version_value(kind: str, n: int) -> Any:
    if kind == "int":
        return n
    if kind == "date":
        return _dt.date(1970, 1, 1) + _dt.timedelta(days=n)
    return _EPOCH + _dt.timedelta(microseconds=n)


def _version_repr(v: Any, origin: str) -> tuple:
    if isinstance(v, bool):
        raise StrataError(f"{origin}: a snapshot version is an int, a date or a datetime, "
                          f"got bool", "pipeline")
    if isinstance(v, int):
        return ("int", v)
    if isinstance(v, _dt.datetime):
        if v.tzinfo is None:
            v = v.replace(tzinfo=_dt.timezone.utc)
        d = v - _EPOCH
        return ("timestamp", (d.days * 86400 + d.seconds) * 1_000_000 + d.microseconds)
    if isinstance(v, _dt.date):
        return ("date", (v - _dt.date(1970, 1, 1)).days)
    raise StrataError(f"{origin}: a snapshot version is an int, a date or a datetime, got "
                      f"{type(v).__name__} {v!r}", "pipeline")


def _stage_snapshots(decl: Any, root: str) -> str:
    """Calls a snapshot flow's Python function until it returns None and stages each snapshot
    where the flow's staging table reads it; returns the staging folder."""
    info = decl.snapshot
    folder = Path(root) / "_strata" / "python_snapshots" / info["flow"]
    # The staging table reads this folder: it exists (empty, the table waits) from the start.
    folder.mkdir(parents=True, exist_ok=True)
    staged = _staged_versions(folder)
    seq = staged[-1][0] if staged else 0
    latest = max((v for _, v in staged), default=None)
    fn = info["fn"]
    name = getattr(fn, "__name__", repr(fn))
    while True:
        try:
            got = fn(latest)
        except Exception as e:
            raise StrataError(f"{decl.origin}: the snapshot source {name}({latest!r}) raised "
                              f"{type(e).__name__}: {e}; nothing was run", "pipeline") from e
        if got is None:
            break
        if not (isinstance(got, tuple) and len(got) == 2):
            raise StrataError(f"{decl.origin}: the snapshot source {name}({latest!r}) must return "
                              f"(data, version) or None, got {type(got).__name__}", "pipeline")
        data, version = got
        kind, n = _version_repr(version, decl.origin)
        seq += 1
        try:
            _native.stage_snapshot(str(folder), f"{seq:06d}-{kind}-{n}.parquet", data,
                                   SNAPSHOT_VERSION_COLUMN, (kind, n))
        except StrataError as e:
            raise StrataError(f"{decl.origin}: snapshot {version!r} from {name}: {e}",
                              e.kind) from None
        value = _version_value(kind, n)
        if latest is not None and type(value) is not type(latest):
            raise StrataError(f"{decl.origin}: snapshot versions must all be of one type; "
                              f"{name} returned {value!r} after {latest!r}", "pipeline")
        if latest is not None and value <= latest:
            # A late or redelivered version: the next call would get the same argument as
            # this one; the function is asked again in the next run.
            break
        latest = value
    return str(folder)


def _stage_returned(decl: Any, warehouse: str, schema: str) -> None:
    """Calls a dataset's function that returns Arrow data (unless it was just called, when
    the file was read) and replaces the rows of the table its view reads with the result."""
    info = decl.returned
    fn = info["fn"]
    name = getattr(fn, "__name__", repr(fn))
    data, info["data"] = info["data"], None  # a later run calls the function again
    if data is None:
        try:
            data = fn()
        except Exception as e:
            raise StrataError(f"{decl.origin}: {name}() raised {type(e).__name__}: {e}; "
                              "nothing was run", "pipeline") from e
    if not hasattr(data, "__arrow_c_stream__"):
        raise StrataError(f"{decl.origin}: {name}() returned Arrow data when it was declared "
                          f"and now {type(data).__name__}; a dataset's function returns Arrow "
                          "data (a pyarrow Table, a pandas or Polars DataFrame) every time, or "
                          "a query every time; nothing was run", "pipeline")
    try:
        _native.stage_table(warehouse, info["staging"], schema, data,
                            f"rows returned by the Python function {name} ({decl.origin})")
    except StrataError as e:
        raise StrataError(f"{decl.origin}: the data {name}() returned: {e}; nothing was run",
                          e.kind) from None


def _snapshot_staging_table(decl: Any, folder: str) -> tuple:
    """The streaming table reading the snapshots a snapshot flow's function returned."""
    staging = decl.snapshot["staging"]
    table = (f"CREATE OR REFRESH STREAMING TABLE {pipelines._ident(staging)}\n"
             f"COMMENT 'snapshots returned by the Python source of flow {decl.snapshot['flow']}'"
             f"\nAS SELECT * FROM STREAM read_files("
             f"{pipelines._literal(folder)}, format => 'parquet')")
    return (decl.origin.replace("(", "(staging table of ", 1), table, False)


def _declared(pipeline: PipelineArg) -> tuple:
    """(texts, Python declarations, event-log path, base folder) of a pipeline given as
    files or a Pipeline."""
    texts: List[tuple] = []
    decls: List[Any] = []

    def add(p: Pipeline) -> None:
        for d in p.decls:
            texts.append((d.origin, d.sql, False))
            decls.append(d)

    if isinstance(pipeline, Pipeline) or pipeline is None:
        add(pipeline or pipelines.current())
        return texts, decls, Path("<python>"), Path.cwd()
    paths = [Path(pipeline)] if isinstance(pipeline, (str, os.PathLike)) else \
        [Path(p) for p in pipeline]
    if not paths:
        raise StrataError("no pipeline files given", "pipeline")
    for p in paths:
        if p.suffix == ".py":
            add(_load_python_file(p))
        elif p.suffix in (".yaml", ".yml"):
            raise StrataError(f"{p}: a YAML spec runs on its own (strata.run('{p}'))",
                              "pipeline")
        else:
            try:
                texts.append((str(p), p.read_text(), True))
            except OSError as e:
                raise StrataError(f"cannot read {p}: {e}", "pipeline") from None
    return texts, decls, paths[0], paths[0].resolve().parent


def _load_python_file(p: Path) -> Pipeline:
    if not p.is_file():
        raise StrataError(f"cannot read {p}: no such file", "pipeline")
    return _load_python(p.resolve())


def _python_inputs(decls: List[Any], warehouse: Optional[str], schema: str) -> List[tuple]:
    """Runs the Python that feeds the pipeline before it runs (with a warehouse; without,
    for plan and sql, nothing is called): each snapshot function until it returns None,
    each dataset function returning Arrow data. Returns the texts of the staging tables."""
    root = _native.warehouse_root(warehouse) if warehouse is not None else None
    texts = []
    for d in decls:
        if d.returned is not None and warehouse is not None:
            _stage_returned(d, warehouse, schema)
        if d.snapshot is not None:
            folder = _stage_snapshots(d, root) if root is not None else ""
            texts.append(_snapshot_staging_table(d, folder))
    return texts


def _sources(pipeline: PipelineArg, warehouse: Optional[str]) -> tuple:
    """(texts, event-log path, base folder) of a pipeline given as files or a Pipeline,
    its Python inputs staged in ``warehouse`` (None: nothing is called)."""
    texts, decls, path, base = _declared(pipeline)
    if not texts:
        raise StrataError("the pipeline declares nothing", "pipeline")
    texts += _python_inputs(decls, warehouse, "default")
    return texts, path, base


def _run_spec(spec: Path, wh: str, conf: Dict[str, str], select: Optional[str],
              refresh: Optional[List[str]], cb: Optional[Callable]) -> Dict[str, Any]:
    """Runs a YAML spec; its ``.py`` libraries are executed here and their declarations
    run with the spec's tables and SQL libraries as one pipeline."""
    info = _native.load_spec(str(spec), conf)
    if not info["python_libraries"]:
        return _native.run_path(str(spec), wh, conf, select, refresh, cb)
    texts: List[tuple] = []
    decls: List[Any] = []
    for lib in info["python_libraries"]:
        for d in _load_python_file(Path(lib)).decls:
            texts.append((d.origin, d.sql, False))
            decls.append(d)
    texts += _python_inputs(decls, wh, info["schema"])
    return _native.run_path(str(spec), wh, conf, select, refresh, cb, texts)


def run(pipeline: PipelineArg = None, warehouse: Optional[Union[str, "os.PathLike[str]"]] = None,
        full_refresh: Union[bool, str, Sequence[str]] = False, select: Optional[str] = None,
        conf: Optional[Dict[str, str]] = None, progress: Union[bool, Callable, None] = True
        ) -> Dict[str, Any]:
    """Runs a pipeline once over all input not yet processed, like ``strata run``.

    ``pipeline``: a ``.py`` file (Lakeflow's Python API), a ``.sql`` file, a YAML spec (its
    ``.py`` libraries executed here), a list of ``.py`` and ``.sql`` files run as one
    pipeline, a ``Pipeline``, or ``None`` for the declarations made so far outside any file
    (a notebook). ``full_refresh``: True for every table, or table names. ``select``:
    ``NAME`` or ``NAME+``. ``conf``: values for ``${name}`` in SQL texts. ``progress``: a
    line per dataset (True), nothing (False), or a function ``f(event, node, detail,
    elapsed_seconds)``. Returns the run report as a dict."""
    wh = _warehouse(warehouse)
    conf = {str(k): str(v) for k, v in (conf or {}).items()}
    refresh = _full_refresh(full_refresh)
    cb = _progress(progress)
    if isinstance(pipeline, (str, os.PathLike)) and Path(pipeline).suffix in (".yaml", ".yml"):
        return _run_spec(Path(pipeline), wh, conf, select, refresh, cb)
    if isinstance(pipeline, (str, os.PathLike)) and Path(pipeline).suffix != ".py":
        return _native.run_path(os.fspath(pipeline), wh, conf, select, refresh, cb)
    texts, path, base = _sources(pipeline, wh)
    return _native.run_sources(texts, str(path), str(base), wh, conf, select, refresh, cb)


def plan(pipeline: PipelineArg = None, conf: Optional[Dict[str, str]] = None) -> List[dict]:
    """The pipeline's steps in execution order (``strata plan``); runs nothing and calls no
    snapshot function."""
    texts, _, _ = _sources(pipeline, None)
    return _native.plan_sources(texts, {str(k): str(v) for k, v in (conf or {}).items()})


def sql(pipeline: PipelineArg = None) -> str:
    """The SQL a Python pipeline renders to, one statement per declaration."""
    texts, _, _ = _sources(pipeline, None)
    return "".join(f"-- {name}\n{text};\n\n" for name, text, _ in texts)


def query(sql: str, warehouse: Optional[Union[str, "os.PathLike[str]"]] = None):
    """Runs SQL over every table of the warehouse (``strata query``) and returns a
    ``pyarrow.Table``. The engine's batches are handed over through the Arrow C stream
    interface: pyarrow takes their buffers as they are, nothing is copied."""
    import pyarrow as pa

    capsule = _native.query(sql, _warehouse(warehouse))
    return pa.RecordBatchReader._import_from_c_capsule(capsule).read_all()


def query_stream(sql: str, warehouse: Optional[Union[str, "os.PathLike[str]"]] = None):
    """The result of ``query`` as an object with ``__arrow_c_stream__`` (the Arrow PyCapsule
    interface), for ``polars.from_arrow``, ``duckdb`` or ``pyarrow.table`` without pyarrow in
    between. It can be read once."""
    return _Stream(_native.query(sql, _warehouse(warehouse)))


class _Stream:
    def __init__(self, capsule: Any):
        self._capsule = capsule

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        if self._capsule is None:
            raise StrataError("this result was already read", "pipeline")
        capsule, self._capsule = self._capsule, None
        return capsule


def as_of(table: str, value: Any, warehouse: Optional[Union[str, "os.PathLike[str]"]] = None):
    """The rows of a historised table valid at ``value`` (a date, datetime, number, or SQL
    text such as ``"DATE '2024-02-15'"``), as a pyarrow.Table."""
    if isinstance(value, str) and not re.match(r"^\d{4}-\d{2}-\d{2}", value):
        v = value  # SQL text: DATE '...', current_date()
    elif isinstance(value, str):
        v = f"TIMESTAMP '{value}'" if len(value) > 10 else f"DATE '{value}'"
    else:
        v = pipelines._literal(value)
    return query(f"SELECT * FROM as_of({pipelines._literal(table)}, {v})", warehouse)


def events(warehouse: Optional[Union[str, "os.PathLike[str]"]] = None,
           last: Optional[int] = None, flow: Optional[str] = None):
    """The event log (one record per dataset and run) as a pyarrow.Table, latest runs last;
    ``last`` keeps the latest N runs, ``flow`` one flow's records."""
    where = []
    if flow is not None:
        where.append(f"flow = {pipelines._literal(flow)}")
    if last is not None:
        where.append("run_id IN (SELECT run_id FROM (SELECT DISTINCT run_id FROM event_log) "
                     f"ORDER BY run_id DESC LIMIT {int(last)})")
    cond = f" WHERE {' AND '.join(where)}" if where else ""
    return query(f"SELECT * FROM event_log{cond} ORDER BY started_at, run_id", warehouse)
