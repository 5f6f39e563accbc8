"""Precision and speed options: bf16 autocast, torch.compile, channels-last video, activation checkpointing.

Tolerances. bfloat16 keeps 8 significant bits, so every rounding has a relative error up to 2**-9 (0.2%);
through the front-ends, a transformer layer and a decoder layer the errors add up to about 1% of a tensor's
norm (the BASE encoder: output 1.1%, gradients of the transformer and audio parameters 1%; measured by
``benchmarks/bench_encoder.py``). The tests allow 3% for outputs and the loss, and 10% for gradients. The
gradients of the video ResNet are the exception: on random video they are ill-conditioned (rounding only the
input video to bfloat16 in an otherwise float32 run moves them by ~10% in the BASE model, and by 20-30% in
the tiny model here), so they are compared with a yardstick rather than a fixed bound: a float32 run in which
every convolution's input, weight and output and every gradient flowing through them is rounded to bfloat16
(:func:`bf16_rounding_model`), which is what any bfloat16 kernel must at least do. Native kernels (AVX-512
BF16 / AMX) come within 1.33x of it; emulated ones (AVX2, where oneDNN converts blocks to float32 and back,
and accumulates in another order) within 1.75x, both measured over 3 seeds with the machine's 2 threads.
Compiled float32 code changes only the order of float operations: 1e-4 relative.
"""

import copy
import dataclasses

import pytest
import torch

from avsr.config import ConfigError
from avsr.encoder import AVHubertEncoder, EncoderRuntime
from avsr.memory import keep_freed_memory
from avsr.models.asr import AVSRModel
from avsr.nn.precision import (
    PRECISIONS,
    autocast_context,
    check_precision,
    fp32_context,
    native_bf16,
    resolve_precision,
)
from avsr.nn.resnet import PReLU, batch_norm_act
from avsr.train.config import TrainConfig, load_experiment_config
from avsr.train.trainer import compile_model
from tests.decoding import decode_nbest

ENC = dict(encoder_layers=1, encoder_embed_dim=16, encoder_ffn_embed_dim=32, encoder_attention_heads=2,
           conv_pos=4, conv_pos_groups=2, resnet_widths=[4, 4, 8, 8], dropout=0.0, dropout_input=0.0,
           attention_dropout=0.0, activation_dropout=0.0, encoder_layerdrop=0.0, modality_dropout=0.0)
DEC = dict(decoder_layers=1, decoder_embed_dim=16, decoder_ffn_embed_dim=32, decoder_attention_heads=2,
           dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
HW = 24


def batch(t: int = 12, seed: int = 0, video: bool = True) -> tuple:
    g = torch.Generator().manual_seed(seed)
    audio = torch.randn(3, 104, t, generator=g)
    frames = torch.randn(3, 1, t, HW, HW, generator=g) if video else None
    lengths = torch.tensor([t, t - 3, t - 5])
    ys = torch.tensor([[1, 2, 3, 4], [5, 6, 7, -1], [2, 8, -1, -1]])
    return audio, frames, lengths, ys, torch.tensor([4, 3, 2])


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float32."""
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).norm() / b.norm())


def loss_and_grads(model: torch.nn.Module, inputs: tuple, precision: str = "fp32",
                   device: str = "cpu") -> tuple:
    """One training step of ``model`` on ``device``: loss, stats and gradients (float32, on the CPU)."""
    model = model.to(device).train()
    model.zero_grad(set_to_none=True)
    with autocast_context(device, precision):
        loss, stats = model(*(x.to(device) if x is not None else None for x in inputs))
    loss.backward()
    # copies: moving the model to another device later moves its .grad tensors in place
    grads = {n: p.grad.to("cpu", torch.float32, copy=True) for n, p in model.named_parameters()
             if p.grad is not None}
    model.cpu()
    return loss.detach().cpu(), {k: v.cpu() if torch.is_tensor(v) else v for k, v in stats.items()}, grads


def grad_rel(grads: dict, ref: dict, video: bool) -> float:
    """Relative difference of the video front-end's gradients (video=True) or of all the others."""
    keys = [k for k in ref if k.startswith("encoder.feature_extractor_video") == video]
    return rel(torch.cat([grads[k].flatten() for k in keys]), torch.cat([ref[k].flatten() for k in keys]))


def test_precision_names_and_contexts():
    assert PRECISIONS == ("auto", "fp32", "bf16") and check_precision("bf16") == "bf16"
    with pytest.raises(ValueError, match=r"precision must be one of \['auto', 'fp32', 'bf16'\], got 'fp16'"):
        check_precision("fp16")
    with pytest.raises(ValueError, match="fp16"):
        autocast_context("cpu", "fp16")
    x, w = torch.randn(2, 4), torch.randn(3, 4)
    with autocast_context("cpu", "bf16"):
        assert torch.nn.functional.linear(x, w).dtype == torch.bfloat16
        with autocast_context("cpu", "fp32"):  # fp32 switches an enclosing autocast off
            assert torch.nn.functional.linear(x, w).dtype == torch.float32
        with fp32_context(torch.device("cpu")):
            assert torch.nn.functional.linear(x, w).dtype == torch.float32
    with autocast_context("cuda:0", "fp32"):  # only the device type matters; no GPU needed to build it
        assert torch.nn.functional.linear(x, w).dtype == torch.float32


@pytest.mark.parametrize("channels_last", [None, False])
def test_encoder_under_a_callers_autocast(channels_last):
    torch.manual_seed(0)
    # None: channels-last under bf16 autocast (the default)
    enc = AVHubertEncoder(runtime=EncoderRuntime(channels_last=channels_last), **ENC)
    audio, video, lengths, _, _ = batch()
    xs = {"audio": audio, "video": video}
    resnet = enc.feature_extractor_video.resnet
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert resnet.use_channels_last(video) == (channels_last is None)
    # float32: channels-last (fused BatchNorm) in CPU training, the original layout for inference
    assert resnet.use_channels_last(video) == (channels_last is None)
    with torch.no_grad():
        assert not resnet.use_channels_last(video)
    enc.eval()
    assert not resnet.use_channels_last(video)
    with torch.no_grad():
        ref, _, _ = enc(xs, lengths)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out, olens, _ = enc(xs, lengths)
    assert out.dtype == torch.bfloat16 and torch.equal(olens, lengths)
    valid = torch.arange(12)[None, :] < lengths[:, None]
    assert rel(out[valid], ref[valid]) < 3e-2
    enc.train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hidden, _, _ = enc(xs, lengths)
    hidden.float().sum().backward()
    grads = [p.grad for p in enc.parameters() if p.requires_grad]
    assert all(g is not None and g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads)


def test_channels_last_video_front_end_and_checkpointing_keep_the_values():
    torch.manual_seed(0)
    conf = {**ENC, "dropout": 0.1, "attention_dropout": 0.1}  # dropout: RNG replayed
    base = AVHubertEncoder(**conf)
    audio, video, lengths, _, _ = batch()
    xs = {"audio": audio, "video": video}
    results = []
    for channels_last, checkpoint in [(False, False), (True, False), (False, True)]:
        runtime = EncoderRuntime(channels_last=channels_last, checkpoint_activations=checkpoint)
        enc = AVHubertEncoder(runtime=runtime, **conf)  # the same weights, another way of computing
        enc.load_state_dict(base.state_dict())
        assert (enc.channels_last, enc.checkpoint_activations) == (channels_last, checkpoint)
        torch.manual_seed(1)
        hidden, _, _ = enc(xs, lengths)
        hidden.pow(2).sum().backward()
        results.append((hidden.detach(), [p.grad.clone() for p in enc.parameters()]))
    (ref, ref_grads), *others = results
    for out, grads in others:  # float32 in another summation order: 1e-5 of the norms
        assert rel(out, ref) < 1e-5
        flat = torch.cat([g.flatten() for g in grads])
        assert rel(flat, torch.cat([r.flatten() for r in ref_grads])) < 1e-5


def _bn_act_case(act_kind: str, residual: bool, dtype=torch.float32, momentum=0.1, seed=0):
    """(x, residual, norm, act, grad_out) for batch_norm_act: a channels-last (6, 8, 5, 7) batch whose
    channels have means far from 0 (the variance must not cancel), a BatchNorm2d with non-trivial
    affine parameters and running statistics."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(6, 8, 5, 7, generator=g) * 2 + torch.linspace(-3, 6, 8)[:, None, None]).to(dtype)
    res = torch.randn(6, 8, 5, 7, generator=g).to(dtype) if residual else None
    norm = torch.nn.BatchNorm2d(8, momentum=momentum)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5, generator=g)
        norm.bias.uniform_(-0.5, 0.5, generator=g)
        norm.running_mean.uniform_(-1, 1, generator=g)
        norm.running_var.uniform_(0.5, 2, generator=g)
    act = {"prelu": PReLU(8), "prelu1": PReLU(1), "relu": torch.nn.ReLU(), "none": None}[act_kind]
    if isinstance(act, PReLU):
        with torch.no_grad():
            act.weight.uniform_(-0.5, 1.5, generator=g)  # slopes of either sign and above 1
    return x, res, norm, act, torch.randn(6, 8, 5, 7, generator=g).to(dtype)


def _bn_act_run(x, res, norm, act, grad, channels_last: bool):
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = x.detach().clone(memory_format=fmt).requires_grad_()
    r = None if res is None else res.detach().clone(memory_format=fmt).requires_grad_()
    out = batch_norm_act(x, norm, act, r)
    out.backward(grad.contiguous(memory_format=fmt))
    params = [norm.weight, norm.bias] + ([act.weight] if isinstance(act, PReLU) else [])
    return (out, x.grad, None if r is None else r.grad, [p.grad for p in params],
            [norm.running_mean.clone(), norm.running_var.clone(), norm.num_batches_tracked.clone()])


@pytest.mark.parametrize("act_kind", ["prelu", "prelu1", "relu", "none"])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("momentum", [0.1, None])
def test_fused_batch_norm_act_matches_the_modules(act_kind, residual, momentum):
    # reference: the modules on the NCHW layout (PyTorch's BatchNorm2d, PReLU); fused: channels-last
    ref_case = _bn_act_case(act_kind, residual, momentum=momentum)
    new_case = tuple(copy.deepcopy(v) for v in ref_case)
    ref = _bn_act_run(*ref_case, channels_last=False)
    new = _bn_act_run(*new_case, channels_last=True)
    assert new[0].is_contiguous(memory_format=torch.channels_last)
    assert rel(new[0], ref[0]) < 1e-5 and rel(new[1], ref[1]) < 1e-5
    if residual:
        assert rel(new[2], ref[2]) < 1e-5
    for p_new, p_ref in zip(new[3], ref[3]):  # BatchNorm weight, bias, PReLU slopes
        assert p_new.shape == p_ref.shape and rel(p_new, p_ref) < 1e-5
    for s_new, s_ref in zip(new[4], ref[4]):  # running mean, unbiased running variance, batch count
        assert rel(s_new.float(), s_ref.float()) < 1e-6


def test_fused_batch_norm_act_in_bf16_and_where_it_does_not_apply():
    x, res, norm, act, grad = _bn_act_case("prelu", True)
    ref = _bn_act_run(x, res, copy.deepcopy(norm), copy.deepcopy(act), grad, channels_last=False)
    # bfloat16 input (as under autocast): bfloat16 output, float32 parameter gradients, within bf16 rounding
    new = _bn_act_run(x.bfloat16(), res.bfloat16(), copy.deepcopy(norm), copy.deepcopy(act), grad.bfloat16(),
                      channels_last=True)
    assert new[0].dtype == torch.bfloat16 and all(p.dtype == torch.float32 for p in new[3])
    assert rel(new[0], ref[0]) < 3e-2 and rel(new[1], ref[1]) < 5e-2
    assert all(rel(p_new, p_ref) < 5e-2 for p_new, p_ref in zip(new[3], ref[3]))
    # running statistics (inference), NCHW input or an unknown activation: exactly the modules
    norm.eval()
    for layout in (torch.channels_last, torch.contiguous_format):
        xin = x.contiguous(memory_format=layout)
        assert torch.equal(batch_norm_act(xin, norm, act, res), act(norm(xin) + res))
    norm.train()
    xin = x.contiguous(memory_format=torch.channels_last)
    gelu, ref_norm = torch.nn.GELU(), copy.deepcopy(norm)
    assert torch.equal(batch_norm_act(xin, norm, gelu), gelu(ref_norm(xin)))
    assert torch.equal(norm.running_var, ref_norm.running_var)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        batch_norm_act(torch.randn(1, 8, 1, 1).contiguous(memory_format=torch.channels_last), norm, act)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_downsample_conv_of_channels_last_input_never_runs_the_strided_1x1_kernel(monkeypatch, precision):
    # PyTorch 2.14's CPU kernel for a strided 1x1 convolution on channels-last input corrupts the heap with
    # 2 threads (float32 and bfloat16; it aborts the process, so it is not run here): the block must read
    # the picked pixels with a stride-1 convolution instead, under a bf16 autocast too, with the same values
    import torch.nn.functional as F

    from avsr.nn import resnet

    block = resnet.BasicBlock(8, 16, stride=2).train()
    x = torch.randn(6, 8, 22, 22).contiguous(memory_format=torch.channels_last)
    with autocast_context("cpu", precision):
        want = block.downsample[0](x.contiguous())  # NCHW: the module's own strided kernel, which is safe
    strides, conv2d = [], F.conv2d

    def recording_conv2d(inp, weight, bias=None, stride=1, *args):
        channels_last = inp.is_contiguous(memory_format=torch.channels_last)
        strides.append((tuple(weight.shape[-2:]), stride, channels_last))
        return conv2d(inp, weight, bias, stride, *args)

    monkeypatch.setattr(resnet.F, "conv2d", recording_conv2d)
    with autocast_context("cpu", precision):
        got = block._downsample_conv(x)
        block(x).sum().backward()
    assert strides[0] == ((1, 1), 1, True)
    assert all(stride in (1, (1, 1)) for kernel, stride, _ in strides if kernel == (1, 1))
    assert got.dtype == want.dtype == (torch.bfloat16 if precision == "bf16" else torch.float32)
    tolerance = 1e-6 if precision == "fp32" else 1e-2
    assert got.shape == (6, 16, 11, 11) and rel(got.float(), want.float()) < tolerance


def test_keep_freed_memory_sets_glibc_malloc_options():
    # whether the page faults go away depends on the process's address space; the benchmark measures that
    import platform

    expected = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    assert keep_freed_memory() is expected
    assert keep_freed_memory() is expected  # idempotent


class _RoundBF16(torch.autograd.Function):
    """Identity that rounds its input to bfloat16 values (kept float32), and so its gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.bfloat16().float()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad.bfloat16().float()


def bf16_rounding_model(model: AVSRModel) -> AVSRModel:
    """A copy of ``model`` whose video ResNet computes in float32 but rounds, as any bfloat16 kernel must, the
    weights, each convolution's and linear layer's input and output, and the gradients through them."""
    runtime = dataclasses.replace(model.encoder.runtime, channels_last=False)
    with torch.random.fork_rng(devices=[]):  # built without drawing from the caller's generator
        rounding = AVSRModel(model.config, runtime=runtime)
    rounding.load_state_dict(model.state_dict())
    model = rounding
    resnet = model.encoder.feature_extractor_video.resnet
    with torch.no_grad():
        for p in resnet.parameters():
            p.copy_(p.bfloat16().float())
    for mod in resnet.modules():
        if isinstance(mod, (torch.nn.Conv2d, torch.nn.Conv3d, torch.nn.Linear)):
            mod.register_forward_pre_hook(lambda m, args: tuple(_RoundBF16.apply(a) for a in args))
            mod.register_forward_hook(lambda m, args, out: _RoundBF16.apply(out))
    return model


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_bf16_training_step_is_close_to_fp32(device, request):
    """bf16 autocast against float32 on the same device (CUDA: float32 without TF32)."""
    if device == "cuda":
        request.getfixturevalue("exact_cuda_float32")
    torch.manual_seed(0)
    model = AVSRModel({"vocab_size": 10, "encoder_conf": ENC, "decoder_conf": DEC})
    inputs = batch()
    ref_loss, _, ref = loss_and_grads(model, inputs, device=device)
    loss, stats, grads = loss_and_grads(model, inputs, "bf16", device)
    assert loss.dtype == torch.float32 and torch.isfinite(loss) and set(grads) == set(ref)
    assert all(v.dtype == torch.float32 for v in stats.values())  # CTC and the losses in float32
    assert abs(float(loss) - float(ref_loss)) < 3e-2 * abs(float(ref_loss))
    assert grad_rel(grads, ref, video=False) < 0.1
    # the video ResNet's gradients: near what bfloat16 rounding at every layer does to them in float32 (the
    # module docstring); emulated bfloat16 kernels differ more from float32 than native ones
    _, _, rounded = loss_and_grads(bf16_rounding_model(model), inputs, device=device)
    yardstick = grad_rel(rounded, ref, video=True)
    audio, video, *rest = inputs
    _, _, input_only = loss_and_grads(model, (audio, video.bfloat16().float(), *rest), device=device)
    assert yardstick > grad_rel(input_only, ref, video=True)  # it rounds more than the input alone
    factor = 1.6 if native_bf16(device)[0] else 2.0
    assert grad_rel(grads, ref, video=True) < factor * max(yardstick, 1e-2)


@pytest.mark.cuda
def test_float32_training_step_on_cuda_matches_the_cpu(exact_cuda_float32):
    """The same model and batch on CUDA and on the CPU, float32 without TF32: the loss and every gradient
    agree to float32 rounding (different kernels sum in different orders)."""
    torch.manual_seed(0)
    model = AVSRModel({"vocab_size": 10, "encoder_conf": ENC, "decoder_conf": DEC})
    inputs = batch()
    cpu_loss, _, cpu_grads = loss_and_grads(model, inputs)
    loss, _, grads = loss_and_grads(model, inputs, device="cuda")
    assert set(grads) == set(cpu_grads) and float(loss) == pytest.approx(float(cpu_loss), rel=1e-5)
    # per parameter, with a floor for gradients that are zero but for rounding (the key projection's bias:
    # softmax ignores a constant added to every key's score)
    off = {k: float((grads[k] - cpu_grads[k]).norm() - 1e-3 * cpu_grads[k].norm()) for k in grads}
    assert max(off.values()) < 1e-6, max(off, key=off.get)
    assert grad_rel(grads, cpu_grads, video=True) < 1e-4 and grad_rel(grads, cpu_grads, video=False) < 1e-4


@pytest.mark.cuda
def test_auto_precision_on_cuda_follows_the_gpu():
    """auto on a CUDA device: bf16 where the GPU computes it natively (Ampere and later), else fp32."""
    native, reason = native_bf16("cuda")
    assert native == torch.cuda.is_bf16_supported(including_emulation=False)
    assert torch.cuda.get_device_name() in reason
    assert resolve_precision("auto", "cuda") == ("bf16" if native else "fp32")
    assert TrainConfig().resolved_precision(torch.device("cuda")) == ("bf16" if native else "fp32")
    with autocast_context("cuda", "auto"):
        out = torch.nn.functional.linear(torch.randn(2, 4, device="cuda"), torch.randn(3, 4, device="cuda"))
    assert out.dtype == (torch.bfloat16 if native else torch.float32)


def test_auto_precision_follows_the_cpu(monkeypatch, caplog):
    """auto: bf16 only where native_bf16 says so, logged once with the reason; explicit bf16 without native
    support is kept, with one warning; fp32 is fp32 everywhere."""
    import avsr.nn.precision as prec

    for native, expected in ((True, "bf16"), (False, "fp32")):
        monkeypatch.setattr(prec, "native_bf16", lambda device, n=native: (n, f"test CPU native={n}"))
        monkeypatch.setattr(prec, "_logged", set())
        caplog.clear()
        with caplog.at_level("INFO", logger="avsr.nn.precision"):
            assert resolve_precision("auto", "cpu", "video_precision") == expected
            assert resolve_precision("auto", "cpu", "video_precision") == expected
            assert resolve_precision("fp32", "cpu") == "fp32"
            assert resolve_precision("bf16", "cpu") == "bf16"
            assert resolve_precision("bf16", "cpu") == "bf16"
        lines = [r.getMessage() for r in caplog.records]
        assert lines[0] == f"video_precision auto -> {expected} on cpu: test CPU native={native}"
        warnings = [r for r in caplog.records if r.levelname == "WARNING"]
        assert len(warnings) == (0 if native else 1) and len(lines) == 1 + len(warnings)
        if not native:
            assert "without native bfloat16" in warnings[0].getMessage()
        config = TrainConfig()  # both default to auto
        assert config.precision == config.video_precision == "auto"
        assert config.resolved_precision(torch.device("cpu")) == expected
        assert config.resolved_video_precision(torch.device("cpu")) == expected
        assert TrainConfig(video_precision=None).resolved_video_precision(torch.device("cpu")) is None
        with autocast_context("cpu", "auto"):
            dtype = torch.nn.functional.linear(torch.randn(2, 4), torch.randn(3, 4)).dtype
        assert dtype == (torch.bfloat16 if native else torch.float32)
    with pytest.raises(ValueError, match="before it is resolved"):
        prec.autocast_dtype("auto")


_NATIVE = "from avsr.nn.precision import native_bf16, resolve_precision; print(*native_bf16('cpu'), sep='|')"


def test_native_bf16_reads_the_cpu_and_torchs_kernel_capability():
    """The CPU's flags decide, unless torch runs kernels below AVX-512 (ATEN_CPU_CAPABILITY=avx2, as an
    AVX2-only CPU does): then bf16 is emulated and not native. No CUDA device here: not native."""
    import os
    import subprocess
    import sys

    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    has_bf16 = any(f in flags.split() for f in ("avx512_bf16", "amx_bf16"))
    native, reason = native_bf16("cpu")
    assert native == (has_bf16 and torch.backends.cpu.get_cpu_capability() == "AVX512"), reason
    env = dict(os.environ, ATEN_CPU_CAPABILITY="avx2")
    out = subprocess.run([sys.executable, "-c", _NATIVE], env=env, capture_output=True, text=True, check=True)
    native2, reason2 = out.stdout.strip().split("|")
    assert native2 == "False" and "AVX2" in reason2
    if not torch.cuda.is_available():
        assert native_bf16("cuda") == (False, "CUDA is not available")


def test_compiled_training_step_matches_eager_and_reuses_code_for_other_lengths():
    # aot_eager: the graphs torch.compile captures and differentiates, without inductor's C++ codegen (minutes
    # on 2 shared CPU cores); the dynamic-shape and recompilation logic is the same.
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = AVSRModel({"vocab_size": 10, "encoder_conf": ENC, "decoder_conf": DEC})
    compiled = compile_model(copy.deepcopy(model), backend="aot_eager")
    graphs = []
    for t in (10, 12, 15, 11):
        inputs = batch(t, seed=t, video=False)
        ref_loss, _, ref = loss_and_grads(model, inputs)
        loss, _, grads = loss_and_grads(compiled, inputs)
        assert torch.isfinite(loss)
        torch.testing.assert_close(loss, ref_loss, rtol=1e-4, atol=1e-6)
        for name, g in ref.items():
            torch.testing.assert_close(grads[name], g, rtol=1e-4, atol=1e-6, msg=name)
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[-1] == graphs[-2] == graphs[1]  # after one recompile with dynamic lengths: no more
    # a compiled bf16 step: same closeness to fp32 as eager bf16
    loss, _, grads = loss_and_grads(compiled, batch(12, seed=12, video=False), "bf16")
    ref_loss, _, ref = loss_and_grads(model, batch(12, seed=12, video=False))
    assert abs(float(loss) - float(ref_loss)) < 3e-2 * abs(float(ref_loss))
    assert grad_rel(grads, ref, video=False) < 0.1
    # parameter names are unchanged (checkpoints load either way)
    assert list(compiled.state_dict()) == list(model.state_dict())


def test_video_precision_runs_the_resnet_alone_in_bf16():
    """video_precision bf16 in float32 training: the ResNet computes in bfloat16, the rest (projection,
    transformer) in float32; output and gradients float32 and close to float32 throughout; fp32 switches a
    caller's bf16 autocast off for the ResNet alone."""
    torch.manual_seed(0)
    ref_enc = AVHubertEncoder(**ENC)
    assert ref_enc.video_precision is None

    def built_with(precision: str) -> AVHubertEncoder:  # the weights of ref_enc, the ResNet in precision
        enc = AVHubertEncoder(runtime=EncoderRuntime(video_precision=precision), **ENC)
        enc.load_state_dict(ref_enc.state_dict())
        for m in (enc.feature_extractor_video.resnet.trunk, enc.feature_extractor_video.proj):
            m.register_forward_hook(lambda m, i, o: seen.append((type(m).__name__, o.dtype)))
        return enc

    audio, video, lengths, _, _ = batch()
    xs = {"audio": audio, "video": video}
    seen = []
    enc = built_with("bf16")
    assert enc.video_precision == "bf16"
    torch.manual_seed(1)  # the same dropout draws in both runs
    out, _, _ = enc(xs, lengths)
    assert seen == [("ResNetTrunk", torch.bfloat16), ("Linear", torch.float32)] and out.dtype == torch.float32
    torch.manual_seed(1)
    ref, _, _ = ref_enc(xs, lengths)
    valid = torch.arange(12)[None, :] < lengths[:, None]
    assert rel(out[valid], ref[valid]) < 3e-2
    out[valid].square().mean().backward()
    ref[valid].square().mean().backward()
    grads = {k: p.grad for k, p in enc.named_parameters() if p.grad is not None}
    ref_grads = {k: p.grad for k, p in ref_enc.named_parameters() if p.grad is not None}
    assert grads.keys() == ref_grads.keys() and all(g.dtype == torch.float32 for g in grads.values())
    rest = [k for k in ref_grads if not k.startswith("feature_extractor_video")]  # float32 math, bf16 input
    flat = [torch.cat([g[k].flatten() for k in rest]) for g in (grads, ref_grads)]
    assert rel(*flat) < 5e-2
    seen.clear()
    enc = built_with("fp32")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        enc(xs, lengths)
    assert seen == [("ResNetTrunk", torch.float32), ("Linear", torch.bfloat16)]
    with pytest.raises(ValueError, match=r"video_precision must be one of \['auto', 'fp32', 'bf16'\], got "
                                         r"'fp16'"):
        EncoderRuntime(video_precision="fp16")


def test_run_time_switches_are_given_at_construction_and_read_only(tmp_path):
    """EncoderRuntime reaches the parts when the encoder is built (from_yaml and from_checkpoint too);
    afterwards the switches read back but cannot be assigned, on the encoder nor on its ResNet."""
    runtime = EncoderRuntime(checkpoint_activations=True, video_precision="bf16", channels_last=False,
                             modality_dropout_by_loader=True)
    enc = AVHubertEncoder(runtime=runtime, **ENC)
    resnet = enc.feature_extractor_video.resnet
    assert enc.runtime is runtime and enc.encoder.checkpoint_activations
    switches = (enc.checkpoint_activations, enc.video_precision, enc.channels_last,
                enc.modality_dropout_by_loader)
    assert switches == (True, "bf16", False, True)
    assert (resnet.precision, resnet.channels_last, resnet.precision_in_eval) == ("bf16", False, True)
    for name, value in (("checkpoint_activations", False), ("video_precision", None), ("channels_last", True),
                        ("modality_dropout_by_loader", False), ("runtime", EncoderRuntime())):
        with pytest.raises(AttributeError):
            setattr(enc, name, value)
    for name, value in (("precision", None), ("channels_last", True), ("precision_in_eval", False)):
        with pytest.raises(AttributeError):
            setattr(resnet, name, value)
    assert enc.runtime == runtime and enc.checkpoint_activations and resnet.precision == "bf16"
    assert AVHubertEncoder(**ENC).runtime == EncoderRuntime()  # the defaults
    with pytest.raises(ValueError, match="video_precision must be one of"):
        EncoderRuntime(video_precision="fp16")
    with pytest.raises(TypeError, match="checkpoint_activations must be a bool"):
        EncoderRuntime(checkpoint_activations=1)
    with pytest.raises(TypeError, match="runtime must be an EncoderRuntime"):
        AVHubertEncoder(runtime={"checkpoint_activations": True}, **ENC)
    with pytest.raises(ConfigError, match="runtime= is for the encoder built from encoder_conf"):
        AVSRModel({"vocab_size": 10}, encoder=enc, runtime=runtime)
    # the ways of building an encoder take the runtime too
    (tmp_path / "m.yaml").write_text("encoder_conf: {encoder_layers: 1, encoder_embed_dim: 16, "
                                     "encoder_ffn_embed_dim: 32, encoder_attention_heads: 2, conv_pos: 4, "
                                     "conv_pos_groups: 2, resnet_widths: [4, 4, 8, 8]}\n")
    assert AVHubertEncoder.from_yaml(tmp_path / "m.yaml", runtime=runtime).runtime is runtime
    config = {"vocab_size": 10, "encoder_conf": ENC, "decoder_conf": DEC}
    model = AVSRModel.from_config(config, runtime=runtime)
    assert model.encoder.runtime is runtime
    torch.save({"model": model.state_dict(), "model_config": model.config.to_dict()}, tmp_path / "m.pt")
    loaded = AVHubertEncoder.from_pretrained(tmp_path / "m.pt", runtime=runtime)
    assert loaded.runtime is runtime and not loaded.training
    assert AVHubertEncoder.from_pretrained(tmp_path / "m.pt").runtime == EncoderRuntime()


def test_video_precision_auto_and_in_training_only():
    """auto: resolved for the input's device at the forward pass; video_precision_in_eval False: the
    precision in training mode only, the caller's in eval mode."""
    expected = torch.bfloat16 if resolve_precision("auto", "cpu") == "bf16" else torch.float32
    seen = []
    runtime = EncoderRuntime(video_precision="auto", video_precision_in_eval=False)
    enc = AVHubertEncoder(runtime=runtime, **ENC)
    enc.feature_extractor_video.resnet.trunk.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    audio, video, lengths, _, _ = batch()
    out, _, _ = enc.train()({"audio": audio, "video": video}, lengths)
    assert seen == [expected] and out.dtype == torch.float32
    with torch.no_grad():
        enc.eval()({"audio": audio, "video": video}, lengths)
        assert seen[1] == torch.float32  # eval: the caller's precision
        with torch.autocast("cpu", dtype=torch.bfloat16):
            enc({"audio": audio, "video": video}, lengths)
        assert seen[2] == torch.bfloat16


def test_decoding_under_bf16_autocast_keeps_scores_float32():
    torch.manual_seed(0)
    model = AVSRModel({"vocab_size": 10, "encoder_conf": ENC, "decoder_conf": DEC}).eval()
    audio, video, lengths, _, _ = batch()
    enc, enc_lens = model.encode(audio, video, lengths)
    with autocast_context("cpu", "bf16"):
        enc16, _ = model.encode(audio, video, lengths)
        logp = model.ctc_log_probs(enc16)
        hyps = decode_nbest(model, audio, video, lengths, beam_size=3, maxlenratio=-3.0)
    assert enc16.dtype == torch.float32 and rel(enc16, enc) < 3e-2  # encode() hands back float32
    assert logp.dtype == torch.float32 and torch.allclose(logp.exp().sum(-1), torch.ones(()), atol=1e-5)
    assert len(hyps) == 3 and all(h and isinstance(h[0].score, float) for h in hyps)


@pytest.mark.parametrize("key,value,match", [
    ("precision", "fp16", r"precision: expected one of \['auto', 'fp32', 'bf16'\]"),
    ("compile", "sometimes", "compile: expected true or false"),
    ("checkpoint_activations", 1, "checkpoint_activations: expected true or false"),
    ("video_precision", "fp16", r"video_precision: expected one of \['auto', 'fp32', 'bf16'\]"),
    ("flush_denormal", "yes please", "flush_denormal: expected true or false"),
])
def test_train_config_speed_options_are_checked(tmp_path, key, value, match):
    path = tmp_path / "train.yaml"
    path.write_text(f"max_epoch: 1\n{key}: {value}\n")
    with pytest.raises(ConfigError, match=match) as err:
        load_experiment_config(path)
    assert str(path) in str(err.value)
    assert TrainConfig(precision="bf16").resolved_precision(torch.device("cpu")) == "bf16"
    # null: the use_amp rule, bf16 on CUDA only
    assert TrainConfig(precision=None).resolved_precision(torch.device("cpu")) == "fp32"
    assert TrainConfig(precision=None, use_amp=True).resolved_precision(torch.device("cuda")) == "bf16"


_SUBNORMALS_IN_EVERY_THREAD = """
import sys, torch
from avsr.nn.precision import flush_denormal
early = sys.argv[1] == "early"
torch.set_num_threads(2)
if early:
    flush_denormal(True)
x = torch.full((1 << 22,), 1e-39)  # subnormal in float32
y = x * 1.0  # large enough to be split over both intra-op threads
if not early:
    flush_denormal(True)
    y = x * 1.0
print(int((y == 0).sum()), y.numel())
"""


@pytest.mark.parametrize("when", ["early", "late"])
def test_flush_denormal_reaches_the_intra_op_threads_when_set_first(when):
    """flush_denormal before the first parallel op: every chunk of a 2-thread op flushes the subnormal
    input to zero; set after the thread pool exists, only the calling thread's chunk does."""
    import subprocess
    import sys

    if not torch.set_flush_denormal(False):
        pytest.skip("this CPU has no flush-to-zero (FTZ/DAZ)")
    out = subprocess.run([sys.executable, "-c", _SUBNORMALS_IN_EVERY_THREAD, when], capture_output=True,
                         text=True, check=True).stdout.split()
    zeros, total = int(out[-2]), int(out[-1])
    if when == "early":
        assert zeros == total
    elif torch.get_num_threads() > 1 or zeros != total:  # a 1-core machine runs every chunk on one thread
        assert 0 < zeros < total
    assert float(torch.tensor([1e-39]) * 1.0) != 0.0  # this process: IEEE subnormals (conftest)
