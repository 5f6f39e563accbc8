"""Speed, memory and parity of AVHubertEncoder (and of a whole training step) per precision/compile mode.

Usage::

    python benchmarks/bench_encoder.py --config avhubert_base --threads 2 --json out.jsonl
        [--config NAME[,NAME...]] [--threads N[,N...]] [--modes fp32,bf16,compile,compile+bf16,...]
        [--measure forward,forward_backward,train_step] [--reps R] [--device cpu|cuda]
        [--modality av|audio|video] [--batch 4] [--frames 100] [--quick] [--no-memory]

``--config`` names a file of ``conf/model`` (``avhubert_base``, ``avhubert_large``, ``avsr_synthgrid_cpu``:
the default recipe's model) or is a path. The batch is fixed: ``--batch`` x ``--frames`` (4 x 100 frames at
25 fps = 16 s of speech), random stacked filterbanks ``(B, 104, T)`` and 88x88 video ``(B, 1, T, 88, 88)``
(``--modality`` audio or video: the other one is None, as the encoder takes it).

Measures:
    forward           eval mode, no gradient: the encoder's output.
    forward_backward  train mode, layer drop and all dropouts 0 (as the published fine-tuning, and so that
                      every mode computes the same function), modality dropout off: output, the fixed loss
                      ``mean(hidden * R)`` (R a fixed N(0, 1) tensor; not ``mean(hidden ** 2)``, which a
                      final LayerNorm makes constant) and its backward (gradients of all encoder parameters).
    train_step        the recipe's whole training step on an AVSRModel built from the config (its
                      ``decoder_conf`` and ``model_conf`` if it has them, else the defaults): front-ends,
                      encoder, decoder, CTC and attention losses, backward, gradient clipping, fused AdamW
                      step, as :class:`avsr.train.trainer.Trainer` does (``--vocab`` tokens, 8 per utterance).

Modes (``+``-joined): ``fp32`` eager, the reference (the computation of the original code); ``bf16``
(bfloat16 autocast, :func:`avsr.nn.precision.autocast_context`; the video front-end then runs channels-last
by default); ``compile`` (``torch.compile`` as the trainer's ``compile: true`` does it,
:func:`avsr.train.trainer.compile_model`); ``cl`` / ``nchw`` force the video front-end's layout
(``EncoderRuntime.channels_last`` True / False; ``bf16+nchw`` is bf16 autocast on the original layout;
``fp32`` and ``compile`` without either run the original layout, ``fp32+cl`` the channels-last one with
the fused BatchNorm + PReLU of CPU training, :func:`avsr.nn.resnet.batch_norm_act`);
``ckpt`` (``checkpoint_activations``). Examples: ``bf16+nchw``, ``compile+bf16``, ``bf16+ckpt``.
``round`` (``fp32+round``) is no speed mode but the yardstick for parity: fp32 on inputs rounded to
bfloat16, i.e. how much the outputs and gradients move when only the inputs carry bfloat16's rounding
error.

Method: every mode runs a model of its own built with the mode's run-time switches
(:class:`avsr.encoder.EncoderRuntime`: layout, activation checkpointing) and given the weights of one base
model (``load_state_dict``; the compile modes: a compiled copy of it), so that all modes start from the same
weights; each mode is warmed up (``--warmup`` calls; the first
calls of a compile mode compile: as in training, a batch 10 frames shorter, then the batch, which recompiles
with dynamic shapes; their time is printed as ``first_s``), then the repetitions are interleaved
(rep 1 of every mode, rep 2 of every mode, ...) so that a change of machine load hits all modes alike; the
median and the minimum are reported. Peak memory: on CPU, each mode runs again in a fresh process (warm-up,
then the peak resident set size of one more call, ``VmHWM`` after resetting it through
``/proc/self/clear_refs``; the figure includes the model and its gradients); on CUDA
``torch.cuda.max_memory_allocated`` of the timed calls. Parity against fp32 (before any optimizer step, on
the same weights and inputs): ``max_abs_diff`` of the output (train_step: of the loss), ``out_rel_diff``
(``||y - y_fp32|| / ||y_fp32||``) and ``grad_rel_diff`` (the same over all parameter gradients together).
``ratio_vs_fp32`` is the speed-up, fp32's median time / the mode's median time.

Output: a table, and with ``--json PATH`` one JSON line per (config, device, threads, mode, measure) with
the keys ``config, device, threads, mode, measure, median_s, min_s, frames_per_s, peak_mem_mib,
ratio_vs_fp32, max_abs_diff`` and also ``out_rel_diff, grad_rel_diff, cpu_s`` (median CPU seconds of the
process per call: with one thread a load-independent figure), ``first_s, reps, batch, frames,
modality, torch, load_avg`` (the 1-minute load average at the start). ``--quick``: 3 repetitions, modes
``fp32,bf16+nchw,bf16`` unless given, measures forward and forward_backward unless given.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from avsr.config import load_yaml  # noqa: E402
from avsr.encoder import AVHubertEncoder, EncoderRuntime  # noqa: E402
from avsr.models.asr import AVSRModel  # noqa: E402
from avsr.nn.precision import autocast_context, machine_summary, resolve_precision  # noqa: E402, I001
from avsr.train.trainer import compile_model, make_adamw  # noqa: E402

MEASURES = ("forward", "forward_backward", "train_step")
MODE_TOKENS = ("fp32", "bf16", "auto", "compile", "cl", "nchw", "ckpt", "round")
DEFAULT_MODES = "fp32,bf16+nchw,bf16,compile,compile+bf16"
NO_DROPOUT = dict(dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, dropout_input=0.0,
                  encoder_layerdrop=0.0)


@dataclass(frozen=True)
class Mode:
    """One way of running the same model: precision, compilation, video layout, activation checkpointing."""

    name: str
    bf16: bool
    compile: bool
    channels_last: bool | None
    checkpoint: bool
    round_inputs: bool = False

    @property
    def precision(self) -> str:
        return "bf16" if self.bf16 else "fp32"


def parse_mode(name: str, device: str = "cpu") -> Mode:
    """``"compile+bf16+cl"`` -> Mode; ``auto`` is ``bf16`` where ``device`` computes bfloat16 natively, else
    ``fp32`` (:func:`avsr.nn.precision.resolve_precision`, as the training setting). Raises SystemExit on an
    unknown token."""
    tokens = name.split("+")
    bad = [t for t in tokens if t not in MODE_TOKENS]
    if bad or sum(t in tokens for t in ("fp32", "bf16", "auto")) > 1 or ("cl" in tokens and "nchw" in tokens):
        raise SystemExit(f"--modes: bad mode {name!r} (tokens: {', '.join(MODE_TOKENS)})")
    if "auto" in tokens:
        tokens[tokens.index("auto")] = resolve_precision("auto", device)
    has = {t: t in tokens for t in MODE_TOKENS}
    # fp32 without a layout token is the reference: the original's layout (and its unfused BatchNorm)
    layout = True if has["cl"] else False if has["nchw"] else (None if has["bf16"] else False)
    return Mode(name, has["bf16"], has["compile"], layout, has["ckpt"], has["round"])


def config_path(name: str) -> Path:
    """A name of ``conf/model/*.yaml`` or a path."""
    path = Path(name)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return path
    path = REPO / "conf" / "model" / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in (REPO / "conf" / "model").glob("*.yaml"))
        raise SystemExit(f"--config: no {path}; known names: {', '.join(known)}")
    return path


def load_avg() -> float:
    """1-minute load average of the machine (other jobs make timings noisy)."""
    return os.getloadavg()[0]


def peak_rss_mib() -> float:
    """Peak resident set size of this process in MiB: ``VmHWM`` (resettable), else ``ru_maxrss``."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def reset_peak_rss() -> None:
    """Reset the peak RSS to the current RSS (Linux >= 4.0); silently nothing elsewhere."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def mode_runtime(mode: Mode) -> EncoderRuntime:
    """The encoder's run-time switches of ``mode``: its layout and activation checkpointing; the modalities
    given are used (``modality_dropout_by_loader``, as the trainer's encoder, whose loader draws)."""
    return EncoderRuntime(channels_last=mode.channels_last, checkpoint_activations=mode.checkpoint,
                          modality_dropout_by_loader=True)


class Bench:
    """The models, inputs and per-mode callables of one (config, measure) on one device.

    ``base_mode``: the mode whose run-time switches the base model is built with (default: the fp32
    reference's); the other modes' models are built with their own and given the base's weights.
    """

    def __init__(self, args: argparse.Namespace, config: str, measure: str, device: torch.device,
                 base_mode: Mode | None = None) -> None:
        self.args, self.measure, self.device = args, measure, device
        conf = load_yaml(config_path(config))
        encoder_conf = dict(conf.get("encoder_conf", conf))
        if measure != "forward":
            encoder_conf.update(NO_DROPOUT)
        self._encoder_conf, self._conf = encoder_conf, conf
        torch.manual_seed(0)
        base_mode = base_mode or Mode("fp32", False, False, None, False)
        self.model = self._build(mode_runtime(base_mode)).to(device)
        self.encoder = self.model.encoder if measure == "train_step" else self.model
        # per (layout, checkpointing): the eager model and its compiled copy, same initial weights
        self.models: dict[tuple, torch.nn.Module] = {self._key(base_mode): self.model}
        self.compiled: dict[tuple, torch.nn.Module] = {}
        self.optimizers: dict[int, torch.optim.Optimizer] = {}
        g = torch.Generator().manual_seed(0)
        b, t, m = args.batch, args.frames, args.modality
        self.audio = torch.randn(b, 104, t, generator=g).to(device) if m in ("av", "audio") else None
        self.video = torch.randn(b, 1, t, 88, 88, generator=g).to(device) if m in ("av", "video") else None
        self.lengths = torch.full((b,), t, dtype=torch.long, device=device)
        self.ys_lens = torch.tensor([8 - i % 3 for i in range(b)], device=device)
        ys = torch.randint(1, args.vocab - 1, (b, 8), generator=g).to(device)
        self.probe = torch.randn(b, t, self.encoder.output_size(), generator=g).to(device)
        self.ys = ys.masked_fill(torch.arange(8, device=device)[None] >= self.ys_lens[:, None], -1)

    def _build(self, runtime: EncoderRuntime) -> torch.nn.Module:
        """The measured model (an AVSRModel for train_step, else the encoder) with ``runtime``, on the CPU."""
        if self.measure == "train_step":
            conf = self._conf
            return AVSRModel({"vocab_size": self.args.vocab, "encoder_conf": self._encoder_conf,
                              "decoder_conf": conf.get("decoder_conf"), "model_conf": conf.get("model_conf")},
                             runtime=runtime)
        return AVHubertEncoder(runtime=runtime, **self._encoder_conf)

    @staticmethod
    def _key(mode: Mode) -> tuple:
        """What a mode's model is built with: (layout, activation checkpointing)."""
        return mode.channels_last, mode.checkpoint

    def module(self, mode: Mode) -> torch.nn.Module:
        """The model as ``mode`` runs it: one per (layout, checkpointing), built with the mode's runtime and
        given the base model's weights when first asked for; compile modes a copy of it compiled in place as
        the trainer does (:func:`avsr.train.trainer.compile_model`)."""
        key = self._key(mode)
        if key not in self.models:
            model = self._build(mode_runtime(mode))
            model.load_state_dict(self.model.state_dict())
            self.models[key] = model.to(self.device)
        if not mode.compile:
            return self.models[key]
        if key not in self.compiled:
            self.compiled[key] = compile_model(copy.deepcopy(self.models[key]))
        return self.compiled[key]

    def optimizer(self, model: torch.nn.Module) -> torch.optim.Optimizer:
        """The fused AdamW of ``model`` (train_step), made when first asked for."""
        if id(model) not in self.optimizers:
            cfg = argparse.Namespace(lr=1e-4, betas=(0.9, 0.98), weight_decay=0.01)
            self.optimizers[id(model)] = make_adamw(model.parameters(), cfg)
        return self.optimizers[id(model)]

    def run(self, mode: Mode, frames: int | None = None) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """One call in ``mode`` (on the first ``frames`` frames of the batch when given): returns (output or
        loss, gradients or None)."""
        model = self.module(mode)
        ctx = autocast_context(self.device, mode.precision)
        t = frames or self.args.frames
        audio = self.audio[:, :, :t] if self.audio is not None else None
        video = self.video[:, :, :t] if self.video is not None else None
        if mode.round_inputs:  # the sensitivity reference: only the inputs carry bfloat16 rounding
            audio = audio.bfloat16().float() if audio is not None else None
            video = video.bfloat16().float() if video is not None else None
        lengths = self.lengths.clamp(max=t)
        if self.measure == "forward":
            model.eval()
            with torch.no_grad(), ctx:
                return model({"audio": audio, "video": video}, lengths)[0], None
        model.train()
        params = [p for p in model.parameters() if p.requires_grad]
        for p in params:
            p.grad = None
        if self.measure == "forward_backward":
            with ctx:
                out = model({"audio": audio, "video": video}, lengths)[0]
            (out.float() * self.probe[:, :t]).mean().backward()
        else:
            with ctx:
                out, _ = model(audio, video, lengths, self.ys, self.ys_lens)
            out.backward()
        return out.detach(), [p.grad for p in params]

    def step(self, mode: Mode) -> None:
        """A timed call: forward / forward_backward, or a whole training step with the optimizer."""
        if self.measure != "train_step":
            self.run(mode)
            return
        model = self.module(mode)
        _, grads = self.run(mode)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt = self.optimizer(model)
        opt.step()
        opt.zero_grad(set_to_none=True)


def parity(ref: tuple[torch.Tensor, list | None], got: tuple[torch.Tensor, list | None]) -> dict:
    """max abs / relative difference of the outputs, relative difference of all gradients together."""
    a, b = ref[0].float(), got[0].float()
    out = {"max_abs_diff": float((a - b).abs().max()),
           "out_rel_diff": float((a - b).norm() / a.norm().clamp(min=1e-30))}
    if ref[1] is not None and got[1] is not None:
        pairs = [(x.float(), y.float()) for x, y in zip(ref[1], got[1]) if x is not None]
        num = sum(float((x - y).pow(2).sum()) for x, y in pairs)
        den = sum(float(x.float().pow(2).sum()) for x in ref[1] if x is not None)
        out["grad_rel_diff"] = (num / max(den, 1e-30)) ** 0.5
    else:
        out["grad_rel_diff"] = None
    return out


def timed(fn: Callable[[], None], device: torch.device) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of one call of ``fn``."""
    sync(device)
    start, cpu = time.perf_counter(), time.process_time()
    fn()
    sync(device)
    return time.perf_counter() - start, time.process_time() - cpu


def bench_one(args: argparse.Namespace, config: str, measure: str, threads: int, device: torch.device,
              modes: list[Mode]) -> list[dict]:
    """Time all modes of one (config, measure, threads) interleaved; parity against fp32."""
    torch.set_num_threads(threads)
    bench = Bench(args, config, measure, device)
    load = load_avg()
    ref_mode = Mode("fp32", False, False, None, False)
    ref = bench.run(ref_mode)
    ref = (ref[0].clone(), [g.clone() if g is not None else None for g in ref[1]] if ref[1] else None)
    first, par, cuda_peak = {}, {}, {}
    times, cpu = {m.name: [] for m in modes}, {m.name: [] for m in modes}
    for m in modes:  # first calls (compile): parity on the same weights, before any optimizer step
        def first_calls(m: Mode = m) -> None:
            if m.compile:  # as in training: a batch of another length, then dynamic-shape code
                bench.run(m, frames=args.frames - 10)
            par[m.name] = parity(ref, bench.run(m))

        first[m.name] = timed(first_calls, device)[0]
    for m in modes:
        for _ in range(args.warmup - 1):
            bench.step(m)
    for _ in range(args.reps):
        for m in modes:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            wall, cpu_s = timed(lambda m=m: bench.step(m), device)
            times[m.name].append(wall)
            cpu[m.name].append(cpu_s)
            if device.type == "cuda":
                peak = torch.cuda.max_memory_allocated(device) / 2**20
                cuda_peak[m.name] = max(cuda_peak.get(m.name, 0.0), peak)
    frames = args.batch * args.frames
    fp32_median = statistics.median(times["fp32"]) if "fp32" in times else None
    rows = []
    for m in modes:
        med, best = statistics.median(times[m.name]), min(times[m.name])
        rows.append({
            "config": config, "device": device.type, "machine": machine_summary(device), "threads": threads,
            "mode": m.name, "measure": measure,
            "median_s": round(med, 4), "min_s": round(best, 4), "frames_per_s": round(frames / med, 1),
            "peak_mem_mib": round(cuda_peak[m.name], 1) if m.name in cuda_peak else None,
            "ratio_vs_fp32": round(fp32_median / med, 3) if fp32_median else None,
            "max_abs_diff": float(f"{par[m.name]['max_abs_diff']:.3g}"),
            "out_rel_diff": float(f"{par[m.name]['out_rel_diff']:.3g}"),
            "grad_rel_diff": (float(f"{par[m.name]['grad_rel_diff']:.3g}")
                              if par[m.name]["grad_rel_diff"] is not None else None),
            "cpu_s": round(statistics.median(cpu[m.name]), 4), "first_s": round(first[m.name], 2),
            "reps": args.reps, "batch": args.batch, "frames": args.frames,
            "modality": args.modality, "torch": torch.__version__, "load_avg": round(load, 2),
        })
    return rows


def child_memory(args: argparse.Namespace) -> None:
    """In a fresh process: warm up one mode, then print the peak RSS (MiB) of one more call."""
    torch.set_num_threads(int(args.threads))
    mode = parse_mode(args.modes, args.device)
    bench = Bench(args, args.config, args.measure, torch.device("cpu"), base_mode=mode)  # one eager model
    for _ in range(max(1, args.warmup)):
        bench.step(mode)
    reset_peak_rss()
    bench.step(mode)
    print(json.dumps({"peak_mem_mib": round(peak_rss_mib(), 1)}))


def memory_in_fresh_process(args: argparse.Namespace, config: str, measure: str, threads: int,
                            mode: Mode) -> float | None:
    cmd = [sys.executable, __file__, "--child-memory", "--config", config, "--measure", measure,
           "--threads", str(threads), "--modes", mode.name, "--batch", str(args.batch), "--frames",
           str(args.frames), "--modality", args.modality, "--vocab", str(args.vocab), "--warmup",
           str(args.warmup)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"memory of {mode.name} {measure}: child failed: {proc.stderr.strip()[-500:]}", file=sys.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])["peak_mem_mib"]


def fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def print_table(rows: list[dict]) -> None:
    head = (f"{'config':<20} {'dev':<4} {'thr':>3} {'mode':<16} {'measure':<16} {'median s':>9} {'min s':>8} "
            f"{'frames/s':>9} {'peak MiB':>9} {'speed-up':>8} {'max|dy|':>8} {'rel dy':>8} {'rel dgrad':>9} "
            f"{'cpu s':>7} {'first s':>8}")
    print(head)
    for r in rows:
        print(f"{r['config']:<20} {r['device']:<4} {r['threads']:>3} {r['mode']:<16} {r['measure']:<16} "
              f"{r['median_s']:>9.3f} {r['min_s']:>8.3f} {r['frames_per_s']:>9.1f} "
              f"{fmt(r['peak_mem_mib'], '.0f'):>9} {fmt(r['ratio_vs_fp32'], '.2f'):>8} "
              f"{fmt(r['max_abs_diff'], '.2g'):>8} {fmt(r['out_rel_diff'], '.2g'):>8} "
              f"{fmt(r['grad_rel_diff'], '.2g'):>9} {r['cpu_s']:>7.3f} {r['first_s']:>8.1f}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="avhubert_base", help="conf/model names or paths, comma-separated")
    p.add_argument("--threads", default="2", help="torch threads, comma-separated (e.g. 1,2)")
    p.add_argument("--modes", default=None, help=f"comma-separated (default {DEFAULT_MODES})")
    p.add_argument("--measure", default=None, help="comma-separated subset of " + ",".join(MEASURES))
    p.add_argument("--reps", type=int, default=None, help="timed repetitions per mode (default 5)")
    p.add_argument("--warmup", type=int, default=1, help="untimed calls per mode before timing")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--modality", choices=("av", "audio", "video"), default="av")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--frames", type=int, default=100, help="frames per utterance (25 fps)")
    p.add_argument("--vocab", type=int, default=122, help="train_step: vocabulary (the recipe's 122)")
    p.add_argument("--quick", action="store_true", help="3 repetitions; fewer modes and measures")
    p.add_argument("--no-memory", action="store_true", help="CPU: skip the fresh-process memory runs")
    p.add_argument("--json", default=None, help="append one JSON line per result to this file")
    p.add_argument("--child-memory", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child_memory:
        args.measure = args.measure or "forward"
        child_memory(args)
        return
    args.reps = args.reps or (3 if args.quick else 5)
    modes = [parse_mode(m, args.device)
             for m in (args.modes or ("fp32,bf16+nchw,bf16" if args.quick else DEFAULT_MODES))
             .split(",")]
    if "fp32" not in [m.name for m in modes]:
        modes.insert(0, parse_mode("fp32"))
    measures = (args.measure or "forward,forward_backward").split(",")
    for ms in measures:
        if ms not in MEASURES:
            raise SystemExit(f"--measure: unknown {ms!r} (known: {', '.join(MEASURES)})")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: CUDA is not available")
    torch._dynamo.config.recompile_limit = 64  # modes share code objects: one graph per mode and measure
    print(machine_summary(device))
    print(f"torch {torch.__version__}, device {device}, batch {args.batch} x {args.frames} frames, modality "
          f"{args.modality}, {args.reps} reps, load average {load_avg():.2f}", flush=True)
    rows = []
    for config in args.config.split(","):
        for threads in [int(t) for t in args.threads.split(",")]:
            for measure in measures:
                new = bench_one(args, config, measure, threads, device, modes)
                if device.type == "cpu" and not args.no_memory:
                    for r, m in zip(new, modes):
                        r["peak_mem_mib"] = memory_in_fresh_process(args, config, measure, threads, m)
                print_table(new)
                sys.stdout.flush()
                rows += new
                if args.json:
                    with open(args.json, "a", encoding="utf-8") as f:
                        for r in new:
                            f.write(json.dumps(r) + "\n")
    print("\nall results:")
    print_table(rows)


if __name__ == "__main__":
    main()
