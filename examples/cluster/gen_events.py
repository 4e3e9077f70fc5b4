#!/usr/bin/env python3
"""Writes EVENTS change events over KEYS customer keys as JSON lines into FOLDER, in FILES
files: upserts with a city and a tier, some deletes, some late (an older sequence number
after a newer one). Deterministic for a given seed; the standard library only.

    gen_events.py FOLDER [--events N] [--keys K] [--files F] [--seed S]
"""
import argparse
import json
import os
import random

CITIES = ["Oslo", "Lyon", "Porto", "Graz", "Turku", "Cork", "Bern", "Gent"]
TIERS = ["free", "plus", "pro"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder")
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--prefix", default="", help="file name prefix (a later delivery)")
    ap.add_argument("--seq-from", type=int, default=0,
                    help="sequence numbers start after this many events (a later delivery)")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    os.makedirs(a.folder, exist_ok=True)
    per_file = -(-a.events // a.files)
    written = 0
    for f in range(a.files):
        with open(os.path.join(a.folder, f"{a.prefix}{f:03}.json"), "w") as out:
            for _ in range(min(per_file, a.events - written)):
                written += 1
                seq = a.seq_from + written
                if rng.random() < 0.02:
                    seq = max(1, seq - rng.randrange(1, 1000))  # late
                op = "delete" if rng.random() < 0.05 else "upsert"
                out.write(json.dumps({
                    "id": rng.randrange(a.keys),
                    "city": rng.choice(CITIES),
                    "tier": rng.choice(TIERS),
                    "op": op,
                    "seq": seq * 10 + rng.randrange(10),
                }) + "\n")


if __name__ == "__main__":
    main()
