"""Models built on the AV-HuBERT encoder: the hybrid CTC/attention ASR model (:class:`AVSRModel`) and the
AV-HuBERT pretraining model (:class:`AVHubertPretrainModel`)."""

from avsr.models.asr import AVSRModel, AVSRModelConfig, label_smoothing_loss
from avsr.models.pretrain import AVHubertPretrainConfig, AVHubertPretrainModel

__all__ = ["AVHubertPretrainConfig", "AVHubertPretrainModel", "AVSRModel", "AVSRModelConfig",
           "label_smoothing_loss"]
