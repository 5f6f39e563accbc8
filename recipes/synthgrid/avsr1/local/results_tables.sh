#!/usr/bin/env bash
# Scoring stage (11) of the SynthGRID recipe: error tables per GRID slot, letter confusions and WER per voice,
# appended to RESULTS.md by the template (avsr.corpora.synthgrid.slots).
#   local/results_tables.sh DECODE_DIR CORPUS_DIR OUT.md [--python python3]
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: local/results_tables.sh DECODE_DIR CORPUS_DIR OUT.md [--python PY]" >&2; exit 1; }
decode_dir=$1; corpus_dir=$2; out=$3; shift 3
python=python3
[ "${1:-}" = --python ] && python=$2
"$python" -m avsr.bin.synthgrid_report --decode-dir "$decode_dir" --corpus "$corpus_dir" --out "$out" > /dev/null
