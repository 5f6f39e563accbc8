"""Command-line entry points (python -m avsr.bin.<tool>).

Importing this package -- which every tool does before its own imports, and so before torch -- sets
``OMP_WAIT_POLICY=PASSIVE`` where the machine is shared (:func:`avsr.threads.prepare_openmp`): torch's
OpenMP runtime reads it once, when torch loads. The tools that compute set their intra-op threads later
(:func:`avsr.threads.apply_threads`).
"""

from avsr.threads import prepare_openmp

prepare_openmp()
