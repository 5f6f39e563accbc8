#!/usr/bin/env bash
# SynthGRID: the embedded default corpus (GRID grammar, festival voices, rendered mouth ROIs).
# Trains one audio-visual hybrid CTC/attention model from scratch and decodes the test speakers in
# {audio, video, audiovisual} x {clean, babble at 10, 5, 0, -5 dB}. CPU-sized by default (~15 min on 2 cores).
#   ./run.sh                          # everything
#   ./run.sh --stage 4 --stop_stage 4 # training only (resumes from exp/<tag>/checkpoint.pt)
#   ./run.sh --ngpu 1                 # train and decode on a GPU
# Any variable of ../../TEMPLATE/avsr1/avsr.sh can be set with --name value.
set -euo pipefail
cd "$(dirname "$0")"
. ./path.sh

corpus_dir=corpus
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do  # the noise files live in the corpus: follow --corpus-dir
  case "${args[$i]}" in
    --corpus-dir|--corpus_dir) corpus_dir="${args[$((i + 1))]:-$corpus_dir}" ;;
    --corpus-dir=*|--corpus_dir=*) corpus_dir="${args[$i]#*=}" ;;
  esac
done
num_train=${num_train:-1500}
num_valid=${num_valid:-100}
num_test=${num_test:-200}

../../TEMPLATE/avsr1/avsr.sh \
  --corpus-dir "$corpus_dir" \
  --local-data-opts "--num-train ${num_train} --num-valid ${num_valid} --num-test ${num_test}" \
  --train-set train --valid-set valid --test-sets test \
  --vocab-size 48 \
  --train-config conf/train/avsr_synthgrid_cpu.yaml \
  --decode-config conf/decode/default.yaml \
  --train-noise "${corpus_dir}/noise/babble_train.wav" \
  --test-noise "${corpus_dir}/noise/babble_test.wav" --noise-name babble --test-snrs "10 5 0 -5" \
  --modalities "audio video audiovisual" \
  "$@"
