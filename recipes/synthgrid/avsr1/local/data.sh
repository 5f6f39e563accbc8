#!/usr/bin/env bash
# Stage 1 of the SynthGRID recipe: generate the corpus (resumable: finished utterances are kept).
#   local/data.sh --corpus-dir corpus --nj 2 [--num-train 3000 --num-valid 100 --num-test 200
#     --num-test-unseen-voice 300 --train-speakers 600 --test-unseen-voice-speakers 10 --seed 0
#     --train-corpus english|voices --train-voices v1,v2,.. --unseen-voices v3,.. --no-augment true
#     --num-train-accented 0 --train-accented-speakers 300 --engines festival,espeak-ng,flite
#     --hold-out-engines flite --num-test-espeak-ng 0 --num-test-flite 0 --test-engine-speakers 12]
set -euo pipefail
corpus_dir=corpus
nj=2
python=python3
num_train=3000
num_valid=100
num_test=200
num_test_unseen_voice=300
train_speakers=600
test_unseen_voice_speakers=10
seed=0
babble_seconds=60
train_corpus=english
train_voices=""
unseen_voices=""
no_augment=false
num_train_accented=0
train_accented_speakers=300
engines=""
hold_out_engines=""
num_test_espeak_ng=0
num_test_flite=0
test_engine_speakers=""
while [ $# -gt 0 ]; do
  case "$1" in
    --corpus-dir) corpus_dir="$2" ;;
    --nj) nj="$2" ;;
    --python) python="$2" ;;
    --num-train) num_train="$2" ;;
    --num-valid) num_valid="$2" ;;
    --num-test) num_test="$2" ;;
    --num-test-unseen-voice) num_test_unseen_voice="$2" ;;
    --train-speakers) train_speakers="$2" ;;
    --test-unseen-voice-speakers) test_unseen_voice_speakers="$2" ;;
    --seed) seed="$2" ;;
    --babble-seconds) babble_seconds="$2" ;;
    --train-corpus) train_corpus="$2" ;;
    --train-voices) train_voices="$2" ;;
    --unseen-voices) unseen_voices="$2" ;;
    --no-augment) no_augment="$2" ;;
    --num-train-accented) num_train_accented="$2" ;;
    --train-accented-speakers) train_accented_speakers="$2" ;;
    --engines) engines="$2" ;;
    --hold-out-engines) hold_out_engines="$2" ;;
    --num-test-espeak-ng) num_test_espeak_ng="$2" ;;
    --num-test-flite) num_test_flite="$2" ;;
    --test-engine-speakers) test_engine_speakers="$2" ;;
    *) echo "local/data.sh: unknown option $1" >&2; exit 1 ;;
  esac
  shift 2
done
command -v festival >/dev/null || { echo "festival is not installed: run scripts/install.sh" >&2; exit 1; }
opts=(--train-corpus "$train_corpus")
[ -n "$train_voices" ] && opts+=(--train-voices "$train_voices")
[ -n "$unseen_voices" ] && opts+=(--unseen-voices "$unseen_voices")
[ "$no_augment" = true ] && opts+=(--no-augment)
[ -n "$engines" ] && opts+=(--engines "$engines")
[ -n "$hold_out_engines" ] && opts+=(--hold-out-engines "$hold_out_engines")
[ "$num_test_espeak_ng" != 0 ] && opts+=(--num-test-espeak-ng "$num_test_espeak_ng")
[ "$num_test_flite" != 0 ] && opts+=(--num-test-flite "$num_test_flite")
[ -n "$test_engine_speakers" ] && opts+=(--test-engine-speakers "$test_engine_speakers")
"$python" -m avsr.bin.synthgrid --out "$corpus_dir" --num-train "$num_train" --num-valid "$num_valid" \
  --num-test "$num_test" --num-test-unseen-voice "$num_test_unseen_voice" --train-speakers "$train_speakers" \
  --test-unseen-voice-speakers "$test_unseen_voice_speakers" --seed "$seed" --babble-seconds "$babble_seconds" \
  --num-train-accented "$num_train_accented" --train-accented-speakers "$train_accented_speakers" \
  --nj "$nj" "${opts[@]}"
