#!/usr/bin/env bash
# make test's run: each tier named in $SOLO_TIERS (a marker; its tests share one deployment, so they
# must run in one process and in order) as a pytest process of its own, started first, its output in
# test-output/tiers/<tier>.log (printed at the end); the rest of the suite at the same time in the
# foreground, on $TEST_WORKERS pytest-xdist processes, then each tier named in $LATER_TIERS in the
# foreground, one pytest process each. Afterwards olmocr_testkit/tier_record.py checks that each
# tier ran in one process, recorded its tests and started its deployment at most once (exactly once in
# a run of the whole suite). Arguments go to every pytest process (paths, -k, -p no:randomly ...); a
# process they select nothing in counts as passed, but without arguments every process must run tests.
set -u
python=.venv/bin/python
# Each process prints its slowest tests, so a run (CI's included) shows where the suite's time goes.
durations=(--durations=25 --durations-min=5)
out=test-output/tiers
mkdir -p "$out"
export OLMOCR_TIER_RECORD="$PWD/$out/record.jsonl"
: > "$OLMOCR_TIER_RECORD"

tiers=(${SOLO_TIERS:-})
pids=()
for tier in "${tiers[@]}"; do
  # A background command of a script ignores Ctrl-C unless told otherwise; the tier must get it to
  # stop its deployment (pytest's teardown), as the foreground run does.
  ( trap - INT; exec "$python" -m pytest --tier "$tier" "${durations[@]}" "$@" ) >"$out/$tier.log" 2>&1 &
  pids+=($!)
  echo "make test: the $tier tier runs in pytest process $! beside the rest (output: $out/$tier.log)"
done

# pytest's exit status 5: nothing selected in this process. Fine when the arguments chose another part;
# in a run of the whole suite (no arguments) that process lost its tests (a marker, a path), a failure.
whole_suite=$([ $# -eq 0 ] && echo 1 || echo 0)
passed() { [ "$1" -eq 0 ] || { [ "$1" -eq 5 ] && [ "$whole_suite" = 0 ]; }; }
# The tiers whose process passed: the record must show their tests (and, whole, their deployment's start).
checks=()
[ "$whole_suite" = 1 ] && checks+=(--whole-suite)
tier_done() {  # tier, its exit status
  [ "$2" -eq 0 ] && checks+=(--ran "$1")
  [ "$2" -eq 5 ] && [ "$whole_suite" = 1 ] && echo "make test: the $1 tier selected no test" >&2
  return 0
}

later=(${LATER_TIERS:-})
"$python" -m pytest -n "${TEST_WORKERS:-1}" --exclude-tiers "${tiers[*]} ${later[*]}" "${durations[@]}" "$@"
status=$?
ran_any=$([ $status -ne 5 ] && echo 1 || echo 0)
passed $status && status=0

# Tiers that would compete with the rest for the cores (image builds, a whole stack) run after it, one
# pytest process each, in the foreground.
for tier in "${later[@]}"; do
  echo "make test: the $tier tier runs now in a pytest process of its own"
  "$python" -m pytest --tier "$tier" "${durations[@]}" "$@"
  tier_status=$?
  tier_done "$tier" $tier_status
  [ $tier_status -ne 5 ] && ran_any=1
  passed $tier_status || status=$tier_status
done

for index in "${!tiers[@]}"; do
  wait "${pids[$index]}"
  tier_status=$?
  echo
  echo "================ the ${tiers[$index]} tier (pytest process ${pids[$index]}, exit $tier_status) ================"
  cat "$out/${tiers[$index]}.log"
  tier_done "${tiers[$index]}" $tier_status
  [ $tier_status -ne 5 ] && ran_any=1
  passed $tier_status || status=$tier_status
done

"$python" -m olmocr_testkit.tier_record "$OLMOCR_TIER_RECORD" "${checks[@]}" || { [ $status -ne 0 ] || status=1; }
if [ "$ran_any" = 0 ]; then
  echo "make test: no test selected" >&2
  exit 5
fi
exit $status
