"""Training: the trainer (one loop for CPU, GPU and torchrun/DDP) and atomic, averageable checkpoints."""
