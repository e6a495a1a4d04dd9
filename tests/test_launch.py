"""The launch on the CPU: the torchrun command and environment, multi-node variables, NUMA binding against a
recorded 2-socket 8-GPU host layout (tests/data/sysfs), and the refusals of impossible distributed settings."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rocmft.errors import ConfigError
from rocmft.facts.device import facts_from_probe
from rocmft.facts.probes import Probes
from rocmft.launch import communication_environment, full_node_environment, graceful_stop_targets, prepare_launch

REPO = Path(__file__).resolve().parents[1]
TWO_SOCKET = Path(__file__).parent / "data" / "sysfs" / "two-socket-8gpu"
# the PCI addresses of the recorded layout's GPUs, in torch's device order
PCI = ["0000:05:00.0", "0000:26:00.0", "0000:46:00.0", "0000:65:00.0",
       "0000:85:00.0", "0000:a6:00.0", "0000:c6:00.0", "0000:e5:00.0"]  # fmt: skip


def eight_gpus() -> dict:
    """The device probe's shape for 8 MI300X (as rocmft.facts.probe reports it), with the layout's PCI addresses."""
    gpus = [{"index": i, "name": "AMD Instinct MI300X", "arch": "gfx942:sramecc+:xnack-", "total_gib": 191.98,
             "free_gib": 191.4, "bf16": True, "pci": pci, "gemm": {}} for i, pci in enumerate(PCI)]  # fmt: skip
    return {"backend": "rocm", "torch": "2.11.0+rocm7.1", "hip": "7.1.0", "cuda": None, "visible": {}, "gpus": gpus}


@pytest.fixture
def launch_plan(render_env, monkeypatch):
    """render + device probe + prepare_launch against the recorded layout, numactl present: the plan and its launch
    record (rocmft.launch.LaunchSpec.as_record, as the manifest saves it)."""
    for name in ("NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "NCCL_SOCKET_IFNAME",
                 "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA", "NPROC_PER_NODE"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)

    def run(environ: dict[str, str], launch_env: dict[str, str] | None = None):
        for name, value in (launch_env or {}).items():
            monkeypatch.setenv(name, value)
        probe = eight_gpus()
        plan = render_env({"DATASET": "identity", **environ}, device=facts_from_probe(probe))
        probes = Probes(seeded={"devices": probe})
        launch = prepare_launch(plan, probes, root=TWO_SOCKET, numactl=True, allowed_cpus=set(range(192)))  # 192 CPUs
        return plan, launch.as_record()

    return run


def test_torchrun_command_for_a_node_of_a_multi_node_job(launch_plan):
    plan, launch = launch_plan(
        {"ROCMFT_DISTRIBUTED": "deepspeed"},
        {"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"},
    )
    command = launch["command"]
    assert command[1:3] == ["-m", "torch.distributed.run"]
    assert command[-3:] == ["-m", "rocmft.worker", str(plan.run_dir)]
    text = " ".join(command)
    assert "--nnodes 2 --node_rank 1 --nproc_per_node 8 --master_addr 10.0.0.1 --master_port 29500" in text
    assert f"--log-dir {plan.run_dir / 'logs'} --tee 3 --numa-binding node" in text
    assert plan.run_dir.name == "rocmft-node1"  # node 0 alone writes OUTPUT_DIR/rocmft
    env = launch["environment"]
    assert env["FORCE_TORCHRUN"] == "1"
    assert env["NCCL_SOCKET_IFNAME"] == "=eth0" and env["GLOO_SOCKET_IFNAME"] == "eth0"
    assert env["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1"
    numa = launch["numa"]
    assert numa["enabled"] and [r["numa_node"] for r in numa["per_rank"]] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert numa["per_rank"][5]["cpus"] == "48-95,144-191"


def test_single_node_adds_no_network_variables_and_the_users_values_win(launch_plan):
    _, launch = launch_plan({"ROCMFT_DISTRIBUTED": "ddp", "ROCMFT_NPROC_PER_NODE": "2"})
    profile = {c["variable"] for c in launch["changes"] if c["source"].startswith("RUNTIME_ line of ")}  # NCCL_DEBUG
    assert not any(k.startswith(("NCCL_", "GLOO_")) for k in set(launch["environment"]) - profile)
    assert "--nnodes 1 --node_rank 0 --nproc_per_node 2" in " ".join(launch["command"])
    _, mine = launch_plan({"ROCMFT_DISTRIBUTED": "ddp"}, {"NNODES": "2", "NCCL_SOCKET_IFNAME": "ib0",
                                                      "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"})  # fmt: skip
    assert "NCCL_SOCKET_IFNAME" not in mine["environment"]
    assert mine["communication"]["NCCL_SOCKET_IFNAME"] == {"value": "ib0", "source": "user"}


def test_numa_binding_off_and_one_process(launch_plan):
    _, off = launch_plan({"ROCMFT_DISTRIBUTED": "ddp", "ROCMFT_NUMA_BIND": "off"})
    assert "--numa-binding" not in off["command"] and not off["numa"]["enabled"]


@pytest.mark.parametrize(("launch_env", "environ", "words"), [
    ({"WORLD_SIZE": "4"}, {"ROCMFT_DISTRIBUTED": "ddp"},
     "WORLD_SIZE=4 (set in the environment) disagrees with NNODES=1 (not set: one node) x 8"),
    ({"NNODES": "2", "NODE_RANK": "2"}, {"ROCMFT_DISTRIBUTED": "ddp"}, "rank 2 (NODE_RANK=2) is not below"),
    ({"NNODES": "2"}, {"ROCMFT_DISTRIBUTED": "ddp"}, "no rendezvous: MASTER_ADDR and MASTER_PORT unset"),
    ({"NNODES": "two"}, {"ROCMFT_DISTRIBUTED": "ddp"}, "NNODES='two'"),
])  # fmt: skip
def test_inconsistent_node_variables_are_refused(launch_plan, launch_env, environ, words):
    with pytest.raises(ConfigError) as caught:
        launch_plan(environ, launch_env)
    assert words in str(caught.value)


def test_communication_settings_name_their_source(tmp_path):
    profile = tmp_path / "arch.env"
    profile.write_text("ARCH=gfx942\nRUNTIME_NCCL_MIN_NCHANNELS=112\nRUNTIME_NCCL_DEBUG=WARN\n")
    environ = {"NCCL_MIN_NCHANNELS": "112", "NCCL_DEBUG": "INFO", "HIP_VISIBLE_DEVICES": "0,1", "PATH": "/bin"}
    found = communication_environment(environ, {"NCCL_SOCKET_IFNAME": "=eth0"}, profile)
    assert found == {  # the user's own values, even the one equal to the profile's: the launch added neither
        "NCCL_DEBUG": {"value": "INFO", "source": "user"},
        "NCCL_MIN_NCHANNELS": {"value": "112", "source": "user"},
        "NCCL_SOCKET_IFNAME": {"value": "=eth0", "source": "rocmft"},
    }
    found = communication_environment({}, {"NCCL_DEBUG": "WARN"}, profile)
    assert found == {"NCCL_DEBUG": {"value": "WARN", "source": "arch profile"}}
    why = {"NCCL_SOCKET_IFNAME": "the default route's interface"}
    found = communication_environment(environ, {"NCCL_SOCKET_IFNAME": "=eth0"}, profile, reasons=why)
    assert found["NCCL_SOCKET_IFNAME"]["source"] == "rocmft: the default route's interface"


def test_the_arch_profiles_runtime_settings_reach_the_worker_and_the_users_own_value_wins(launch_plan, tmp_path,
                                                                                          monkeypatch):  # fmt: skip
    """Issue 31, finding 4: rocmft's launch itself applies the profile's RUNTIME_<NAME> lines, not only the image's
    entry script (which `apptainer exec ... rocmft train` and a bare-metal install skip). An injected profile
    (ARCH_PROFILE) reaches the worker's environment with its source in launch.changes and launch.communication;
    the user's NCCL_DEBUG wins and is not said. Without ARCH_PROFILE and outside an image, the shipped profile of the
    GPUs the probe found (8 x MI300X: docker/arch/gfx942.env) applies; an unreadable ARCH_PROFILE is refused."""
    from rocmft.launch import LaunchSpec

    profile = tmp_path / "site.env"
    profile.write_text("ARCH=gfx942\nRUNTIME_HSA_NO_SCRATCH_RECLAIM=1\nRUNTIME_GPU_MAX_HW_QUEUES=3\n"
                       "RUNTIME_NCCL_DEBUG=WARN\n")  # fmt: skip
    _, record = launch_plan({"ROCMFT_DISTRIBUTED": "ddp"}, {"ARCH_PROFILE": str(profile), "NCCL_DEBUG": "INFO"})
    worker = LaunchSpec.from_record(record).process_environment({"NCCL_DEBUG": "INFO", "PATH": "/bin"})
    assert worker["HSA_NO_SCRATCH_RECLAIM"] == "1" and worker["GPU_MAX_HW_QUEUES"] == "3", worker
    assert worker["NCCL_DEBUG"] == "INFO"
    changes = {c["variable"]: c for c in record["changes"]}
    assert changes["GPU_MAX_HW_QUEUES"]["source"] == f"RUNTIME_ line of {profile}", changes
    assert changes["GPU_MAX_HW_QUEUES"]["why"] == "the gfx942 profile's runtime default"
    assert "NCCL_DEBUG" not in changes and "NCCL_DEBUG" not in record["environment"]
    assert record["communication"]["GPU_MAX_HW_QUEUES"] == {"value": "3", "source": "arch profile"}
    assert record["communication"]["NCCL_DEBUG"] == {"value": "INFO", "source": "user"}

    monkeypatch.delenv("ARCH_PROFILE")
    monkeypatch.delenv("NCCL_DEBUG")
    _, shipped = launch_plan({"ROCMFT_DISTRIBUTED": "ddp"})
    assert shipped["environment"]["HIP_FORCE_DEV_KERNARG"] == "1" and shipped["environment"]["NCCL_DEBUG"] == "WARN"
    source = {c["variable"]: c["source"] for c in shipped["changes"]}["HIP_FORCE_DEV_KERNARG"]
    assert source.endswith("gfx942.env"), source

    with pytest.raises(ConfigError) as caught:
        launch_plan({"ROCMFT_DISTRIBUTED": "ddp"}, {"ARCH_PROFILE": str(tmp_path / "missing.env")})
    assert f"ARCH_PROFILE={tmp_path / 'missing.env'} cannot be read" in str(caught.value)


def test_full_node_settings_apply_only_when_every_gpu_of_the_node_runs():
    """gfx942's NCCL_MIN_NCHANNELS=112 is tuned for the 8-GPU mesh: added at 8 processes, not at 2 or 4, and
    never over the user's own value; the launch record names it as the profile's."""
    profile = REPO / "docker" / "arch" / "gfx942.env"
    assert full_node_environment(8, {}, profile) == {"NCCL_MIN_NCHANNELS": "112"}
    assert full_node_environment(2, {}, profile) == full_node_environment(4, {}, profile) == {}
    assert full_node_environment(8, {"NCCL_MIN_NCHANNELS": "32"}, profile) == {}
    assert full_node_environment(8, {}, REPO / "docker" / "arch" / "gfx1100.env") == {}
    found = communication_environment({}, full_node_environment(8, {}, profile), profile)
    assert found["NCCL_MIN_NCHANNELS"] == {"value": "112", "source": "arch profile, full node"}


def test_every_automatic_change_is_said_in_one_block_that_is_the_manifests(launch_plan, tmp_path, capsys):
    """Node 0 of a two-node job in an Apptainer container with ROCMFT_COLLECTIVES=safe, on the injected 8 x MI300X
    probe: the block rocmft prints before the checks (rocmft.changes.say_changes, called by the commands on
    LaunchSpec.changes) is the manifest's launch.changes line for line, and holds every variable the launch adds
    and every value the planner set: none is added unsaid."""
    from rocmft.changes import Change, change_lines, say_changes
    from rocmft.launch import LaunchSpec
    from rocmft.outputs.manifest import RunOutcome, now, write_manifest

    plan, record = launch_plan(
        {"ROCMFT_DISTRIBUTED": "ddp", "ROCMFT_COLLECTIVES": "safe", "TMPDIR": str(tmp_path / "local")},
        {"NNODES": "2", "NODE_RANK": "0", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500",
         "APPTAINER_CONTAINER": "/scratch/rocmft.sif"},
    )  # fmt: skip
    spec = LaunchSpec.from_record(record)
    capsys.readouterr()
    say_changes(spec.changes)
    printed = [line.removeprefix("[rocmft] ") for line in capsys.readouterr().out.splitlines()]
    path = write_manifest(tmp_path / "manifest.json", plan, probes={}, launch=spec, checks=None,
                          outcome=RunOutcome("running", None, now()))  # fmt: skip
    recorded = [Change.from_dict(c) for c in json.loads(path.read_text())["launch"]["changes"]]
    assert printed == change_lines(recorded), printed
    said = {line.strip().partition("=")[0] for line in printed[1:]}
    assert set(record["environment"]) <= said, set(record["environment"]) - said
    assert {name.upper() for name in plan.perf.planned_arguments()} <= said
    assert {"NCCL_SOCKET_IFNAME", "MIOPEN_USER_DB_PATH", "FORCE_TORCHRUN", "NCCL_P2P_DISABLE"} <= said
    assert "  NCCL_PROTO=Simple: RCCL's Simple protocol only" in "\n".join(printed)
    assert all(line.endswith(")") and ": " in line for line in printed[1:])  # <VARIABLE>=<value>: <why> (<source>)


def test_the_hang_restarts_settings_add_rccls_fallbacks_with_their_source_and_keep_the_users(render_env):
    """What `rocmft train` gives the attempt after a hang (rocmft.cli.train.restart_overrides, as ROCMFT_ON_HANG=retry
    makes it): ROCMFT_COLLECTIVES=safe and the checkpoint as overrides, never the user's; the launch adds the
    fallbacks the user did not set (NCCL_PROTO is theirs), each said with the restart as its source; and the
    timeout's words are found in the two backends' real messages."""
    from rocmft.changes import change_lines
    from rocmft.cli.train import restart_overrides
    from rocmft.records import Restart
    from rocmft.worker.peers import collective_timeout

    restart = Restart("collectives hang", 4, None, "fp32", "fp32", "default", "safe")
    plan = render_env({"DATASET": "identity", "NCCL_PROTO": "LL128"}, overrides=restart_overrides(restart))
    assert plan.settings.rocmft.collectives == "safe" and "collectives" not in plan.settings.explicit_rocmft
    launch = prepare_launch(plan)
    assert launch.environment["NCCL_P2P_DISABLE"] == "1" and launch.environment["HSA_ENABLE_SDMA"] == "0"
    assert "NCCL_PROTO" not in launch.environment  # the user's LL128 stays
    lines = "\n".join(change_lines(launch.changes))
    assert ("  ROCMFT_COLLECTIVES=safe: RCCL's safe fallbacks (the NCCL_/HSA_ lines below) (the restart after a "
            "collectives hang at step 4)") in lines  # fmt: skip
    assert "(ROCMFT_COLLECTIVES=safe, the restart after a collectives hang at step 4)" in lines
    assert "ROCMFT_RESUME=never" in lines  # no checkpoint: from step 0
    gloo = "[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 3000ms for recv " \
           "operation to complete"  # fmt: skip
    # gloo's as torch 2.11 printed it here (two ranks, a 3 s timeout); the watchdog's as in GAIR-NLP/DeepResearcher#16
    nccl = (
        "[rank3]:[E416 20:40:12.98] ProcessGroupNCCL.cpp:607] [Rank 3] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=8, OpType=ALLTOALL, Timeout(ms)=600000) ran for 600000 milliseconds"
    )
    assert collective_timeout(gloo) == "Timed out waiting 3000ms for recv operation to complete"
    assert collective_timeout(nccl).startswith("Watchdog caught collective operation timeout: WorkNCCL(SeqNum=8")
    assert collective_timeout("RuntimeError: CUDA out of memory") is None


@pytest.mark.parametrize("on_hang", ["retry", "stop"])
def test_a_watchdog_line_in_train_log_alone_calls_for_the_retry(render_env, capsys, on_hang):
    """On a GPU torch's watchdog aborts the rank that timed out, which writes no record: its line in train.log is
    what rocmft train reads (the words as in NVIDIA/nccl#1610). `retry` restarts from step 0 (no checkpoint)
    with ROCMFT_COLLECTIVES=safe; `stop` says why it does not."""
    from rocmft.cli.train import _hang_restart

    plan = render_env({"DATASET": "identity", "ROCMFT_ON_HANG": on_hang})
    plan.run_dir.mkdir(parents=True, exist_ok=True)
    (plan.run_dir / "train.log").write_text(
        "step 7 ...\n[rank1]:[E218 04:54:22.86 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective "
        "operation timeout: WorkNCCL(SeqNum=216, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1800045 ms\n"
    )
    restart = _hang_restart(plan, None, [])
    if on_hang == "stop":
        assert restart is None
        assert "a collective timed out; no automatic retry (ROCMFT_ON_HANG=stop;" in capsys.readouterr().out
        return
    assert restart.as_dict() == {"cause": "collectives hang", "at_step": None, "from_checkpoint": None,
                                 "precision": {"from": "fp32", "to": "fp32"},
                                 "collectives": {"from": "default", "to": "safe"}}  # fmt: skip
    said = capsys.readouterr().out
    assert "restarting once from step 0 (no complete checkpoint) with ROCMFT_COLLECTIVES=safe" in said
    assert plan.arguments["ddp_timeout"] == 1800  # the retry needs the hang to end


def test_a_secret_named_variable_is_never_shown_or_recorded():
    from rocmft.launch.changes import Added

    added = Added()
    added.add("WANDB_API_KEY", "k-123456", "a plug-in's credential", "a test")
    assert added.values == {"WANDB_API_KEY": "k-123456"}  # the worker still gets it
    assert "k-123456" not in added.changes["WANDB_API_KEY"].line()
    assert added.changes["WANDB_API_KEY"].as_dict()["value"] == "<redacted>"


def quantized_copy(tiny_model: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "tiny-gptq"
    shutil.copytree(tiny_model, folder)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_sharding_a_quantized_model_is_refused(render_env, tiny_model, tmp_path):
    quantized = str(quantized_copy(tiny_model, tmp_path))
    for environ in ({"ROCMFT_DISTRIBUTED": "deepspeed", "ROCMFT_ZERO_STAGE": "3"}, {"ROCMFT_DISTRIBUTED": "fsdp"}):
        with pytest.raises(ConfigError) as caught:
            render_env({**environ, "MODEL_NAME_OR_PATH": quantized, "DATASET": "identity"})
        assert "already quantized (gptq" in str(caught.value) and "cannot shard" in str(caught.value)
    # ZeRO-2 keeps whole weights per rank: allowed
    render_env({"ROCMFT_DISTRIBUTED": "deepspeed", "MODEL_NAME_OR_PATH": quantized, "DATASET": "identity"})


def test_only_4bit_bitsandbytes_is_shardable(render_env):
    with pytest.raises(ConfigError) as caught:
        render_env({"ROCMFT_DISTRIBUTED": "fsdp", "QUANTIZATION_BIT": "8", "DATASET": "identity"})
    assert "QUANTIZATION_BIT=8" in str(caught.value) and "FSDP" in str(caught.value)
    qlora = render_env({"ROCMFT_DISTRIBUTED": "deepspeed", "ROCMFT_ZERO_STAGE": "3", "QUANTIZATION_BIT": "4",
                        "DATASET": "identity"})  # fmt: skip
    assert qlora.arguments["quantization_bit"] == 4


@pytest.mark.slow  # starts rocmft, LLaMA-Factory's parser or a trainer as a process (not the fast layer)
def test_the_parser_process_becomes_the_worker_only_with_the_same_environment(render_env, shared_data):
    """A one-process `rocmft train` reuses the child that imported LLaMA-Factory and parsed the configuration;
    a torchrun command or an environment the child did not start with (variables that must be set before
    torch initialises) gets a fresh worker. A real child process and a real parse."""
    import os
    import sys

    from rocmft.validate import Validator

    plan = render_env({"DATASET": "identity", "DATASET_DIR": str(shared_data), "CUTOFF_LEN": "64"})
    child = Validator()
    try:
        result = child.parse({"arguments": plan.arguments, "environ": {}}, timeout=300)
        assert result is not None and result["ok"], result
        worker = [sys.executable, "-m", "rocmft.worker", str(plan.run_dir)]
        same = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_TOKEN": "hf_handedOverOnTrain1"}
        assert child.can_train(worker, same) is None
        assert child.can_train(worker, {**same, "HSA_NO_SCRATCH_RECLAIM": "1"}) == (
            "the launch changes HSA_NO_SCRATCH_RECLAIM"
        )
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", *worker[1:]]
        assert child.can_train(torchrun, same) == "the launch is not one plain worker process"
    finally:
        child.cancel()
    assert child.proc.poll() is not None  # cancel ends it


@pytest.mark.slow  # imports mlflow in a process of its own (about 4 s)
def test_a_variable_mlflows_import_sets_is_no_change_of_the_launch():
    """`rocmft train` said "a fresh worker process: the launch changes _MLFLOW_TELEMETRY_SESSION_ID" after the
    entrypoint had imported mlflow: a real `import mlflow` in a process started with this environment, and the
    environment it leaves is no change for the launch; a real setting still is."""
    from rocmft.validate import environment_changes

    # a user's machine: mlflow turns its telemetry (and the variable) off under pytest and CI markers
    # (mlflow/telemetry/utils.py, _is_ci_env_or_testing: PYTEST_CURRENT_TEST, CI, GITHUB_ACTIONS, ...)
    started = {k: os.environ[k] for k in ("PATH", "HOME", "PYTHONPATH", "LANG") if k in os.environ}
    code = "import json, os, mlflow; print(json.dumps(dict(os.environ)))"
    after = json.loads(subprocess.run([sys.executable, "-c", code], env=started, capture_output=True, text=True,
                                      check=True).stdout)  # fmt: skip
    assert "_MLFLOW_TELEMETRY_SESSION_ID" in after.keys() - started.keys()  # the premise: mlflow's import sets it
    assert environment_changes(started, after) == []
    assert environment_changes(started, {**after, "HSA_NO_SCRATCH_RECLAIM": "1"}) == ["HSA_NO_SCRATCH_RECLAIM"]


@pytest.mark.slow  # torchrun and two ranks
def test_a_first_stop_signal_goes_to_torchruns_ranks_not_to_torchrun_or_their_children(tmp_path):
    """Real torchrun on the CPU: each rank starts a child (as DataLoader workers are); the graceful stop's
    targets are exactly the ranks (rocmft.launch.graceful_stop_targets). One plain worker is its own target."""
    script = tmp_path / "rank.py"
    script.write_text(
        "import os, pathlib, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        "pathlib.Path(sys.argv[1], 'rank' + os.environ['RANK']).write_text(f'{os.getpid()} {child.pid}')\n"
        "time.sleep(120)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--log-dir", str(tmp_path / "logs"),
         "--tee", "3", str(script), str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("rank?"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        pids = [tuple(map(int, f.read_text().split())) for f in sorted(tmp_path.glob("rank?"))]
        assert len(pids) == 2, "torchrun did not start two ranks in 120 s"
        assert sorted(graceful_stop_targets(proc.pid, "torchrun")) == sorted(rank for rank, _ in pids)
        assert graceful_stop_targets(proc.pid, "python") == [proc.pid]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        for record in tmp_path.glob("rank?"):  # torchrun's ranks run in sessions of their own: not in its group
            for pid in map(int, record.read_text().split()):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def test_sigterm_while_a_run_is_prepared_removes_its_staging_folder_and_exits_143(start_rocmft, tmp_path, tiny_model):
    """Issue 31, finding 9: on Slurm, when one task refuses its configuration, srun --kill-on-bad-exit sends SIGTERM
    to the others while they still prepare (render, LLaMA-Factory's parse). Python's default for SIGTERM is to die
    at once, which left the staging folder in OUTPUT_DIR (an 'empty' saves/<run>/ to `ls`). Now it goes through the
    same cleanup as a refusal: the staging folder and the OUTPUT_DIR this run created are removed, exit 143."""
    output = tmp_path / "saves" / "stopped"
    proc = start_rocmft("train", env={"MODEL_NAME_OR_PATH": str(tiny_model), "OUTPUT_DIR": str(output)})
    deadline = time.monotonic() + 300
    while not list(output.glob(".rocmft-staging-*")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, f"rocmft ended before its staging folder appeared:\n{proc.communicate()[0][-3000:]}"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 143, f"{proc.returncode}\n{out[-3000:]}"
    assert not output.exists(), f"{sorted(p.name for p in output.iterdir())}\n{out[-3000:]}"
