"""Video front-end of AV-HuBERT: a 3-D convolutional stem, a 2-D ResNet-18 trunk and a linear projection.

Follows ``avhubert/resnet.py`` (``ResEncoder``, ``ResNet``, ``BasicBlock``) and ``SubModel`` in
``avhubert/hubert.py`` of facebookresearch/av_hubert (Shi et al., 2022, Sec. 3 and Appendix A), itself the
lip-reading front-end of Ma et al. (2021) and Stafylakis & Tzimiropoulos (2017). Module attribute names are
those of the original, so a state dict maps 1:1, e.g. ``resnet.frontend3D.0.weight``,
``resnet.trunk.layer2.0.downsample.0.weight``, ``resnet.trunk.layer1.0.relu1.weight`` (PReLU).

The channel widths are configurable (``widths``, default ResNet-18's 64-128-256-512) so that a small CPU
configuration exists; with the defaults the parameter names and shapes are those of the original.

Speed (same values as the original's layers): under a bfloat16 autocast (or built with
``channels_last=True``) the activations are kept channels-last (NDHWC / NHWC), the layout in which oneDNN's
bfloat16 convolutions and the CPU pooling kernels run fastest (see :class:`ResEncoder`); the stem's max
pooling, whose kernel is 1 frame long, is computed as a 2-D max pool (same maxima) so that the
channels-last frames can be pooled once folded into the batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.utils import _triple

from avsr.nn.precision import autocast_context, check_precision, resolve_precision

__all__ = ["BasicBlock", "ResNetTrunk", "ResEncoder", "VideoFrontEnd", "RESNET_RELU_TYPES", "PReLU",
           "batch_norm_act"]

RESNET_RELU_TYPES = ("prelu", "relu")


class PReLU(nn.PReLU):
    """:class:`torch.nn.PReLU` (one slope per channel, parameter ``weight``) that is fast on channels-last
    input too.

    On a channels-last ``(N, C, H, W)`` or ``(N, C, T, H, W)`` tensor the channel is the innermost axis, and
    PyTorch's CPU kernel, which broadcasts the C slopes along it, runs element by element (in bfloat16 up
    to 15x slower than on the NCHW layout for C = 8). The same memory is then viewed as rows of ``W * C``
    values with the slopes repeated W times -- the same PReLU, now vectorised along a long contiguous row;
    the slopes' gradient is summed back over the repeats by autograd. Other layouts go to
    :func:`torch.nn.functional.prelu` unchanged. Same values; output in the input's layout.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(N, C, ...) -> (N, C, ...)``."""
        if self.num_parameters == 1 or x.dim() not in (4, 5) or x.is_contiguous():
            return F.prelu(x, self.weight)
        fmt = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
        if not x.is_contiguous(memory_format=fmt):
            return F.prelu(x, self.weight)
        c, w = x.shape[1], x.shape[-1]
        rows = x.movedim(1, -1).reshape(-1, w * c)  # a view: (N*[T*]H, W*C)
        y = F.prelu(rows, self.weight.repeat(w))
        return y.view(x.movedim(1, -1).shape).movedim(-1, 1)


def _activation(relu_type: str, channels: int) -> nn.Module:
    """PReLU with one slope per channel (:class:`PReLU`), or ReLU (``resnet_relu_type``)."""
    if relu_type == "prelu":
        return PReLU(num_parameters=channels)
    if relu_type == "relu":
        return nn.ReLU()
    raise ValueError(f"resnet_relu_type must be one of {RESNET_RELU_TYPES}, got {relu_type!r}")


def _per_channel(v: torch.Tensor, channels: int) -> torch.Tensor:
    """Column sums ``(W * C,)`` of a channels-last row view -> per-channel sums ``(C,)``."""
    return v.view(-1, channels).sum(0)


def _column_sums(rows: torch.Tensor) -> torch.Tensor:
    """``(R, W * C)`` -> float32 column sums ``(W * C,)``. A bfloat16 input is converted first: PyTorch
    2.14's CPU ``sum(0, dtype=torch.float32)`` of bfloat16 rows is 3-4x slower than the conversion and a
    float32 sum together (e.g. 7.0 ms against 1.8 ms for 16,500 x 352, 2 threads)."""
    return rows.sum(0) if rows.dtype == torch.float32 else rows.float().sum(0)


class _BatchNormActRows(torch.autograd.Function):
    """Training-mode BatchNorm (+ residual) (+ PReLU / ReLU) on the rows of a channels-last tensor.

    ``rows`` is ``(R, W * C)``: an ``(N, C, H, W)`` channels-last tensor viewed as R = N*H rows of W pixels x
    C channels, channel innermost. Every operation runs along these long contiguous rows (reductions over
    dim 0, element-wise products with a ``(W * C,)`` vector), which PyTorch's CPU kernels vectorise well,
    where its own channels-last BatchNorm backward and PReLU backward, reducing a channel axis of 8-64
    values, are 5-10x slower than on NCHW. The batch statistics are accumulated in float32 (for bfloat16
    input too); the variance is the biased one of the batch (BatchNorm's normalisation), computed from the
    centred values. Returns the output rows (the input's dtype) and the float32 batch mean and variance
    ``(C,)`` for the running statistics.
    """

    @staticmethod
    def forward(ctx, rows, weight, bias, slope, residual, channels, eps, relu):  # noqa: D102
        reps = rows.shape[1] // channels
        count = rows.shape[0] * reps
        mean = _per_channel(_column_sums(rows), channels) / count
        d = rows - mean.repeat(reps).to(rows.dtype)  # centred (x - mean, mean rounded to the dtype)
        dmean = _per_channel(_column_sums(d), channels) / count  # what that rounding left
        var = _per_channel(_column_sums(d * d), channels) / count - dmean * dmean
        invstd = torch.rsqrt(var + eps)
        scale = weight.float() * invstd
        shift = bias.float() - dmean * scale
        y = torch.addcmul(shift.repeat(reps).to(rows.dtype), d, scale.repeat(reps).to(rows.dtype))
        if residual is not None:
            y.add_(residual)
        if relu:
            z = torch.relu(y)
        elif slope is not None:
            z = F.prelu(y, slope.repeat(reps).to(rows.dtype))
        else:
            z = y
        act = relu or slope is not None
        ctx.save_for_backward(d, y if act else None, invstd, scale, dmean, slope)
        ctx.channels, ctx.residual, ctx.relu = channels, residual is not None, relu
        ctx.dtypes = (weight.dtype, bias.dtype)
        return z, mean + dmean, var

    @staticmethod
    def backward(ctx, grad, _grad_mean, _grad_var):  # noqa: D102
        d, y, invstd, scale, dmean, slope = ctx.saved_tensors
        c, dt = ctx.channels, grad.dtype
        reps = grad.shape[1] // c
        count = grad.shape[0] * reps
        grad_slope = None
        if ctx.relu:
            gy = torch.ops.aten.threshold_backward(grad, y, 0)
        elif slope is not None:  # PReLU: grad where y > 0, slope * grad elsewhere
            a = slope.repeat(reps).to(dt)
            if ctx.needs_input_grad[3]:
                grad_slope = _per_channel(_column_sums(grad * y.clamp(max=0)), c).to(slope.dtype)
            gy = torch.addcmul(torch.ops.aten.threshold_backward(grad, y, 0).mul_(1 - a), grad, a)
        else:
            gy = grad
        sum_g = _per_channel(_column_sums(gy), c)  # = grad of the bias
        sum_gd = _per_channel(_column_sums(gy * d), c) - dmean * sum_g  # sum(gy * (x - mean))
        grad_weight = sum_gd * invstd
        # dx = scale * (gy - sum_g / count - xhat * grad_weight / count), xhat = (d - dmean) * invstd
        b = -scale * invstd * grad_weight / count
        c0 = -scale * sum_g / count - b * dmean
        dx = torch.addcmul(c0.repeat(reps).to(dt), gy, scale.repeat(reps).to(dt))
        dx.addcmul_(d, b.repeat(reps).to(dt))
        return (dx, grad_weight.to(ctx.dtypes[0]), sum_g.to(ctx.dtypes[1]), grad_slope,
                gy if ctx.residual else None, None, None, None)


def _fusable(x: torch.Tensor, norm: nn.modules.batchnorm._BatchNorm, act: nn.Module | None,
             residual: torch.Tensor | None = None) -> bool:
    """Whether :func:`batch_norm_act` takes its fused path for these arguments (see there)."""
    if x.dim() != 4 or x.device.type != "cpu" or not norm.affine:
        return False
    if not (norm.training or norm.running_mean is None):  # running statistics: an affine map, nothing to fuse
        return False
    if not isinstance(act, (nn.PReLU, nn.ReLU, type(None))):
        return False
    c = x.shape[1]
    if isinstance(act, nn.PReLU) and act.weight.numel() not in (1, c):
        return False
    if not x.is_contiguous(memory_format=torch.channels_last) or x.is_contiguous() or x.numel() <= c:
        return False
    return residual is None or (residual.shape == x.shape
                                and residual.is_contiguous(memory_format=torch.channels_last))


def batch_norm_act(x: torch.Tensor, norm: nn.modules.batchnorm._BatchNorm, act: nn.Module | None = None,
                   residual: torch.Tensor | None = None) -> torch.Tensor:
    """``act(norm(x) + residual)``, fused for channels-last input in training mode on CPU.

    ``x`` ``(N, C, H, W)`` float (or bfloat16 under autocast); ``norm`` a BatchNorm of C channels; ``act``
    None, :class:`torch.nn.ReLU` or a PReLU with C slopes (or one); ``residual`` None or like ``x``.
    When ``x`` is channels-last (and not also NCHW-contiguous), on CPU, and ``norm`` normalises with the
    batch statistics (training, or no running statistics), the three run as one autograd function over
    rows of the channels-last memory (:class:`_BatchNormActRows`): forward + backward 2.7-3.4x faster than
    PyTorch's channels-last BatchNorm + PReLU at 8 channels on 44x44 and 22x22 maps (1.2-1.3x faster than on
    NCHW), as fast at 64 channels on 3x3 maps (``(400, C, H, W)``, 2 threads); the running statistics
    are updated as :class:`torch.nn.BatchNorm2d` does (momentum, or the cumulative
    average when ``momentum`` is None; unbiased variance). The same values up to float32 summation order.
    Any other case runs the modules themselves. Output: the layout of ``x``.
    Raises ValueError (as BatchNorm) for one value per channel in training.
    """
    if not _fusable(x, norm, act, residual):
        out = norm(x)
        if residual is not None:
            out = out + residual
        return out if act is None else act(out)
    return _fused_batch_norm_act(x, norm, act, residual)


def _fused_batch_norm_act(x: torch.Tensor, norm: nn.modules.batchnorm._BatchNorm, act: nn.Module | None,
                          residual: torch.Tensor | None = None) -> torch.Tensor:
    """The fused path of :func:`batch_norm_act`, for arguments :func:`_fusable` accepted."""
    c = x.shape[1]
    slope = act.weight if isinstance(act, nn.PReLU) else None
    n, _, h, w = x.shape
    rows = x.permute(0, 2, 3, 1).reshape(n * h, w * c)  # views of the channels-last memory
    res_rows = None if residual is None else residual.permute(0, 2, 3, 1).reshape(n * h, w * c)
    if slope is not None and slope.numel() == 1:
        slope = slope.expand(c)
    out, mean, var = _BatchNormActRows.apply(rows, norm.weight, norm.bias, slope, res_rows, c, norm.eps,
                                             isinstance(act, nn.ReLU))
    if norm.training and norm.track_running_stats and norm.running_mean is not None:
        with torch.no_grad():
            norm.num_batches_tracked.add_(1)
            factor = norm.momentum if norm.momentum is not None else 1.0 / float(norm.num_batches_tracked)
            count = n * h * w
            norm.running_mean.lerp_(mean.to(norm.running_mean.dtype), factor)
            norm.running_var.lerp_((var * count / (count - 1)).to(norm.running_var.dtype), factor)
    return out.view(n, h, w, c).permute(0, 3, 1, 2)


class BasicBlock(nn.Module):
    """ResNet basic block: two 3x3 convolutions with batch norm, a residual connection.

    ``relu2(bn2(conv2(relu1(bn1(conv1(x))))) + downsample(x))``; ``conv1`` carries the stride and
    ``downsample`` (1x1 convolution with the stride, then BatchNorm2d) is present when the stride or the
    width changes, as ``downsample_basic_block`` in av_hubert's ``resnet.py``.

    Input ``(N, in_channels, H, W)`` float, output ``(N, channels, ceil(H/stride), ceil(W/stride))``.
    """

    def __init__(self, in_channels: int, channels: int, stride: int = 1, relu_type: str = "prelu") -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu1 = _activation(relu_type, channels)
        self.conv2 = nn.Conv2d(channels, channels, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.relu2 = _activation(relu_type, channels)
        self.downsample: nn.Sequential | None = None
        if stride != 1 or in_channels != channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, channels, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(N, C_in, H, W) -> (N, C, H', W')`` (channels-last input: fused BatchNorm, see
        :func:`batch_norm_act`)."""
        out = batch_norm_act(self.conv1(x), self.bn1, self.relu1)
        residual = x
        if self.downsample is not None:
            residual = batch_norm_act(self._downsample_conv(x), self.downsample[1])
        return batch_norm_act(self.conv2(out), self.bn2, self.relu2, residual)

    def _downsample_conv(self, x: torch.Tensor) -> torch.Tensor:
        """``downsample[0](x)``. On a channels-last CPU tensor the 1x1 stride-s convolution runs as a 1x1
        convolution of the pixels it reads, ``x[:, :, ::s, ::s]`` (the same values), in float32 and in
        bfloat16 (also under an autocast): PyTorch 2.14's CPU kernel for the strided 1x1 convolution in that
        layout corrupts the heap with 2 or more threads on some shapes (glibc aborts with "corrupted size vs.
        prev_size" or "corrupted double-linked list", or a segmentation fault; e.g. 8 -> 16 channels on 22x22
        maps, stride 2, batches of 150-600, 2 threads of an AMD EPYC with AVX-512 BF16, in both dtypes; one
        thread and NCHW ran clean). CUDA and the NCHW layout call the module itself."""
        conv = self.downsample[0]
        s = conv.stride
        if (x.device.type != "cpu" or s == (1, 1) or conv.kernel_size != (1, 1) or conv.padding != (0, 0)
                or not x.is_contiguous(memory_format=torch.channels_last)):
            return conv(x)
        picked = x[:, :, ::s[0], ::s[1]].contiguous(memory_format=torch.channels_last)
        return F.conv2d(picked, conv.weight, conv.bias)


class ResNetTrunk(nn.Module):
    """The 2-D ResNet-18 trunk: four stages of two :class:`BasicBlock` each, then global average pooling.

    Stage widths ``widths`` (default 64-128-256-512), strides 1-2-2-2. Input ``(N, widths[0], H, W)`` float
    (N = batch x frames), output ``(N, widths[3])``: one vector per frame.

    Initialisation as the original ``ResNet``: conv weights normal(0, sqrt(2 / (k*k*out_channels))),
    batch-norm weight 1 and bias 0.
    """

    def __init__(self, widths: Sequence[int] = (64, 128, 256, 512), relu_type: str = "prelu") -> None:
        super().__init__()
        if len(widths) != 4 or any(int(w) < 1 for w in widths):
            raise ValueError(f"resnet_widths must be 4 positive integers, got {list(widths)}")
        w = [int(v) for v in widths]
        self.layer1 = self._stage(w[0], w[0], 1, relu_type)
        self.layer2 = self._stage(w[0], w[1], 2, relu_type)
        self.layer3 = self._stage(w[1], w[2], 2, relu_type)
        self.layer4 = self._stage(w[2], w[3], 2, relu_type)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                fan = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
                nn.init.normal_(m.weight, 0.0, math.sqrt(2.0 / fan))
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    @staticmethod
    def _stage(in_channels: int, channels: int, stride: int, relu_type: str) -> nn.Sequential:
        return nn.Sequential(
            BasicBlock(in_channels, channels, stride, relu_type),
            BasicBlock(channels, channels, 1, relu_type),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(N, widths[0], H, W) -> (N, widths[3])``."""
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.avgpool(x).flatten(1)


class ResEncoder(nn.Module):
    """3-D convolutional stem plus the 2-D ResNet trunk applied frame by frame (av_hubert ``ResEncoder``).

    ``frontend3D`` = Conv3d(1 -> widths[0], kernel 5x7x7, stride 1x2x2, padding 2x3x3, no bias),
    BatchNorm3d, PReLU/ReLU, MaxPool3d(kernel 1x3x3, stride 1x2x2, padding 0x1x1). The time axis keeps its
    length (the stem's 5-frame temporal kernel is the only place where neighbouring frames mix); frames are
    then folded into the batch (B*T) for :class:`ResNetTrunk`. The max pool, 1 frame long, is computed as a
    2-D max pool over the folded frames: the same maxima as ``frontend3D[3]`` (which is kept for the
    module structure).

    Run-time switches (constructor arguments, read back as the read-only properties of the same names; they
    change no result beyond float rounding and are not saved with the configuration or the weights):

    ``channels_last``: None (default) = True under a bfloat16 autocast, for bfloat16 input and in training
    (with gradients) on CPU, False otherwise (the original's layout and operations: float32 inference,
    CUDA); True/False force it. When True, the stem's 3-D
    convolution runs as a 2-D convolution over each frame's 5-frame neighbourhood (:meth:`_stem_conv_frames`)
    and all activations are channels-last (NHWC; the stem's BatchNorm3d and activation see an NDHWC view of
    the same memory). Same values up to float summation order; in bfloat16 on CPUs with AMX / AVX-512 BF16
    the convolutions then run in oneDNN's native bfloat16 layout, 2-3x faster than bfloat16 in the original
    layout (``benchmarks/bench_encoder.py``). In training on CPU every BatchNorm (+ residual) (+ PReLU)
    then runs as one fused function over the channels-last rows (:func:`batch_norm_act`), which together
    with the channels-last convolutions and pooling makes the recipe's forward + backward 12% faster in
    float32 and 24% in bfloat16 than the original layout. Parameters keep their layout.

    ``precision``: None (default) = the caller's (float32, or the dtype of an autocast region around it);
    ``"bf16"`` / ``"fp32"`` = this module computes under :func:`avsr.nn.precision.autocast_context` of that
    precision whatever the caller's, and returns its output in the input's dtype (float32 for float32
    video); ``"auto"`` = ``bf16`` or ``fp32`` as :func:`avsr.nn.precision.resolve_precision` chooses for the
    input's device at each forward pass (logged once, as ``video_precision``). ``"bf16"`` in float32
    training on CPU is the training setting ``video_precision`` (:class:`avsr.train.config.TrainConfig`):
    the ResNet's memory-bound BatchNorm, PReLU and pooling move half the bytes and oneDNN's bfloat16
    convolutions are faster, while the transformer stays float32.

    ``precision_in_eval``: True (default): ``precision`` applies in training and in eval mode; False: in
    training mode only, eval mode computing in the caller's precision (the ESPnet wrapper's rule).

    Input ``(B, 1, T, H, W)`` float (88x88 mouth crops at 25 fps, normalised); output
    ``(B, widths[3], T)`` float.

    Raises:
        ValueError: ``precision`` other than None or one of :data:`avsr.nn.precision.PRECISIONS` (the message
            names ``video_precision``).
    """

    def __init__(self, widths: Sequence[int] = (64, 128, 256, 512), relu_type: str = "prelu", *,
                 channels_last: bool | None = None, precision: str | None = None,
                 precision_in_eval: bool = True) -> None:
        super().__init__()
        if precision is not None:
            check_precision(precision, "video_precision")
        self.frontend_nout = int(widths[0])
        self.backend_out = int(widths[-1])
        self.frontend3D = nn.Sequential(
            nn.Conv3d(1, self.frontend_nout, kernel_size=(5, 7, 7), stride=(1, 2, 2), padding=(2, 3, 3),
                      bias=False),
            nn.BatchNorm3d(self.frontend_nout),
            _activation(relu_type, self.frontend_nout),
            nn.MaxPool3d(kernel_size=(1, 3, 3), stride=(1, 2, 2), padding=(0, 1, 1)),
        )
        self.trunk = ResNetTrunk(widths, relu_type)
        self._channels_last = None if channels_last is None else bool(channels_last)
        self._precision = precision
        self._precision_in_eval = bool(precision_in_eval)

    @property
    def channels_last(self) -> bool | None:
        """The layout switch given at construction (None: chosen per input, see the class docstring)."""
        return self._channels_last

    @property
    def precision(self) -> str | None:
        """The precision given at construction: None (the caller's), ``"auto"``, ``"fp32"`` or ``"bf16"``."""
        return self._precision

    @property
    def precision_in_eval(self) -> bool:
        """Whether :attr:`precision` applies in eval mode too (else in training mode only)."""
        return self._precision_in_eval

    def use_channels_last(self, x: torch.Tensor) -> bool:
        """Whether :meth:`forward` takes the channels-last path for input ``x`` (see the class docstring)."""
        if self._channels_last is not None:
            return self._channels_last
        dev = x.device.type
        if dev == "cpu" and self.training and torch.is_grad_enabled():
            return True  # CPU training: fused channels-last BatchNorm (batch_norm_act), faster in any dtype
        return x.dtype == torch.bfloat16 or (
            torch.is_autocast_enabled(dev) and torch.get_autocast_dtype(dev) == torch.bfloat16
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, 1, T, H, W) -> (B, widths[3], T)`` (in ``precision`` when set, see the class docstring)."""
        precision = self._precision
        if precision is None or not (self.training or self._precision_in_eval):
            return self._forward(x)
        if precision == "auto":
            precision = resolve_precision(precision, x.device, "video_precision")
        with autocast_context(x.device, precision):
            y = self._forward(x)
        return y.to(x.dtype)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t = x.shape[0], x.shape[2]
        _, norm, act, pool = self.frontend3D
        kernel, stride, padding = (_triple(v)[1:] for v in (pool.kernel_size, pool.stride, pool.padding))
        if self.use_channels_last(x):
            x = self._stem_conv_frames(x)  # (B*T, C, H', W') channels-last
            if _fusable(x, norm, act):  # BatchNorm3d over B, T, H', W' = over the folded frames
                x = _fused_batch_norm_act(x, norm, act)
            else:  # a (B, C, T, H', W') view of the same memory (channels-last-3d)
                c, h, w = x.shape[1:]
                x = act(norm(x.view(b, t, c, h, w).transpose(1, 2)))
                x = x.transpose(1, 2).reshape(b * t, c, h, w)  # a view again when the layout was kept
            x = F.max_pool2d(x, kernel, stride, padding)
        else:
            x = act(norm(self.frontend3D[0](x)))  # (B, C, T, H', W')
            c = x.shape[1]
            # the 1-frame max pool in 2-D on a (B, C*T, H', W') view, then fold the frames as the original
            x = F.max_pool2d(x.flatten(1, 2), kernel, stride, padding)
            x = x.view(b, c, t, x.shape[2], x.shape[3]).transpose(1, 2).reshape(b * t, c, x.shape[2],
                                                                                  x.shape[3])
        x = self.trunk(x)  # (B*T, C_out)
        return x.view(b, t, -1).transpose(1, 2)

    def _stem_conv_frames(self, x: torch.Tensor) -> torch.Tensor:
        """The stem's 3-D convolution as a 2-D one over each frame's temporal neighbourhood, channels-last.

        Conv3d(1 -> C, kernel kt x kh x kw, time stride 1, time padding p) equals a Conv2d whose ``kt`` input
        channels are the frames ``t - p .. t + p`` (zeros beyond the ends) with the weight ``(C, kt, kh, kw)``
        = ``conv.weight[:, 0]``. oneDNN runs the latter much faster in bfloat16 (2-D, channels-last), at the
        cost of a ``kt``-fold copy of the (small, one-channel) input. ``(B, 1, T, H, W)`` ->
        ``(B*T, C, H', W')`` in the channels-last layout, in the autocast dtype when autocast is on.
        """
        conv = self.frontend3D[0]
        kt, pt = conv.kernel_size[0], conv.padding[0]
        b, _, t, h, w = x.shape
        if torch.is_autocast_enabled(x.device.type):  # cast the one-channel input before copying it kt times
            x = x.to(torch.get_autocast_dtype(x.device.type))
        frames = F.pad(x[:, 0], (0, 0, 0, 0, pt, pt)).unfold(1, kt, 1)  # (B, T, H, W, kt) view
        frames = frames.reshape(b * t, h, w, kt).permute(0, 3, 1, 2)  # (B*T, kt, H, W), channels-last
        weight = conv.weight[:, 0].contiguous(memory_format=torch.channels_last)  # (C, kt, kh, kw)
        return F.conv2d(frames, weight, None, conv.stride[1:], conv.padding[1:], conv.dilation[1:])


class VideoFrontEnd(nn.Module):
    """The video feature extractor of AV-HuBERT (``feature_extractor_video``): ResEncoder + linear projection.

    Input ``(B, 1, T, H, W)`` float video at 25 fps; output ``(B, embed_dim, T)`` float (channels first, as
    the original ``SubModel``). Attributes ``resnet`` (:class:`ResEncoder`) and ``proj``
    (``Linear(widths[3], embed_dim)``, PyTorch default init) match the original's key names.
    ``channels_last``, ``precision`` and ``precision_in_eval`` are the ResNet's run-time switches (see
    :class:`ResEncoder`, whose errors the constructor raises).

    ``input_size`` (an avsr extension; None as AV-HuBERT): the side in pixels to which each ``H x W`` frame
    is reduced by area averaging (:func:`torch.nn.functional.interpolate`, ``mode="area"``; for 88 -> 44 the
    mean of each 2 x 2 block) before the ResNet, so that a small model reads the same 88 x 88 crops from a
    quarter of the pixels (in training on CPU a third of the ResNet's time: its per-frame work shrinks
    less). Frames already of that size, and frames smaller than it, pass unchanged.
    Raises ValueError for an ``input_size`` below 8 (the stem and the trunk's four stride-2 steps need it).
    """

    def __init__(self, embed_dim: int, widths: Sequence[int] = (64, 128, 256, 512),
                 relu_type: str = "prelu", *, channels_last: bool | None = None, precision: str | None = None,
                 precision_in_eval: bool = True, input_size: int | None = None) -> None:
        super().__init__()
        if input_size is not None and int(input_size) < 8:
            raise ValueError(f"video_input_size must be at least 8 pixels, got {input_size}")
        self.input_size = None if input_size is None else int(input_size)
        self.resnet = ResEncoder(widths, relu_type, channels_last=channels_last, precision=precision,
                                 precision_in_eval=precision_in_eval)
        self.proj = nn.Linear(self.resnet.backend_out, embed_dim)

    def forward(self, video: torch.Tensor) -> torch.Tensor:
        """``(B, 1, T, H, W) -> (B, embed_dim, T)``."""
        return self.proj(self.resnet(self.reduce(video)).transpose(1, 2)).transpose(1, 2)

    def reduce(self, video: torch.Tensor) -> torch.Tensor:
        """``(B, 1, T, H, W)`` -> ``(B, 1, T, s, s)`` area-averaged to ``s = input_size`` (the input itself
        when ``input_size`` is None or not below both of ``H`` and ``W``)."""
        s = self.input_size
        if s is None or video.shape[-1] <= s and video.shape[-2] <= s:
            return video
        b, c, t, h, w = video.shape
        frames = F.interpolate(video.reshape(b, c * t, h, w), size=(s, s), mode="area")
        return frames.view(b, c, t, s, s)
