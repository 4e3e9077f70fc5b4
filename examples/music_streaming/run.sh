#!/usr/bin/env bash
# Runs the music-streaming example in two deliveries and shows what each one did.
#
#   examples/music_streaming/run.sh [WAREHOUSE_DIR]          (default /tmp/strata-music)
#
# STRATA names the binary (default: the debug build that examples/run.sh and scripts/test.sh
# make, ${CARGO_TARGET_DIR:-~/.cache/strata-target}/debug/strata). The warehouse is rebuilt from
# scratch; the files are delivered through a scratch folder WAREHOUSE_DIR-input (the pipeline
# and its incoming/ folder), so the bundled data/ is never modified.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
strata="${STRATA:-${CARGO_TARGET_DIR:-$HOME/.cache/strata-target}/debug/strata}"
warehouse="${1:-/tmp/strata-music}"
input="$warehouse-input"

if [[ ! -x "$strata" ]]; then
  echo "no strata binary at $strata: build it (examples/run.sh does) or set STRATA=/path/to/strata" >&2
  exit 2
fi
# Only ever delete a previous run of this script (or an empty folder).
for dir in "$warehouse" "$input"; do
  if [[ -e "$dir" ]]; then
    if [[ -d "$dir/_strata" || -f "$dir/pipeline.sql" || -z "$(ls -A "$dir")" ]]; then
      rm -rf "$dir"
    else
      echo "$dir exists and is not a strata warehouse or a previous input folder: not touching it" >&2
      exit 2
    fi
  fi
done
mkdir -p "$input/incoming"
cp "$here/pipeline.sql" "$input/pipeline.sql"

deliver() {
  echo
  echo "### delivering data/$1 (cp -r data/$1/. $input/incoming/)"
  cp -r "$here/data/$1/." "$input/incoming/"
  echo "\$ strata run $input/pipeline.sql --warehouse $warehouse"
  "$strata" run "$input/pipeline.sql" --warehouse "$warehouse"
}
show() {
  echo
  echo "\$ strata query \"$1\""
  "$strata" query --warehouse "$warehouse" "$1"
}

FEB_PREMIUM="SELECT p.plan, p.streams, p.hours AS hours_point_in_time, n.streams AS streams_naive, n.hours AS hours_naive
FROM plan_hours_by_month p JOIN plan_hours_by_month_naive n ON n.month = p.month AND n.plan = p.plan
WHERE p.month = DATE '2026-02-01' AND p.plan = 'premium'"
USER_HISTORY="SELECT user_id, name, country, plan, __START_AT, __END_AT FROM dim_user WHERE user_id IN (2, 3, 4) ORDER BY user_id, __START_AT"

deliver batch1
show "$USER_HISTORY"
show "$FEB_PREMIUM"

deliver batch2
show "$USER_HISTORY"
show "$FEB_PREMIUM"

# Where the naive join's extra hours come from: for each February play, how many premium
# versions of its user the join on user_id matched, and the plan the user really had then.
show "SELECT plan_at_start, premium_versions_matched, count(*) AS plays,
       round(sum(ms_played) * premium_versions_matched / 3600000.0, 2) AS naive_hours
FROM (SELECT s.stream_id, s.ms_played,
             sum(CASE WHEN u.plan = 'premium' THEN 1 ELSE 0 END) AS premium_versions_matched,
             max(CASE WHEN s.started_at >= u.__START_AT AND (u.__END_AT IS NULL OR s.started_at < u.__END_AT)
                      THEN u.plan END) AS plan_at_start
      FROM fact_stream s JOIN dim_user u ON u.user_id = s.user_id
      WHERE s.started_at >= TIMESTAMP '2026-02-01 00:00:00' AND s.started_at < TIMESTAMP '2026-03-01 00:00:00'
      GROUP BY s.stream_id, s.ms_played)
WHERE premium_versions_matched > 0
GROUP BY plan_at_start, premium_versions_matched ORDER BY plan_at_start, premium_versions_matched"

show "SELECT * FROM plan_hours_by_month ORDER BY month, plan"

# What the silver expectations saw over both runs (the event log has one record per dataset
# and run, with a count per expectation).
show "SELECT flow, expectation, action, sum(passed) AS passed, sum(failed) AS failed
FROM (SELECT flow, e['name'] AS expectation, e['action'] AS action, e['passed'] AS passed, e['failed'] AS failed
      FROM (SELECT flow, unnest(expectations) AS e FROM event_log))
GROUP BY flow, expectation, action ORDER BY flow, expectation"

echo
echo "\$ strata validate --warehouse $warehouse dim_user"
"$strata" validate --warehouse "$warehouse" dim_user
echo "\$ strata validate --warehouse $warehouse dim_track"
"$strata" validate --warehouse "$warehouse" dim_track

if command -v python3 >/dev/null; then
  echo
  echo "\$ python3 check.py --warehouse $warehouse --views"
  python3 "$here/check.py" --warehouse "$warehouse" --strata "$strata" --views
fi
