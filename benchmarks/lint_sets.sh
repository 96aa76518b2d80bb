#!/usr/bin/env bash
# Score every lint truth set (issue 33) with the gpu_training on PYTHONPATH (default: this
# tree's src), each with all of its triage tables as --extra; one JSON per set under OUT.
#   bash benchmarks/lint_sets.sh OUT [SET...]      # sets: 4 5 6 7 7b 8 ... 21 (default: all)
# The exports must exist first: /tmp/h<SET>/<owner>+<name> (benchmarks/lint_export.py).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: lint_sets.sh OUT [SET...]}
shift
mkdir -p "$out"
sets=("$@")
if [[ ${#sets[@]} -eq 0 ]]; then
  sets=(4 5 6 7 7b)
  for f in "$here"/lint_heldout*_truth.csv; do
    n=${f##*lint_heldout}; n=${n%_truth.csv}
    [[ $n =~ ^[0-9]+$ && $n -ge 8 ]] && sets+=("$n")
  done
fi
export PYTHONPATH=${PYTHONPATH:-$here/../src}
python=${PYTHON:-$here/../.venv/bin/python}  # the project's venv, unless PYTHON names another
[[ -x $python ]] || python=python3
for s in "${sets[@]}"; do
  case $s in
    7|7b) truth=$here/lint_tuning${s}_truth.csv; pre=lint_tuning$s ;;
    *) truth=$here/lint_heldout${s}_truth.csv; pre=lint_heldout$s ;;
  esac
  extras=()
  for e in "$here/${pre}"_triage*.csv "$here/${pre}"_table.csv; do
    [[ -f $e ]] && extras+=(--extra "$e")
  done
  "$python" "$here/lint_truth_score.py" "$truth" "/tmp/h$s" "${extras[@]}" --json > "$out/s$s.json"
  "$python" - "$s" "$out/s$s.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[2]))
o = d["overall"]
p = 100 * o["true"] / o["findings"] if o["findings"] else float("nan")
r = 100 * o["found"] / (o["found"] + o["missed"]) if o["found"] + o["missed"] else float("nan")
print(f"set {sys.argv[1]:>3}: {o['findings']:3d} findings {o['true']:3d} true  missed {o['missed']:3d}  {p:5.1f} / {r:5.1f}  unread {len(d.get('unread', []))}")
PY
done
