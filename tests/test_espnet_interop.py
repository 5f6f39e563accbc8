"""avsr.espnet against a real ESPnet (skipped where ``espnet2`` is not importable; ``bash
scripts/install_espnet.sh`` makes the environment, then ``.venv-espnet/bin/python -m pytest -q
tests/test_espnet_interop.py``): ESPnet's collect_stats and one epoch of asr_train with our encoder through
the
entry point, Speech2Text and asr_inference decoding, reload_pretrained_parameters inside ESPnet's model
building, and avsr's search with ``pre_beam: espnet`` against ESPnet's BeamSearch / BatchBeamSearch."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

pytest.importorskip("espnet2", reason="ESPnet is not installed (bash scripts/install_espnet.sh)")

from avsr.checkpoint import save_atomic  # noqa: E402
from avsr.data.datadir import read_kaldi_map, write_datadir  # noqa: E402
from avsr.data.tokenizer import Tokenizer, train_sentencepiece  # noqa: E402
from avsr.decode import DecodeConfig, batch_beam_search  # noqa: E402
from avsr.encoder import AVHubertEncoder  # noqa: E402
from avsr.espnet import register  # noqa: E402
from avsr.espnet.dump import dump_datadir  # noqa: E402
from avsr.espnet.layout import crop_and_normalize, unpack_frames  # noqa: E402
from avsr.models.asr import AVSRModel  # noqa: E402
from avsr.nn.decoder import TransformerDecoder  # noqa: E402
from tests.test_data import WORDS, make_utt  # noqa: E402
from tests.test_espnet import TINY as ESPNET_TINY  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(ESPNET_TINY, modality_dropout=0.5, audio_dropout=0.5)
D = 104 + 96 * 96


def run_tool(module, *args, cwd):
    """``python -m module args`` in a fresh interpreter, as a user runs it (output in the failure message)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", module, *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Data dirs, a dump, ESPnet collect_stats and one epoch of ESPnet training with encoder avsr_avhubert."""
    root = tmp_path_factory.mktemp("espnet")
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(WORDS, 4)) for _ in range(8)]
    for name, ids in (("train", range(6)), ("valid", range(6, 8))):
        utts = [make_utt(root, f"s{i}_{i}", frames=10 + i, text=texts[i]) for i in ids]
        write_datadir(root / "data" / name, utts)
        dump_datadir(root / "data" / name, root / "dump" / name)
    tok = Tokenizer(train_sentencepiece(texts * 20, root / "bpe", vocab_size=30))
    (root / "tokens.txt").write_text("\n".join(tok.token_list) + "\n", encoding="utf-8")
    config = {
        "encoder": "avsr_avhubert",
        "encoder_conf": TINY,
        "decoder": "transformer",
        "decoder_conf": {"attention_heads": 2, "linear_units": 32, "num_blocks": 1},
        "model_conf": {"ctc_weight": 0.3, "lsm_weight": 0.1},
        "normalize": None,
        "optim": "adamw",
        "optim_conf": {"lr": 1e-3},
        "max_epoch": 1,
        "batch_type": "unsorted",
        "batch_size": 3,
        "num_workers": 0,
        "num_att_plot": 0,
        "seed": 0,
    }
    (root / "train.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    common = [
        "--use_preprocessor",
        "true",
        "--token_type",
        "bpe",
        "--bpemodel",
        root / "bpe.model",
        "--token_list",
        root / "tokens.txt",
        "--config",
        root / "train.yaml",
        "--input_size",
        D,
    ]
    for part in ("train", "valid"):
        common += [
            f"--{part}_data_path_and_name_and_type",
            f"{root}/dump/{part}/feats.scp,speech,npy",
            f"--{part}_data_path_and_name_and_type",
            f"{root}/dump/{part}/text,text,text",
        ]
    run_tool(
        "avsr.espnet.asr_train",
        "--collect_stats",
        "true",
        *common,
        "--train_shape_file",
        root / "dump/train/feats.scp",
        "--valid_shape_file",
        root / "dump/valid/feats.scp",
        "--output_dir",
        root / "stats",
        cwd=root,
    )
    run_tool(
        "avsr.espnet.asr_train",
        *common,
        "--train_shape_file",
        root / "stats/train/speech_shape",
        "--valid_shape_file",
        root / "stats/valid/speech_shape",
        "--output_dir",
        root / "exp",
        cwd=root,
    )
    return root


def test_collect_stats_and_one_epoch_of_asr_train_with_the_encoder(trained):
    shapes = read_kaldi_map(trained / "stats" / "train" / "speech_shape")
    assert shapes["s2_2"] == f"12,{D}"
    config = yaml.safe_load((trained / "exp" / "config.yaml").read_text())
    assert config["encoder"] == "avsr_avhubert" and config["encoder_conf"]["encoder_embed_dim"] == 16
    state = torch.load(trained / "exp" / "1epoch.pth", map_location="cpu")
    assert "encoder.avhubert.feature_extractor_video.resnet.trunk.layer1.0.conv1.weight" in state
    assert (trained / "exp" / "valid.acc.best.pth").is_file()


def test_speech2text_and_asr_inference_decode_with_each_modality(trained):
    register()
    from espnet2.bin.asr_inference import Speech2Text

    s2t = Speech2Text(
        asr_train_config=trained / "exp" / "config.yaml",
        asr_model_file=trained / "exp" / "valid.acc.best.pth",
        beam_size=3,
        ctc_weight=0.3,
    )
    x = torch.from_numpy(np.load(read_kaldi_map(trained / "dump/valid/feats.scp")["s6_6"]).astype(np.float32))
    encoder = s2t.asr_model.encoder
    outputs = {}
    for modality in ("audiovisual", "audio", "video"):
        encoder.modality = modality
        text, tokens, ids, _ = s2t(x)[0]
        assert isinstance(text, str) and all(0 < i < len(s2t.asr_model.token_list) - 1 for i in ids)
        outputs[modality] = encoder(x[None], torch.tensor([x.shape[0]]))[0]
    assert not torch.allclose(outputs["audio"], outputs["video"])
    out = trained / "decode_audio"
    run_tool(
        "avsr.espnet.asr_inference",
        "--modality",
        "audio",
        "--asr_train_config",
        trained / "exp/config.yaml",
        "--asr_model_file",
        trained / "exp/valid.acc.best.pth",
        "--data_path_and_name_and_type",
        f"{trained}/dump/valid/feats.scp,speech,npy",
        "--key_file",
        trained / "dump/valid/feats.scp",
        "--output_dir",
        out,
        "--beam_size",
        3,
        "--batch_size",
        1,
        cwd=trained,
    )
    assert sorted(read_kaldi_map(out / "1best_recog" / "text", allow_empty_value=True)) == ["s6_6", "s7_7"]
    assert yaml.safe_load((out / "asr_config_audio.yaml").read_text())["encoder_conf"]["modality"] == "audio"


def test_reload_pretrained_parameters_in_espnet_model_building_gives_the_avsr_encoder_output(tmp_path):
    register()
    from espnet2.tasks.asr import ASRTask

    config = {
        "vocab_size": 10,
        "encoder_conf": TINY,
        "decoder_conf": dict(
            decoder_layers=1, decoder_embed_dim=16, decoder_ffn_embed_dim=32, decoder_attention_heads=2
        ),
    }
    torch.manual_seed(3)
    ckpt = tmp_path / "avsr.pt"
    save_atomic({"model": AVSRModel.from_config(config).state_dict(), "model_config": config}, ckpt)
    tokens = tmp_path / "tokens.txt"
    tokens.write_text("\n".join(["<blank>", "<unk>", *"ABCDEFGH", "<sos/eos>"]) + "\n")
    args = ASRTask.get_parser().parse_args(
        [
            "--token_list",
            str(tokens),
            "--input_size",
            str(D),
            "--encoder",
            "avsr_avhubert",
            "--encoder_conf",
            f"pretrained={ckpt}",
            "--decoder",
            "transformer",
            "--init",
            "xavier_uniform",
            "--output_dir",
            str(tmp_path / "exp"),
        ]
    )
    model = ASRTask.build_model(args).eval()  # ESPnet's initialize, then reload_pretrained_parameters
    g = torch.Generator().manual_seed(0)
    lens = torch.tensor([11, 8])
    xs = torch.cat(
        [torch.randn(2, 11, 104, generator=g), torch.randint(0, 256, (2, 11, 96 * 96), generator=g)], -1
    )
    ref = AVHubertEncoder.from_pretrained(ckpt).eval()
    with torch.no_grad():
        got = model.encode(xs, lens)[0]
        a, v = unpack_frames(xs)
        want = ref({"audio": a, "video": crop_and_normalize(v, train=False)}, lens)[0]
    for i, n in enumerate(lens.tolist()):
        assert (got[i, :n] - want[i, :n]).abs().max() <= 1e-5


@pytest.mark.parametrize("scoring", ["partial", "full"])
@pytest.mark.parametrize("pre_beam", ["espnet", "espnet_nonbatch", "avsr"])
def test_espnet_pre_beam_gives_the_hypotheses_of_espnets_beam_search(scoring, pre_beam):
    """espnet: BatchBeamSearch; espnet_nonbatch: BeamSearch; avsr: BatchBeamSearch with use_avsr_pre_beam."""
    from avsr.espnet.scorers import espnet_beam_search, peaky_utterances, use_avsr_pre_beam

    v, d, b, t = 40, 32, 12, 24
    torch.manual_seed(0)
    dec = TransformerDecoder(
        v, d, dict(decoder_layers=2, decoder_embed_dim=d, decoder_ffn_embed_dim=64, decoder_attention_heads=4)
    ).eval()
    mem, lens, ctc_lo = peaky_utterances(b, t, d, v)
    logp = torch.log_softmax(ctc_lo(mem).float(), -1)
    batch = pre_beam != "espnet_nonbatch"
    cfg = DecodeConfig(beam_size=5, ctc_weight=0.5, penalty=0.2, ctc_scoring=scoring, pre_beam=pre_beam)
    ours = batch_beam_search(mem, lens, cfg, decoder=dec, ctc_logp=logp, sos=v - 1, eos=v - 1)
    search = espnet_beam_search(
        dec,
        ctc_lo,
        v,
        v - 1,
        v - 1,
        beam_size=5,
        ctc_weight=0.5,
        penalty=0.2,
        full_ctc=scoring == "full",
        batch=batch,
    )
    if pre_beam == "avsr" and scoring == "partial":
        use_avsr_pre_beam(search, eos=v - 1)
    ended = 0
    for i in range(b):
        with torch.no_grad():
            best = search(x=mem[i, : lens[i]], maxlenratio=0.0, minlenratio=0.0)[0]
        tokens = best.yseq[1:].tolist()
        while tokens and tokens[-1] == v - 1:  # [..., eos, eos] where ESPnet adds eos at the maximum length
            tokens.pop()
        assert ours[i][0].tokens == tokens
        if (
            len(tokens) < int(lens[i]) - 1
        ):  # ended on its own (at the maximum length ESPnet adds eos unscored)
            assert ours[i][0].score == pytest.approx(float(best.score), abs=1e-3)
            ended += 1
    assert ended >= 2 * b // 3, ended
