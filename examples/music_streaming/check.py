#!/usr/bin/env python3
"""Independent check of the example's answer (Python 3 standard library only).

    python3 check.py [--data DIR] [--batches N]
    python3 check.py --warehouse DIR [--strata BIN] [--views] [--batches N]

Computes "how many hours did premium users stream in February 2026?" straight from the source
files, without strata: the silver rules (rows without user_id dropped, negative ms_played
dropped, plan names lower-cased and trimmed), each play's latest report (by updated_at), and
each user's plan at the start of the play, from a plain fold over that user's change records
ordered by updated_at (the latest record at or before the start; a deletion means no plan).
It also computes what the naive join on user_id gives (a play counted once per premium version
of its user, versions built by the same fold: a change that alters nothing is no new version).

With --warehouse it runs the same two questions with `strata query` on the gold tables
(dim_user, fact_stream) and compares play counts and milliseconds exactly, and the version
count of dim_user and the content of fact_stream; --views also compares the materialized views
plan_hours_by_month and plan_hours_by_month_naive. --batches 1 checks a warehouse that has
seen only batch 1. Prints the numbers; exits 1 on any mismatch.
"""

import argparse
import csv
import glob
import json
import os
import subprocess
import sys
from collections import defaultdict
from datetime import datetime, timezone

FEB = (datetime(2026, 2, 1, tzinfo=timezone.utc), datetime(2026, 3, 1, tzinfo=timezone.utc))
TRACKED = ("name", "country", "plan")


def parse_ts(s):
    return datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)


def clean(s, f):
    return None if s is None else f(s.strip())


def load(data, batches):
    users, streams = [], []
    for b in range(1, batches + 1):
        for path in sorted(glob.glob(os.path.join(data, f"batch{b}", "users", "*.json"))):
            with open(path, encoding="utf-8") as f:
                for line in f:
                    r = json.loads(line)
                    if r["user_id"] is None:
                        continue  # silver: valid_user_id ... ON VIOLATION DROP ROW
                    users.append(dict(user_id=r["user_id"], name=clean(r["name"], str),
                                      country=clean(r["country"], str.upper), plan=clean(r["plan"], str.lower),
                                      op=r["op"], updated_at=parse_ts(r["updated_at"])))
        for path in sorted(glob.glob(os.path.join(data, f"batch{b}", "streams", "*.csv"))):
            with open(path, encoding="utf-8", newline="") as f:
                for r in csv.DictReader(f):
                    if r["user_id"] == "" or int(r["ms_played"]) < 0:
                        continue  # silver: valid_user_id, valid_ms_played ... DROP ROW
                    streams.append(dict(stream_id=int(r["stream_id"]), user_id=int(r["user_id"]),
                                        started_at=parse_ts(r["started_at"]), ms_played=int(r["ms_played"]),
                                        updated_at=parse_ts(r["updated_at"])))
    return users, streams


def fold_users(users):
    """user_id -> list of versions (values, start, end); end None = open."""
    by_user = defaultdict(dict)
    for e in users:
        seen = by_user[e["user_id"]].setdefault(e["updated_at"], e)
        if seen != e:
            sys.exit(f"user {e['user_id']}: two different changes at {e['updated_at']}")
    versions = {}
    for uid, events in by_user.items():
        out, open_ = [], None
        for t in sorted(events):
            e = events[t]
            if e["op"] == "DELETE":
                if open_:
                    out.append((open_[0], open_[1], t))
                open_ = None
                continue
            values = tuple(e[c] for c in TRACKED)
            if open_ and open_[0] == values:
                continue  # no change: no new version
            if open_:
                out.append((open_[0], open_[1], t))
            open_ = (values, t)
        if open_:
            out.append((open_[0], open_[1], None))
        versions[uid] = out
    return versions


def latest_reports(streams):
    fact = {}
    for s in streams:
        cur = fact.get(s["stream_id"])
        if cur is None or s["updated_at"] > cur["updated_at"]:
            fact[s["stream_id"]] = s
        elif s["updated_at"] == cur["updated_at"] and s != cur:
            sys.exit(f"stream {s['stream_id']}: two different reports at {s['updated_at']}")
    return fact


def plan_at(events, t):
    """The plan of the latest change at or before t (a plain scan, independent of the versions)."""
    latest = None
    for e in events:
        if e["updated_at"] <= t and (latest is None or e["updated_at"] > latest["updated_at"]):
            latest = e
    return None if latest is None or latest["op"] == "DELETE" else latest["plan"]


def expected(data, batches):
    users, streams = load(data, batches)
    versions = fold_users(users)
    fact = latest_reports(streams)
    events = defaultdict(list)
    for e in users:
        events[e["user_id"]].append(e)
    r = dict(pit_streams=0, pit_ms=0, naive_streams=0, naive_ms=0,
             dim_user_rows=sum(len(v) for v in versions.values()),
             fact_rows=len(fact), fact_ms=sum(s["ms_played"] for s in fact.values()))
    for s in fact.values():
        if not FEB[0] <= s["started_at"] < FEB[1]:
            continue
        if plan_at(events[s["user_id"]], s["started_at"]) == "premium":
            r["pit_streams"] += 1
            r["pit_ms"] += s["ms_played"]
        n = sum(1 for v in versions.get(s["user_id"], []) if v[0][2] == "premium")
        r["naive_streams"] += n
        r["naive_ms"] += n * s["ms_played"]
    return r


FEB_SQL = "s.started_at >= TIMESTAMP '2026-02-01 00:00:00' AND s.started_at < TIMESTAMP '2026-03-01 00:00:00'"
QUERIES = {
    "pit": "SELECT count(*) AS streams, coalesce(sum(s.ms_played), 0) AS ms FROM fact_stream s "
           "JOIN dim_user u ON u.user_id = s.user_id AND s.started_at >= u.__START_AT "
           "AND (u.__END_AT IS NULL OR s.started_at < u.__END_AT) "
           f"WHERE u.plan = 'premium' AND {FEB_SQL}",
    "naive": "SELECT count(*) AS streams, coalesce(sum(s.ms_played), 0) AS ms FROM fact_stream s "
             f"JOIN dim_user u ON u.user_id = s.user_id WHERE u.plan = 'premium' AND {FEB_SQL}",
    "tables": "SELECT (SELECT count(*) FROM dim_user) AS dim_user_rows, (SELECT count(*) FROM fact_stream) AS fact_rows, "
              "(SELECT sum(ms_played) FROM fact_stream) AS fact_ms",
    "views": "SELECT (SELECT hours FROM plan_hours_by_month WHERE month = DATE '2026-02-01' AND plan = 'premium') AS pit, "
             "(SELECT hours FROM plan_hours_by_month_naive WHERE month = DATE '2026-02-01' AND plan = 'premium') AS naive",
}


def query(strata, warehouse, sql):
    p = subprocess.run([strata, "query", "--warehouse", warehouse, "--format", "json", sql],
                       capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"strata query failed ({p.returncode}): {p.stderr.strip()}\n{sql}")
    return json.loads(p.stdout.splitlines()[0])


def hours(ms):
    return ms / 3_600_000


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description="Checks the February premium hours against a fold over the source files.")
    ap.add_argument("--data", default=os.path.join(here, "data"))
    ap.add_argument("--batches", type=int, default=2, choices=[1, 2])
    ap.add_argument("--warehouse")
    ap.add_argument("--strata", default=os.environ.get("STRATA", os.path.join(
        os.environ.get("CARGO_TARGET_DIR", os.path.expanduser("~/.cache/strata-target")), "debug", "strata")))
    ap.add_argument("--views", action="store_true", help="also compare the materialized views")
    a = ap.parse_args()

    e = expected(a.data, a.batches)
    print(f"expected (fold over batch 1..{a.batches}):")
    print(f"  point-in-time join: {e['pit_streams']} plays, {hours(e['pit_ms']):.2f} hours of premium listening in February")
    print(f"  naive join:         {e['naive_streams']} plays, {hours(e['naive_ms']):.2f} hours")
    print(f"  dim_user {e['dim_user_rows']} rows, fact_stream {e['fact_rows']} rows ({e['fact_ms']} ms)")
    if not a.warehouse:
        return 0

    bad = []
    pit, naive, tables = (query(a.strata, a.warehouse, QUERIES[k]) for k in ("pit", "naive", "tables"))
    print(f"strata ({a.warehouse}):")
    print(f"  point-in-time join: {pit['streams']} plays, {hours(pit['ms']):.2f} hours")
    print(f"  naive join:         {naive['streams']} plays, {hours(naive['ms']):.2f} hours")
    print(f"  dim_user {tables['dim_user_rows']} rows, fact_stream {tables['fact_rows']} rows ({tables['fact_ms']} ms)")
    for name, got, want in (("pit plays", pit["streams"], e["pit_streams"]), ("pit ms", pit["ms"], e["pit_ms"]),
                            ("naive plays", naive["streams"], e["naive_streams"]), ("naive ms", naive["ms"], e["naive_ms"]),
                            ("dim_user rows", tables["dim_user_rows"], e["dim_user_rows"]),
                            ("fact_stream rows", tables["fact_rows"], e["fact_rows"]),
                            ("fact_stream ms", tables["fact_ms"], e["fact_ms"])):
        if got != want:
            bad.append(f"{name}: strata {got}, expected {want}")
    if a.views:
        v = query(a.strata, a.warehouse, QUERIES["views"])
        print(f"  views: plan_hours_by_month {v['pit']}, plan_hours_by_month_naive {v['naive']}")
        for name, got, want in (("plan_hours_by_month", v["pit"], hours(e["pit_ms"])),
                                ("plan_hours_by_month_naive", v["naive"], hours(e["naive_ms"]))):
            if got is None or abs(got - want) > 0.0051:
                bad.append(f"{name}: {got} hours, expected {want:.2f}")
    for b in bad:
        print("MISMATCH " + b, file=sys.stderr)
    print("ok" if not bad else f"{len(bad)} mismatch(es)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
