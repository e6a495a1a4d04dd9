"""Trying to break patches.train_mode_set_once and patches.gradients_found_without_walking (rocmft.worker.params):
a real transformers Trainer on the CPU trains the same with them as without them, through evaluations, gradient
accumulation, gradient checkpointing, torch.compile and peft or module surgery mid-run; a model they saw is freed when
dropped; and nothing that worked without them raises with them.

The reference run puts transformers' and torch's own functions back (the ones each patch wrapped, read from its
closure) for its duration. The model is a Qwen2 of two layers with peft LoRA (dropout 0.1) on every Linear.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import weakref

import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

from transformers import modeling_utils  # noqa: E402
from transformers.models.qwen2 import modeling_qwen2  # noqa: E402

from rocmft.worker import params, patches  # noqa: E402


@pytest.fixture(autouse=True)
def _patched():
    patches.train_mode_set_once()
    patches.gradients_found_without_walking()


def _wrapped(function, name: str):
    """The function a patch wrapped: ``name`` in the patch's closure."""
    return function.__closure__[function.__code__.co_freevars.index(name)].cell_contents


@contextlib.contextmanager
def _unpatched():
    """transformers' and torch's own ``_clip_grad_norm``, ``zero_grad`` and ``train`` while the block runs."""
    owners = {(transformers.Trainer, "_clip_grad_norm"): "clip", (torch.nn.Module, "zero_grad"): "zero_grad",
              (modeling_utils.PreTrainedModel, "train"): "train"}  # fmt: skip
    saved = {key: getattr(*key) for key in owners}
    for (owner, attribute), name in owners.items():
        setattr(owner, attribute, _wrapped(saved[owner, attribute], name))
    try:
        yield
    finally:
        for (owner, attribute), function in saved.items():
            setattr(owner, attribute, function)


def _model(dropout: float = 0.1):
    config = transformers.Qwen2Config(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config)
    return peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16, target_modules="all-linear",
                                                      lora_dropout=dropout, init_lora_weights=False))  # fmt: skip


class _Rows(torch.utils.data.Dataset):
    def __init__(self, count: int) -> None:
        self.ids = torch.randint(1, 97, (count, 16), generator=torch.Generator().manual_seed(3))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index):
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


class _AtStep(transformers.TrainerCallback):
    """Runs ``operations[step](model)`` when optimizer step ``step`` ends (a callback's surgery mid-run)."""

    def __init__(self, operations) -> None:
        self.operations = operations

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step in self.operations:
            self.operations[state.global_step](model)


def _train(tmp_path, operations=None, checkpointing=False, **arguments):
    """6 optimizer steps of 2 micro-steps, clipped at 0.05, evaluated every 2: the log, the parameters, the modes."""
    model = _model()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
        model.enable_input_require_grads()
    arguments = {"output_dir": str(tmp_path), "report_to": [], "use_cpu": True, "max_grad_norm": 0.05,
                 "per_device_train_batch_size": 2, "gradient_accumulation_steps": 2, "max_steps": 6,
                 "eval_strategy": "steps", "eval_steps": 2, "logging_steps": 1, "seed": 1, "save_strategy": "no",
                 "learning_rate": 1e-2, "disable_tqdm": True, **arguments}  # fmt: skip
    trainer = transformers.Trainer(model=model, args=transformers.TrainingArguments(**arguments),
                                   train_dataset=_Rows(40), eval_dataset=_Rows(4),
                                   callbacks=[_AtStep(operations)] if operations else None)  # fmt: skip
    trainer.train()
    log = [{k: v for k, v in entry.items() if "runtime" not in k and "per_second" not in k}
           for entry in trainer.state.log_history]  # fmt: skip
    return log, dict(model.named_parameters()), [m.training for m in model.modules()], trainer


def _add_adapter(model) -> None:
    model.add_adapter("b", peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.2))
    model.set_adapter("b")


def _delete_adapter(model) -> None:
    model.set_adapter("default")
    model.delete_adapter("b")


def _forward_without_adapters(model) -> None:
    with model.disable_adapter():
        ids = torch.arange(1, 17).view(1, -1)
        model(input_ids=ids, labels=ids)


def _replace_mlp(model) -> None:
    torch.manual_seed(5)
    model.base_model.model.model.layers[1].mlp = modeling_qwen2.Qwen2MLP(model.config)


def _replace_parameters(model) -> None:
    attention = model.base_model.model.model.layers[0].self_attn
    lora_a = attention.q_proj.lora_A["default"]
    lora_a.weight = torch.nn.Parameter(lora_a.weight.detach() * 2)
    attention.k_proj.base_layer.bias = None
    del attention.v_proj.lora_dropout["default"]
    attention.v_proj.lora_dropout["default"] = torch.nn.Identity()


RUNS = {
    "eval between steps, dropout, accumulation": {},
    "no accumulation": {"gradient_accumulation_steps": 1},
    "max_grad_norm 0": {"max_grad_norm": 0},
    "gradient checkpointing": {"checkpointing": True},
    "peft add, set, delete adapter": {"operations": {2: _add_adapter, 4: _delete_adapter}},
    "peft disable_adapter, enable_input_require_grads": {
        "operations": {1: _forward_without_adapters, 2: lambda m: m.enable_input_require_grads()}
    },
    "module and parameters replaced, set to None, deleted": {"operations": {2: _replace_mlp, 4: _replace_parameters}},
    "torch.compile": {"torch_compile": True, "torch_compile_backend": "eager"},
}


@pytest.mark.parametrize("case", RUNS, ids=list(RUNS))
def test_a_trainer_run_is_the_same_with_the_patches(tmp_path, case):
    with _unpatched():
        log, weights, modes, _ = _train(tmp_path / "reference", **RUNS[case])
    got_log, got_weights, got_modes, trainer = _train(tmp_path / "patched", **RUNS[case])
    assert got_log == log
    assert got_modes == modes, "a module was left in another train/eval mode"
    for name, weight in weights.items():
        assert torch.equal(got_weights[name], weight), f"{name} trained differently"
    assert params.is_listed(trainer.model_wrapped) == (trainer.args.max_grad_norm > 0), "the list was not used"


def test_a_module_that_cannot_be_hashed_is_still_built_once_a_list_exists():
    """torch registers submodules and parameters without hashing the module; the list's hook must not either."""
    params.listed(_model())  # installs torch's global registration hooks, for every module built after it

    class Compared(torch.nn.Module):
        """``__eq__`` without ``__hash__``: its instances cannot be hashed."""

        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(2, 2)
            self.scale = torch.nn.Parameter(torch.ones(2))

        def __eq__(self, other) -> bool:
            return type(other) is Compared

        def forward(self, x):
            return self.linear(x) * self.scale

    module = Compared()
    assert module(torch.ones(1, 2)).shape == (1, 2)


def test_a_model_trained_and_dropped_is_freed(tmp_path):
    """Two models trained one after another in one process: the first one's weights go when it is dropped."""
    trainer = _train(tmp_path, max_steps=2)[3]
    dropped = [weakref.ref(trainer.model), weakref.ref(trainer.model.base_model.model)]  # peft's, transformers'
    del trainer
    gc.collect()
    assert [ref() is None for ref in dropped] == [True, True], "a model dropped after training is still alive"


def test_a_module_put_in_after_the_walk_is_walked():
    """``layer.mlp = loaded``: a module in eval mode (as ``from_pretrained`` leaves one) or with a ``train`` of its
    own, put into a tree whose walk the patch skips, gets the walk that transformers gives it."""

    class Counted(torch.nn.Identity):
        calls = 0

        def train(self, mode: bool = True):
            Counted.calls += 1
            return super().train(mode)

    model = _model()
    model.train()
    layer = model.base_model.model.model.layers[0]
    loaded = copy.deepcopy(layer.mlp).eval()
    layer.mlp = loaded
    model.train()
    assert loaded.training, "a module put in in eval mode stayed in eval mode"
    layer.counted = Counted()
    model.train()
    assert Counted.calls == 1, "a module with a train of its own, put in later, did not get its call"


def test_in_a_trainer_run_the_walk_runs_at_the_start_and_around_each_evaluation(tmp_path):
    """The skip still works in a real run (no registration into the tree at each step brings the walk back): one
    LoRA MLP's ``train`` calls, 12 micro-steps with an evaluation after every 4."""
    calls: list[bool] = []

    class Watch(transformers.TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            mlp = model.base_model.model.model.layers[1].mlp
            walk = mlp.train

            def train(mode: bool = True):
                calls.append(mode)
                return walk(mode)

            mlp.train = train  # an instance attribute: the class's train, which the patch looks at, is unchanged

    arguments = {"output_dir": str(tmp_path), "report_to": [], "use_cpu": True, "max_steps": 6, "eval_steps": 2,
                 "per_device_train_batch_size": 2, "gradient_accumulation_steps": 2, "eval_strategy": "steps",
                 "save_strategy": "no", "disable_tqdm": True}  # fmt: skip
    trainer = transformers.Trainer(model=_model(), args=transformers.TrainingArguments(**arguments),
                                   train_dataset=_Rows(40), eval_dataset=_Rows(4), callbacks=[Watch()])  # fmt: skip
    trainer.train()
    assert calls == [True, False, True, False, True, False]


def test_sagemaker_model_parallel_under_fp16_keeps_the_optimizers_clip(tmp_path, monkeypatch):
    """transformers' ``_clip_grad_norm`` clips the optimizer's fp32 master gradients there, not the model's."""
    arguments = transformers.TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, max_grad_norm=0.5)
    trainer = transformers.Trainer(model=_model(), args=arguments)
    monkeypatch.setattr(transformers.trainer, "is_sagemaker_mp_enabled", lambda: True)
    monkeypatch.setattr(trainer.args, "fp16", True)
    clipped: list[float] = []

    class MasterGradients:
        def clip_master_grads(self, max_norm):
            clipped.append(max_norm)
            return torch.tensor(1.0)

    trainer.optimizer = MasterGradients()
    trainer._clip_grad_norm(trainer.model)
    assert clipped == [0.5]


def test_a_deep_copy_of_a_listed_model_is_clipped_and_zeroed_apart_and_set_to_none_false_zeroes(tmp_path):
    arguments = transformers.TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, max_grad_norm=0.01)
    trainer = transformers.Trainer(model=_model(), args=arguments)
    model = trainer.model
    ids = torch.randint(1, 97, (2, 16), generator=torch.Generator().manual_seed(1))
    model(input_ids=ids, labels=ids).loss.backward()
    trainer._clip_grad_norm(model)  # lists model
    twin = copy.deepcopy(model)
    for m in (model, twin):
        m.zero_grad()
        m(input_ids=ids, labels=ids).loss.backward()
    before = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    trainer._clip_grad_norm(twin)
    assert all(torch.equal(p.grad, before[name]) for name, p in model.named_parameters() if p.grad is not None)
    assert all(float(p.grad.norm()) < 0.01 + 1e-6 for p in twin.parameters() if p.grad is not None)
    twin.zero_grad()
    assert all(p.grad is None for p in twin.parameters()) and len(params.with_grad(model)) == len(before)
    model.zero_grad(set_to_none=False)  # torch's own: zeroed in place, not dropped
    zeroed = [p for p in model.parameters() if p.grad is not None and not p.grad.any()]
    assert len(zeroed) == len(before)


def test_train_raises_where_torch_raises_and_only_there():
    """``train(1)`` is refused by torch ("expected to be boolean") also when the walk would be skipped; a model
    class that cannot be hashed (``__eq__`` without ``__hash__``) trains, as it does without the patch."""
    model = _model().base_model.model
    model.train()
    with pytest.raises(ValueError, match="boolean"):
        model.train(1)

    class Compared(transformers.Qwen2ForCausalLM):
        def __eq__(self, other) -> bool:
            return other is self

    compared = Compared(model.config)
    compared.train()
    compared.train()
    assert compared.training and all(m.training for m in compared.model.modules())  # its own modules() hashes it
