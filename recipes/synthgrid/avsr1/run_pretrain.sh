#!/usr/bin/env bash
# SynthGRID with AV-HuBERT pretraining: two iterations of masked multimodal cluster prediction on all
# training utterances (no transcripts), then fine-tuning on 10% of them with transcripts, compared with the
# same fine-tuning from scratch, both decoded clean and in babble at 0 dB. About 40 min on 2 CPU cores.
#   iteration 1: MFCC (39-dim, 100 Hz) -> k-means K=100 -> pretraining
#   iteration 2: layer features of iteration 1's model (25 Hz) -> k-means K=500 -> pretraining
#   ./run_pretrain.sh                       # everything (stages 1-11)
#   ./run_pretrain.sh --finetune-percent 20 # more labels
#   ./run_pretrain.sh --stage 9             # fine-tune, decode and score again
# Options as run.sh (corpus options, and any variable of ../../TEMPLATE/avsr1/avsr.sh). Its corpus is the
# 1,500-utterance, 48-speaker, festival-only SynthGRID of its verified results, in its own corpus and data
# directories (the default run.sh generates a larger one of three engines); later options override these.
set -euo pipefail
cd "$(dirname "$0")"
exec ./run.sh \
  --num-train 1500 --train-speakers 48 --engines festival --num-test-espeak-ng 0 --num-test-flite 0 \
  --corpus-dir corpus_pretrain --data-dir data_pretrain \
  --pretrain-iters 2 \
  --pretrain-config conf/pretrain/avhubert_synthgrid_cpu.yaml \
  --km-classes 100 --km-classes2 500 \
  --finetune-percent 10 \
  --scratch-baseline true \
  --test-snrs "0" \
  --train-config conf/train/avsr_synthgrid_cpu_finetune.yaml \
  "$@"
