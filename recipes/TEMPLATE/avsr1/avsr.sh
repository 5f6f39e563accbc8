#!/usr/bin/env bash
# Generic audio-visual speech recognition recipe (the ESPnet egs2/TEMPLATE/asr1/asr.sh of avsr).
# A corpus recipe's run.sh sets its variables and calls this script; every variable below can also be
# given on the command line as --name value (dashes or underscores). Stages are idempotent and resumable:
#   1  corpus preparation   (the corpus recipe's local/data.sh: generation or download-free preparation)
#   2  data dirs            (python -m avsr.bin.prepare_data: Kaldi wav.scp, video.scp, text, utt2spk)
#   3  tokenizer            (python -m avsr.bin.tokenizer: sentencepiece unigram + token list)
#   4  training             (python -m avsr.bin.train; resumes from exp/<tag>/checkpoint.pt)
#   5  decoding             (python -m avsr.bin.decode: test sets x modalities x noise conditions)
#   6  scoring              (python -m avsr.bin.score: RESULTS.md, results.json, wer_vs_snr.png)
set -euo pipefail

log() { echo "$(date '+%Y-%m-%dT%H:%M:%S') (${BASH_SOURCE[1]##*/}:${BASH_LINENO[0]}) $*" >&2; }

# ---- defaults (a corpus run.sh overrides them before calling this script) ----
stage=${stage:-1}
stop_stage=${stop_stage:-100}
ngpu=${ngpu:-0}                     # 0: CPU; 1: one GPU; >1: torchrun --nproc_per_node ngpu
nj=${nj:-2}                         # parallel jobs for corpus preparation
python=${python:-python3}
corpus_dir=${corpus_dir:-corpus}    # <split>/<speaker>/<utt>.{wav,mp4,txt}
local_data_opts=${local_data_opts:-}
data_dir=${data_dir:-data}
exp_dir=${exp_dir:-exp}
train_set=${train_set:-train}
valid_set=${valid_set:-valid}
test_sets=${test_sets:-test}
vocab_size=${vocab_size:-64}        # sentencepiece vocabulary (soft limit)
bpemode=${bpemode:-unigram}         # unigram | bpe | char | word
train_config=${train_config:-}
decode_config=${decode_config:-}
tag=${tag:-}                        # experiment name (default: the training config's name)
train_noise=${train_noise:-}        # noise wav for training-time augmentation
test_noise=${test_noise:-}          # noise wav for the noisy test conditions
noise_name=${noise_name:-babble}
test_snrs=${test_snrs:-"10 5 0 -5"}
modalities=${modalities:-"audio video audiovisual"}
average_nbest=${average_nbest:-5}

# ---- options: --name value ----
while [ $# -gt 0 ]; do
  case "$1" in
    --help|-h) sed -n '2,12p' "${BASH_SOURCE[0]}"; exit 0 ;;
    --*=*) name="${1%%=*}"; value="${1#*=}"; shift ;;
    --*) [ $# -ge 2 ] || { log "option $1 needs a value"; exit 1; }; name="$1"; value="$2"; shift 2 ;;
    *) log "unexpected argument: $1"; exit 1 ;;
  esac
  name="${name#--}"; name="${name//-/_}"
  if ! declare -p "$name" >/dev/null 2>&1 || [[ ! "$name" =~ ^[a-z_][a-z0-9_]*$ ]]; then
    log "unknown option --${name//_/-}"; exit 1
  fi
  printf -v "$name" '%s' "$value"
done

[ -n "$train_config" ] || { log "--train-config is required"; exit 1; }
[ -n "$decode_config" ] || { log "--decode-config is required"; exit 1; }
[ -n "$tag" ] || tag="$(basename "${train_config%.*}")"
exp="${exp_dir}/${tag}"
token_dir="${data_dir}/token_list"
mkdir -p "${exp}/logs"
times="${exp}/stage_times.tsv"

run_stage() {  # run_stage N name command... : runs when stage <= N <= stop_stage, logs and times it
  local n="$1" name="$2"; shift 2
  if [ "$stage" -le "$n" ] && [ "$stop_stage" -ge "$n" ]; then
    log "Stage ${n}: ${name}"
    local t0=$SECONDS
    local rc
    set +e
    "$@" 2>&1 | tee -a "${exp}/logs/stage${n}.log"
    rc=${PIPESTATUS[0]}
    set -e
    [ "$rc" -eq 0 ] || { log "Stage ${n} (${name}) failed with exit code ${rc}; see ${exp}/logs/stage${n}.log"; exit "$rc"; }
    printf '%s\t%s\t%s\n' "$n" "$name" "$((SECONDS - t0))" >> "$times"
    log "Stage ${n} done in $((SECONDS - t0)) s"
  fi
}

stage_corpus() {
  [ -x local/data.sh ] || { log "local/data.sh not found in $(pwd)"; return 1; }
  # shellcheck disable=SC2086
  local/data.sh --corpus-dir "$corpus_dir" --nj "$nj" --python "$python" $local_data_opts
}

stage_datadirs() {
  "$python" -m avsr.bin.prepare_data --corpus "$corpus_dir" --out "$data_dir" \
    --splits "$train_set" "$valid_set" $test_sets
}

stage_tokenizer() {
  "$python" -m avsr.bin.tokenizer --text "${data_dir}/${train_set}/text" --out "$token_dir" \
    --vocab-size "$vocab_size" --model-type "$bpemode"
}

stage_train() {
  local noise_opt=()
  [ -n "$train_noise" ] && noise_opt=(--train-noise "$train_noise")
  local launcher=("$python")
  if [ "$ngpu" -gt 1 ]; then launcher=("$python" -m torch.distributed.run --standalone --nproc_per_node "$ngpu"); fi
  "${launcher[@]}" -m avsr.bin.train --config "$train_config" --train-data "${data_dir}/${train_set}" \
    --valid-data "${data_dir}/${valid_set}" --bpemodel "${token_dir}/bpe.model" --exp-dir "$exp" \
    --ngpu "$([ "$ngpu" -gt 0 ] && echo 1 || echo 0)" "${noise_opt[@]}"
}

stage_decode() {
  # On CPU every modality is decoded by its own single-threaded process, all in parallel (the beam search's
  # small tensor ops gain nothing from threads); on a GPU one process decodes them in turn.
  local noise_opt=() dev=0
  [ -n "$test_noise" ] && noise_opt=(--noise-file "$test_noise" --noise-name "$noise_name" --snrs $test_snrs)
  [ "$ngpu" -gt 0 ] && dev=1
  local groups=("$modalities")
  # shellcheck disable=SC2206
  [ "$dev" -eq 0 ] && groups=($modalities)
  for t in $test_sets; do
    local pids=() logs=() failed=0 i
    for i in "${!groups[@]}"; do
      local lg="${exp}/logs/decode_${t}_${i}.log"
      # shellcheck disable=SC2086
      "$python" -m avsr.bin.decode --exp-dir "$exp" --data "${data_dir}/${t}" --test-set "$t" \
        --decode-config "$decode_config" --modalities ${groups[$i]} --average-nbest "$average_nbest" \
        --out "${exp}/decode" --ngpu "$dev" "${noise_opt[@]}" > "$lg" 2>&1 &
      pids+=($!); logs+=("$lg")
      log "decoding ${t} / ${groups[$i]} (pid $!, log ${lg})"
    done
    for i in "${!pids[@]}"; do
      if ! wait "${pids[$i]}"; then log "decoding failed, see ${logs[$i]}:"; tail -n 20 "${logs[$i]}"; failed=1; fi
    done
    [ "$failed" -eq 0 ] || return 1
    grep -h "utterances in" "${logs[@]}" || true
  done
}

stage_score() {
  # notes for RESULTS.md: the recipe's own (local/results_notes.md) and the wall time of each stage so far
  local notes=""
  [ -f local/results_notes.md ] && notes="$(cat local/results_notes.md)"$'\n\n'
  if [ -f "$times" ]; then
    notes+="Stage wall times (s), last run of each: "
    notes+="$(awk -F'\t' '$1 != 6 {t[$1] = $2 ": " $3} END {for (k = 1; k <= 20; k++) if (k in t) printf "%d %s; ", k, t[k]}' "$times")"
  fi
  "$python" -m avsr.bin.score --decode-dir "${exp}/decode" --out "$exp" --notes "$notes"
}

run_stage 1 "corpus preparation" stage_corpus
run_stage 2 "data dirs" stage_datadirs
run_stage 3 "tokenizer" stage_tokenizer
run_stage 4 "training" stage_train
run_stage 5 "decoding" stage_decode
run_stage 6 "scoring" stage_score
log "Finished: ${exp}"
