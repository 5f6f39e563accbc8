"""Data: corpora, data dirs, media I/O, datasets and batching."""
