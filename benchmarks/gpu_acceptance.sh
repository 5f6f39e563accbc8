#!/usr/bin/env bash
# GPU acceptance run: is avsr fast and working on the machine you have? One script, four timed steps, one
# JSON and one short table.
#
#   bash benchmarks/gpu_acceptance.sh [--device cuda|cuda:N|cpu] [--tiny] [--out DIR]
#
# Defaults: --device cuda, --out exp/gpu_acceptance. On a GPU machine (one H100 or H200: at most 8 minutes):
#   bash scripts/install.sh                      # .venv with torch, festival for the recipe's corpus
#   bash benchmarks/gpu_acceptance.sh            # -> exp/gpu_acceptance/acceptance.{json,md}
# On a CPU, in seconds (what CI runs, tests/test_gpu_acceptance.py): --device cpu --tiny.
# Python: $PYTHON if set, else the repository's .venv/bin/python, else python3; the repository itself is put
# first on PYTHONPATH. The exit status is 0 only if every step passed (a skipped step passes); a failed step
# does not stop the others, and the JSON is written in any case.
#
# The steps and their figures (acceptance.json: "steps" -> name -> status ok|failed|skipped, rc, seconds,
# figures; a failed step also has log_tail, the last lines of DIR/steps/<name>.log; a skipped one a reason):
#   cuda_tests  pytest -q -rs -m cuda: the tests marked cuda (the batched beam search, a float32 training
#               step and the Transcriber's batches against the CPU, bf16 training against float32 on the
#               GPU, auto precision on the GPU). Figures: passed, skipped, failed, errors. Without CUDA they
#               skip; with --device cuda a skipped CUDA test fails the step.
#   train_step  one training step (forward, backward, fused AdamW step; dropouts off, both modalities) of the
#               AV-HuBERT BASE and LARGE encoders (avsr/conf/model/avhubert_{base,large}.yaml) on an
#               audio-visual batch of 8 x 250 frames (10 s each: stacked filterbanks and 88x88 lips), bf16
#               autocast on a GPU (precision auto on a CPU: bf16 only where it is native). Figures per encoder:
#                 step_s_median        median wall time of 5 timed steps (after 1 FLOP-counted + 2 warm-up
#                                      steps; torch.cuda.synchronize() before and after each)
#                 tokens_per_s         encoder frames (25 Hz) per second: 8 * 250 / step_s_median
#                 flops_per_step       model FLOPs of one step (forward + backward), counted by
#                                      torch.utils.flop_counter.FlopCounterMode (matmuls, convolutions,
#                                      attention; a multiply-add is 2 FLOPs)
#                 mfu                  model FLOPs utilisation: flops_per_step / step_s_median / the GPU's
#                                      dense bf16 peak (H100 SXM / H200 989.4, H100 PCIe 756, A100 312, L4 121
#                                      TFLOP/s ...: PEAK_BF16_FLOPS in gpu_acceptance.py, matched on
#                                      torch.cuda.get_device_name). null on a CPU, an unknown GPU or without
#                                      bf16; mfu_note says why.
#                 peak_mem_mib         torch.cuda.max_memory_allocated (GPU) or the peak RSS (CPU)
#               --tiny: 1- and 2-layer encoders of width 32 / 64, ResNet widths 4-4-8-8, 2 x 25 frames, 2
#               timed steps.
#   recipe      recipes/synthgrid/avsr1/run.sh with --ngpu 1 (CPU: 0) into DIR/recipe (removed first):
#               corpus generation, data dirs, tokenizer, training, decoding, scoring. GPU: the default model
#               and training config for 3 epochs on 400 utterances, all test sets and modalities, clean,
#               0 and -5 dB. --tiny: the tiny model of tests/test_recipe.py, 1 epoch on 12 utterances, one
#               test set, audio-visual, clean and 0 dB. Figures: stage_times_s (stage_times.tsv) and results
#               (results.json: WER per condition; meaningless at this size, the point is that it runs).
#               Skipped, with the reason, when festival is not installed.
#   decode      benchmarks/bench_decode.py on the device: the batched joint CTC/attention beam search over
#               a random model (encoder output given). GPU: 32 utterances of 150 frames (6 s), beam 10, a
#               6 x 768 decoder over 1000 tokens (AV-HuBERT BASE fine-tuning size), 30 tokens per hypothesis.
#               Figures per mode (att, joint-partial, joint-full, ctc): utt_per_s (utterances per second),
#               rtf (search time / speech duration), steps_per_s, peak_cuda_mib.
# The table (acceptance.md, printed at the end) names the machine (avsr.nn.precision.machine_summary).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
device=cuda
tiny=false
out=exp/gpu_acceptance
while [ $# -gt 0 ]; do
  case "$1" in
    --device) device="$2"; shift 2 ;;
    --device=*) device="${1#*=}"; shift ;;
    --tiny) tiny=true; shift ;;
    --out) out="$2"; shift 2 ;;
    --out=*) out="${1#*=}"; shift ;;
    -h|--help) sed -n '2,50p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "gpu_acceptance.sh: unknown option $1 (--device cuda|cpu, --tiny, --out DIR)" >&2; exit 2 ;;
  esac
done
case "$device" in cpu|cuda|cuda:[0-9]*) ;; *) echo "gpu_acceptance.sh: --device cuda|cuda:N|cpu, got ${device}" >&2; exit 2 ;; esac

py="${PYTHON:-}"
if [ -z "$py" ]; then
  if [ -x "${root}/.venv/bin/python" ]; then py="${root}/.venv/bin/python"; else py="$(command -v python3)"; fi
fi
export PYTHONPATH="${root}${PYTHONPATH:+:${PYTHONPATH}}"
export PYTHONUNBUFFERED=1
mkdir -p "$out"
out="$(cd "$out" && pwd)"
steps="${out}/steps"
rm -rf "$steps"
mkdir -p "$steps"
opts=(--device "$device")
[ "$tiny" = true ] && opts+=(--tiny)
script="${root}/benchmarks/gpu_acceptance.py"

now() { date +%s.%N; }
t_start="$(now)"

run_step() {  # run_step NAME SUBCOMMAND [ARGS...]: logs to steps/NAME.log, records rc and seconds
  local name="$1" rc t0
  shift
  echo "== ${name}: $* ($(date '+%H:%M:%S'))"
  t0="$(now)"
  set +e
  "$py" "$script" "$@" "${opts[@]}" --json "${steps}/${name}.json" > "${steps}/${name}.log" 2>&1
  rc=$?
  set -e
  echo "$rc" > "${steps}/${name}.rc"
  awk -v a="$t0" -v b="$(now)" 'BEGIN {printf "%.3f\n", b - a}' > "${steps}/${name}.seconds"
  if [ "$rc" -eq 0 ]; then
    echo "   ok in $(cat "${steps}/${name}.seconds") s"
  else
    echo "   FAILED (exit ${rc}) in $(cat "${steps}/${name}.seconds") s; last lines of ${steps}/${name}.log:"
    tail -n 8 "${steps}/${name}.log" | sed 's/^/   | /'
  fi
}

echo "gpu_acceptance: device ${device}, tiny ${tiny}, out ${out}, python ${py}"
cd "$root"
run_step cuda_tests cuda-tests
run_step train_step train-step
run_step recipe recipe --work "${out}/recipe"
run_step decode decode
total="$(awk -v a="$t_start" -v b="$(now)" 'BEGIN {printf "%.3f", b - a}')"
echo
"$py" "$script" report "${opts[@]}" --out "$out" --total-s "$total"
