#!/usr/bin/env bash
# Stage 1 of the SynthGRID recipe: generate the corpus (resumable: finished utterances are kept).
#   local/data.sh --corpus-dir corpus --nj 2 [--num-train 3000 --num-valid 100 --num-test 200 --train-speakers 600 --seed 0]
set -euo pipefail
corpus_dir=corpus
nj=2
python=python3
num_train=3000
num_valid=100
num_test=200
train_speakers=600
seed=0
babble_seconds=60
while [ $# -gt 0 ]; do
  case "$1" in
    --corpus-dir) corpus_dir="$2" ;;
    --nj) nj="$2" ;;
    --python) python="$2" ;;
    --num-train) num_train="$2" ;;
    --num-valid) num_valid="$2" ;;
    --num-test) num_test="$2" ;;
    --train-speakers) train_speakers="$2" ;;
    --seed) seed="$2" ;;
    --babble-seconds) babble_seconds="$2" ;;
    *) echo "local/data.sh: unknown option $1" >&2; exit 1 ;;
  esac
  shift 2
done
command -v festival >/dev/null || { echo "festival is not installed: run scripts/install.sh" >&2; exit 1; }
"$python" -m avsr.bin.synthgrid --out "$corpus_dir" --num-train "$num_train" --num-valid "$num_valid" \
  --num-test "$num_test" --train-speakers "$train_speakers" --seed "$seed" --babble-seconds "$babble_seconds" --nj "$nj"
