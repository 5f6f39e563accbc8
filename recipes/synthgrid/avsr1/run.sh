#!/usr/bin/env bash
# SynthGRID: the embedded default corpus (GRID grammar; voices of festival, eSpeak NG and flite; rendered mouth
# ROIs). Trains one audio-visual hybrid CTC/attention model from scratch and decodes the test sets (test:
# festival voices of unseen speakers; test_edges: test with each end cut to the speech or 0.4-1.0 s longer;
# test_unseen_voice, test_espeak_ng, test_flite: voices of each engine that no training utterance has; and
# test's audio with other lips: test_other_lips, test_frozen_mouth, test_photo_lips) in {audio, video,
# audiovisual} x {clean, babble at 10, 5, 0, -5 dB}. CPU-sized by default (about 18 minutes of stages on 2
# cores of an AMD EPYC with AVX-512 BF16; docs/performance.md).
#   ./run.sh                          # everything
#   ./run.sh --stage 9 --stop_stage 9 # training only (resumes from exp/<tag>/checkpoint.pt)
#   ./run.sh --ngpu 1                 # train and decode on a GPU
#   ./run.sh --num-train 6000         # corpus size (also --num-valid, --num-test, --num-test-unseen-voice,
#                                     --train-speakers, --test-unseen-voice-speakers, --babble-seconds,
#                                     --seed, --train-corpus english|voices, --train-voices, --unseen-voices,
#                                     --no-augment true, --num-train-accented, --train-accented-speakers)
#   ./run.sh --engines festival       # the training engines (default festival,espeak-ng,flite);
#                                     # --hold-out-engines X trains without engine X (leave one engine out)
#   ./run.sh --num-test-flite 0       # test set sizes of the engines' held-out voices (default 300 each; 0
#                                     # leaves the set out; also --num-test-espeak-ng, --test-engine-speakers)
# Any variable of ../../TEMPLATE/avsr1/avsr.sh can be set with --name value.
set -euo pipefail
cd "$(dirname "$0")"
. ./path.sh

corpus_dir=corpus
corpus_opts=(--num-train 3000 --num-valid 100 --num-test 200 --num-test-unseen-voice 300 --train-speakers 600
             --test-unseen-voice-speakers 10 --babble-seconds 60 --seed 0 --engines festival,espeak-ng,flite)
declare -A engine_tests=([espeak_ng]=300 [flite]=300)  # utterances of each engine's held-out voices
rest=()
while [ $# -gt 0 ]; do  # options of this corpus; the rest goes to the template
  case "$1" in
    --num-train|--num-valid|--num-test|--num-test-unseen-voice|--train-speakers|--test-unseen-voice-speakers|\
    --babble-seconds|--seed|--train-corpus|--train-voices|--unseen-voices|--no-augment|\
    --num-train-accented|--train-accented-speakers|--engines|--hold-out-engines|--test-engine-speakers)
      corpus_opts+=("$1" "$2"); shift 2 ;;
    --num-test-espeak-ng|--num-test-flite)  # a test set of the engine's held-out voices, decoded too
      t="${1#--num-test-}"; engine_tests[${t//-/_}]="$2"; shift 2 ;;
    --corpus-dir|--corpus_dir) corpus_dir="$2"; shift 2 ;;
    *) rest+=("$1"); shift ;;
  esac
done
test_sets="test test_unseen_voice"
for t in espeak_ng flite; do
  corpus_opts+=("--num-test-${t//_/-}" "${engine_tests[$t]}")
  [ "${engine_tests[$t]}" = 0 ] || test_sets+=" test_${t}"
done

../../TEMPLATE/avsr1/avsr.sh \
  --corpus-dir "$corpus_dir" \
  --local-data-opts "${corpus_opts[*]}" \
  --train-set train --valid-set valid --test-sets "$test_sets" --edge-test-sets test \
  --lip-test-sets test \
  --vocab-size 120 --bpemode bpe \
  --train-config conf/train/avsr_synthgrid_cpu.yaml --phone-lexicon "${corpus_dir}/lexicon.txt" \
  --decode-config conf/decode/default.yaml \
  --train-noise "${corpus_dir}/noise/babble_train.wav" \
  --test-noise "${corpus_dir}/noise/babble_test.wav" --noise-name babble --test-snrs "10 5 0 -5" \
  --modalities "audio video audiovisual" \
  "${rest[@]}"
