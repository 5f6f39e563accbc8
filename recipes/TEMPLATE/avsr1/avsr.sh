#!/usr/bin/env bash
# Generic audio-visual speech recognition recipe (the ESPnet egs2/TEMPLATE/asr1/asr.sh of avsr).
# A corpus recipe's run.sh sets its variables and calls this script; every variable below can also be
# given on the command line as --name value (dashes or underscores). Stages are idempotent and resumable:
#   1  corpus preparation   (the corpus recipe's local/data.sh: generation or download-free preparation)
#   2  mouth ROIs           (raw face videos only, --roi-list: python -m avsr.bin.preprocess_roi)
#   3  data dirs            (python -m avsr.bin.prepare_data: Kaldi wav.scp, video.scp, text, utt2spk;
#                            --finetune-percent P < 100: a labeled subset data/<train_set>_<P>pct;
#                            --edge-test-sets S: data/<S>_edges, S with other silences at the edges;
#                            --lip-test-sets S: data/<S>_other_lips, data/<S>_frozen_mouth (S with video
#                            that does not say the transcript), data/<S>_photo_lips (a photograph's mouth))
#   4  tokenizer            (python -m avsr.bin.tokenizer: sentencepiece model + token list)
#   5  clustering, iter 1   (--pretrain-iters >= 1: MFCC features, k-means, 100 Hz labels, cluster quality)
#   6  pretraining, iter 1  (masked multimodal cluster prediction; resumes from its checkpoint.pt)
#   7  clustering, iter 2   (--pretrain-iters 2: features of iteration 1's model, k-means, 25 Hz labels)
#   8  pretraining, iter 2
#   9  training             (python -m avsr.bin.train, fine-tuning the last pretrained encoder if any, and
#                            with --scratch-baseline true the same training from scratch; resumes)
#  10  decoding             (python -m avsr.bin.decode: systems x test sets x modalities x noise conditions)
#  11  scoring              (python -m avsr.bin.score: RESULTS.md, results.json, wer_vs_snr.png)
set -euo pipefail

log() { echo "$(date '+%Y-%m-%dT%H:%M:%S') (${BASH_SOURCE[1]##*/}:${BASH_LINENO[0]}) $*" >&2; }

# ---- defaults (a corpus run.sh overrides them before calling this script) ----
stage=${stage:-1}
stop_stage=${stop_stage:-100}
ngpu=${ngpu:-0}                     # 0: CPU; 1: one GPU; >1: torchrun --nproc_per_node ngpu
nnodes=${nnodes:-1}                 # training on several nodes: run the training stages on every node with
node_rank=${node_rank:-0}           #   --nnodes N --node-rank R --master-addr HOST (torchrun's static rendezvous)
master_addr=${master_addr:-}
master_port=${master_port:-29500}
nj=${nj:-2}                         # parallel jobs for corpus preparation
python=${python:-python3}
corpus_dir=${corpus_dir:-corpus}    # <split>/<speaker>/<utt>.{wav,mp4,txt}
local_data_opts=${local_data_opts:-}
data_dir=${data_dir:-data}
exp_dir=${exp_dir:-exp}
train_set=${train_set:-train}
pretrain_set=${pretrain_set:-}      # data of the pretraining stages 5-8 (default: train_set)
valid_set=${valid_set:-valid}
test_sets=${test_sets:-test}
edge_test_sets=${edge_test_sets:-}  # test sets also decoded as <set>_edges: each end cut to the speech or
                                    #   0.4-1.0 s longer (python -m avsr.bin.edge_sets)
lip_test_sets=${lip_test_sets:-}    # test sets also decoded as <set>_other_lips (another utterance's mouth),
                                    #   <set>_frozen_mouth (one frame held) and <set>_photo_lips (a photograph's
                                    #   mouth moved by the utterance; python -m avsr.bin.lip_sets)
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
roi_list=${roi_list:-}              # raw videos to crop: lines "<src.mp4> <corpus-relative dst.mp4>"
finetune_percent=${finetune_percent:-100}  # labeled share of the training set used for training (%)
pretrain_iters=${pretrain_iters:-0}        # 0: no pretraining; 1 or 2 iterations of AV-HuBERT pretraining
pretrain_config=${pretrain_config:-}       # conf/pretrain/*.yaml of iteration 1
pretrain_config2=${pretrain_config2:-}     # of iteration 2 (default: the same as iteration 1)
km_classes=${km_classes:-100}              # k-means clusters of iteration 1 (MFCC)
km_classes2=${km_classes2:-500}            # k-means clusters of iteration 2 (transformer layer)
km_layer=${km_layer:-}                     # layer of iteration 1's model for iteration 2 (default: middle)
km_percent=${km_percent:--1}              # share of the utterances used to fit k-means, 0..1 (-1: all)
scratch_baseline=${scratch_baseline:-false}  # also train the same model from scratch (stage 9)
init_encoder=${init_encoder:-}             # stage 9 without pretraining stages: start the encoder from this
train_opts=${train_opts:-}                 # more options of avsr.bin.train, e.g. "--precision bf16"
phone_lexicon=${phone_lexicon:-}           # Kaldi lexicon.txt (WORD phone...): the phone targets of a training
                                           #   config with model_conf.phone_ctc_weight > 0
decode_opts=${decode_opts:-}               # more options of avsr.bin.decode, e.g. "--precision bf16"
decode_nj=${decode_nj:-0}                  # test sets decoded at once (0: one per CPU core; on a GPU 1)

# ---- options: --name value ----
while [ $# -gt 0 ]; do
  case "$1" in
    --help|-h) sed -n '2,18p' "${BASH_SOURCE[0]}"; exit 0 ;;
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
case "$pretrain_iters" in 0|1|2) ;; *) log "--pretrain-iters must be 0, 1 or 2, got ${pretrain_iters}"; exit 1 ;; esac
[ "$pretrain_iters" -eq 0 ] || [ -n "$pretrain_config" ] || { log "--pretrain-iters ${pretrain_iters} needs --pretrain-config"; exit 1; }
[ -n "$pretrain_config2" ] || pretrain_config2="$pretrain_config"
[ -n "$pretrain_set" ] || pretrain_set="$train_set"
decode_sets="$test_sets"  # the test sets of the corpus, then the ones stage 3 derives from them
for s in $edge_test_sets; do
  [[ " $test_sets " == *" $s "* ]] || { log "--edge-test-sets: ${s} is not one of the test sets (${test_sets})"; exit 1; }
  decode_sets+=" ${s}_edges"
done
for s in $lip_test_sets; do
  [[ " $test_sets " == *" $s "* ]] || { log "--lip-test-sets: ${s} is not one of the test sets (${test_sets})"; exit 1; }
  decode_sets+=" ${s}_other_lips ${s}_frozen_mouth ${s}_photo_lips"
done
[ "$nnodes" -eq 1 ] || [ -n "$master_addr" ] || { log "--nnodes ${nnodes} needs --master-addr"; exit 1; }
# the training set of stage 9 (and of the tokenizer): all of train_set or a labeled subset of it
asr_train_set="$train_set"
[ "$finetune_percent" = 100 ] || asr_train_set="${train_set}_${finetune_percent}pct"
# experiment directories: the systems of stage 9 and the pretraining iterations
pt_exp="${exp_dir}/pretrain_$(basename "${pretrain_config%.*}")"
if [ "$pretrain_iters" -gt 0 ]; then
  exp="${exp_dir}/${tag}_pretrained"; systems=("$exp")
  [ "$scratch_baseline" = true ] && systems+=("${exp_dir}/${tag}_scratch")
  results_dir="${exp_dir}/${tag}_compare"
else
  exp="${exp_dir}/${tag}"; systems=("$exp"); results_dir="$exp"
fi
token_dir="${data_dir}/token_list"
[ "$asr_train_set" = "$train_set" ] || token_dir="${data_dir}/token_list_${asr_train_set}"
mkdir -p "${results_dir}/logs"
times="${results_dir}/stage_times.tsv"

run_stage() {  # run_stage N name command... : runs when stage <= N <= stop_stage, logs and times it
  local n="$1" name="$2"; shift 2
  if [ "$stage" -le "$n" ] && [ "$stop_stage" -ge "$n" ]; then
    log "Stage ${n}: ${name}"
    local t0=$SECONDS
    local rc
    set +e
    "$@" 2>&1 | tee -a "${results_dir}/logs/stage${n}.log"
    rc=${PIPESTATUS[0]}
    set -e
    [ "$rc" -eq 0 ] || { log "Stage ${n} (${name}) failed with exit code ${rc}; see ${results_dir}/logs/stage${n}.log"; exit "$rc"; }
    printf '%s\t%s\t%s\n' "$n" "$name" "$((SECONDS - t0))" >> "$times"
    log "Stage ${n} done in $((SECONDS - t0)) s"
  fi
}

stage_corpus() {
  [ -x local/data.sh ] || { log "local/data.sh not found in $(pwd)"; return 1; }
  # shellcheck disable=SC2086
  local/data.sh --corpus-dir "$corpus_dir" --nj "$nj" --python "$python" $local_data_opts
}

stage_roi() {
  [ -n "$roi_list" ] || { log "no --roi-list: nothing to crop (the corpus already holds mouth ROIs)"; return 0; }
  "$python" -m avsr.bin.preprocess_roi --list "$roi_list" --dst-dir "$corpus_dir" --nj "$nj"
}

stage_datadirs() {
  "$python" -m avsr.bin.prepare_data --corpus "$corpus_dir" --out "$data_dir" --nj "$nj" --no-progress \
    --splits "$train_set" "$valid_set" $test_sets $([ "$pretrain_set" = "$train_set" ] || echo "$pretrain_set")
  if [ "$asr_train_set" != "$train_set" ]; then
    "$python" -m avsr.bin.subset_data --src "${data_dir}/${train_set}" --dst "${data_dir}/${asr_train_set}" \
      --percent "$finetune_percent"
  fi
  local s
  for s in $edge_test_sets; do
    "$python" -m avsr.bin.edge_sets --src "${data_dir}/${s}" --dst "${data_dir}/${s}_edges" --no-progress
  done
  for s in $lip_test_sets; do
    "$python" -m avsr.bin.lip_sets --src "${data_dir}/${s}" --dst-prefix "${data_dir}/${s}" --no-progress
  done
}

stage_tokenizer() {
  "$python" -m avsr.bin.tokenizer --text "${data_dir}/${asr_train_set}/text" --out "$token_dir" \
    --vocab-size "$vocab_size" --model-type "$bpemode"
}

launcher() {  # the python command of a training job: torchrun for several GPUs and/or nodes
  if [ "$nnodes" -gt 1 ]; then
    echo "$python -m torch.distributed.run --nnodes $nnodes --node_rank $node_rank --master_addr $master_addr" \
      "--master_port $master_port --nproc_per_node $((ngpu > 0 ? ngpu : 1))"
  elif [ "$ngpu" -gt 1 ]; then echo "$python -m torch.distributed.run --standalone --nproc_per_node $ngpu"
  else echo "$python"; fi
}

stage_cluster() {  # stage_cluster ITER: features -> k-means -> labels of train and valid sets -> quality
  local it="$1" km_dir="${pt_exp}_iter$1/km" feat_opts k s
  local dev; dev="$([ "$ngpu" -gt 0 ] && echo cuda || echo cpu)"
  if [ "$it" -eq 1 ]; then
    feat_opts=(--feature mfcc); k="$km_classes"
  else
    local prev="${pt_exp}_iter$((it - 1))" ckpt layer="$km_layer"
    ckpt="$(ls -1v "${prev}"/epoch*.pt 2>/dev/null | tail -n 1)"
    [ -n "$ckpt" ] || { log "no checkpoint of pretraining iteration $((it - 1)) in ${prev}"; return 1; }
    if [ -z "$layer" ]; then  # default: the middle layer of the encoder (AV-HuBERT BASE: 12 layers -> 6..12)
      layer="$("$python" -c "import sys, torch; c = torch.load(sys.argv[1], weights_only=True, mmap=True)
print(max(1, (c['model_config']['encoder_conf'].get('encoder_layers', 12) + 1) // 2))" "$ckpt")"
    fi
    feat_opts=(--feature layer --checkpoint "$ckpt" --layer "$layer" --device "$dev"); k="$km_classes2"
  fi
  for s in "$pretrain_set" "$valid_set"; do
    "$python" -m avsr.bin.dump_features --data-dir "${data_dir}/${s}" --feat-dir "${km_dir}/feats" \
      --split "$s" "${feat_opts[@]}"
  done
  [ -f "${km_dir}/km.joblib" ] || "$python" -m avsr.bin.kmeans fit --feat-dir "${km_dir}/feats" \
    --split "$pretrain_set" --km "${km_dir}/km.joblib" --n-clusters "$k" --percent "$km_percent"
  for s in "$pretrain_set" "$valid_set"; do
    "$python" -m avsr.bin.kmeans apply --feat-dir "${km_dir}/feats" --split "$s" --km "${km_dir}/km.joblib" \
      --data-dir "${data_dir}/${s}" --name "iter${it}"
  done
  # cluster quality against phone alignments, where the corpus has them (SynthGRID's <utt>.phn)
  if ! "$python" -m avsr.bin.cluster_quality --labels "${data_dir}/${pretrain_set}/iter${it}.km" \
      --out "${km_dir}/quality.json"; then
    log "no cluster quality for iteration ${it} (no phone alignments in this corpus?)"
  fi
}

stage_pretrain() {  # stage_pretrain ITER
  local it="$1" cfg="$pretrain_config" noise_opt=()
  [ "$it" -eq 2 ] && cfg="$pretrain_config2"
  [ -n "$train_noise" ] && noise_opt=(--train-noise "$train_noise")
  # shellcheck disable=SC2046
  $(launcher) -m avsr.bin.train --config "$cfg" --train-data "${data_dir}/${pretrain_set}" \
    --valid-data "${data_dir}/${valid_set}" --labels "iter${it}.km" --exp-dir "${pt_exp}_iter${it}" \
    --ngpu "$([ "$ngpu" -gt 0 ] && echo 1 || echo 0)" "${noise_opt[@]}"
}

stage_train() {
  local noise_opt=() init_opt=() sys
  [ -n "$train_noise" ] && noise_opt=(--train-noise "$train_noise")
  if [ "$pretrain_iters" -gt 0 ]; then
    local ckpt; ckpt="$(ls -1v "${pt_exp}_iter${pretrain_iters}"/epoch*.pt 2>/dev/null | tail -n 1)"
    [ -n "$ckpt" ] || { log "no checkpoint of pretraining iteration ${pretrain_iters}"; return 1; }
    init_opt=(--init-encoder "$ckpt")
  elif [ -n "$init_encoder" ]; then
    init_opt=(--init-encoder "$init_encoder")
  fi
  for sys in "${systems[@]}"; do
    local opts=()
    [ "$sys" = "$exp" ] && opts=("${init_opt[@]}")
    [ -n "$phone_lexicon" ] && opts+=(--phone-lexicon "$phone_lexicon")
    log "training ${sys} on ${data_dir}/${asr_train_set} ${opts[*]}"
    # shellcheck disable=SC2046
    $(launcher) -m avsr.bin.train --config "$train_config" --train-data "${data_dir}/${asr_train_set}" \
      --valid-data "${data_dir}/${valid_set}" --bpemodel "${token_dir}/bpe.model" --exp-dir "$sys" \
      --ngpu "$([ "$ngpu" -gt 0 ] && echo 1 || echo 0)" "${noise_opt[@]}" "${opts[@]}" $train_opts
  done
}

stage_decode() {
  # One process per test set decodes every modality and condition (audio-visual decoding yields the
  # audio-only and video-only hypotheses too where the model's ranking searches those views:
  # avsr.inference.decode_dir); with fewer test sets than processes to run, one per test set and modality.
  # On CPU up to one single-threaded process per core runs at once (the beam search's small tensor ops gain
  # nothing from threads), on a GPU one at a time (decode_nj sets it).
  local noise_opt=() dev=0 jobs="$decode_nj" failed=0 sys t lg groups=("$modalities") i
  local -A logs=()  # pid -> log of the running processes
  [ -n "$test_noise" ] && noise_opt=(--noise-file "$test_noise" --noise-name "$noise_name" --snrs $test_snrs)
  [ "$ngpu" -gt 0 ] && dev=1
  [ "$jobs" -gt 0 ] || jobs=$([ "$dev" -eq 1 ] && echo 1 || nproc)
  # shellcheck disable=SC2206
  [ "$(( ${#systems[@]} * $(wc -w <<< "$decode_sets") ))" -ge "$jobs" ] || groups=($modalities)
  reap() {  # wait for one decoding process; its utterance counts, or the tail of its log if it failed
    local pid rc=0
    wait -n -p pid "${!logs[@]}" || rc=$?
    if [ "$rc" -ne 0 ]; then
      log "decoding failed, see ${logs[$pid]}:"; tail -n 20 "${logs[$pid]}"; failed=1
    else
      grep -h "utterances" "${logs[$pid]}" || true
    fi
    unset "logs[$pid]"
  }
  for sys in "${systems[@]}"; do
    mkdir -p "${sys}/logs"
    for t in $decode_sets; do
      for i in "${!groups[@]}"; do
        while [ "${#logs[@]}" -ge "$jobs" ]; do reap; done
        lg="${sys}/logs/decode_${t}.log"
        [ "${#groups[@]}" -eq 1 ] || lg="${sys}/logs/decode_${t}_${groups[$i]}.log"
        # shellcheck disable=SC2086
        "$python" -m avsr.bin.decode --exp-dir "$sys" --data "${data_dir}/${t}" --test-set "$t" \
          --decode-config "$decode_config" --modalities ${groups[$i]} --average-nbest "$average_nbest" \
          --out "${sys}/decode" --ngpu "$dev" "${noise_opt[@]}" $decode_opts > "$lg" 2>&1 &
        logs[$!]="$lg"
        log "decoding ${sys##*/}: ${t} / ${groups[$i]} (pid $!, log ${lg})"
      done
    done
  done
  while [ "${#logs[@]}" -gt 0 ]; do reap; done
  return "$failed"
}

stage_score() {
  # notes for RESULTS.md: the recipe's own (local/results_notes.md) and the wall time of each stage so far
  local notes=""
  [ -f local/results_notes.md ] && notes="$(cat local/results_notes.md)"$'\n\n'
  if [ -f "$times" ]; then
    notes+="Stage wall times (s), last run of each: "
    notes+="$(awk -F'\t' '$1 != 11 {t[$1] = $2 ": " $3} END {for (k = 1; k <= 20; k++) if (k in t) printf "%d %s; ", k, t[k]}' "$times")"
  fi
  local src=(--decode-dir "${exp}/decode") extra=() it sys
  if [ "${#systems[@]}" -gt 1 ] || [ "$pretrain_iters" -gt 0 ]; then
    src=()
    for sys in "${systems[@]}"; do src+=(--system "${sys##*/}=${sys}/decode"); done
  fi
  for ((it = 1; it <= pretrain_iters; it++)); do
    local q="${pt_exp}_iter${it}/km/quality.json"
    [ -f "$q" ] && extra+=("$q")
  done
  if [ "${#extra[@]}" -gt 0 ]; then
    "$python" -m avsr.bin.cluster_quality --report "${extra[@]}" --out "${results_dir}/cluster_quality.md"
    extra=(--append "${results_dir}/cluster_quality.md")
  fi
  # the corpus recipe's own tables (optional): local/results_tables.sh DECODE_DIR CORPUS_DIR OUT.md
  if [ -x local/results_tables.sh ]; then
    local/results_tables.sh "${exp}/decode" "$corpus_dir" "${results_dir}/corpus_tables.md" --python "$python"
    [ "${#extra[@]}" -gt 0 ] || extra=(--append)
    extra+=("${results_dir}/corpus_tables.md")
  fi
  "$python" -m avsr.bin.score "${src[@]}" --out "$results_dir" --notes "$notes" "${extra[@]}"
}

run_stage 1 "corpus preparation" stage_corpus
run_stage 2 "mouth ROIs" stage_roi
run_stage 3 "data dirs" stage_datadirs
run_stage 4 "tokenizer" stage_tokenizer
if [ "$pretrain_iters" -ge 1 ]; then
  run_stage 5 "clustering, iteration 1" stage_cluster 1
  run_stage 6 "pretraining, iteration 1" stage_pretrain 1
fi
if [ "$pretrain_iters" -ge 2 ]; then
  run_stage 7 "clustering, iteration 2" stage_cluster 2
  run_stage 8 "pretraining, iteration 2" stage_pretrain 2
fi
run_stage 9 "training" stage_train
run_stage 10 "decoding" stage_decode
run_stage 11 "scoring" stage_score
log "Finished: ${results_dir}"
