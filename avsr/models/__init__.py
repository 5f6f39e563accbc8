"""Models built on the AV-HuBERT encoder: the hybrid CTC/attention ASR model (:class:`AVSRModel`)."""

from avsr.models.asr import AVSRModel, AVSRModelConfig, label_smoothing_loss

__all__ = ["AVSRModel", "AVSRModelConfig", "label_smoothing_loss"]
