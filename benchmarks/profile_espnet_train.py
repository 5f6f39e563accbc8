"""Where an ESPnet training step's time goes with avsr's encoder (``encoder: avsr_avhubert``), phase by phase.

Usage (from ``recipes/synthgrid/asr1_espnet`` after its stages 2-4 wrote the dump, the shape files and
``exp/<tag>/train_asr.yaml``; the arguments after ``--`` are ``python -m avsr.espnet.asr_train``'s)::

    ../../../.venv-espnet/bin/python ../../../benchmarks/profile_espnet_train.py [--steps 30] [--skip 5] \\
        [--threads 2] [--ops 25] [--flush-denormal false] [--keep-freed-memory false] \\
        [--video-precision fp32] -- --config exp/x/train_asr.yaml --input_size 9320 \\
        --train_data_path_and_name_and_type dump/train/feats.scp,speech,npy ... --output_dir /tmp/x

Builds the model, optimizer, scheduler and training iterator as ESPnet's ``ASRTask.main_worker`` does (its
``build_model``, ``build_optimizers``, ``build_iter_factory``) after
:func:`avsr.espnet.asr_train.prepare_process` (as that entry point's ``main``; ``--flush-denormal false`` /
``--keep-freed-memory false`` leave out its settings, ``--video-precision`` overrides the encoder's), then
runs ``--skip`` untimed and ``--steps`` timed steps of ESPnet's trainer loop (forward of
``ESPnetASRModel`` = encoder + CTC + transformer decoder, backward, gradient clipping, optimizer and
scheduler step, zero_grad). Prints the mean wall-clock and CPU milliseconds per step of each phase (data:
the iterator's next batch, i.e. reading the packed ``.npy`` frames and ESPnet's collation; forward;
backward; optimizer), per batch kind (audio-only, video-only, audio-visual: the encoder's modality dropout),
the parts of the forward pass (video crop/normalise, video and audio front-ends, transformer encoder,
decoder), and with ``--ops N`` the N operators with the most CPU time (torch.profiler over the timed steps).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from avsr.nn.precision import machine_summary  # noqa: E402

PHASES = ("data", "forward", "backward", "optimizer")


class _Timer:
    """Wall and CPU seconds of named parts, summed over a step (module pre/post hooks)."""

    def __init__(self) -> None:
        self.step: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        self._open: dict[str, tuple[float, float]] = {}

    def hook(self, module: torch.nn.Module, name: str) -> None:
        def pre(*_):
            self._open[name] = (time.perf_counter(), time.process_time())

        def post(*_):
            w, c = self._open.pop(name)
            self.step[name][0] += time.perf_counter() - w
            self.step[name][1] += time.process_time() - c

        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)

    def wrap(self, obj, attr: str, name: str) -> None:
        fn = getattr(obj, attr)

        def timed(*a, **k):
            w, c = time.perf_counter(), time.process_time()
            try:
                return fn(*a, **k)
            finally:
                self.step[name][0] += time.perf_counter() - w
                self.step[name][1] += time.process_time() - c

        setattr(obj, attr, timed)


def _lap(clock: dict[str, list[float]], name: str, w: float, c: float) -> tuple[float, float]:
    """Record wall/CPU seconds since ``(w, c)`` as ``clock[name]``; return the new start."""
    w2, c2 = time.perf_counter(), time.process_time()
    clock[name] = [w2 - w, c2 - c]
    return w2, c2


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        raise SystemExit("usage: profile_espnet_train.py [options] -- <avsr.espnet.asr_train arguments>")
    cut = argv.index("--")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--skip", type=int, default=5)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--ops", type=int, default=0, help="list the N operators with the most CPU time")
    p.add_argument("--flush-denormal", choices=["true", "false"], default="true",
                   help="prepare_process's flush of subnormal floats (false: the IEEE default)")
    p.add_argument("--keep-freed-memory", choices=["true", "false"], default="true",
                   help="prepare_process's malloc settings (false: glibc's defaults)")
    p.add_argument("--video-precision", default=None, choices=["auto", "fp32", "bf16", "none"],
                   help="override the encoder's video_precision (none: the caller's, float32)")
    args = p.parse_args(argv[:cut])
    espnet_argv = argv[cut + 1:]

    from avsr.espnet import asr_train, register

    register()
    from espnet2.tasks.asr import ASRTask
    from espnet2.train.distributed_utils import DistributedOption, resolve_distributed_mode
    from espnet2.utils.build_dataclass import build_dataclass

    done = asr_train.prepare_process(args.flush_denormal == "true", args.keep_freed_memory == "true")
    if args.threads:
        torch.set_num_threads(args.threads)
    eargs = ASRTask.get_parser().parse_args(espnet_argv)
    ASRTask.check_required_command_args(eargs)
    resolve_distributed_mode(eargs)
    if args.video_precision is not None:  # the encoder is built with it (its run-time switch)
        precision = None if args.video_precision == "none" else args.video_precision
        eargs.encoder_conf = {**(eargs.encoder_conf or {}), "video_precision": precision}
    torch.manual_seed(eargs.seed)
    dist = build_dataclass(DistributedOption, eargs)
    dist.init_options()
    model = ASRTask.build_model(eargs)
    optimizers = ASRTask.build_optimizers(eargs, model)
    from espnet2.tasks.abs_task import scheduler_classes

    scheduler = scheduler_classes[eargs.scheduler](optimizers[0], **eargs.scheduler_conf)
    iterator = iter(ASRTask.build_iter_factory(eargs, dist, mode="train").build_iter(1))
    model.train()

    timer = _Timer()
    enc = model.encoder
    timer.wrap(sys.modules[type(enc).__module__], "crop_and_normalize", "video crop+normalise")
    timer.hook(enc.avhubert.feature_extractor_video, "video front-end")
    timer.hook(enc.avhubert.feature_extractor_audio, "audio front-end")
    timer.hook(enc.avhubert.encoder, "transformer encoder")
    timer.hook(model.decoder, "decoder")
    timer.hook(model.ctc, "ctc")

    totals = {k: defaultdict(lambda: [0.0, 0.0]) for k in ("all", "audio", "video", "audiovisual")}
    parts: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    counts: dict[str, int] = defaultdict(int)
    prof = None
    print(f"[profile_espnet_train] {machine_summary()}; torch threads {torch.get_num_threads()}; "
          f"{done}; video_precision {enc.video_precision}",
          flush=True)
    for i in range(args.skip + args.steps):
        timed = i >= args.skip
        if timed and prof is None and args.ops:
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            prof.__enter__()
        timer.step.clear()
        clock: dict[str, list[float]] = {}
        w, c = time.perf_counter(), time.process_time()
        try:
            _, batch = next(iterator)
        except StopIteration:
            break
        w, c = _lap(clock, "data", w, c)
        retval = model(**batch)
        loss = retval[0] if isinstance(retval, tuple) else retval["loss"]
        w, c = _lap(clock, "forward", w, c)
        loss.backward()
        w, c = _lap(clock, "backward", w, c)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=eargs.grad_clip)
        optimizers[0].step()
        scheduler.step()
        optimizers[0].zero_grad()
        _lap(clock, "optimizer", w, c)
        if not timed:
            continue
        kind = ("audiovisual" if "video front-end" in timer.step and "audio front-end" in timer.step
                else "video" if "video front-end" in timer.step else "audio")
        counts[kind] += 1
        counts["all"] += 1
        for name, (dw, dc) in clock.items():
            for k in ("all", kind):
                totals[k][name][0] += dw
                totals[k][name][1] += dc
        for name, (dw, dc) in timer.step.items():
            parts[name][0] += dw
            parts[name][1] += dc
    if prof is not None:
        prof.__exit__(None, None, None)
    n = counts["all"]
    if not n:
        raise SystemExit("no timed steps")
    print(f"mean ms per step over {n} steps (wall / cpu), by batch kind:")
    for k in ("all", "audio", "video", "audiovisual"):
        if counts[k]:
            row = "  ".join(f"{ph} {totals[k][ph][0] / counts[k] * 1e3:7.0f}/"
                            f"{totals[k][ph][1] / counts[k] * 1e3:7.0f}" for ph in PHASES)
            step = sum(totals[k][ph][0] for ph in PHASES) / counts[k] * 1e3
            print(f"  {k:12s} x{counts[k]:3d}: {row}  step {step:7.0f}")
    print("forward parts, mean ms per step (wall / cpu):")
    for name, (dw, dc) in sorted(parts.items(), key=lambda kv: -kv[1][0]):
        print(f"  {name:22s} {dw / n * 1e3:7.0f}/{dc / n * 1e3:7.0f}")
    if prof is not None:
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.ops))


if __name__ == "__main__":
    main()
