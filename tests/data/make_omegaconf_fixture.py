"""Writes tests/data/omegaconf_cfg.pt: a checkpoint whose ``cfg`` is an omegaconf ``DictConfig`` (not
converted to plain containers), as a fairseq checkpoint saved without ``OmegaConf.to_container`` would hold.

Needs omegaconf 2.0.x (fairseq's pin in 2021), which avsr does not depend on; the test only reads the file:
``PYTHONPATH=<dir with omegaconf 2.0.6> python tests/data/make_omegaconf_fixture.py``.
The model section is a structured config of a dataclass defined in a module named ``avhubert.hubert``, with
the interpolation ``label_rate: ${task.label_rate}`` left unresolved, and holds the pretraining configuration
of a fine-tuned model in ``w2v_args``, as the original does.
"""

import dataclasses
import sys
import types
import typing
from pathlib import Path

import torch
from omegaconf import II, OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests import fairseq_reference as ref  # noqa: E402


def structured(name: str, module: str, values: dict):
    mod = sys.modules.setdefault(module, types.ModuleType(module))
    fields = []
    for k, v in values.items():
        if k == "label_rate":
            fields.append((k, int, dataclasses.field(default=II("task.label_rate"))))
        elif isinstance(v, (list, dict)) or v is None:
            fields.append((k, typing.Any, dataclasses.field(default_factory=lambda v=v: v)))
        else:
            fields.append((k, type(v), dataclasses.field(default=v)))
    cls = dataclasses.make_dataclass(name, fields)
    cls.__module__ = module
    setattr(mod, name, cls)
    return OmegaConf.structured(cls)


sys.modules.setdefault("avhubert", types.ModuleType("avhubert"))
pre = ref.full_cfg(ref.pretrain_model_cfg())
pre_model = {k: v for k, v in pre["model"].items() if k not in ("latent_temp",)}
w2v_args = OmegaConf.create({**{k: v for k, v in pre.items() if k != "model"},
                             "model": structured("AVHubertConfig", "avhubert.hubert", pre_model)})
ft = ref.finetune_model_cfg("av_hubert_seq2seq", None)
model = structured("AVHubertSeq2SeqConfig", "avhubert.hubert_asr", ft)
model.w2v_args = w2v_args
cfg = OmegaConf.create({"task": ref.task_cfg(is_s2s=True, fine_tuning=True, labels=["wrd"]), "model": model,
                        "criterion": {"_name": "label_smoothed_cross_entropy", "label_smoothing": 0.1}})
out = Path(__file__).with_name("omegaconf_cfg.pt")
torch.save({"cfg": cfg, "model": {}}, out)
print(out)
