"""``python -m strata run PIPELINE [PIPELINE ...] [--warehouse DIR] ...``: what ``strata run``
delegates ``.py`` pipelines to. Exit codes as the CLI's: 2 the pipeline or input is wrong,
3 another writer kept committing first, 4 storage failed, 5 an internal error."""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

EXIT = {"pipeline": 2, "conflict": 3, "storage": 4, "internal": 5}


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="strata", description="Run a pipeline written in Python")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run a pipeline (.py, .sql, .yaml; several files run as one)")
    r.add_argument("pipeline", nargs="+")
    r.add_argument("--warehouse")
    r.add_argument("--conf", action="append", default=[], metavar="NAME=VALUE")
    r.add_argument("--select", metavar="NAME[+]")
    r.add_argument("--full-refresh", nargs="*", metavar="TABLE")
    s = sub.add_parser("sql", help="print the SQL a Python pipeline renders to")
    s.add_argument("pipeline", nargs="+")
    args = p.parse_args(argv)

    import strata

    try:
        if args.command == "sql":
            print(strata.sql(args.pipeline), end="")
            return 0
        conf = {}
        for c in args.conf:
            k, eq, v = c.partition("=")
            if not eq or not k.strip():
                print(f"error: expected NAME=VALUE, got '{c}'", file=sys.stderr)
                return 2
            conf[k.strip()] = v
        refresh = None
        if args.full_refresh is not None:
            refresh = [t for a in args.full_refresh for t in a.split(",") if t] or True
        pipeline = args.pipeline[0] if len(args.pipeline) == 1 else args.pipeline
        report = strata.run(pipeline, warehouse=args.warehouse, conf=conf, select=args.select,
                            full_refresh=refresh or False, progress=progress)
    except strata.StrataError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT.get(e.kind, 2)
    for line in summary(report):
        print(line)
    return 0


def progress(event: str, node: str, detail: str, elapsed: float) -> None:
    """A plain line per dataset on stderr, as the CLI logs without a terminal."""
    if event == "finished":
        print(f"{node}: {detail} ({elapsed:.1f} s)", file=sys.stderr, flush=True)


def summary(report: dict) -> List[str]:
    """The run's outcome, one line per dataset, as ``strata run`` prints it."""
    out = []
    for i in report["ingests"]:
        what = f"flow {i['flow']} (into {i['table']})" if i["append"] else f"table {i['table']}"
        if i["skipped"]:
            out.append(f"{what}: {i['skipped']}")
        else:
            src = f"from {len(i['files'])} file(s)" if i["files"] else "from its source table"
            dropped = f", {i['rows_dropped']} dropped by expectations" if i["rows_dropped"] else ""
            out.append(f"{what}: ingested {i['rows']} row(s) {src}{dropped}")
    out += [f"waiting: {w}" for w in report["waiting"]]
    for f in report["flows"]:
        if f["skipped"]:
            out.append(f"flow {f['flow']}: {f['skipped']}")
        else:
            out.append(f"flow {f['flow']}: {f['events']} event(s), {f['keys_changed']} key(s) "
                       f"changed, {f['rows_inserted']} row(s) written, {f['rows_deleted']} "
                       "row(s) replaced")
        out += [f"flow {f['flow']}: {n}" for n in f["notes"]]
    for v in report["views"]:
        out.append(f"materialized view {v['table']}: " +
                   (v["skipped"] or f"recomputed, {v['rows']} row(s)"))
    for t in report["pits"]:
        out.append(f"point-in-time table {t['table']}: " +
                   (t["skipped"] or f"{t['rows']} row(s) written"))
    return out


if __name__ == "__main__":
    sys.exit(main())
