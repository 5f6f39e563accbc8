#!/usr/bin/env bash
# LRS3 (AV-HuBERT setup): raw face videos -> mouth ROIs -> hybrid CTC/attention or attention AVSR model ->
# decoding of the test set in {audio, video, audiovisual} x {clean, babble, music, noise, speech at
# 10 .. -10 dB}. GPU-sized; see README.md in this directory for the paper's configurations.
#   ./run.sh --lrs3-root /data/lrs3 --musan /data/musan                    # everything, 30 h labeled
#   ./run.sh --lrs3-root /data/lrs3 --labeled 433h     # 433 h labeled (conf/finetune/avhubert_base_433h.yaml)
#   ./run.sh --stage 9 --stop-stage 9 --ngpu 8                             # training only (resumes)
#   ./run.sh --stage 9 --stop-stage 9 --ngpu 8 --nnodes 4 --node-rank R --master-addr HOST   # on each node
# Corpus options (stage 1, local/data.sh): --lrs3-root DIR, --labeled 30h|433h, --include-pretrain true|false,
#   --valid-ids FILE (AV-HuBERT's lrs3-valid.id) | --num-valid N, --max-seconds S,
#   --musan DIR ({babble,music,noise}/ or speech/), --noise-seconds S, --speech-min-seconds S, --seed N,
#   --corpus-dir DIR (no spaces in these paths).
# --noise-types "babble music noise speech": the noisy test conditions decoded (those prepared in stage 1).
# Any variable of ../../TEMPLATE/avsr1/avsr.sh can be set with --name value.
set -euo pipefail
cd "$(dirname "$0")"
. ./path.sh

log() { echo "$(date '+%Y-%m-%dT%H:%M:%S') (run.sh) $*" >&2; }

corpus_dir=corpus
data_opts=()
labeled=30h
include_pretrain=
noise_types="babble music noise speech"
stage=1
stop_stage=100
pretrain_iters=0
rest=()
while [ $# -gt 0 ]; do  # options of this corpus; the rest goes to the template
  case "$1" in --help|-h) sed -n '2,14p' "${BASH_SOURCE[0]##*/}"; exit 0 ;; esac
  [ $# -ge 2 ] || { log "option $1 needs a value"; exit 1; }
  case "$1" in
    --lrs3-root|--valid-ids|--num-valid|--max-seconds|--musan|--noise-seconds|--speech-min-seconds|--seed)
      data_opts+=("$1" "$2") ;;
    --labeled) labeled="$2"; data_opts+=("$1" "$2") ;;
    --include-pretrain) include_pretrain="$2"; data_opts+=("$1" "$2") ;;
    --corpus-dir|--corpus_dir) corpus_dir="$2" ;;
    --noise-types|--noise_types) noise_types="$2" ;;
    --stage) stage="$2" ;;
    --stop-stage|--stop_stage) stop_stage="$2" ;;
    --pretrain-iters|--pretrain_iters) pretrain_iters="$2"; rest+=("$1" "$2") ;;
    *) rest+=("$1" "$2") ;;
  esac
  shift 2
done
case "$labeled" in 30h|433h) ;; *) log "--labeled must be 30h or 433h, got ${labeled}"; exit 1 ;; esac
[ -n "$include_pretrain" ] || { [ "$labeled" = 433h ] && include_pretrain=true || include_pretrain=false; }

common=(
  --corpus-dir "$corpus_dir"
  --local-data-opts "${data_opts[*]}"
  --roi-list "${corpus_dir}/roi.list"
  --train-set train --valid-set valid --test-sets test
  --vocab-size 1000 --bpemode unigram
  --train-config "conf/finetune/avhubert_base_${labeled}.yaml"
  --decode-config conf/decode/avhubert_s2s.yaml
  --test-snrs "10 5 0 -5 -10"
  --modalities "audio video audiovisual"
  --km-layer 9            # AV-HuBERT clusters the layer-9 output of the iteration-1 model (av_hubert issue #82)
  --ngpu 1 --nj 8
)
# self-supervised pretraining on all 433 h while fine-tuning on the 30 h (needs the template's --pretrain-set)
if [ "$pretrain_iters" -gt 0 ] && [ "$labeled" = 30h ] && [ "$include_pretrain" = true ]; then
  common+=(--pretrain-set pretrain_all)
fi

template() { ../../TEMPLATE/avsr1/avsr.sh "${common[@]}" "$@" "${rest[@]}"; }
in_range() { [ "$stage" -le "$2" ] && [ "$stop_stage" -ge "$1" ]; }  # in_range FROM TO: overlaps the run
from() { echo "$((stage > $1 ? stage : $1))"; }
to() { echo "$((stop_stage < $1 ? stop_stage : $1))"; }

# stages 1-2 (corpus and noise preparation, mouth ROIs) first: the later stages need to know which noise
# stage 1 made, and which videos stage 2 could not crop
if in_range 1 2; then template --stage "$(from 1)" --stop-stage "$(to 2)"; fi
if [ -d "${corpus_dir}/pretrain_all" ]; then  # links to train utterances whose ROI failed (see failed.tsv)
  broken="$(find "${corpus_dir}/pretrain_all" -xtype l -print -delete | wc -l)"
  [ "$broken" -eq 0 ] || log "removed ${broken} links of pretrain_all to media that stage 2 did not write"
fi
train_noise=()
[ -f "${corpus_dir}/noise/all_train.wav" ] && train_noise=(--train-noise "${corpus_dir}/noise/all_train.wav")
# stages 3-9: data dirs, tokenizer, (clustering, pretraining), training
if in_range 3 9; then template --stage "$(from 3)" --stop-stage "$(to 9)" "${train_noise[@]}"; fi
# stage 10 once per noise type (clean conditions and video-only input are decoded once: finished
# conditions are skipped)
if in_range 10 10; then
  decoded=0
  for name in $noise_types; do
    wav="${corpus_dir}/noise/${name}_test.wav"
    if [ ! -f "$wav" ]; then log "no ${wav}: the ${name} conditions are not decoded"; continue; fi
    template --stage 10 --stop-stage 10 --test-noise "$wav" --noise-name "$name"
    decoded=1
  done
  [ "$decoded" -eq 1 ] || { log "no noise prepared: decoding clean conditions only"; template --stage 10 --stop-stage 10; }
fi
if in_range 11 100; then template --stage "$(from 11)" --stop-stage "$stop_stage"; fi
