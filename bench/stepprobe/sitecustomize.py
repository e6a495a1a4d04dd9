"""Profile two steady optimizer steps, or compile each decoder layer, in one process of a benchmark run (not rocmft).

Put this folder first on PYTHONPATH and set ``BENCH_STEPPROBE=NAME=TEXT[,NAME=TEXT...]``: a Python process whose
command line (``sys.orig_argv``) contains TEXT is probed under NAME (``rocmft=rocmft.validate.child``: on one GPU
the process that validated the configuration goes on to train, rocmft.launch.run; ``peer=peer_unsloth.py``;
``expert=--lf-child``). Every ``transformers.Trainer`` built in it gets a callback that

* with ``BENCH_STEPPROBE_DIR=DIR``: runs ``torch.profiler`` (CPU and CUDA activities) over optimizer steps AT and
  AT+1 (``BENCH_STEPPROBE_AT``, default 16 of a 20-step run: well after the first step's compilation), with
  ``torch.cuda.synchronize()`` at both ends, and writes ``DIR/profile-NAME.txt`` (the top 40 ops by self CUDA
  time, PyTorch's ``key_averages().table``) and ``DIR/profile-NAME.json`` (GPU kernel time summed by kernel name
  and by :func:`kernel_group`, the window's wall seconds and, rewritten at the end of training, the wall time
  of every step's start from the first's);
  the profiled steps run slower: leave them out of a steady rate (the JSON's ``step_starts_s``);
* with ``BENCH_STEPPROBE_GAPS=1`` as well: records Python frames (``with_stack``) and writes the window's Chrome
  trace, ``DIR/trace-NAME.json.gz``, for bench/stepprobe/gaps.py (where the GPU waited and for what);
* with ``BENCH_STEPPROBE_LORA=addmm``: peft's LoRA Linears add the adapter's product with one ``addmm``
  (:func:`lora_addmm`);
* with ``BENCH_STEPPROBE_COMPILE=layers``: compiles each module whose class name ends in ``DecoderLayer`` in place
  (``nn.Module.compile``) at ``on_train_begin``: regional compilation, PyTorch's recipe "Reducing torch.compile
  cold start compilation time with regional compilation" (one graph reused by every layer).

transformers is never imported here: Unsloth must be imported before it (bench/peer_unsloth.py). A finder on
``sys.meta_path`` waits until the run itself imports ``transformers.trainer`` and then wraps ``Trainer.__init__``
(and likewise ``peft.tuners.lora.layer``).
Nothing happens without ``BENCH_STEPPROBE`` or when no TEXT matches.
"""

import importlib.abc
import importlib.util
import json
import os
import re
import sys
import time

# Kernel names of an H100 bf16 LoRA step, grouped (first match wins): cuBLAS's Hopper GEMMs (nvjet, sm90 cutlass),
# attention (flash / varlen / fmha / cudnn sdpa), Triton-compiled kernels (Liger's, Unsloth's, Inductor's), the
# optimizer, copies and element-wise kernels, reductions.
GROUPS = (
    ("matmul", r"nvjet|gemm|cutlass|sm90_xmma|cublas|splitK"),
    ("attention", r"flash|fmha|varlen|attention|cudnn"),
    ("triton", r"^triton|_kernel$|liger"),
    ("optimizer", r"adam|multi_tensor"),
    ("copy/cast", r"copy|cat|Memcpy|Memset|to_copy|index|gather|scatter|repeat"),
    ("elementwise", r"elementwise|vectorized|unrolled|silu|mul|add"),
    ("reduction", r"reduce|sum|norm"),
)


def kernel_group(name: str) -> str:
    """The :data:`GROUPS` name of a GPU kernel's name, ``other`` when none matches."""
    for group, pattern in GROUPS:
        if re.search(pattern, name, re.IGNORECASE):
            return group
    return "other"


def decoder_layers(model) -> list:
    """The modules of ``model`` (any wrapping: peft, accelerate) whose class name ends in ``DecoderLayer``."""
    return [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]


def probe_name(argv: list[str], spec: str) -> str | None:
    """The NAME of the first ``NAME=TEXT`` in ``spec`` (comma-separated) whose TEXT occurs in ``argv``."""
    line = " ".join(argv)
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, text = item.partition("=")
        if text and text in line:
            return name
    return None


def summarize(events, limit: int = 60) -> dict:
    """GPU kernel time (µs) by kernel name (the ``limit`` largest) and by :func:`kernel_group`, from profiler events
    (``torch.profiler.profile().events()``: the kernel events, whose device type is CUDA, each with its
    ``time_range`` on the GPU)."""
    by_name: dict[str, float] = {}
    for event in events:
        if str(getattr(event, "device_type", "")).rsplit(".", 1)[-1] != "CUDA":
            continue
        by_name[event.name] = by_name.get(event.name, 0.0) + float(event.time_range.elapsed_us())
    groups: dict[str, float] = {}
    for name, us in by_name.items():
        groups[kernel_group(name)] = groups.get(kernel_group(name), 0.0) + us
    top = sorted(by_name.items(), key=lambda item: -item[1])[:limit]
    ordered = sorted(groups.items(), key=lambda item: -item[1])
    return {"gpu_us_total": round(sum(by_name.values()), 1), "by_group_us": {k: round(v, 1) for k, v in ordered},
            "top_kernels_us": [[k, round(v, 1)] for k, v in top]}  # fmt: skip


def _callback_class(base):
    import torch

    def sync() -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    class StepProbe(base):
        def __init__(self, name: str):
            self.name, self.folder = name, os.environ.get("BENCH_STEPPROBE_DIR")
            self.at = int(os.environ.get("BENCH_STEPPROBE_AT", "16"))
            self.compile = os.environ.get("BENCH_STEPPROBE_COMPILE") == "layers"
            self.starts: list[float] = []
            self.gaps = os.environ.get("BENCH_STEPPROBE_GAPS") == "1"
            self.profiler, self.window_start, self.report = None, 0.0, None

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            if self.compile and model is not None:
                layers = decoder_layers(model)
                for layer in layers:
                    layer.compile()
                print(f"[stepprobe] {self.name}: compiled {len(layers)} decoder layers", flush=True)

        def on_step_begin(self, args, state, control, **kwargs):
            self.starts.append(time.perf_counter())
            if self.folder and state.global_step == self.at - 1 and self.profiler is None:
                sync()
                activities = [torch.profiler.ProfilerActivity.CPU]
                if torch.cuda.is_available():
                    activities.append(torch.profiler.ProfilerActivity.CUDA)
                # BENCH_STEPPROBE_GAPS=1: Python frames too, and the Chrome trace for bench/stepprobe/gaps.py
                self.profiler = torch.profiler.profile(activities=activities, with_stack=self.gaps)
                self.profiler.__enter__()
                self.window_start = time.perf_counter()
            elif self.profiler is not None and state.global_step == self.at + 1:
                self._write()

        def on_train_end(self, args, state, control, **kwargs):
            if self.profiler is not None:
                self._write()
            if self.folder:  # again, with every step's start
                self._dump({**(self.report or {"name": self.name, "profiled": False}), "step_starts_s": self._starts()})

        def _starts(self) -> list[float]:
            return [round(t - self.starts[0], 4) for t in self.starts]

        def _write(self) -> None:
            sync()
            window = time.perf_counter() - self.window_start
            self.profiler.__exit__(None, None, None)
            averages = self.profiler.key_averages()
            os.makedirs(self.folder, exist_ok=True)
            with open(os.path.join(self.folder, f"profile-{self.name}.txt"), "w") as handle:
                handle.write(averages.table(sort_by="self_device_time_total", row_limit=40, max_name_column_width=90))
            report = {"name": self.name, "profiled_steps": [self.at, self.at + 1], "window_s": round(window, 4)}
            if self.gaps:
                self.profiler.export_chrome_trace(os.path.join(self.folder, f"trace-{self.name}.json.gz"))
            try:
                report.update(summarize(self.profiler.events()))
            except Exception as err:  # the table above is written; the summary is extra
                report["summary_error"] = repr(err)
            self.profiler, self.report = None, report
            self._dump({**report, "step_starts_s": self._starts()})
            print(f"[stepprobe] {self.name}: steps {self.at}-{self.at + 1} took {window:.3f} s profiled", flush=True)

        def _dump(self, report: dict) -> None:
            os.makedirs(self.folder, exist_ok=True)
            with open(os.path.join(self.folder, f"profile-{self.name}.json"), "w") as handle:
                json.dump(report, handle, indent=1)

    return StepProbe


def _patch_trainer(module, name: str) -> None:
    probe = _callback_class(module.TrainerCallback)
    original = module.Trainer.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.add_callback(probe(name))

    module.Trainer.__init__ = __init__


def lora_addmm(layer) -> None:
    """Patch peft's ``lora.Linear.forward`` (``layer``: ``peft.tuners.lora.layer``, peft 0.18.1) to add the adapter's
    product into the base output with one ``torch.addmm`` (the GEMM's epilogue: C read once, D written once) in
    place of ``result + lora_B(lora_A(dropout(x))) * scaling`` (``layer.py``, ``Linear.forward``: lora_B's output
    written, scaled, added: three more passes over a T x out tensor, and the scaling's pass again in backward),
    as Unsloth's ``matmul_lora`` does (``addmm_``, unsloth/kernels/utils.py). Only plain LoRA under autocast: one
    active adapter, no dropout, no DoRA or other variant, not merged, no extra arguments; the rest goes to peft.
    One rounding instead of three, so values differ from peft's in the last bf16 bit (the run's loss curve is
    compared with the plain run's: bench/steady_probe.py)."""
    import torch

    original = layer.Linear.forward

    def forward(self, x, *args, **kwargs):
        names = self.active_adapters
        plain = (not args and not kwargs and not self.disable_adapters and not self.merged and len(names) == 1
                 and names[0] in self.lora_A and not self.lora_variant
                 and isinstance(self.lora_dropout[names[0]], torch.nn.Identity)
                 and torch.is_autocast_enabled(x.device.type))  # fmt: skip
        if not plain:
            return original(self, x, *args, **kwargs)
        result = self.base_layer(x)
        low = self.lora_A[names[0]](x)  # T x r, in the autocast dtype
        weight = self.lora_B[names[0]].weight  # out x r
        flat = torch.addmm(result.reshape(-1, result.shape[-1]), low.reshape(-1, low.shape[-1]), weight.t(),
                           alpha=self.scaling[names[0]])  # fmt: skip
        return flat.view(result.shape)

    layer.Linear.forward = forward


class _After(importlib.abc.MetaPathFinder):
    """Finds ``module`` through the other finders and calls ``patch(module)`` once the module has run."""

    def __init__(self, module: str, patch):
        self.module, self.patch = module, patch

    def find_spec(self, fullname, path, target=None):
        if fullname != self.module:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        run, patch = spec.loader.exec_module, self.patch

        def exec_module(module):
            run(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


_NAME = probe_name(getattr(sys, "orig_argv", sys.argv), os.environ.get("BENCH_STEPPROBE", ""))
if _NAME:
    sys.meta_path.insert(0, _After("transformers.trainer", lambda module: _patch_trainer(module, _NAME)))
    if os.environ.get("BENCH_STEPPROBE_LORA") == "addmm":
        sys.meta_path.insert(0, _After("peft.tuners.lora.layer", lora_addmm))
