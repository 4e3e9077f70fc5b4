#!/usr/bin/env python3
"""Generates the source files of the music-streaming example (Python 3 standard library only).

    python3 generate.py [--out DIR] [--users N] [--tracks N] [--artists N] [--streams N] [--seed S]

Writes DIR/batch1/{users,artists,tracks,streams}/... and DIR/batch2/... (DIR defaults to the
`data` folder next to this file). The same arguments give byte-for-byte the same files; the
bundled data is `python3 generate.py` with the defaults.

What the files hold (all timestamps UTC, ISO-8601, whole seconds):

- users (JSON Lines): change records of the account system, full rows: user_id, name, country,
  plan, op ('UPSERT' or 'DELETE'; a DELETE carries only user_id and updated_at), updated_at.
  Accounts sign up in 2025 or during January to March 2026 and change plan (free, premium,
  family), country or name; a few delete their account. Dirty rows: NULL user_id (silver drops
  them), unknown plans such as 'trial' (silver keeps and counts them), plans in odd case or with
  spaces (silver normalises them).
- artists (CSV): artist_id, name, country, updated_at; batch 2 renames two artists.
- tracks (CSV): track_id, artist_id, title, genre, duration_ms, updated_at; genre
  reclassifications and remastered re-releases during the quarter.
- streams (CSV): stream_id, user_id, track_id, started_at, ms_played, updated_at (when the play
  was reported). A few plays are corrected later (same stream_id, new ms_played, later
  updated_at); a few are delivered twice unchanged; dirty rows have no user_id or a negative
  ms_played.

Batch 1 is everything the sources had reported by the cut-off (2026-02-15 00:00 UTC) except
some late records; batch 2 is the rest: plan upgrades after the cut-off (free to premium in
February, premium to family in March), records older than the cut-off that were held back
(account changes earlier than the latest change batch 1 has for that user, offline plays synced
late, a change older than an account deletion), corrections and redeliveries.
"""

import argparse
import csv
import io
import json
import os
import random
from datetime import datetime, timedelta, timezone

UTC = timezone.utc
CUT = datetime(2026, 2, 15, tzinfo=UTC)  # batch 1 holds what was reported before this
Q_START = datetime(2026, 1, 1, tzinfo=UTC)
Q_END = datetime(2026, 4, 1, tzinfo=UTC)
PLANS = ["free", "premium", "family"]
COUNTRIES = ["DE", "FR", "ES", "IT", "NL", "SE", "PL", "PT", "US", "BR", "MX", "JP"]
GENRES = ["pop", "rock", "hip-hop", "electronic", "jazz", "classical", "indie", "latin", "metal", "folk"]
FIRST = ["Ana", "Ben", "Cleo", "Dev", "Ema", "Finn", "Gia", "Hugo", "Ines", "Jon", "Kai", "Lena",
         "Milo", "Nora", "Omar", "Pia", "Quinn", "Rosa", "Sami", "Tess", "Ugo", "Vera", "Wim",
         "Xena", "Yara", "Zoe", "Luca", "Maya", "Noah", "Ella"]
LAST = ["Alves", "Berg", "Costa", "Dahl", "Eriksen", "Fischer", "Garcia", "Horvat", "Ito", "Jansen",
        "Kowalski", "Lopez", "Moreau", "Novak", "Olsen", "Perez", "Rossi", "Silva", "Tanaka",
        "Weber"]
SYL = ["la", "mo", "ri", "ka", "ne", "so", "tu", "vi", "da", "xo", "lu", "pe", "zin", "ra", "mi"]
WORDS = ["Night", "Echo", "River", "Gold", "Static", "Velvet", "Paper", "Neon", "Quiet", "Storm",
         "Glass", "Summer", "Ghost", "Signal", "Wild", "Blue", "Fire", "Orbit", "Salt", "Dust"]


def ts(t):
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def rand_time(rng, lo, hi):
    """A whole-second time in [lo, hi)."""
    span = int((hi - lo).total_seconds())
    return lo + timedelta(seconds=rng.randrange(span))


class User:
    def __init__(self, uid):
        self.uid = uid
        self.events = []  # dicts: name, country, plan, op, updated_at (datetime)

    def state_at(self, t):
        """The plan of the latest event at or before t, by updated_at; None: no account then."""
        cur = None
        for e in self.events:
            if e["updated_at"] <= t and (cur is None or e["updated_at"] > cur["updated_at"]):
                cur = e
        if cur is None or cur["op"] == "DELETE":
            return None
        return cur["plan"]


def gen_users(rng, n):
    users = []
    for uid in range(1, n + 1):
        u = User(uid)
        name = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
        country = rng.choice(COUNTRIES)
        plan = rng.choices(PLANS, weights=[55, 35, 10])[0]
        if rng.random() < 0.75:
            signup = rand_time(rng, datetime(2025, 6, 1, tzinfo=UTC), Q_START)
        else:
            signup = rand_time(rng, Q_START, datetime(2026, 3, 20, tzinfo=UTC))
        u.events.append(dict(name=name, country=country, plan=plan, op="UPSERT", updated_at=signup))
        n_changes = rng.choices([0, 1, 2, 3], weights=[40, 30, 20, 10])[0]
        lo = max(signup, Q_START) + timedelta(hours=1)
        times = sorted(rand_time(rng, lo, Q_END) for _ in range(n_changes)) if lo < Q_END else []
        for t in times:
            kind = rng.choices(["plan", "country", "name"], weights=[70, 18, 12])[0]
            if kind == "plan":
                plan = {"free": rng.choices(["premium", "family"], weights=[85, 15])[0],
                        "premium": rng.choices(["family", "free"], weights=[60, 40])[0],
                        "family": rng.choices(["premium", "free"], weights=[70, 30])[0]}[plan]
            elif kind == "country":
                country = rng.choice([c for c in COUNTRIES if c != country])
            else:
                name = f"{name.split()[0]} {rng.choice(LAST)}"
            u.events.append(dict(name=name, country=country, plan=plan, op="UPSERT", updated_at=t))
        if rng.random() < 0.04:
            last = u.events[-1]["updated_at"]
            if last + timedelta(days=2) < Q_END:
                t = rand_time(rng, last + timedelta(days=1), Q_END)
                u.events.append(dict(name=None, country=None, plan=None, op="DELETE", updated_at=t))
        users.append(u)
    return users


def script_users(rng, users):
    """Makes sure the stories the README tells are in the data, whatever --users says (>= 20)."""
    feb = lambda d, h=12: datetime(2026, 2, d, h, 0, 0, tzinfo=UTC)
    mar = lambda d, h=12: datetime(2026, 3, d, h, 0, 0, tzinfo=UTC)
    stories = {}
    # 1. free -> premium in February after the cut-off (arrives with batch 2).
    u = users[0]
    u.events = [dict(name="Ana Silva", country="PT", plan="free", op="UPSERT",
                     updated_at=datetime(2025, 9, 3, 18, 4, 11, tzinfo=UTC)),
                dict(name="Ana Silva", country="PT", plan="premium", op="UPSERT", updated_at=feb(18, 9))]
    stories["upgrade_free_to_premium_feb"] = u.uid
    # 2. premium -> family in March, after a move in January: two premium versions, so the
    #    naive join counts this user's February plays twice.
    u = users[1]
    u.events = [dict(name="Ben Dahl", country="SE", plan="premium", op="UPSERT",
                     updated_at=datetime(2025, 7, 21, 7, 30, 0, tzinfo=UTC)),
                dict(name="Ben Dahl", country="NO", plan="premium", op="UPSERT",
                     updated_at=datetime(2026, 1, 12, 20, 15, 0, tzinfo=UTC)),
                dict(name="Ben Dahl", country="NO", plan="family", op="UPSERT", updated_at=mar(4, 10))]
    stories["premium_to_family_mar"] = u.uid
    # 3. a late upgrade: batch 1 has the signup (free) and a later change of country (already
    #    premium); the upgrade itself on February 3 arrives with batch 2 and splits the interval.
    u = users[2]
    u.events = [dict(name="Cleo Rossi", country="IT", plan="free", op="UPSERT",
                     updated_at=datetime(2025, 11, 2, 9, 0, 0, tzinfo=UTC)),
                dict(name="Cleo Rossi", country="IT", plan="premium", op="UPSERT", updated_at=feb(3, 21),
                     late=True),
                dict(name="Cleo Rossi", country="FR", plan="premium", op="UPSERT", updated_at=feb(11, 8))]
    stories["late_upgrade"] = u.uid
    # 4. a deletion in batch 1, and a downgrade older than the deletion that arrives late: it
    #    fills the time before the deletion and does not bring the account back.
    u = users[3]
    u.events = [dict(name="Dev Novak", country="PL", plan="premium", op="UPSERT",
                     updated_at=datetime(2025, 8, 14, 12, 0, 0, tzinfo=UTC)),
                dict(name="Dev Novak", country="PL", plan="free", op="UPSERT", updated_at=feb(6, 15),
                     late=True),
                dict(name=None, country=None, plan=None, op="DELETE", updated_at=feb(10, 17))]
    stories["late_change_before_delete"] = u.uid
    # 5. an unknown plan ('trial') between free and premium: kept by silver and counted.
    u = users[4]
    u.events = [dict(name="Ema Weber", country="DE", plan="free", op="UPSERT",
                     updated_at=datetime(2025, 12, 1, 8, 0, 0, tzinfo=UTC)),
                dict(name="Ema Weber", country="DE", plan="trial", op="UPSERT", updated_at=datetime(2026, 1, 20, 8, 0, 0, tzinfo=UTC)),
                dict(name="Ema Weber", country="DE", plan="premium", op="UPSERT", updated_at=feb(20, 8))]
    stories["unknown_plan"] = u.uid
    return stories


def choose_late_users(rng, users, skip):
    """Marks a non-last pre-cut change of some users as late (held back to batch 2)."""
    count = 0
    for u in users:
        if u.uid in skip or count >= max(2, len(users) // 20):
            continue
        pre = [e for e in u.events if e["updated_at"] < CUT]
        if len(pre) >= 3 and pre[-2]["updated_at"] >= Q_START and pre[-2]["op"] == "UPSERT" and rng.random() < 0.7:
            pre[-2]["late"] = True
            count += 1
    return count


def add_dirty_users(rng, users):
    """Unknown plans on a few real changes, odd spellings of known plans."""
    dirty = []
    for u in users[5:]:
        for e in u.events:
            if e["op"] == "UPSERT" and rng.random() < 0.05:
                e["plan_raw"] = rng.choice([e["plan"].upper(), " " + e["plan"], e["plan"].capitalize() + " "])
    candidates = [u for u in users[5:] if len(u.events) >= 2 and u.events[-1]["op"] == "UPSERT"]
    for u in rng.sample(candidates, min(3, len(candidates))):
        e = u.events[-1]
        e["plan"] = e["plan_raw"] = rng.choice(["trial", "student", "premium_plus"])
    # rows without a user_id (a broken export): dropped by silver
    for i in range(3):
        t = rand_time(rng, Q_START, CUT) if i < 2 else rand_time(rng, CUT, Q_END)
        dirty.append(dict(user_id=None, name=f"{rng.choice(FIRST)} {rng.choice(LAST)}",
                          country=rng.choice(COUNTRIES), plan="free", op="UPSERT", updated_at=t))
    return dirty


def user_rows(users, dirty):
    b1, b2 = [], []
    for u in users:
        for e in u.events:
            row = dict(user_id=u.uid, name=e["name"], country=e["country"],
                       plan=e.get("plan_raw", e["plan"]), op=e["op"], updated_at=e["updated_at"])
            (b1 if e["updated_at"] < CUT and not e.get("late") else b2).append(row)
    for row in dirty:
        (b1 if row["updated_at"] < CUT else b2).append(row)
    key = lambda r: (r["updated_at"], r["user_id"] or 0)
    return sorted(b1, key=key), sorted(b2, key=key)


def gen_artists(rng, n):
    rows, b2 = [], []
    for aid in range(1, n + 1):
        name = ("".join(rng.choice(SYL) for _ in range(rng.randint(2, 3)))).capitalize()
        if rng.random() < 0.4:
            name = "The " + rng.choice(WORDS) + "s"
        rows.append(dict(artist_id=aid, name=name, country=rng.choice(COUNTRIES),
                         updated_at=rand_time(rng, datetime(2025, 1, 1, tzinfo=UTC), datetime(2025, 12, 1, tzinfo=UTC))))
    for a in rng.sample(rows, min(2, n)):
        b2.append(dict(a, name=a["name"] + " & Friends" if rng.random() < 0.5 else a["name"].upper(),
                       updated_at=rand_time(rng, CUT, Q_END)))
    return rows, b2


def gen_tracks(rng, n, n_artists):
    tracks = {}  # track_id -> list of versions (dicts), sorted by updated_at
    for tid in range(1, n + 1):
        title = f"{rng.choice(WORDS)} {rng.choice(WORDS)}"
        tracks[tid] = [dict(track_id=tid, artist_id=rng.randint(1, n_artists), title=title,
                            genre=rng.choice(GENRES), duration_ms=rng.randint(120, 360) * 1000 + rng.randint(0, 999),
                            updated_at=rand_time(rng, datetime(2024, 1, 1, tzinfo=UTC), datetime(2025, 12, 20, tzinfo=UTC)))]
    ids = list(tracks)
    # genre reclassifications (one of them reported late), then remastered re-releases
    for i, tid in enumerate(rng.sample(ids, min(8, n))):
        prev = tracks[tid][-1]
        t = rand_time(rng, Q_START, CUT if i == 0 else Q_END)  # the first one is reported late
        tracks[tid].append(dict(prev, genre=rng.choice([g for g in GENRES if g != prev["genre"]]), updated_at=t,
                                late=(i == 0)))
    for tid in rng.sample(ids, min(4, n)):
        prev = tracks[tid][-1]
        t = rand_time(rng, max(prev["updated_at"], datetime(2026, 1, 20, tzinfo=UTC)) + timedelta(hours=1), Q_END)
        tracks[tid].append(dict(prev, title=prev["title"] + " (Remastered)",
                                duration_ms=prev["duration_ms"] + rng.randint(-15000, 15000), updated_at=t))
    for tid in ids:
        tracks[tid].sort(key=lambda v: v["updated_at"])
    return tracks


def track_rows(tracks):
    b1, b2 = [], []
    for tid in sorted(tracks):
        for v in tracks[tid]:
            (b1 if v["updated_at"] < CUT and not v.get("late") else b2).append(v)
    key = lambda r: (r["updated_at"], r["track_id"])
    return sorted(b1, key=key), sorted(b2, key=key)


def duration_at(versions, t):
    d = versions[0]["duration_ms"]
    for v in versions:
        if v["updated_at"] <= t:
            d = v["duration_ms"]
    return d


def gen_streams(rng, n, users, tracks):
    weights = {u.uid: rng.lognormvariate(0, 0.8) for u in users}
    tids = sorted(tracks)
    popularity = [1.0 / (rank + 1) ** 0.8 for rank in range(len(tids))]
    rng.shuffle(popularity)
    rows = []
    sid = 100000
    while len(rows) < n:
        t = rand_time(rng, Q_START, Q_END)
        active = []
        for u in users:
            plan = u.state_at(t)
            if plan is not None:
                active.append((u, weights[u.uid] * (1.6 if plan in ("premium", "family") else 1.0)))
        if not active:
            continue
        u = rng.choices([a[0] for a in active], weights=[a[1] for a in active])[0]
        tid = rng.choices(tids, weights=popularity)[0]
        dur = duration_at(tracks[tid], t)
        if rng.random() < 0.25:
            ms = rng.randint(4000, 30000)  # skipped
        else:
            ms = rng.randint(int(dur * 0.6), dur)
        sid += 1
        rows.append(dict(stream_id=sid, user_id=u.uid, track_id=tid, started_at=t, ms_played=ms,
                         updated_at=t + timedelta(seconds=(ms + 999) // 1000)))
    rows.sort(key=lambda r: (r["started_at"], r["stream_id"]))
    for i, r in enumerate(rows):  # ids in order of play
        r["stream_id"] = 100001 + i
    return rows


def stream_rows(rng, base):
    b1, b2 = [], []
    for r in base:
        late = r["updated_at"] < CUT and rng.random() < 0.04  # offline plays synced late
        (b1 if r["updated_at"] < CUT and not late else b2).append(r)
    # corrections: the client reported the play twice as long (or cut it short); the fix has
    # the same stream_id and a later updated_at
    for r in rng.sample(base, len(base) // 50):
        fix = dict(r, ms_played=max(1000, r["ms_played"] // 2 if rng.random() < 0.7 else r["ms_played"] + rng.randint(1000, 60000)),
                   updated_at=r["updated_at"] + timedelta(hours=rng.randint(2, 72)))
        (b1 if fix["updated_at"] < CUT else b2).append(fix)
    # corrections sent weeks later, with batch 2, of plays that batch 1 delivered
    in_b1 = {id(r) for r in b1}
    for r in rng.sample([r for r in base if id(r) in in_b1], 12):
        b2.append(dict(r, ms_played=max(1000, r["ms_played"] // 3), updated_at=rand_time(rng, CUT, Q_END)))
    # redeliveries: rows of batch 1 sent again, byte for byte
    b2.extend(dict(r) for r in rng.sample(b1, min(20, len(b1))))
    # dirty rows: no user_id, or a negative duration
    sid = 900000
    for i in range(10):
        src = rng.choice(base)
        sid += 1
        bad = dict(src, stream_id=sid)
        if i < 6:
            bad["user_id"] = None
        else:
            bad["ms_played"] = -rng.randint(1, 5000)
        (b1 if bad["updated_at"] < CUT else b2).append(bad)
    seen = {}
    for r in b1 + b2:  # AUTO CDC rejects two different reports of one play at one updated_at
        k = (r["stream_id"], r["updated_at"])
        assert seen.setdefault(k, r) == r, f"stream {r['stream_id']}: tie"
    return b1, b2


def csv_text(rows, cols):
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(cols)
    for r in rows:
        w.writerow(["" if r[c] is None else ts(r[c]) if isinstance(r[c], datetime) else r[c] for c in cols])
    return buf.getvalue()


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(here, "data"))
    ap.add_argument("--users", type=int, default=200)
    ap.add_argument("--tracks", type=int, default=100)
    ap.add_argument("--artists", type=int, default=20)
    ap.add_argument("--streams", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=2026)
    a = ap.parse_args()
    if a.users < 20 or a.tracks < 10 or a.artists < 2:
        ap.error("need at least 20 users, 10 tracks and 2 artists")
    rng = random.Random(a.seed)

    users = gen_users(rng, a.users)
    stories = script_users(rng, users)
    n_late = choose_late_users(rng, users, set(stories.values()))
    dirty_users = add_dirty_users(rng, users)
    artists_b1, artists_b2 = gen_artists(rng, a.artists)
    tracks = gen_tracks(rng, a.tracks, a.artists)
    streams = gen_streams(rng, a.streams, users, tracks)
    streams_b1, streams_b2 = stream_rows(rng, streams)
    users_b1, users_b2 = user_rows(users, dirty_users)
    for u in users:  # AUTO CDC rejects two different changes of one key at one sequence value
        assert len({e["updated_at"] for e in u.events}) == len(u.events), f"user {u.uid}: tie"
    tracks_b1, tracks_b2 = track_rows(tracks)

    ucols = ["user_id", "name", "country", "plan", "op", "updated_at"]
    for b, rows in (("batch1", users_b1), ("batch2", users_b2)):
        text = "".join(json.dumps({c: ts(r[c]) if c == "updated_at" else r[c] for c in ucols}) + "\n" for r in rows)
        write(os.path.join(a.out, b, "users", f"users_{b[-1]}.json"), text)
    acols = ["artist_id", "name", "country", "updated_at"]
    write(os.path.join(a.out, "batch1", "artists", "artists_1.csv"), csv_text(artists_b1, acols))
    write(os.path.join(a.out, "batch2", "artists", "artists_2.csv"), csv_text(artists_b2, acols))
    tcols = ["track_id", "artist_id", "title", "genre", "duration_ms", "updated_at"]
    write(os.path.join(a.out, "batch1", "tracks", "tracks_1.csv"), csv_text(tracks_b1, tcols))
    write(os.path.join(a.out, "batch2", "tracks", "tracks_2.csv"), csv_text(tracks_b2, tcols))
    scols = ["stream_id", "user_id", "track_id", "started_at", "ms_played", "updated_at"]
    for b, rows in (("batch1", streams_b1), ("batch2", streams_b2)):
        months = sorted({r["started_at"].strftime("%Y-%m") for r in rows})
        for m in months:
            part = sorted((r for r in rows if r["started_at"].strftime("%Y-%m") == m),
                          key=lambda r: (r["updated_at"], r["stream_id"]))
            write(os.path.join(a.out, b, "streams", f"streams_{b[-1]}_{m}.csv"), csv_text(part, scols))

    print(f"users:   {len(users_b1)} + {len(users_b2)} change records ({n_late} users with a late change besides the scripted ones)")
    print(f"artists: {len(artists_b1)} + {len(artists_b2)} rows")
    print(f"tracks:  {len(tracks_b1)} + {len(tracks_b2)} rows")
    print(f"streams: {len(streams_b1)} + {len(streams_b2)} rows ({len(streams)} plays)")
    print("scripted users: " + ", ".join(f"{k}={v}" for k, v in stories.items()))


if __name__ == "__main__":
    main()
