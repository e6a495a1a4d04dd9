"""The PyTorch runtime variables users set by hand: the allocator's configuration and TunableOp's online tuning."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocmft.errors import ConfigError, ExitCode
from rocmft.validate.rules.runtime import allocator_findings, parse_alloc_conf, tunableop_online_tuning


def test_nothing_set_is_nothing_to_say():
    assert allocator_findings({}) == []
    assert allocator_findings({"PYTORCH_ALLOC_CONF": "expandable_segments:True"}) == []


def test_values_torch_refuses_are_refused_before_the_model_loads():
    for text, word in [("expandable_segments:true", "True or False"), ("max_split_size_mb:8", "at least 20"),
                       ("max_split_size_mb:1.5e2", "whole number"), ("garbage_collection_threshold:1.5", "0 and 1"),
                       ("expandable_segments", "option:value")]:  # fmt: skip
        with pytest.raises(ConfigError) as caught:
            allocator_findings({"PYTORCH_HIP_ALLOC_CONF": text})
        assert "PYTORCH_HIP_ALLOC_CONF" in str(caught.value) and word in str(caught.value), text
        assert caught.value.code == ExitCode.CONFIG_ERROR and caught.value.remedy


def test_disagreeing_variables_are_refused_naming_both():
    with pytest.raises(ConfigError) as caught:
        allocator_findings({"PYTORCH_ALLOC_CONF": "expandable_segments:True",
                            "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"})  # fmt: skip
    assert "PYTORCH_ALLOC_CONF=expandable_segments:True (set in the environment)" in str(caught.value)
    assert "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128 (set in the environment)" in str(caught.value)
    # the same value under two names is no conflict
    same = allocator_findings({"PYTORCH_ALLOC_CONF": "expandable_segments:True",
                               "PYTORCH_HIP_ALLOC_CONF": "expandable_segments:True"})  # fmt: skip
    assert same == []


def test_runnable_but_risky_settings_are_warnings_with_the_cost():
    (warning,) = allocator_findings({"PYTORCH_ALLOC_CONF": "expandable_segments:True,max_split_size_mb:512"})
    assert "pytorch/pytorch#123548" in warning and "out of memory" in warning
    (old,) = allocator_findings({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    assert "PYTORCH_ALLOC_CONF" in old and "old name" in old
    (unknown,) = allocator_findings({"PYTORCH_ALLOC_CONF": "expandible_segments:True"})
    assert "expandible_segments" in unknown


def test_bracketed_roundup_divisions_are_one_option():
    options = parse_alloc_conf("PYTORCH_ALLOC_CONF", "roundup_power2_divisions:[256:1,>:4], expandable_segments:True")
    assert options == {"roundup_power2_divisions": "[256:1,>:4]", "expandable_segments": "True"}


def test_tunableop_online_tuning_is_refused_across_ranks():
    tunableop_online_tuning({"PYTORCH_TUNABLEOP_ENABLED": "1"}, 1)  # one process: fine
    tunableop_online_tuning({"PYTORCH_TUNABLEOP_ENABLED": "1", "PYTORCH_TUNABLEOP_TUNING": "0"}, 8)  # offline results
    tunableop_online_tuning({}, 8)
    with pytest.raises(ConfigError) as caught:
        tunableop_online_tuning({"PYTORCH_TUNABLEOP_ENABLED": "1"}, 8)
    text = str(caught.value)
    assert "PYTORCH_TUNABLEOP_ENABLED=1" in text and "8 ranks" in text and "pytorch/pytorch#190433" in text
    assert "PYTORCH_TUNABLEOP_TUNING=0" in caught.value.remedy


@pytest.mark.slow  # rocmft render as a process
def test_render_refuses_a_bad_allocator_string_with_exit_2(tmp_path, cache_dir, tiny_model, demo_data):
    """Through the CLI as a user runs it: exit 2, the variable named, no traceback, no rendered files."""
    from conftest import rocmft_in

    env = {
        "MODEL_NAME_OR_PATH": str(tiny_model),
        "DATASET": "rocmft_demo",
        "DATASET_DIR": str(demo_data),
        "TEMPLATE": "qwen",
        "OUTPUT_DIR": str(tmp_path / "out"),
        "PYTORCH_HIP_ALLOC_CONF": "expandable_segments:true",
    }
    done = rocmft_in(tmp_path, cache_dir, "render", env=env)
    assert done.returncode == ExitCode.CONFIG_ERROR, done.stdout[-2000:]
    assert "PYTORCH_HIP_ALLOC_CONF" in done.stdout and "Traceback" not in done.stdout
    assert not (tmp_path / "out" / "rocmft" / "train.yaml").exists()


@pytest.mark.slow  # rocmft train as a process
def test_train_refuses_online_tunableop_in_a_two_rank_job(tmp_path, cache_dir, tiny_model, demo_data):
    """The launch rule with the job's real world size (DDP, 2 processes on the CPU): exit 2 before a process starts."""
    from conftest import rocmft_in

    env = {"MODEL_NAME_OR_PATH": str(tiny_model), "DATASET": "rocmft_demo", "DATASET_DIR": str(demo_data),
           "TEMPLATE": "qwen", "OUTPUT_DIR": str(tmp_path / "out"), "MAX_STEPS": "2", "CUTOFF_LEN": "64",
           "ROCMFT_DISTRIBUTED": "ddp", "ROCMFT_NPROC_PER_NODE": "2", "PYTORCH_TUNABLEOP_ENABLED": "1"}  # fmt: skip
    done = rocmft_in(tmp_path, cache_dir, "train", env=env)
    assert done.returncode == ExitCode.CONFIG_ERROR, done.stdout[-2000:]
    assert "2 ranks" in done.stdout and "pytorch/pytorch#190433" in done.stdout and "Traceback" not in done.stdout
    assert not (tmp_path / "out" / "trainer_state.json").exists()


def test_gpu_visibility_is_composed_as_rocm_applies_it():
    from rocmft.validate.rules.runtime import visible_gpus

    assert visible_gpus({}, "rocm") == (None, [])
    assert visible_gpus({"ROCR_VISIBLE_DEVICES": "2,3"}, "rocm") == (["2", "3"], [])
    physical, warnings = visible_gpus({"ROCR_VISIBLE_DEVICES": "4,5,6,7", "HIP_VISIBLE_DEVICES": "1,3"}, "rocm")
    assert physical == ["5", "7"] and "applied one after the other" in warnings[0]
    # the classic mistake: the same physical ids in both hide every GPU
    with pytest.raises(ConfigError) as caught:
        visible_gpus({"ROCR_VISIBLE_DEVICES": "2,3", "HIP_VISIBLE_DEVICES": "2,3"}, "rocm")
    text = str(caught.value)
    assert "ROCR_VISIBLE_DEVICES=2,3 (set in the environment)" in text and "see 0 GPU(s)" in text
    assert "ROCR_VISIBLE_DEVICES=2,3" in caught.value.remedy
    with pytest.raises(ConfigError):
        visible_gpus({"HIP_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": "1"}, "rocm")
    # on NVIDIA only CUDA_VISIBLE_DEVICES counts (the benchmarks set HIP_ as well)
    assert visible_gpus({"HIP_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": "1"}, "cuda") == (["1"], [])
    assert visible_gpus({"HIP_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": "0"}, "rocm") == (["0"], [])


def test_render_prints_the_rank_to_gpu_map_and_refuses_hidden_gpus(render_env, monkeypatch, capsys):
    """Through render with an MI300X's probe result (injected: the CPU cannot show one)."""
    from rocmft.facts.device import DeviceFacts

    mi300x = DeviceFacts(backend="rocm", count=2, names=["AMD Instinct MI300X"] * 2, archs=["gfx942"] * 2,
                         memory_gib=[191.98] * 2, bf16=True)  # fmt: skip
    monkeypatch.setenv("ROCR_VISIBLE_DEVICES", "6,7")
    render_env({}, device=mi300x)
    assert "local rank 0 -> GPU 6, local rank 1 -> GPU 7" in capsys.readouterr().out
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "6,7")
    with pytest.raises(ConfigError, match="hides GPUs"):
        render_env({}, device=mi300x)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(values=st.dictionaries(st.sampled_from(["PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF",
                                               "PYTORCH_CUDA_ALLOC_CONF", "ROCR_VISIBLE_DEVICES",
                                               "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES",
                                               "PYTORCH_TUNABLEOP_ENABLED", "PYTORCH_TUNABLEOP_TUNING"]),
                              st.one_of(st.text(max_size=40), st.sampled_from(["²", "0,²", "max_split_size_mb:²",
                                                                               "[", "a:b:c", ",,", " : "]))),
       backend=st.sampled_from(["rocm", "cuda", "cpu"]), world=st.integers(0, 16))  # fmt: skip
def test_the_runtime_rules_answer_any_text_with_their_own_error(values, backend, world):
    """Whatever these variables hold: a result, or rocmft's ConfigError naming the variable (the fuzz test of every
    setting, tests/test_fuzz_inputs.py, does not know these: torch reads them, not rocmft's settings)."""
    from rocmft.validate.rules.runtime import visible_gpus

    for check in (lambda: allocator_findings(values), lambda: visible_gpus(values, backend),
                  lambda: tunableop_online_tuning(values, world)):  # fmt: skip
        try:
            check()
        except ConfigError as err:
            assert any(name in str(err) for name in values), str(err)
