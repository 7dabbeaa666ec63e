#!/usr/bin/env bash
# Short fuzzing smoke run for CI: every target for SECONDS (default 30) from
# the committed seed corpus. Needs cargo-fuzz (`cargo install cargo-fuzz
# --locked`); libFuzzer needs nightly flags, which RUSTC_BOOTSTRAP=1 unlocks
# on the stable toolchain. New inputs go to fuzz/work/ (not committed); a
# crash leaves its input in fuzz/artifacts/<target>/ and fails the script.
#
#   fuzz/smoke.sh            # all targets, 30 s each
#   SECONDS_PER_TARGET=600 fuzz/smoke.sh frames   # one target, 10 minutes
set -euo pipefail
cd "$(dirname "$0")"
export RUSTC_BOOTSTRAP=1
secs="${SECONDS_PER_TARGET:-30}"
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cargo fuzz list)
fi
flags=(-s none --debug-assertions)
cargo fuzz build "${flags[@]}"
failed=()
for t in "${targets[@]}"; do
  mkdir -p "work/$t" "corpus/$t"
  echo "== $t: ${secs}s"
  if ! cargo fuzz run "${flags[@]}" "$t" "work/$t" "corpus/$t" -- \
      -max_total_time="$secs" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 2>"work/$t.log"; then
    failed+=("$t")
    tail -n 30 "work/$t.log"
  fi
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "work/$t.log" | sed "s/^/   $t /" || true
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz smoke FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz smoke passed: ${targets[*]}"
