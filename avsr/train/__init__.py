"""Training: the trainer (one loop for CPU, GPU and torchrun/DDP), its configuration, experiments and curves
(checkpoints: :mod:`avsr.checkpoint`)."""
