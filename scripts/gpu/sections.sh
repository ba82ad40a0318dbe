# The section runner of the time-boxed GPU scripts (families.sh, hybrid.sh), sourced by them:
# their argument handling, the budget, and one runner that starts a section only when the budget
# has the time it needs. The sourcing script sets SECTIONS (its default list), BUDGET, T0 and
# SECTIONS_TAG (its name in log lines), then calls `sections_args "$@"`; before running
# sections it sets NEED / EST (associative arrays: seconds a section needs to start / takes),
# RES (results: sections.tsv) and LOGS (one log per section).

# sections_args ARGS...: --sections LIST, --budget SECONDS, --dry-run, --selftest, -h/--help
# (the script's header comment, lines 2-44); MODE becomes run, dry or selftest.
sections_args() {
  MODE=run
  while [[ $# -gt 0 ]]; do
    case $1 in
      --sections) SECTIONS=$2; shift 2 ;;
      --budget) BUDGET=$2; shift 2 ;;
      --dry-run) MODE=dry; shift ;;
      --selftest) MODE=selftest; shift ;;
      -h|--help) sed -n '2,44p' "$0"; exit 0 ;;
      *) echo "$SECTIONS_TAG.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
  done
}

log() { printf '[%s %4ss] %s\n' "$SECTIONS_TAG" "$((SECONDS - T0))" "$*"; }
left() { echo $((BUDGET - (SECONDS - T0))); }
# record NAME STATE RC SECONDS WHY: one line of $RES/sections.tsv (RC "-" when it did not run).
record() { printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" >>"$RES/sections.tsv"; }

# run_section NAME CMD...: runs when the budget has NEED[NAME] seconds left, a command under
# `timeout` of what is left (a function of the script bounds its own commands); its output goes
# to $LOGS/NAME.log, and its last SECTION_TAIL (8) lines to the terminal.
run_section() {
  local name=$1 l t rc
  shift
  l=$(left)
  if [[ $l -lt ${NEED[$name]} ]]; then
    record "$name" skipped - 0 "budget: ${l} s left, needs ~${EST[$name]} s (run it in another call: --sections $name)"
    log "$name: NOT RUN (${l} s left)"
    return
  fi
  log "$name: start (${l} s left, ~${EST[$name]} s)"
  t=$SECONDS
  if declare -F "$1" >/dev/null; then
    "$@" >"$LOGS/$name.log" 2>&1
  else
    timeout --signal=TERM --kill-after=20 "$l" "$@" >"$LOGS/$name.log" 2>&1
  fi
  rc=$?
  record "$name" ran "$rc" $((SECONDS - t)) "$([[ $rc == 124 ]] && echo "stopped at the budget")"
  log "$name: exit $rc after $((SECONDS - t)) s; last lines:"
  grep -v -E "it/s\]|s/it\]" "$LOGS/$name.log" | tail -n "${SECTION_TAIL:-8}" | sed 's/^/    /'
}
