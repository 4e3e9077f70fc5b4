#!/usr/bin/env bash
# Runs each cargo-fuzz target of fuzz/ for a bounded time.
#
#   scripts/fuzz.sh [SECONDS] [TARGET ...]
#
# SECONDS per target (default 30: a CI smoke run; give 600 or more to hunt). TARGETs default
# to all of them: sql_parse_plan (parser, planner, ${} substitution), yaml_spec (YAML spec
# loader and planner), read_files (JSON/CSV input through a real pipeline run).
#
# Needs cargo-fuzz (`cargo install cargo-fuzz`). The stable toolchain serves: RUSTC_BOOTSTRAP=1
# lets it take the nightly flags cargo-fuzz passes. Built without a sanitizer by default
# (strata is safe Rust; panics are what the targets look for, and an ASan build of DataFusion
# runs at half the speed): FUZZ_SANITIZER=address turns AddressSanitizer on. The first build
# compiles every dependency with coverage instrumentation (release profile): expect 30-60 min on
# 2 cores. Seeds are regenerated from tests/scenarios and examples into fuzz/seeds/ each
# time; what the fuzzer learns stays in fuzz/corpus/ (both ignored by git).
#
# The short form CI runs instead (no cargo-fuzz build: the same checks, fuzz/checks/TARGET.rs,
# in the workspace's debug build, seeds and fuzz/regressions/ replayed, then an
# uninstrumented, time-boxed mutation loop of STRATA_FUZZ_SECONDS per target) is
#   cargo test --workspace --test fuzz_smoke
# It has no coverage feedback; this script is the coverage-guided run.
#
# Exits 1 if any target crashed (panic, failed assertion, timeout, out of memory) and prints
# each reproducer: `cargo fuzz run TARGET fuzz/artifacts/TARGET/crash-...` replays one, and
# `cargo fuzz tmin TARGET PATH` minimises it.
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_EACH="${1:-30}"
shift || true
TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then
  TARGETS=(sql_parse_plan yaml_spec read_files)
fi

export RUSTC_BOOTSTRAP=1
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/strata-target}"
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
SANITIZER="${FUZZ_SANITIZER:-none}"
FLAGS=(--sanitizer "$SANITIZER" --debug-assertions --codegen-units 16)

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "cargo-fuzz is not installed: cargo install cargo-fuzz" >&2
  exit 2
fi

python3 fuzz/make_seeds.py
# One build for all targets (each `cargo fuzz run` below then finds it up to date).
cargo fuzz build "${FLAGS[@]}"

failed=()
for t in "${TARGETS[@]}"; do
  mkdir -p "fuzz/corpus/$t" "fuzz/artifacts/$t"
  before=$(find "fuzz/artifacts/$t" -type f | sort)
  echo "==> $t for ${SECONDS_EACH}s"
  # -timeout: one input taking longer is a crash (a hang); -rss_limit_mb: so is this much memory.
  if ! cargo fuzz run "${FLAGS[@]}" "$t" "fuzz/corpus/$t" "fuzz/seeds/$t" -- \
      -max_total_time="$SECONDS_EACH" -timeout=60 -rss_limit_mb=4096 -max_len=8192 \
      -dict="fuzz/dict/$t.dict" -print_final_stats=1; then
    failed+=("$t")
  fi
  after=$(find "fuzz/artifacts/$t" -type f | sort)
  new=$(comm -13 <(echo "$before") <(echo "$after") | sed '/^$/d' || true)
  if [ -n "$new" ]; then
    [[ " ${failed[*]} " == *" $t "* ]] || failed+=("$t")
    echo "$t: reproducer(s):"
    for f in $new; do
      echo "  $f   (replay: cargo fuzz run ${FLAGS[*]} $t $f)"
    done
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "crashed: ${failed[*]}" >&2
  exit 1
fi
echo "no crash in ${TARGETS[*]} (${SECONDS_EACH}s each)"
