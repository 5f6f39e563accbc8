"""Clustering targets for AV-HuBERT pretraining (HuBERT's ``simple_kmeans``, AV-HuBERT's ``clustering``).

The pipeline, one command-line tool per step::

    data dir --avsr.bin.dump_features--> feature shards (.npy/.len/.json)    (MFCC 100 Hz | layer L 25 Hz)
             --avsr.bin.kmeans fit-----> km.joblib (MiniBatchKMeans)
             --avsr.bin.kmeans apply---> <data-dir>/<name>.km + .km.json   (one label per feature frame)
             --avsr.bin.cluster_quality-> phone purity, cluster purity, PNMI against .phn alignments

Modules: :mod:`~avsr.clustering.labels` (label files), :mod:`~avsr.clustering.shards` (feature shards),
:mod:`~avsr.clustering.extract` (MFCC and encoder-layer extractors), :mod:`~avsr.clustering.kmeans`,
:mod:`~avsr.clustering.quality`.
"""

from avsr.clustering.labels import LabelError, read_label_meta, read_labels, write_label_meta, write_labels
from avsr.clustering.quality import cluster_quality, label_quality

__all__ = ["LabelError", "read_labels", "write_labels", "read_label_meta", "write_label_meta",
           "cluster_quality", "label_quality"]
