"""Models built on the AV-HuBERT encoder: the hybrid CTC/attention ASR model (:class:`AVSRModel`) and the
AV-HuBERT pretraining model (:class:`AVHubertPretrainModel`), both built from one configuration tree
(:class:`ModelConfig`)."""

from avsr.models.asr import AVSRModel, label_smoothing_loss
from avsr.models.config import AVHubertPretrainConfig, AVSRModelConfig, ModelConfig
from avsr.models.pretrain import AVHubertPretrainModel

__all__ = ["AVHubertPretrainConfig", "AVHubertPretrainModel", "AVSRModel", "AVSRModelConfig", "ModelConfig",
           "label_smoothing_loss"]
