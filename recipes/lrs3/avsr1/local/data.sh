#!/usr/bin/env bash
# Stage 1 of the LRS3 recipe: splits, transcripts and the ROI work list (local/prepare_lrs3.py), then the
# noise recordings of the noisy conditions (local/prepare_noise.py). Media are cut in stage 2 (ROIs).
#   local/data.sh --lrs3-root /data/lrs3 --corpus-dir corpus [--labeled 30h|433h] [--include-pretrain true]
#                 [--valid-ids lrs3-valid.id | --num-valid 1200] [--max-seconds 20] [--musan /data/musan]
#                 [--noise-seconds 600] [--speech-min-seconds 20] [--seed 0]
set -euo pipefail
corpus_dir=corpus
nj=2
python=python3
lrs3_root=
labeled=30h
include_pretrain=
valid_ids=
num_valid=1200
max_seconds=20
musan=
noise_seconds=600
speech_min_seconds=20
seed=0
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || { echo "local/data.sh: option $1 needs a value" >&2; exit 1; }
  case "$1" in
    --corpus-dir) corpus_dir="$2" ;;
    --nj) nj="$2" ;;
    --python) python="$2" ;;
    --lrs3-root) lrs3_root="$2" ;;
    --labeled) labeled="$2" ;;
    --include-pretrain) include_pretrain="$2" ;;
    --valid-ids) valid_ids="$2" ;;
    --num-valid) num_valid="$2" ;;
    --max-seconds) max_seconds="$2" ;;
    --musan) musan="$2" ;;
    --noise-seconds) noise_seconds="$2" ;;
    --speech-min-seconds) speech_min_seconds="$2" ;;
    --seed) seed="$2" ;;
    *) echo "local/data.sh: unknown option $1" >&2; exit 1 ;;
  esac
  shift 2
done
[ -n "$lrs3_root" ] || { echo "local/data.sh: --lrs3-root is required (the LRS3 directory with pretrain/ trainval/ test/)" >&2; exit 1; }
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

opts=(--lrs3-root "$lrs3_root" --corpus-dir "$corpus_dir" --labeled "$labeled" --num-valid "$num_valid"
      --max-seconds "$max_seconds" --seed "$seed")
[ -n "$include_pretrain" ] && opts+=(--include-pretrain "$include_pretrain")
[ -n "$valid_ids" ] && opts+=(--valid-ids "$valid_ids")
"$python" "${here}/prepare_lrs3.py" "${opts[@]}"

noise_opts=(--out "${corpus_dir}/noise" --speech-list "${corpus_dir}/local/speech_noise.list"
            --seconds "$noise_seconds" --speech-min-seconds "$speech_min_seconds" --seed "$seed")
[ -n "$musan" ] && noise_opts+=(--musan "$musan")
"$python" "${here}/prepare_noise.py" "${noise_opts[@]}"
