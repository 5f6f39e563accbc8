#!/usr/bin/env bash
# SynthGRID with avsr's AV-HuBERT encoder inside ESPnet2: ESPnet's own trainer (collect_stats, asr_train),
# model (ESPnetASRModel: ESPnet's transformer decoder and CTC) and decoder (Speech2Text's BatchBeamSearch).
# Needs the ESPnet environment:  bash scripts/install_espnet.sh  (-> .venv-espnet at the repository root).
#   ./run.sh                       # all stages
#   ./run.sh --stage 4             # from training on (re-running stage 4 resumes ESPnet's checkpoint)
#   ./run.sh --snrs "0 -5"         # babble conditions decoded besides clean (default: 10 5 0 -5)
#   ./run.sh --train-noise-prob 0.3 --max-epoch 8 --nj 2
#   ./run.sh --pre-beam-modalities ""   # skip the second decoding with avsr's pre-beam ranking
#   ./run.sh --num-threads 1       # one intra-op thread for training (OMP_NUM_THREADS): on a machine whose
#                                  # cores other jobs also use, 2 threads on 2 cores made each step ~9x slower
#   ./run.sh --stage 4 --max-epoch 1 --snrs "" --num-utts 40 --pre-beam-modalities audiovisual
#                                       # a quick cut-down run (1 epoch; first 40 test utterances, clean)
#   ./run.sh --stage 4 --stop_stage 4 --num-threads 1; ./run.sh --stage 5 --nj 2   # the run of RESULTS.md
# Stages:
#   1  corpus, data dirs, tokenizer: ../avsr1/run.sh --stop_stage 4 (shared with avsr's recipe: same test set)
#   2  dump: python -m avsr.espnet.dump -> dump/{train,valid}, dump/test/{clean,babble_<snr>} (packed frames)
#   3  ESPnet collect_stats (shape files)      python -m avsr.espnet.asr_train --collect_stats true
#   4  ESPnet training                         python -m avsr.espnet.asr_train
#   5  decoding with ESPnet's Speech2Text, {audio, video, audiovisual} x {clean, babble}   local/decode.py (--nj processes);
#      again with the pre-beam ranked as avsr's default (pre_beam: avsr), for --pre-beam-modalities
#   6  scoring: RESULTS.md + results.json (avsr.bin.score) and the comparison with ../avsr1   local/compare.py
set -euo pipefail
cd "$(dirname "$0")"
root="$(cd ../../.. && pwd)"
python="${root}/.venv-espnet/bin/python"
export PYTHONPATH="${root}${PYTHONPATH:+:${PYTHONPATH}}" PYTHONUNBUFFERED=1

stage=1
stop_stage=6
nj=2
tag=asr_avhubert_synthgrid
train_config=conf/train_asr.yaml
decode_config=conf/decode_asr.yaml
snrs="10 5 0 -5"
modalities="audio video audiovisual"
pre_beam_modalities="audio audiovisual"
train_noise_prob=0.3
train_snrs="-5 0 5 10 20"
max_epoch=""
num_utts=""
num_threads=""
avsr1=../avsr1
while [ $# -gt 0 ]; do
  case "$1" in
    --stage) stage="$2" ;; --stop_stage|--stop-stage) stop_stage="$2" ;; --nj) nj="$2" ;; --tag) tag="$2" ;;
    --train-config) train_config="$2" ;; --decode-config) decode_config="$2" ;; --snrs) snrs="$2" ;;
    --modalities) modalities="$2" ;; --pre-beam-modalities) pre_beam_modalities="$2" ;; --train-noise-prob) train_noise_prob="$2" ;; --max-epoch) max_epoch="$2" ;;
    --python) python="$2" ;; --num-utts) num_utts="$2" ;; --num-threads) num_threads="$2" ;;
    *) echo "run.sh: unknown option $1" >&2; exit 1 ;;
  esac
  shift 2
done
[ -z "$num_threads" ] || export OMP_NUM_THREADS="$num_threads" MKL_NUM_THREADS="$num_threads"
[ -x "$python" ] || { echo "run.sh: no ESPnet environment at $python: run bash scripts/install_espnet.sh" >&2; exit 1; }
data="${avsr1}/data"
corpus="${avsr1}/corpus"
exp="exp/${tag}"
mkdir -p "${exp}/logs"
log() { echo "$(date '+%Y-%m-%dT%H:%M:%S') $*"; }
timed() {  # timed <stage> <command...>: run, log to exp/<tag>/logs/stage<N>.log, append the wall time
  local n="$1"; shift
  local t0; t0=$(date +%s)
  log "Stage ${n}: $*"
  if ! "$@" > "${exp}/logs/stage${n}.log" 2>&1; then
    tail -20 "${exp}/logs/stage${n}.log" >&2
    echo "stage ${n} failed: see ${exp}/logs/stage${n}.log" >&2
    exit 1
  fi
  grep -E "epoch results|^\[decode\]|WER" "${exp}/logs/stage${n}.log" | cut -c1-200 || true
  printf "%s\t%s\n" "${n}" "$(( $(date +%s) - t0 ))" >> "${exp}/stage_times.tsv"
}

stage1() { (cd "${avsr1}" && PATH="${root}/.venv-espnet/bin:${PATH}" ./run.sh --stop_stage 4); }
stage2() {
  "$python" -m avsr.espnet.dump --data "${data}/train" --out dump/train --nj "$nj" \
    --noise "${corpus}/noise/babble_train.wav" --noise-prob "$train_noise_prob" --snr-db $train_snrs
  "$python" -m avsr.espnet.dump --data "${data}/valid" --out dump/valid --nj "$nj"
  "$python" -m avsr.espnet.dump --data "${data}/test" --out dump/test/clean --nj "$nj"
  for snr in $snrs; do
    "$python" -m avsr.espnet.dump --data "${data}/test" --out "dump/test/babble_${snr}" --nj "$nj" \
      --noise "${corpus}/noise/babble_test.wav" --snr-db "$snr"
  done
}
espnet_args() {  # espnet_args CONFIG: the config, data and token options of collect_stats and training
  echo --use_preprocessor true --token_type bpe --bpemodel "${data}/token_list/bpe.model" \
    --token_list "${data}/token_list/tokens.txt" --config "$1" \
    --input_size "$(cat dump/train/feats_dim)" \
    --train_data_path_and_name_and_type dump/train/feats.scp,speech,npy \
    --train_data_path_and_name_and_type dump/train/text,text,text \
    --valid_data_path_and_name_and_type dump/valid/feats.scp,speech,npy \
    --valid_data_path_and_name_and_type dump/valid/text,text,text
}
stage3() {
  # shellcheck disable=SC2046
  "$python" -m avsr.espnet.asr_train --collect_stats true $(espnet_args "$train_config") --batch_type unsorted --batch_size 16 \
    --train_shape_file dump/train/feats.scp --valid_shape_file dump/valid/feats.scp --output_dir "${exp}/stats"
}
stage4() {
  # the cosine schedule decays over the whole run: first_cycle_steps = max_epoch x batches per epoch
  "$python" - "$train_config" "$exp" "$max_epoch" <<'PY'
import sys

import yaml
from espnet2.samplers.build_batch_sampler import build_batch_sampler

config, exp, max_epoch = sys.argv[1:]
cfg = yaml.safe_load(open(config, encoding="utf-8"))
if max_epoch:
    cfg["max_epoch"] = int(max_epoch)
sampler = build_batch_sampler(cfg["batch_type"], cfg.get("batch_size", 1), cfg["batch_bins"],
                              [f"{exp}/stats/train/speech_shape", f"{exp}/stats/train/text_shape"])
steps = len(sampler) * cfg["max_epoch"] // cfg.get("accum_grad", 1)
cfg["scheduler_conf"]["first_cycle_steps"] = steps
# a short run (--max-epoch) keeps 3/4 of it for the decay
cfg["scheduler_conf"]["warmup_steps"] = min(cfg["scheduler_conf"]["warmup_steps"], steps // 4)
with open(f"{exp}/train_asr.yaml", "w", encoding="utf-8") as f:
    f.write(f"# {config} with first_cycle_steps = {cfg['max_epoch']} epochs x {len(sampler)} batches\n")
    yaml.safe_dump(cfg, f, sort_keys=False)
print(f"[stage4] {len(sampler)} batches per epoch, {steps} steps")
PY
  # shellcheck disable=SC2046
  "$python" -m avsr.espnet.asr_train $(espnet_args "${exp}/train_asr.yaml") --resume true --output_dir "${exp}" \
    --train_shape_file "${exp}/stats/train/speech_shape" --train_shape_file "${exp}/stats/train/text_shape" \
    --valid_shape_file "${exp}/stats/valid/speech_shape" --valid_shape_file "${exp}/stats/valid/text_shape" \

}
stage5() {
  local conds=(clean) subset=()
  [ -n "$num_utts" ] && subset=(--num-utts "$num_utts")
  for snr in $snrs; do conds+=("babble_${snr}"); done
  "$python" local/decode.py --nj "$nj" --exp "${exp}" --model "${exp}/valid.acc.ave.pth" --decode-config "${decode_config}" \
    --dump dump/test --conditions "${conds[@]}" --modalities $modalities --out "${exp}/decode/test" "${subset[@]}"
  if [ -n "$pre_beam_modalities" ]; then
    "$python" local/decode.py --nj "$nj" --exp "${exp}" --model "${exp}/valid.acc.ave.pth" --decode-config "${decode_config}" \
      --dump dump/test --conditions "${conds[@]}" --modalities $pre_beam_modalities --pre-beam avsr "${subset[@]}" \
      --out "${exp}/decode_pre_beam_avsr/test"
  fi
}
stage6() {
  "$python" -m avsr.bin.score --decode-dir "${exp}/decode" --out "${exp}" \
    --notes "ESPnet $("$python" -c 'import espnet; print(espnet.__version__)') (asr_train + Speech2Text)"
  local pre_beam=()
  if [ -d "${exp}/decode_pre_beam_avsr" ]; then
    "$python" -m avsr.bin.score --system "pre_beam_espnet=${exp}/decode" \
      --system "pre_beam_avsr=${exp}/decode_pre_beam_avsr" --out "${exp}/pre_beam" --title "Pre-beams compared"
    pre_beam=(--pre-beam "${exp}/pre_beam/results.json")
  fi
  local notes=()
  [ -f local/results_notes.md ] && notes=(--notes local/results_notes.md)
  "$python" local/compare.py --espnet "${exp}/results.json" --avsr "${avsr1}/results.json" \
    --exp "${exp}" --out RESULTS.md "${pre_beam[@]}" "${notes[@]}"
}

for n in 1 2 3 4 5 6; do
  if [ "$n" -ge "$stage" ] && [ "$n" -le "$stop_stage" ]; then timed "$n" "stage${n}"; fi
done
log "Finished: ${exp}"
