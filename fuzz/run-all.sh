#!/usr/bin/env bash
# Runs every fuzz target, one after the other and each in a single process,
# to 10 million executions or 30 minutes each (whichever comes first), then
# prints a table of the figures.
#
#   fuzz/run-all.sh                  # every target
#   fuzz/run-all.sh pktline names    # some targets
#   RUNS=100000 MAX_TOTAL_TIME=120 fuzz/run-all.sh
#
# New inputs go to fuzz/target/work/<target> (not committed); crashes to
# fuzz/artifacts/<target>. Logs: fuzz/target/logs/<target>.log.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${RUNS:-10000000}
MAX_TOTAL_TIME=${MAX_TOTAL_TIME:-1800}

declare -A MAX_LEN=(
  [admission]=16384 [conversion]=20480 [kptfile]=4096 [resourcelist]=8192
  [package_split_join]=8192 [names]=512 [pktline]=4096 [snapshot_manifest]=4096
)
declare -A DICT=(
  [admission]=admission [conversion]=conversion [kptfile]=yaml [resourcelist]=yaml
  [package_split_join]=yaml [names]=names [pktline]=pktline [snapshot_manifest]=snapshot_manifest
)
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(admission conversion kptfile resourcelist package_split_join names pktline snapshot_manifest)
fi

cargo +nightly fuzz build --sanitizer none
mkdir -p fuzz/target/logs
rows=()
for t in "${targets[@]}"; do
  mkdir -p "fuzz/target/work/$t" "fuzz/artifacts/$t"
  log="fuzz/target/logs/$t.log"
  start=$(date +%s)
  status=0
  cargo +nightly fuzz run --sanitizer none "$t" "fuzz/target/work/$t" "fuzz/corpus/$t" -- \
    -runs="$RUNS" -max_total_time="$MAX_TOTAL_TIME" \
    -max_len="${MAX_LEN[$t]}" -timeout=10 -rss_limit_mb=2048 \
    -dict="fuzz/dicts/${DICT[$t]}.dict" -print_final_stats=1 >"$log" 2>&1 || status=$?
  # fuzzing time from libFuzzer's last line; wall time when it stopped on a crash
  secs=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -1)
  minutes=$(awk -v s="${secs:-$(( $(date +%s) - start ))}" 'BEGIN { printf "%.1f", s / 60 }')
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  crashes=$(grep -c 'Test unit written to' "$log" || true)
  if [ "$status" -ne 0 ] && [ "$crashes" -eq 0 ]; then crashes="exit $status"; fi
  rows+=("| $t | ${execs:-?} | ${rate:-?} | $minutes | $crashes |")
done

echo
echo "| target | executions | exec/s | minutes | crashes |"
echo "|---|---:|---:|---:|---:|"
printf '%s\n' "${rows[@]}"
