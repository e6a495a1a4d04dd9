"""bench/stepprobe (issue 32's steady-rate probe), in-process on the CPU: the import hook patches a trainer module
only after the run imports it, the callback compiles the decoder layers and profiles exactly the asked steps, and
the kernel summary adds GPU time by name and group. No transformers and no training: a stand-in trainer module and
a few CPU matrix products; the GPU profile itself is bench/throughput.py's (BENCHMARKS.md)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

SITE = Path(__file__).resolve().parents[1] / "bench" / "stepprobe" / "sitecustomize.py"
FAKE_TRAINER = """
class TrainerCallback:
    pass


class Trainer:
    def __init__(self):
        self.callbacks = []

    def add_callback(self, callback):
        self.callbacks.append(callback)
"""


@pytest.fixture
def stepprobe(monkeypatch):
    monkeypatch.delenv("BENCH_STEPPROBE", raising=False)
    spec = importlib.util.spec_from_file_location("stepprobe_site", SITE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert not any(type(f).__name__ == "_After" for f in sys.meta_path)  # unset: nothing installed
    return module


@pytest.fixture
def fake_trainer(tmp_path, monkeypatch):
    package = tmp_path / "fakehf"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "trainer.py").write_text(FAKE_TRAINER)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "fakehf.trainer"
    for name in ("fakehf.trainer", "fakehf"):
        sys.modules.pop(name, None)


class ToyDecoderLayer(torch.nn.Linear):
    pass


def test_probe_names_the_process_whose_command_line_matches(stepprobe):
    spec = "rocmft=rocmft.validate.child, peer=peer_unsloth.py"
    assert stepprobe.probe_name(["python3", "bench/peer_unsloth.py", "--model", "m"], spec) == "peer"
    assert stepprobe.probe_name(["python3", "-m", "rocmft.validate.child", "run"], spec) == "rocmft"
    assert stepprobe.probe_name(["python3", "-m", "rocmft", "train"], spec) is None


def test_the_trainer_module_is_patched_once_the_run_imports_it(stepprobe, fake_trainer, monkeypatch, tmp_path):
    finder = stepprobe._After(fake_trainer, lambda module: stepprobe._patch_trainer(module, "probe"))
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    trainer = importlib.import_module(fake_trainer).Trainer()
    assert finder not in sys.meta_path  # one module, patched once
    (callback,) = trainer.callbacks
    assert type(callback).__name__ == "StepProbe" and callback.name == "probe"


def test_the_callback_compiles_the_layers_and_profiles_the_steps_asked(stepprobe, fake_trainer, monkeypatch, tmp_path):
    monkeypatch.setenv("BENCH_STEPPROBE_DIR", str(tmp_path / "out"))
    monkeypatch.setenv("BENCH_STEPPROBE_AT", "2")
    monkeypatch.setenv("BENCH_STEPPROBE_COMPILE", "layers")
    probe = stepprobe._callback_class(importlib.import_module(fake_trainer).TrainerCallback)("rocmft")
    model = torch.nn.Sequential(ToyDecoderLayer(8, 8), torch.nn.ReLU(), ToyDecoderLayer(8, 8))
    probe.on_train_begin(None, None, None, model=model)
    assert [m._compiled_call_impl is not None for m in model] == [True, False, True]
    for step in range(4):  # global_step at a step's start = steps done; steps 2 and 3 are profiled
        probe.on_step_begin(None, SimpleNamespace(global_step=step), None)
        if step == 1:
            torch.randn(16, 16) @ torch.randn(16, 16)  # inside the window (step 2 runs after this call)
    probe.on_train_end(None, None, None)
    report = json.loads((tmp_path / "out" / "profile-rocmft.json").read_text())
    assert report["profiled_steps"] == [2, 3] and report["window_s"] > 0
    assert len(report["step_starts_s"]) == 4 and report["step_starts_s"][0] == 0.0  # rewritten at the end
    assert "aten::mm" in (tmp_path / "out" / "profile-rocmft.txt").read_text()


def test_kernel_time_is_summed_by_name_and_group(stepprobe):
    def event(name, us, device="DeviceType.CUDA"):
        return SimpleNamespace(name=name, device_type=device, time_range=SimpleNamespace(elapsed_us=lambda: us))

    events = [event("nvjet_tst_192x192_64x4_h_bz_NNT", 300.0), event("nvjet_tst_192x192_64x4_h_bz_NNT", 200.0),
              event("pytorch_flash::flash_fwd_kernel", 50.0), event("_rms_norm_forward_kernel", 25.0),
              event("aten::mm", 999.0, device="DeviceType.CPU")]  # fmt: skip
    summary = stepprobe.summarize(events)
    assert summary["gpu_us_total"] == 575.0
    assert summary["by_group_us"] == {"matmul": 500.0, "attention": 50.0, "triton": 25.0}
    assert summary["top_kernels_us"][0] == ["nvjet_tst_192x192_64x4_h_bz_NNT", 500.0]


@pytest.fixture
def steady_probe():
    sys.path.insert(0, str(SITE.parents[1]))
    try:
        yield importlib.import_module("steady_probe")
    finally:
        sys.path.remove(str(SITE.parents[1]))


@pytest.mark.parametrize(
    ("option", "message"),
    [(["--at", "20"], "--at 20: give a step in 3..19"), (["--parts", "peer,fast"], "fast is not one of loss, peer")],
)
def test_steady_probe_refuses_bad_options_before_writing(steady_probe, tmp_path, capsys, option, message):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as stop:
        steady_probe.main(["--out", str(out), "--work", str(tmp_path / "w"), "--data", str(tmp_path),
                           "--peer-pythonpath", str(tmp_path), *option])  # fmt: skip
    assert stop.value.code == 2 and message in capsys.readouterr().err
    assert not out.exists()


def test_steady_rate_before_the_profiled_window_is_read_from_the_trainer_state(steady_probe, tmp_path):
    log = [{"loss": 12.0, "num_input_tokens_seen": 8000 * n, "train_runtime": 5.0 + 0.5 * (n - 1)} for n in (1, 2, 3)]
    log[2]["train_runtime"] += 10.0  # step 3, profiled: slower, and left out of steps 2..2
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": [*log, {"train_runtime": 16.0}]}))
    assert steady_probe.steady_before(tmp_path, 2) == 16000.0  # 8000 tokens in 0.5 s
    assert steady_probe.steady_before(tmp_path, 4) is None  # not that many steps logged


def test_lora_addmm_adds_the_adapter_product_as_peft_does(stepprobe, monkeypatch):
    peft = pytest.importorskip("peft")
    from peft.tuners.lora import layer

    torch.manual_seed(0)
    model = peft.get_peft_model(torch.nn.Sequential(torch.nn.Linear(64, 96).bfloat16()),
                                peft.LoraConfig(r=8, lora_alpha=16, target_modules=["0"]))  # fmt: skip
    lora = model.base_model.model[0]
    lora.lora_A["default"].float(), lora.lora_B["default"].float()  # fp32 adapters, as LLaMA-Factory keeps them
    torch.nn.init.normal_(lora.lora_B["default"].weight)  # peft starts B at 0: the product would vanish
    x = torch.randn(2, 5, 64).bfloat16()

    def step(autocast: bool = True):
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y = model(x)
        y.float().square().mean().backward()
        return y.detach().float(), lora.lora_A["default"].weight.grad.clone(), lora.lora_B["default"].weight.grad

    peft_fused = step()
    peft_plain = step(autocast=False)
    fused = []
    monkeypatch.setattr(torch, "addmm", lambda *a, _addmm=torch.addmm, **k: fused.append(1) or _addmm(*a, **k))
    monkeypatch.setattr(layer.Linear, "forward", layer.Linear.forward)  # undone after the test
    stepprobe.lora_addmm(layer)
    ours = step()
    assert fused == [1]  # the adapter's product went through addmm
    # float64 reference of the same adapter: addmm rounds once where peft rounds three times, so its output and
    # gradients are as close to it as peft's (not bit-equal to peft's)
    w, b = (p.detach().double() for p in lora.base_layer.parameters())
    a64, b64 = (m.weight.detach().double().requires_grad_() for m in (lora.lora_A["default"], lora.lora_B["default"]))
    y64 = x.double() @ w.T + b + lora.scaling["default"] * (x.double() @ a64.T) @ b64.T
    y64.square().mean().backward()
    for got, peft_value, want in zip(ours, peft_fused, (y64.detach(), a64.grad, b64.grad), strict=True):
        assert (got.double() - want).abs().max() <= 1.5 * (peft_value.double() - want).abs().max() + 1e-6
    assert all(torch.equal(a, b) for a, b in zip(step(autocast=False), peft_plain, strict=True))  # peft's own path
    assert fused == [1]
