"""Command-line entry points (python -m avsr.bin.<tool>)."""
