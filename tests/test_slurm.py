"""deploy/slurm/train.sbatch submitted with a real ``sbatch`` to a real Slurm cluster: the two-node cluster on this
host that ``make slurm-ready`` starts (deploy/slurm/local-cluster.sh), or any cluster ``sinfo`` answers for with
two idle nodes. Each job runs the built-in default (tiny model, demo data) on the CPU with gloo, without a
container (ROCMFT_CONTAINER=none, this checkout's .venv on PATH), as a site install would.

Both launch modes of the same template: node mode (``--ntasks-per-node=1``: rocmft starts torchrun on each node)
and task mode (``--ntasks-per-node=2``: four ranks started by srun, no torchrun); and in each mode a stop with
``scancel --signal=TERM`` followed by ``scontrol requeue``, which must resume from the stop's checkpoint to the
uninterrupted run's loss. A failing test prints the job's batch log and every task's log.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import REPO, _clean_environment
from rocmft.errors import ExitCode

pytestmark = [pytest.mark.slurm, pytest.mark.train]

TEMPLATE = REPO / "deploy" / "slurm" / "train.sbatch"
# Slurm's job states after which a job runs no more (man squeue, JOB STATE CODES); a requeued job goes back to
# PENDING, so a test that requeues waits again.
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL",
         "DEADLINE"}  # fmt: skip
# How long one job may take before the test fails: measured 3.6 min for a node-mode job of 10 steps on this
# 2-core machine while other test suites ran beside it (the two LLaMA-Factory imports took 54 s each); twice that.
JOB_TIMEOUT_S = 480
# The settings of every job (the uninterrupted runs and the stopped-and-resumed ones are the same, so their losses
# compare): enough steps that a stop requested after step 3 arrives before the run ends (a CPU step of the tiny
# model took 0.2-0.3 s here in both modes).
RUN = {"MAX_STEPS": "60", "LOGGING_STEPS": "1"}
TASKS_PER_NODE = {"node": 1, "task": 2}


@pytest.fixture(scope="module")
def cluster() -> None:
    """Skips unless ``sinfo`` answers with at least two responding nodes (make slurm-ready starts them here)."""
    if not shutil.which("sbatch") or not shutil.which("sinfo"):
        pytest.skip("no Slurm here (sbatch/sinfo not on PATH): `make slurm-ready` starts the local two-node cluster")
    try:
        nodes = subprocess.run(["sinfo", "--noheader", "--responding", "--Node", "--format=%N"], capture_output=True,
                               text=True, timeout=30)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.skip("sinfo did not answer in 30 s: no slurmctld is running (`make slurm-ready`)")
    if nodes.returncode != 0 or len(set(nodes.stdout.split())) < 2:
        answer = (nodes.stderr or nodes.stdout)[-300:]
        pytest.skip(f"no Slurm cluster with two responding nodes answers sinfo ({answer!r}): `make slurm-ready` "
                    "starts the local one (as root)")  # fmt: skip


@dataclass
class Job:
    """A submitted job: its id, the folder its logs and OUTPUT_DIR are in."""

    id: str
    folder: Path

    @property
    def output(self) -> Path:
        return self.folder / "out"

    def task_logs(self) -> list[Path]:
        return sorted((self.folder / "logs").glob(f"*-{self.id}-node*-task*.out"))

    def logs(self, tail: int = 6000) -> str:
        """The batch shell's log and each task's log (their last ``tail`` characters), for failure messages."""
        parts = []
        for path in [*sorted(self.folder.glob(f"batch-{self.id}.out")), *self.task_logs()]:
            parts.append(f"----- {path.name}\n{path.read_text(errors='replace')[-tail:]}")
        return "\n".join(parts) or f"(no logs in {self.folder})"

    def show(self) -> dict[str, str]:
        """``scontrol show job`` as a dict (JobState, ExitCode, Restarts, ...)."""
        text = subprocess.run(["scontrol", "show", "job", "--oneliner", self.id], capture_output=True, text=True,
                              check=True).stdout  # fmt: skip
        return dict(item.split("=", 1) for item in text.split() if "=" in item)

    def wait(self, timeout: float = JOB_TIMEOUT_S) -> dict[str, str]:
        """Polls ``scontrol show job`` until the job has ended; fails the test (cancelling it) after ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = self.show()
            if info["JobState"] in ENDED:
                return info
            time.sleep(2)
        subprocess.run(["scancel", self.id], check=False)
        pytest.fail(f"Slurm job {self.id} did not end within {timeout:.0f} s ({info['JobState']}):\n{self.logs()}")

    def wait_for_text(self, text: str, timeout: float = JOB_TIMEOUT_S) -> None:
        """Waits until a task log holds ``text``; fails the test (cancelling the job) after ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(text in path.read_text(errors="replace") for path in self.task_logs()):
                return
            if self.show()["JobState"] in ENDED:
                pytest.fail(f"job {self.id} ended before a task printed {text!r}:\n{self.logs()}")
            time.sleep(0.5)
        subprocess.run(["scancel", self.id], check=False)
        pytest.fail(f"no task of job {self.id} printed {text!r} within {timeout:.0f} s:\n{self.logs()}")


def submit(folder: Path, cache_dir: Path, ntasks_per_node: int, env: dict[str, str] | None = None) -> Job:
    """``sbatch`` the template on two nodes with ``ntasks_per_node`` tasks each (one CPU per task, no GPU),
    OUTPUT_DIR and every log in ``folder``, the session's rocmft cache, rocmft from this checkout."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tmp").mkdir(exist_ok=True)
    environ = _clean_environment()
    environ.update({
        "PATH": f"{REPO / '.venv' / 'bin'}{os.pathsep}{environ.get('PATH', '')}",
        "PYTHONPATH": str(REPO / "entrypoint"),  # this checkout's rocmft, also in a worktree of another's .venv
        "ROCMFT_CONTAINER": "none", "CONFIG": "", "TASK_LOG": str(folder / "logs" / "%x-%j-node%n-task%t.out"),
        "OUTPUT_DIR": str(folder / "out"), "ROCMFT_CACHE_DIR": str(cache_dir), "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1", "TMPDIR": str(folder / "tmp"),
        # the CPU with gloo: the GPU count check is skipped, as a CPU-only user would (tests/test_resilience.py)
        "ROCMFT_DISTRIBUTED": "ddp", "ROCMFT_SKIP_CHECKS": "gpu-runtime",
        # one thread per rank and one tokenizing process: the machine has 2 cores for up to 4 ranks
        "OMP_NUM_THREADS": "1", "PREPROCESSING_NUM_WORKERS": "1",
    })  # fmt: skip
    environ.update(env or {})
    command = ["sbatch", "--parsable", f"--chdir={folder}", f"--output={folder}/batch-%j.out",
               f"--job-name=rocmft-test-{ntasks_per_node}", "--nodes=2", f"--ntasks-per-node={ntasks_per_node}",
               "--cpus-per-task=1", "--gpus-per-node=0", "--time=20", str(TEMPLATE)]  # fmt: skip
    submitted = subprocess.run(command, env=environ, capture_output=True, text=True, timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    return Job(submitted.stdout.strip().split(";")[0], folder)


def final_loss(output: Path) -> tuple[int, float]:
    """(step, loss) of the last logged loss in trainer_state.json."""
    history = json.loads((output / "trainer_state.json").read_text())["log_history"]
    last = [h for h in history if "loss" in h][-1]
    return last["step"], last["loss"]


def assert_one_run_record(job: Job, mode: str, world_size: int) -> dict:
    """The assertions both modes share: node 0 (rank 0) alone wrote the run's outputs and its record says
    Slurm, two nodes, ``mode``, ``world_size`` ranks trained together; the other record folders
    (``rocmft-node1``, ``rocmft-rank<r>``) hold no summary and no weights. Returns the manifest."""
    output, logs = job.output, job.logs()
    manifest = json.loads((output / "rocmft" / "manifest.json").read_text())
    layout = manifest["job"]
    assert (layout["engine"], layout["nnodes"], layout["mode"], layout["job_id"]) == ("slurm", 2, mode, job.id), (
        f"{layout}\n{logs}")  # fmt: skip
    if mode == "task":
        assert layout["world_size"] == world_size and layout["rank"] == 0, f"{layout}\n{logs}"
    assert manifest["status"] == "finished", f"{manifest['status']}\n{logs}"
    # the worker's own record of the ranks that trained together: one run across both nodes, not two runs
    assert manifest["worker"]["world_size"] == world_size, f"{manifest['worker']}\n{logs}"
    assert (output / "run_summary.md").is_file(), logs
    assert list(output.glob("*.safetensors")), logs  # the built-in default's weights (a full fine-tune)
    others = sorted(p for p in output.glob("rocmft-*") if p.name != "rocmft-history")
    for record in others:  # node N's run record: no outputs of its own
        assert not list(record.rglob("run_summary.md")) and not list(record.rglob("*.safetensors")), f"{record}\n{logs}"
    return manifest


def assert_each_task_ran(job: Job, mode: str, tasks: int) -> None:
    """One log per task (%n node, %t task in srun's --output), each from a rocmft that placed itself where the
    file name says (its printed job layout) and trained."""
    import re

    task_logs = job.task_logs()
    assert len(task_logs) == tasks, f"{[p.name for p in task_logs]}\n{job.logs()}"
    for path in task_logs:
        node, task = re.search(r"-node(\d+)-task(\d+)\.out$", path.name).groups()
        text = path.read_text(errors="replace")
        place = f"this is node {node};" if mode == "node" else f"this is rank {task} (local"
        assert f"[rocmft] job: Slurm job {job.id}" in text and place in text, (
            f"{path.name}: no {place!r}\n{text[-3000:]}"
        )
        assert "[rocmft] training finished in" in text, f"{path.name}\n{text[-3000:]}"


def run_whole(tmp_path_factory, cache_dir, mode: str) -> tuple[Job, dict[str, str], float]:
    """The uninterrupted job of ``mode`` (node: two nodes, one task each; task: two tasks each), run once per
    module: (job, its final scontrol record, wall seconds)."""
    started = time.monotonic()
    job = submit(tmp_path_factory.mktemp(f"slurm-{mode}"), cache_dir, TASKS_PER_NODE[mode], RUN)
    info = job.wait()
    return job, info, time.monotonic() - started


@pytest.fixture(scope="module")
def whole_runs(cluster, tmp_path_factory, cache_dir, tiny_model) -> dict:
    """mode -> the uninterrupted job of that mode, submitted on first use. ``tiny_model`` builds the model in
    the cache before any job, so that the nodes do not both build it."""
    runs: dict = {}

    def get(mode: str) -> tuple[Job, dict[str, str], float]:
        if mode not in runs:
            runs[mode] = run_whole(tmp_path_factory, cache_dir, mode)
        return runs[mode]

    return get


def test_node_mode_two_nodes_one_task_each_runs_one_run_from_node_0(whole_runs):
    job, info, seconds = whole_runs("node")
    print(f"node-mode job {job.id}: {seconds:.0f} s")
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), f"{info}\n{job.logs()}"
    assert_one_run_record(job, "node", world_size=2)
    assert_each_task_ran(job, "node", 2)


def test_task_mode_two_nodes_two_tasks_each_runs_four_ranks_without_torchrun(whole_runs):
    job, info, seconds = whole_runs("task")
    print(f"task-mode job {job.id}: {seconds:.0f} s")
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), f"{info}\n{job.logs()}"
    assert_one_run_record(job, "task", world_size=4)
    assert_each_task_ran(job, "task", 4)
    assert "torch.distributed.run" not in job.logs(tail=10**9)  # srun started the ranks, not torchrun


# Both modes: Slurm signals every process of the step, not only the task (slurmstepd: "*** STEP N.0 CANCELLED ***"),
# so torchrun, the ranks and their DataLoader workers all get the SIGTERM, besides rocmft's own forward. Before
# main's cf06545 (torchrun started with the signals blocked, a repeat within 5 s the same request) node mode
# stopped with no checkpoint here (job 8: torchrun "Received 15 death signal, shutting down workers").
@pytest.mark.parametrize("mode", ["node", "task"])
def test_scancel_term_stops_with_a_checkpoint_and_the_requeued_job_resumes_to_the_same_loss(
    whole_runs, tmp_path, cache_dir, mode
):
    """``scancel --signal=TERM`` signals the steps (not the batch shell: man scancel), each rocmft stops at its
    next optimizer step with a checkpoint; ``scontrol requeue`` of the ended job runs the script again under the
    same id (and OUTPUT_DIR), which resumes from that checkpoint and ends at the uninterrupted run's loss (same
    mode and settings; fp32 on the CPU, so 1e-5 relative as in tests/test_resilience.py).

    Slurm makes a requeued job wait about 120 s (its EligibleTime, seen on the local cluster); the test sets its
    begin time to now (``scontrol update StartTime=now``), as an operator may, instead of waiting."""
    whole, whole_info, _ = whole_runs(mode)
    assert whole_info["JobState"] == "COMPLETED", whole.logs()
    started = time.monotonic()
    job = submit(tmp_path / "stop", cache_dir, TASKS_PER_NODE[mode], RUN)
    job.wait_for_text("[rocmft] step 3/")
    subprocess.run(["scancel", "--signal=TERM", job.id], check=True)
    info = job.wait()
    assert info["ExitCode"] == f"{ExitCode.INTERRUPTED}:0", f"{info}\n{job.logs()}"
    result = json.loads((job.output / "rocmft" / "worker-result.json").read_text())
    # stopped at a step, with a checkpoint
    assert result.get("stopped_at_step"), f"worker status {result.get('status')}\n{job.logs()}"
    checkpoint = job.output / f"checkpoint-{result['stopped_at_step']}"
    ranks = TASKS_PER_NODE[mode] * 2 if mode == "task" else 2
    for name in ("trainer_state.json", "model.safetensors", "optimizer.pt", *(f"rng_state_{r}.pth" for r in
                 range(ranks))):  # fmt: skip
        assert (checkpoint / name).is_file(), f"{name}: {sorted(p.name for p in checkpoint.glob('*'))}\n{job.logs()}"
    assert json.loads((job.output / "rocmft" / "manifest.json").read_text())["status"] == "interrupted"

    requeued = subprocess.run(["scontrol", "requeue", job.id], capture_output=True, text=True)
    assert requeued.returncode == 0, f"scontrol requeue {job.id} of the ended job refused: {requeued.stderr}"
    # Not in the second the job ended: slurmd revokes the ended job's credential with a time stamp of whole seconds,
    # and a restart allocated within it is killed ("Killing non-startable batch JobId=29: Job credential revoked" in
    # slurmctld.log, 0.3 s after the end, in a clean-clone rehearsal 2026-12-05). Slurm's own ~120 s wait avoids it.
    time.sleep(2)
    subprocess.run(["scontrol", "update", f"JobId={job.id}", "StartTime=now"], check=True)
    again = job.wait()
    print(f"{mode}-mode stop and requeue, job {job.id}: {time.monotonic() - started:.0f} s")
    assert (again["JobState"], again["ExitCode"], again["Restarts"]) == ("COMPLETED", "0:0", "1"), (
        f"{again}\n{job.logs()}"
    )
    assert f"resuming from {checkpoint}" in job.logs(tail=10**9), job.logs()
    step, loss = final_loss(job.output)
    whole_step, whole_loss = final_loss(whole.output)
    assert step == whole_step and loss == pytest.approx(whole_loss, rel=1e-5), job.logs()


def standin_apptainer(folder: Path) -> Path:
    """A stand-in ``apptainer`` (this host has none) in ``folder``/bin, for ``apptainer exec [options] IMAGE
    COMMAND...``: it runs COMMAND on this host with only what ``--containall`` lets in, the ``APPTAINERENV_*``
    variables without their prefix (Apptainer's user guide, "Environment and metadata"), APPTAINER_CONTAINER as
    Apptainer sets it inside, HOME in the --workdir, and this checkout's .venv on PATH as the image's own. Like the
    real one it never runs the image's entry script (docker's ENTRYPOINT): the point of issue 31, finding 4."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "apptainer"
    script.write_text(f"""#!/bin/bash
[[ $1 == exec ]] || {{ echo "stand-in apptainer: only exec" >&2; exit 64; }}
shift
workdir=/tmp
while [[ $1 == -* ]]; do
  case $1 in
    --workdir) workdir=$2; shift 2 ;;
    --bind) shift 2 ;;
    *) shift ;;
  esac
done
[[ -f $1 ]] || {{ echo "stand-in apptainer: no image $1" >&2; exit 255; }}
image=$1
shift
inside=(PATH={REPO / ".venv" / "bin"}:/usr/bin:/bin HOME="$workdir" APPTAINER_CONTAINER="$image")
for name in $(compgen -e); do
  [[ $name == APPTAINERENV_* ]] && inside+=("${{name#APPTAINERENV_}}=${{!name}}")
done
exec env -i "${{inside[@]}}" "$@"
""")
    script.chmod(0o755)
    return bin_dir


def test_the_arch_profiles_runtime_settings_reach_a_task_started_through_apptainer_exec(cluster, tmp_path, cache_dir,
                                                                                         tiny_model):  # fmt: skip
    """Issue 31, finding 4: train.sbatch runs ``apptainer exec ... rocmft train``, which skips the image's entry
    script, until then the only place the profile's RUNTIME_ lines were exported. rocmft's launch applies them
    itself: an injected profile (ARCH_PROFILE, passed into the container with PASS_VARS) reaches each node's launch,
    recorded with its source in the manifest, and the user's own NCCL_DEBUG wins."""
    profile = tmp_path / "site-gfx.env"
    profile.write_text("ARCH=cpu\nRUNTIME_GPU_MAX_HW_QUEUES=2\nRUNTIME_HSA_NO_SCRATCH_RECLAIM=1\n"
                       "RUNTIME_NCCL_DEBUG=WARN\n")  # fmt: skip
    image = tmp_path / "rocmft.sif"
    image.write_text("stand-in image\n")
    bin_dir = standin_apptainer(tmp_path)
    passed = "OUTPUT_DIR PYTHONPATH PYTHONUNBUFFERED TMPDIR OMP_NUM_THREADS PREPROCESSING_NUM_WORKERS MAX_STEPS " \
             "LOGGING_STEPS ARCH_PROFILE"  # fmt: skip
    env = {"ROCMFT_CONTAINER": "apptainer", "IMAGE": str(image), "PASS_VARS": passed, "ARCH_PROFILE": str(profile),
           "NCCL_DEBUG": "INFO", "MAX_STEPS": "2", "LOGGING_STEPS": "1",
           "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}  # fmt: skip
    job = submit(tmp_path / "job", cache_dir, 1, env)
    info = job.wait()
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), f"{info}\n{job.logs()}"
    manifest = json.loads((job.output / "rocmft" / "manifest.json").read_text())
    launch = manifest["launch"]
    assert launch["environment"].get("GPU_MAX_HW_QUEUES") == "2", f"{launch['environment']}\n{job.logs()}"
    assert launch["environment"].get("HSA_NO_SCRATCH_RECLAIM") == "1"
    changes = {c["variable"]: c for c in launch["changes"]}
    assert changes["GPU_MAX_HW_QUEUES"]["source"] == f"RUNTIME_ line of {profile}", changes
    assert launch["communication"]["NCCL_DEBUG"] == {"value": "INFO", "source": "user"}
    assert "NCCL_DEBUG" not in launch["environment"]
    assert f"GPU_MAX_HW_QUEUES=2: the cpu profile's runtime default (RUNTIME_ line of {profile})" in job.logs(10**9)


def test_a_refused_configuration_ends_the_job_with_the_tasks_code_and_leaves_no_run_folder(
    cluster, tmp_path, cache_dir, tiny_model
):
    """Issue 31, finding 9: four ranks (task mode) whose configuration LLaMA-Factory refuses (a model and no
    DATASET): the first rank to refuse exits 2 and srun --kill-on-bad-exit stops the others with SIGTERM (143), and
    srun returns the highest code, 143. The job must end with the task's own code, 2, and leave no saves/<run>/
    behind: not the run folder, not a staging folder of a rank stopped while preparing, not the exit-code folder."""
    folder = tmp_path / "job"
    run = folder / "saves" / "refused"
    job = submit(folder, cache_dir, 2, {"MODEL_NAME_OR_PATH": str(tiny_model), "OUTPUT_DIR": str(run),
                                        "SAVES": str(folder / "saves")})  # fmt: skip
    info = job.wait()
    logs = job.logs(tail=10**9)
    assert "CONFIGURATION ERROR" in logs and "Please specify dataset" in logs, logs
    assert (info["JobState"], info["ExitCode"]) == ("FAILED", f"{ExitCode.CONFIG_ERROR}:0"), f"{info}\n{logs}"
    assert not run.exists(), f"{sorted(str(p) for p in run.rglob('*'))}\n{logs}"
    assert not list((folder / "saves").iterdir()) and not list((folder / "logs").glob(".rocmft-*")), logs
