"""Lakeflow's Python API (``from pyspark import pipelines as dp``), for strata.

    from strata import pipelines as dp
    from strata.pipelines import col, expr

Every decorator and call declares a dataset or a flow, as in Lakeflow. Nothing runs here:
each declaration becomes the equivalent statement of strata's pipeline SQL (docs/pipeline-sql.md),
and ``strata.run`` plans and runs them with the engine that runs SQL files, with the same
semantics and the same checks. Errors name the Python file and line of the declaration.

Where Lakeflow's functions return Spark DataFrames, a decorated function here returns SQL
text (``"SELECT * FROM STREAM(users_cdc)"``) or a relation of the small API below
(``read_files``, ``table``, ``stream``, ``.select``, ``.where``, ``.with_column``), which
becomes SQL. A ``@dp.table`` / ``@dp.materialized_view`` function may also return Arrow data
(a pyarrow Table, a pandas or Polars DataFrame): the dataset is then a materialized view of
what the function returns when the pipeline runs. ``create_auto_cdc_from_snapshot_flow(
source=fn)`` takes a Python function returning snapshots as Arrow data.
"""

from __future__ import annotations

import datetime as _dt
import inspect
import os
import re
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Union

__all__ = [
    "Pipeline", "table", "materialized_view", "view", "create_streaming_table", "append_flow",
    "expect", "expect_or_drop", "expect_or_fail", "expect_all", "expect_all_or_drop",
    "expect_all_or_fail", "create_auto_cdc_flow", "create_auto_cdc_from_snapshot_flow",
    "apply_changes", "apply_changes_from_snapshot", "create_target_table", "create_sink",
    "read_files", "table_ref", "stream", "col", "expr", "lit", "struct", "Column", "Relation",
]


class StrataError(Exception):
    """Placeholder replaced by ``strata._native.StrataError`` when the engine is loaded."""


def _error(message: str) -> Exception:
    try:
        from . import _native
        return _native.StrataError(message, "pipeline")
    except ImportError:  # rendering works without the engine (tests of the SQL text)
        return StrataError(message)


# ------------------------------------------------------------------------------------------
# Expressions and relations
# ------------------------------------------------------------------------------------------

def _ident(name: str) -> str:
    """A column or table name as SQL: plain when it is a plain identifier, else backticked.
    Dotted names (`schema.table`, `_metadata.file_name`) keep their dots."""
    if not isinstance(name, str) or not name:
        raise _error(f"expected a column name (a non-empty string), got {name!r}")
    parts = name.split(".")
    return ".".join(p if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", p) else
                    "`" + p.replace("`", "``") + "`" for p in parts)


def _literal(v: Any) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return "TRUE" if v else "FALSE"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, _dt.datetime):
        return f"TIMESTAMP '{v.isoformat(sep=' ')}'"
    if isinstance(v, _dt.date):
        return f"DATE '{v.isoformat()}'"
    if isinstance(v, str):
        return "'" + v.replace("\\", "\\\\").replace("'", "\\'") + "'"
    raise _error(f"cannot write {type(v).__name__} {v!r} as a SQL literal")


class Column:
    """A SQL expression built in Python: ``col("a") == "x"``, ``expr("op = 'DELETE'")``."""

    def __init__(self, sql: str):
        self.sql = sql

    def __repr__(self) -> str:
        return f"Column({self.sql!r})"

    def _bin(self, op: str, other: Any, swap: bool = False) -> "Column":
        o = other.sql if isinstance(other, Column) else _literal(other)
        return Column(f"({o} {op} {self.sql})" if swap else f"({self.sql} {op} {o})")

    def __eq__(self, o):  # type: ignore[override]
        return self._bin("=", o)

    def __ne__(self, o):  # type: ignore[override]
        return self._bin("<>", o)

    def __lt__(self, o): return self._bin("<", o)
    def __le__(self, o): return self._bin("<=", o)
    def __gt__(self, o): return self._bin(">", o)
    def __ge__(self, o): return self._bin(">=", o)
    def __add__(self, o): return self._bin("+", o)
    def __radd__(self, o): return self._bin("+", o, swap=True)
    def __sub__(self, o): return self._bin("-", o)
    def __rsub__(self, o): return self._bin("-", o, swap=True)
    def __mul__(self, o): return self._bin("*", o)
    def __rmul__(self, o): return self._bin("*", o, swap=True)
    def __truediv__(self, o): return self._bin("/", o)
    def __and__(self, o): return self._bin("AND", o)
    def __or__(self, o): return self._bin("OR", o)
    def __invert__(self): return Column(f"(NOT {self.sql})")
    __hash__ = None  # type: ignore[assignment]

    def isNull(self) -> "Column": return Column(f"({self.sql} IS NULL)")
    def isNotNull(self) -> "Column": return Column(f"({self.sql} IS NOT NULL)")

    def isin(self, *values: Any) -> "Column":
        if len(values) == 1 and isinstance(values[0], (list, tuple, set)):
            values = tuple(values[0])
        return Column(f"({self.sql} IN ({', '.join(_literal(v) for v in values)}))")

    def alias(self, name: str) -> "Column":
        return Column(f"{self.sql} AS {_ident(name)}")

    def cast(self, type_name: str) -> "Column":
        return Column(f"CAST({self.sql} AS {type_name})")

    def __bool__(self):
        raise _error("a Column has no truth value: combine conditions with & | ~, not and/or/not")


def col(name: str) -> Column:
    """A column by name (``col("sequenceNum")``)."""
    return Column(_ident(name))


def expr(sql: str) -> Column:
    """A SQL expression as text (``expr("operation = 'DELETE'")``)."""
    if not isinstance(sql, str):
        raise _error(f"expr() takes SQL text, got {type(sql).__name__}")
    return Column(sql)


def lit(value: Any) -> Column:
    """A literal value."""
    return Column(_literal(value))


def struct(*cols: Union[str, Column]) -> Column:
    """``struct("a", "b")``: order by a, then b (for ``sequence_by``)."""
    return Column("STRUCT(" + ", ".join(_expr_sql(c, "struct") for c in cols) + ")")


def _expr_sql(v: Any, arg: str) -> str:
    """A Column, or a string (a column name where Lakeflow takes one, else SQL text)."""
    if isinstance(v, Column):
        return v.sql
    if isinstance(v, str) and v:
        return v
    raise _error(f"{arg}: expected a column name, col(...) or expr(...), got {type(v).__name__}")


def _column_name(v: Any, arg: str) -> str:
    if isinstance(v, Column):
        return v.sql
    if isinstance(v, str) and v:
        return _ident(v)
    raise _error(f"{arg}: expected column names (strings or col(...)), got {type(v).__name__}")


def _names(v: Any, arg: str) -> Optional[List[str]]:
    if v is None:
        return None
    if isinstance(v, (str, Column)) or not isinstance(v, Iterable):
        raise _error(f"{arg}: expected a list of column names, got {type(v).__name__}")
    out = [_column_name(x, arg) for x in v]
    if not out:
        raise _error(f"{arg}: the list is empty")
    return out


class Relation:
    """A query in the small relational API: a source (``read_files``, ``table``, ``stream``)
    with a projection and filters. ``str(rel)`` (or ``rel.sql``) is its SQL."""

    def __init__(self, source: str, streaming: bool,
                 projection: Optional[List[str]] = None, filters: Optional[List[str]] = None,
                 text: Optional[str] = None):
        self.text = text  # a query given as SQL text: used as it is
        self.source = source
        self.streaming = streaming
        self.projection = projection or ["*"]
        self.filters = filters or []

    def _with(self, projection=None, filters=None) -> "Relation":
        if self.text is not None:
            raise _error("select/where/with_column apply to read_files, table_ref and stream "
                         "relations, not to SQL text (write them into the SQL)")
        return Relation(self.source, self.streaming,
                        projection if projection is not None else list(self.projection),
                        filters if filters is not None else list(self.filters))

    def select(self, *cols: Union[str, Column]) -> "Relation":
        return self._with(projection=[c if c == "*" else _column_name(c, "select") if
                                      isinstance(c, str) else c.sql for c in cols])

    def selectExpr(self, *exprs: str) -> "Relation":
        return self._with(projection=[_expr_sql(e, "selectExpr") for e in exprs])

    def where(self, condition: Union[str, Column]) -> "Relation":
        return self._with(filters=self.filters + [_expr_sql(condition, "where")])

    filter = where

    def with_column(self, name: str, value: Union[Column, Any]) -> "Relation":
        v = value.sql if isinstance(value, Column) else _literal(value)
        return self._with(projection=self.projection + [f"{v} AS {_ident(name)}"])

    withColumn = with_column

    @property
    def sql(self) -> str:
        if self.text is not None:
            return self.text
        text = f"SELECT {', '.join(self.projection)} FROM {self.source}"
        if self.filters:
            text += " WHERE " + " AND ".join(f"({f})" for f in self.filters)
        return text

    def __str__(self) -> str:
        return self.sql

    def __repr__(self) -> str:
        return f"Relation({self.sql!r})"


def read_files(path: str, format: str, schema: Optional[str] = None, **options: Any) -> Relation:
    """Files under ``path`` read incrementally, like Auto Loader
    (``STREAM read_files(path, format => ..., schema => ..., header => true)``). A relative
    path resolves against the pipeline file's folder."""
    if not isinstance(path, str) or not isinstance(format, str):
        raise _error("read_files(path, format): both are strings")
    args = [_literal(path), f"format => {_literal(format)}"]
    if schema is not None:
        args.append(f"schema => {_literal(schema)}")
    for k, v in options.items():
        args.append(f"{k} => {_literal(v)}")
    return Relation(f"STREAM read_files({', '.join(args)})", streaming=True)


def table_ref(name: str) -> Relation:
    """A table of the pipeline or the warehouse, read in batch (``spark.read.table``)."""
    return Relation(_ident(name), streaming=False)


def stream(name: str) -> Relation:
    """The rows appended to a streaming table since the last run (``spark.readStream.table``;
    an AUTO CDC target's change data feed)."""
    return Relation(f"STREAM({_ident(name)})", streaming=True)


# ------------------------------------------------------------------------------------------
# Declarations
# ------------------------------------------------------------------------------------------

class _Decl:
    """One declaration: its SQL, and where in Python it was made."""

    def __init__(self, kind: str, name: str, origin: str, sql: str = "",
                 snapshot: Optional[dict] = None, returned: Optional[dict] = None):
        self.kind, self.name, self.origin, self.sql = kind, name, origin, sql
        self.snapshot = snapshot  # a Python snapshot source: {fn, flow, keys, ...}
        self.returned = returned  # a function returning Arrow data: {fn, staging, data}


class Pipeline:
    """The declarations of one pipeline. Declarations outside ``with Pipeline():`` go to the
    default pipeline (notebooks); ``strata.run(path.py)`` gives each file its own."""

    def __init__(self) -> None:
        self.decls: List[_Decl] = []
        # Whether the pipeline runs right after it is declared (a file strata.run executes),
        # so that the data a function returned when declared is the run's: else each run
        # calls the function again.
        self.runs_now = False

    def __enter__(self) -> "Pipeline":
        _stack.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _stack.remove(self)

    def clear(self) -> None:
        self.decls.clear()

    def _add(self, d: _Decl) -> None:
        for other in self.decls:
            if other.name == d.name and other.kind not in ("flow", "snapshot_flow") \
                    and d.kind not in ("flow", "snapshot_flow"):
                raise _error(f"{d.origin}: {d.name} is already declared at {other.origin}")
        self.decls.append(d)


_default = Pipeline()
_stack: List[Pipeline] = []


def current() -> Pipeline:
    """The pipeline declarations go to now."""
    return _stack[-1] if _stack else _default


def _origin(what: str, fn: Optional[Callable] = None) -> str:
    """``file.py:12 (@dp.table users)``: where the user declared it."""
    if fn is not None:
        try:
            code = fn.__code__
            return f"{os.path.basename(code.co_filename)}:{code.co_firstlineno} ({what})"
        except AttributeError:
            pass
    for frame in inspect.stack()[2:]:
        if os.path.dirname(os.path.abspath(frame.filename)) != os.path.dirname(__file__):
            return f"{os.path.basename(frame.filename)}:{frame.lineno} ({what})"
    return what


def _check_kwargs(fn_name: str, given: Dict[str, Any], allowed: Sequence[str]) -> None:
    for k in given:
        if k not in allowed:
            raise TypeError(f"{fn_name}() got an unexpected keyword argument '{k}'")


_NOT_YET = {
    "spark_conf": "Spark configuration does not apply to strata",
    "path": "tables live in the warehouse, at <warehouse>/<schema>/<table>",
    "row_filter": "row filters are not supported",
}


def _refuse(origin: str, **args: Any) -> None:
    for k, v in args.items():
        if v not in (None, False, [], {}):
            raise _error(f"{origin}: argument {k} is not supported by strata: {_NOT_YET[k]}")


def _props(table_properties: Optional[Dict[str, Any]], origin: str) -> str:
    if not table_properties:
        return ""
    if not isinstance(table_properties, dict):
        raise _error(f"{origin}: table_properties must be a dict, got "
                     f"{type(table_properties).__name__}")
    items = ", ".join(f"{_literal(str(k))} = {_literal(str(v))}"
                      for k, v in table_properties.items())
    return f"\nTBLPROPERTIES ({items})"


def _layout(partition_cols: Any, cluster_by: Any, origin: str) -> str:
    """``PARTITIONED BY (cols)`` (Delta partition columns) or ``CLUSTER BY (cols)`` (the
    columns ``strata optimize`` Z-orders the files by), as in Lakeflow not both."""
    def given(v: Any) -> Any:  # an empty list is no list, as Lakeflow takes it
        return None if isinstance(v, (list, tuple)) and not v else v

    partitions = _names(given(partition_cols), f"{origin}: partition_cols")
    clustering = _names(given(cluster_by), f"{origin}: cluster_by")
    if partitions and clustering:
        raise _error(f"{origin}: give partition_cols or cluster_by, not both")
    if partitions:
        return f"\nPARTITIONED BY ({', '.join(partitions)})"
    if clustering:
        return f"\nCLUSTER BY ({', '.join(clustering)})"
    return ""


def _comment(comment: Optional[str], origin: str) -> str:
    if comment is None:
        return ""
    if not isinstance(comment, str):
        raise _error(f"{origin}: comment must be a string, got {type(comment).__name__}")
    return f"\nCOMMENT {_literal(comment)}"


def _columns(schema: Any, expectations: List[tuple], origin: str) -> str:
    """The column list: a DDL schema string and the expectations as constraints."""
    parts: List[str] = []
    if schema is not None:
        if not isinstance(schema, str):
            raise _error(f"{origin}: schema must be a DDL string ('id INT, name STRING'), "
                         f"got {type(schema).__name__}")
        parts.append(schema.strip())
    for name, cond, action in expectations:
        on = {"warn": "", "drop": " ON VIOLATION DROP ROW", "fail": " ON VIOLATION FAIL UPDATE"}
        parts.append(f"CONSTRAINT {_ident(name)} EXPECT ({cond}){on[action]}")
    return f" (\n  {', '.join(parts)}\n)" if parts else ""


def _expectations_of(expect_all=None, expect_all_or_drop=None, expect_all_or_fail=None,
                     origin: str = "") -> List[tuple]:
    out = []
    for arg, d, action in (("expect_all", expect_all, "warn"),
                           ("expect_all_or_drop", expect_all_or_drop, "drop"),
                           ("expect_all_or_fail", expect_all_or_fail, "fail")):
        if d is None:
            continue
        if not isinstance(d, dict):
            raise _error(f"{origin}: {arg} must be a dict of name -> condition")
        out.extend((k, _expr_sql(v, arg), action) for k, v in d.items())
    return out


class _Returned:
    """Arrow data a dataset's function returned (anything with ``__arrow_c_stream__``)."""

    def __init__(self, data: Any):
        self.data = data


def _result_of(fn: Callable, origin: str) -> Union[Relation, _Returned]:
    """Calls a decorated function: it returns SQL text, a Relation, or Arrow data."""
    if not callable(fn):
        raise _error(f"{origin}: expected a function, got {type(fn).__name__}")
    q = fn()
    if isinstance(q, Relation):
        return q
    if isinstance(q, str):
        text = q.strip().rstrip(";").strip()
        return Relation("", streaming=bool(re.search(r"\bSTREAM\b", text, re.I)), text=text)
    if hasattr(q, "__arrow_c_stream__"):
        return _Returned(q)
    raise _error(f"{origin}: the function must return SQL text, a relation "
                 f"(read_files, table_ref, stream) or Arrow data (a pyarrow Table, a pandas or "
                 f"Polars DataFrame), got {type(q).__name__}")


def _query_of(fn: Callable, origin: str) -> Relation:
    """Calls a flow's function: it returns SQL text or a Relation."""
    q = _result_of(fn, origin)
    if isinstance(q, _Returned):
        raise _error(f"{origin}: the function returned Arrow data; a flow's function returns a "
                     "stream (SQL text or a relation); data produced in Python is a dataset "
                     "(@dp.table or @dp.materialized_view returning it) or a snapshot source "
                     "(create_auto_cdc_from_snapshot_flow(source=function))")
    return q


#: The suffix of the table holding the rows a dataset's Python function returned.
RETURNED_SUFFIX = "__python"


def _returned(fn: Callable, ds: str, data: Any) -> tuple:
    """(query, what to stage) of a dataset whose function returned Arrow data: the dataset
    reads the table its rows are staged in before each run."""
    staging = ds + RETURNED_SUFFIX  # beside the dataset, in its schema
    keep = data if current().runs_now else None  # else the run calls the function again
    return (Relation("", streaming=False, text=f"SELECT * FROM {_ident(staging)}"),
            {"fn": fn, "staging": staging, "data": keep})


def _pending_expectations(fn: Callable) -> List[tuple]:
    return list(reversed(getattr(fn, "__strata_expectations__", [])))


def _dataset(kind: str, decorator: str, query_fn=None, *, name=None, comment=None,
             spark_conf=None, table_properties=None, path=None, partition_cols=None,
             cluster_by=None, schema=None, row_filter=None, temporary=False, private=False,
             **extra):
    def register(fn: Callable) -> Callable:
        if not callable(fn):
            raise _error(f"@dp.{decorator} decorates a function, got {type(fn).__name__}")
        ds = name or fn.__name__
        origin = _origin(f"@dp.{decorator} {ds}", fn)
        _refuse(origin, spark_conf=spark_conf, path=path, row_filter=row_filter)
        layout = _layout(partition_cols, cluster_by, origin)
        q = _result_of(fn, origin)
        returned = None
        if isinstance(q, _Returned):
            q, returned = _returned(fn, ds, q.data)
        exps = _pending_expectations(fn)
        effective = kind
        if kind == "table":
            effective = "streaming" if q.streaming else "mv"
        if kind == "view" and q.streaming:
            # strata's views are batch queries; a view over a stream (Lakeflow's streaming
            # view, the usual source of create_auto_cdc_flow) is kept as a streaming table.
            effective = "streaming"
        if effective == "view":
            if exps:
                raise _error(f"{origin}: expectations on a view are not supported (put them on "
                             "the table that reads it)")
            sql = f"CREATE TEMPORARY VIEW {_ident(ds)}{_comment(comment, origin)} AS\n{q.sql}"
        else:
            # private=True (temporary=True, its legacy name): kept out of the catalog,
            # read by this pipeline alone.
            keep = " PRIVATE" if (private or temporary) else ""
            head = (f"CREATE OR REFRESH{keep} STREAMING TABLE" if effective == "streaming"
                    else f"CREATE OR REFRESH{keep} MATERIALIZED VIEW")
            sql = (f"{head} {_ident(ds)}{_columns(schema, exps, origin)}"
                   f"{_comment(comment, origin)}{layout}{_props(table_properties, origin)}"
                   f"\nAS {q.sql}")
        current()._add(_Decl(effective, ds, origin, sql, returned=returned))
        return fn

    if query_fn is not None:
        return register(query_fn)
    return register


def table(query_function: Optional[Callable] = None, *, name: Optional[str] = None,
          comment: Optional[str] = None, spark_conf: Optional[dict] = None,
          table_properties: Optional[dict] = None, path: Optional[str] = None,
          partition_cols: Optional[list] = None, cluster_by: Optional[list] = None,
          schema: Optional[str] = None, row_filter: Optional[str] = None,
          temporary: bool = False, private: bool = False):
    """``@dp.table``: a streaming table when the function reads a stream (``read_files``,
    ``stream(...)``, ``STREAM`` in its SQL), else a materialized view, as in Lakeflow; a
    function returning Arrow data makes a materialized view of what it returns on each run."""
    return _dataset("table", "table", query_function, name=name, comment=comment,
                    spark_conf=spark_conf, table_properties=table_properties, path=path,
                    partition_cols=partition_cols, cluster_by=cluster_by, schema=schema,
                    row_filter=row_filter, temporary=temporary, private=private)


def materialized_view(query_function: Optional[Callable] = None, *, name: Optional[str] = None,
                      comment: Optional[str] = None, spark_conf: Optional[dict] = None,
                      table_properties: Optional[dict] = None, path: Optional[str] = None,
                      partition_cols: Optional[list] = None, cluster_by: Optional[list] = None,
                      schema: Optional[str] = None, row_filter: Optional[str] = None,
                      private: bool = False):
    """``@dp.materialized_view``: a batch query stored as a table, recomputed when what it
    reads changed."""
    return _dataset("mv", "materialized_view", query_function, name=name, comment=comment,
                    spark_conf=spark_conf, table_properties=table_properties, path=path,
                    partition_cols=partition_cols, cluster_by=cluster_by, schema=schema,
                    row_filter=row_filter, private=private)


def view(query_function: Optional[Callable] = None, *, name: Optional[str] = None,
         comment: Optional[str] = None):
    """``@dp.view``: a named query, not stored. A view over a stream is kept as a streaming
    table (strata's views are batch queries)."""
    return _dataset("view", "view", query_function, name=name, comment=comment)


temporary_view = view


def create_streaming_table(name: str, comment: Optional[str] = None,
                           spark_conf: Optional[dict] = None,
                           table_properties: Optional[dict] = None, path: Optional[str] = None,
                           partition_cols: Optional[list] = None,
                           cluster_by: Optional[list] = None, schema: Optional[str] = None,
                           expect_all: Optional[dict] = None,
                           expect_all_or_drop: Optional[dict] = None,
                           expect_all_or_fail: Optional[dict] = None,
                           row_filter: Optional[str] = None) -> None:
    """A streaming table that flows (``create_auto_cdc_flow``, ``@dp.append_flow``) write into."""
    if not isinstance(name, str) or not name:
        raise _error(f"create_streaming_table: name must be a string, got {type(name).__name__}")
    origin = _origin(f"create_streaming_table {name}")
    _refuse(origin, spark_conf=spark_conf, path=path, row_filter=row_filter)
    layout = _layout(partition_cols, cluster_by, origin)
    exps = _expectations_of(expect_all, expect_all_or_drop, expect_all_or_fail, origin)
    sql = (f"CREATE OR REFRESH STREAMING TABLE {_ident(name)}{_columns(schema, exps, origin)}"
           f"{_comment(comment, origin)}{layout}{_props(table_properties, origin)}")
    current()._add(_Decl("streaming_target", name, origin, sql))


create_target_table = create_streaming_table


def create_sink(name: str, format: str, options: Optional[dict] = None) -> None:
    """``dp.create_sink(name, "delta", {"path": ...})`` (or ``{"tableName": "schema.t"}``): a
    Delta table outside the pipeline's datasets that ``@dp.append_flow(target=name)`` flows
    append to (and ``create_auto_cdc_flow(target=name)`` flows apply changes to), exactly
    once across kills and re-runs. Kafka and Event Hubs sinks are not
    supported; PostgreSQL sinks need a connection, which only the SQL dialect declares."""
    if not isinstance(name, str) or not name:
        raise _error(f"create_sink: name must be a string, got {type(name).__name__}")
    origin = _origin(f"create_sink {name}")
    if not isinstance(format, str):
        raise _error(f"{origin}: format must be a string such as 'delta'")
    opts = dict(options or {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in opts.items()):
        raise _error(f"{origin}: options must map option names to strings")
    rendered = ", ".join(f"{_ident(k)} {_literal(v)}" for k, v in
                         [("format", format)] + sorted(opts.items()))
    sql = f"CREATE SINK {_ident(name)} OPTIONS ({rendered})"
    current()._add(_Decl("sink", name, origin, sql))


def append_flow(func: Optional[Callable] = None, *, target: Optional[str] = None,
                name: Optional[str] = None, spark_conf: Optional[dict] = None,
                once: bool = False, comment: Optional[str] = None):
    """``@dp.append_flow(target=...)``: appends the new rows of the function's stream.

    With ``once=True`` it is a one-time flow (a backfill, ``INSERT INTO ONCE``): the
    function returns a batch query (``read_files`` reads every file under its path,
    ``table_ref`` a whole table, or SQL text without ``STREAM``); it runs in the first
    update after it is declared and again only after a full refresh of its target."""
    def register(fn: Callable) -> Callable:
        flow = name or fn.__name__
        origin = _origin(f"@dp.append_flow {flow}", fn)
        if not isinstance(target, str) or not target:
            raise _error(f"{origin}: target must be the name of a streaming table")
        _refuse(origin, spark_conf=spark_conf)
        if not isinstance(once, bool):
            raise _error(f"{origin}: once must be True or False")
        q = _query_of(fn, origin)
        if once:
            q = _batch_of(q, origin)
        insert = "INSERT INTO ONCE" if once else "INSERT INTO"
        sql = f"CREATE FLOW {_ident(flow)}{_comment(comment, origin)} AS {insert} " \
              f"{_ident(target)} BY NAME\n{q.sql}"
        current()._add(_Decl("flow", flow, origin, sql))
        return fn

    if func is not None:
        return register(func)
    return register


def _batch_of(q: Relation, origin: str) -> Relation:
    """The batch form of a once flow's query (Lakeflow's ``once=True`` takes a batch
    DataFrame): ``read_files`` reads every file under its path; a stream is refused."""
    if q.text is None and q.source.startswith("STREAM read_files("):
        return Relation(q.source[len("STREAM "):], streaming=False,
                        projection=list(q.projection), filters=list(q.filters))
    if q.streaming:
        raise _error(f"{origin}: a once=True flow reads in batch (spark.read, not readStream): "
                     "return read_files(...), table_ref(...) or SQL text without STREAM")
    return q


def _expect_decorator(action: str, pairs: Callable[[], Dict[str, Any]], decorator: str):
    def wrap(fn: Callable) -> Callable:
        got = pairs()
        existing = list(getattr(fn, "__strata_expectations__", []))
        # Decorators apply bottom-up; keep the written (top-down) order when rendering.
        for k, v in reversed(list(got.items())):
            if not isinstance(k, str) or not k:
                raise _error(f"@dp.{decorator}: an expectation's name must be a string")
            existing.append((k, _expr_sql(v, decorator), action))
        fn.__strata_expectations__ = existing  # type: ignore[attr-defined]
        return fn
    return wrap


def expect(description: str, constraint: str):
    """Keep rows failing ``constraint`` and count them in the event log."""
    return _expect_decorator("warn", lambda: {description: constraint}, "expect")


def expect_or_drop(description: str, constraint: str):
    """Drop rows failing ``constraint`` (and count them)."""
    return _expect_decorator("drop", lambda: {description: constraint}, "expect_or_drop")


def expect_or_fail(description: str, constraint: str):
    """Fail the update when a row fails ``constraint``; nothing of the batch is written."""
    return _expect_decorator("fail", lambda: {description: constraint}, "expect_or_fail")


def _dict_arg(d: Any, decorator: str) -> Dict[str, Any]:
    if not isinstance(d, dict):
        raise _error(f"@dp.{decorator} takes a dict of name -> condition, got {type(d).__name__}")
    return d


def expect_all(expectations: Dict[str, str]):
    return _expect_decorator("warn", lambda: _dict_arg(expectations, "expect_all"), "expect_all")


def expect_all_or_drop(expectations: Dict[str, str]):
    return _expect_decorator("drop", lambda: _dict_arg(expectations, "expect_all_or_drop"),
                             "expect_all_or_drop")


def expect_all_or_fail(expectations: Dict[str, str]):
    return _expect_decorator("fail", lambda: _dict_arg(expectations, "expect_all_or_fail"),
                             "expect_all_or_fail")


def _scd(stored_as_scd_type: Any, origin: str, snapshot: bool = False) -> str:
    v = stored_as_scd_type
    if isinstance(v, str) and v.strip().upper() == "SNAPSHOTS" and snapshot:
        return "SNAPSHOTS"
    if isinstance(v, str) and v.strip() in ("1", "2"):
        v = int(v)
    if v in (1, 2) and not isinstance(v, bool):
        return f"SCD TYPE {v}"
    also = " (or 'SNAPSHOTS')" if snapshot else ""
    raise _error(f"{origin}: stored_as_scd_type must be 1 or 2{also}, got {stored_as_scd_type!r}")


def _track_history(origin: str, column_list=None, except_column_list=None) -> str:
    cols = _names(column_list, "track_history_column_list")
    exc = _names(except_column_list, "track_history_except_column_list")
    if cols and exc:
        raise _error(f"{origin}: give track_history_column_list or "
                     "track_history_except_column_list, not both")
    if cols:
        return f"\nTRACK HISTORY ON {', '.join(cols)}"
    if exc:
        return f"\nTRACK HISTORY ON * EXCEPT ({', '.join(exc)})"
    return ""


def _columns_clause(origin: str, column_list=None, except_column_list=None,
                    extra_except: Sequence[str] = ()) -> str:
    cols = _names(column_list, "column_list")
    exc = _names(except_column_list, "except_column_list")
    if cols and exc:
        raise _error(f"{origin}: give column_list or except_column_list, not both")
    if cols:
        return f"\nCOLUMNS {', '.join(cols)}"
    exc = (exc or []) + list(extra_except)
    if exc:
        return f"\nCOLUMNS * EXCEPT ({', '.join(exc)})"
    return ""


def _source_name(source: Any, origin: str) -> str:
    if isinstance(source, str) and source:
        return _ident(source)
    raise _error(f"{origin}: source must be the name of a streaming table or view, "
                 f"got {type(source).__name__}")


def create_auto_cdc_flow(target: str, source: str, keys: Sequence[Union[str, Column]],
                         sequence_by: Union[str, Column], ignore_null_updates: bool = False,
                         apply_as_deletes: Optional[Union[str, Column]] = None,
                         apply_as_truncates: Optional[Union[str, Column]] = None,
                         column_list: Optional[Sequence[Union[str, Column]]] = None,
                         except_column_list: Optional[Sequence[Union[str, Column]]] = None,
                         stored_as_scd_type: Union[int, str] = 1,
                         track_history_column_list: Optional[Sequence[Union[str, Column]]] = None,
                         track_history_except_column_list: Optional[
                             Sequence[Union[str, Column]]] = None,
                         name: Optional[str] = None, once: bool = False) -> None:
    """An AUTO CDC flow: change events of ``source`` applied to ``target`` (SCD type 1 or 2).

    With ``once=True`` it is a one-time backfill (``AUTO CDC ONCE``): ``source`` is read in
    batch in the first update after the flow is declared, and again only after a full refresh
    of ``target``; its events meet those of the streaming flows into ``target`` as theirs do."""
    if not isinstance(target, str) or not target:
        raise _error(f"create_auto_cdc_flow: target must be a table name, got "
                     f"{type(target).__name__}")
    flow = name if name is not None else f"{target.split('.')[-1]}_flow"
    if not isinstance(flow, str) or not flow:
        raise _error("create_auto_cdc_flow: name must be a string")
    origin = _origin(f"create_auto_cdc_flow {flow}")
    if not isinstance(once, bool):
        raise _error(f"{origin}: once must be True or False")
    if not isinstance(ignore_null_updates, bool):
        raise _error(f"{origin}: ignore_null_updates must be True or False")
    key_list = _names(keys, "keys")
    if not key_list:
        raise _error(f"{origin}: keys must list the key columns")
    if sequence_by is None:
        raise _error(f"{origin}: sequence_by is required")
    seq = _column_name(sequence_by, "sequence_by") if isinstance(sequence_by, str) \
        else _expr_sql(sequence_by, "sequence_by")
    # once=True: AUTO CDC ONCE, a one-time backfill that reads its source in batch.
    source_sql = (_source_name(source, origin) if once
                  else f"STREAM({_source_name(source, origin)})")
    sql = (f"CREATE FLOW {_ident(flow)} AS AUTO CDC{' ONCE' if once else ''} INTO "
           f"{_ident(target)}\nFROM {source_sql}\nKEYS ({', '.join(key_list)})")
    if ignore_null_updates:
        sql += "\nIGNORE NULL UPDATES"
    if apply_as_deletes is not None:
        sql += f"\nAPPLY AS DELETE WHEN {_expr_sql(apply_as_deletes, 'apply_as_deletes')}"
    if apply_as_truncates is not None:
        sql += f"\nAPPLY AS TRUNCATE WHEN {_expr_sql(apply_as_truncates, 'apply_as_truncates')}"
    sql += f"\nSEQUENCE BY {seq}"
    sql += _columns_clause(origin, column_list, except_column_list)
    sql += f"\nSTORED AS {_scd(stored_as_scd_type, origin)}"
    sql += _track_history(origin, track_history_column_list, track_history_except_column_list)
    current()._add(_Decl("flow", flow, origin, sql))


apply_changes = create_auto_cdc_flow

#: The column holding a Python-produced snapshot's version in its staging table.
SNAPSHOT_VERSION_COLUMN = "__snapshot_version"


def create_auto_cdc_from_snapshot_flow(
        target: str, source: Union[str, Callable[[Any], Any]],
        keys: Sequence[Union[str, Column]], stored_as_scd_type: Union[int, str] = 1,
        track_history_column_list: Optional[Sequence[Union[str, Column]]] = None,
        track_history_except_column_list: Optional[Sequence[Union[str, Column]]] = None,
        name: Optional[str] = None, column_list=None, except_column_list=None) -> None:
    """History from full snapshots. ``source`` is a table name (each run whose source changed
    takes its whole content as one snapshot) or a function ``fn(latest_version)`` returning
    ``(data, version)`` or ``None``: strata calls it with the latest version it was given
    (``None`` the first time) until it returns ``None``, and applies each snapshot (Arrow data:
    a pyarrow Table, a pandas or Polars DataFrame) at its version, late ones included."""
    if not isinstance(target, str) or not target:
        raise _error("create_auto_cdc_from_snapshot_flow: target must be a table name")
    flow = name if name is not None else f"{target.split('.')[-1]}_flow"
    origin = _origin(f"create_auto_cdc_from_snapshot_flow {flow}")
    key_list = _names(keys, "keys")
    if not key_list:
        raise _error(f"{origin}: keys must list the key columns")
    scd = _scd(stored_as_scd_type, origin, snapshot=True)
    history = _track_history(origin, track_history_column_list, track_history_except_column_list)
    if callable(source) and not isinstance(source, str):
        staging = target + "__snapshots"
        columns = _columns_clause(origin, column_list, except_column_list,
                                  extra_except=[SNAPSHOT_VERSION_COLUMN])
        sql = (f"CREATE FLOW {_ident(flow)} AS AUTO CDC FROM SNAPSHOT INTO {_ident(target)}\n"
               f"FROM STREAM({_ident(staging)})\nKEYS ({', '.join(key_list)})\n"
               f"SNAPSHOT VERSION BY {SNAPSHOT_VERSION_COLUMN}{columns}\nSTORED AS {scd}"
               f"{history}")
        current()._add(_Decl("snapshot_flow", flow, origin, sql, snapshot={
            "fn": source, "flow": flow, "staging": staging, "keys": key_list}))
        return
    columns = _columns_clause(origin, column_list, except_column_list)
    sql = (f"CREATE FLOW {_ident(flow)} AS AUTO CDC FROM SNAPSHOT INTO {_ident(target)}\n"
           f"FROM {_source_name(source, origin)}\nKEYS ({', '.join(key_list)}){columns}\n"
           f"STORED AS {scd}{history}")
    current()._add(_Decl("flow", flow, origin, sql))


apply_changes_from_snapshot = create_auto_cdc_from_snapshot_flow
