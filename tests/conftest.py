"""Shared fixtures: the tiny model, the shared demo data, and a way to run `rocmft` as a user would.

Tests run the real `rocmft` command in a child process with a clean environment (the developer's own
ROCMFT_* and training variables removed), a private cache folder and HF_HUB_OFFLINE=1: nothing is
downloaded, as on CI. The command is rocmft's own entry point (rocmft.cli.main) started through the tests' launcher,
tests/support/rocmft_under_test.py (:data:`ROCMFT`), which alone takes the test hooks ROCMFT_TEST_PROBES and
ROCMFT_FAULT_* (rocmft.testhooks); without them set it is `python -m rocmft`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# `rocmft` under test: the launcher that installs the test hooks of its environment, then runs rocmft.cli.main
ROCMFT = (sys.executable, str(REPO / "tests" / "support" / "rocmft_under_test.py"))
PRODUCTION_ROCMFT = (sys.executable, "-m", "rocmft")  # as a user runs it: no test hooks, whatever the environment


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """LLaMA-Factory's demo data sets in ../shared/data (ENVIRONMENT.md)."""
    root = Path(os.environ.get("SHARED_DIR") or REPO.parent / "shared").resolve()  # tests run in other folders
    data = root / "data"
    if not (data / "alpaca_zh_demo.json").is_file():
        pytest.fail(f"the shared demo data is missing: expected {data}/alpaca_zh_demo.json (set SHARED_DIR)")
    return data


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    """One rocmft cache (tiny model, demo data) for the whole session."""
    return tmp_path_factory.mktemp("rocmft-cache")


@pytest.fixture(scope="session")
def tiny_model(cache_dir) -> Path:
    """The built-in tiny Qwen2 model folder (built once per session, ~2 s)."""
    from rocmft.config.demo import ensure_tiny_model

    return ensure_tiny_model(cache_dir)


@pytest.fixture(scope="session")
def demo_data(cache_dir) -> Path:
    """The built-in demo data set's folder (rocmft_demo)."""
    from rocmft.config.demo import ensure_demo_data

    return ensure_demo_data(cache_dir)


@pytest.fixture
def bf16_checkpoint(tmp_path, tiny_model) -> Path:
    """A copy of the tiny model stored in bf16 (weights and config dtype): a bf16-native checkpoint."""
    import shutil

    from transformers import AutoModelForCausalLM

    folder = tmp_path / "tiny-bf16"
    shutil.copytree(tiny_model, folder)
    AutoModelForCausalLM.from_pretrained(tiny_model, dtype="bfloat16").save_pretrained(folder)
    return folder


def _clean_environment() -> dict[str, str]:
    from rocmft.config.lfargs import env_arguments

    arguments = env_arguments()
    return {
        k: v
        for k, v in os.environ.items()
        if not k.upper().startswith("ROCMFT_") and k.upper() not in arguments and not k.startswith("PYTEST_")
    }


@pytest.fixture
def render_env(tmp_path, cache_dir, tiny_model):
    """render(environ) -> Plan, with OUTPUT_DIR and the cache in tmp_path, the tiny model unless overridden. The
    settings read the test's process environment (cleaned of rocmft's and the arguments' variables; a test sets
    the rest with monkeypatch) under ``environ``, as `rocmft render` reads its own; ``overrides``: a restart's
    (rocmft.config.settings.load_settings)."""

    def run(environ: dict[str, str], model: bool = True, device=None, overrides=None):
        base = {"ROCMFT_CACHE_DIR": str(cache_dir), "OUTPUT_DIR": str(tmp_path / "out")}
        if model:
            base["MODEL_NAME_OR_PATH"] = str(tiny_model)
        from rocmft.config.settings import load_settings

        settings = load_settings({**_clean_environment(), **base, **environ}, overrides=overrides,
                                 defer_unknown=True)  # as the commands that render read them  # fmt: skip

        def make_staging(output_dir: Path) -> Path:
            staging = tmp_path / "staging"
            staging.mkdir(parents=True, exist_ok=True)
            return staging

        from rocmft.facts.device import DeviceFacts
        from rocmft.validate.rules import render_checked

        return render_checked(settings, device or DeviceFacts(backend="cpu"), make_staging)

    return run


def short_temp_folder(folder: Path) -> Path:
    """The test's own temp folder for ``folder`` (`rocmft status` notes runs there), the same for every call: a short
    path in the system's temp folder. Python's multiprocessing and torch's DataLoader put AF_UNIX sockets there,
    whose paths may not exceed 107 bytes; under pytest-xdist (``.../popen-gw1/<test>/tmp/pymp-.../listener-...``)
    a folder under tmp_path is too long, and datasets' preprocessing workers fail with EOFError."""
    digest = hashlib.sha1(str(folder).encode()).hexdigest()[:12]
    short = Path(tempfile.gettempdir()) / f"rft-{digest}"
    short.mkdir(exist_ok=True)
    return short


def _rocmft_environment(tmp_path: Path, cache_dir: Path, env: dict[str, str] | None) -> dict[str, str]:
    environ = _clean_environment()
    environ.update({"ROCMFT_CACHE_DIR": str(cache_dir), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
                    "TMPDIR": str(short_temp_folder(tmp_path))})  # fmt: skip
    environ.update(env or {})
    return environ


def rocmft_in(folder: Path, cache_dir: Path, *args: str, env: dict[str, str] | None = None,
              timeout: float = 600, merge_stderr: bool = True,
              entry: tuple[str, ...] = ROCMFT) -> subprocess.CompletedProcess:  # fmt: skip
    """Run ``rocmft *args`` in ``folder`` with the tests' clean environment plus ``env``; stdout and stderr together
    in ``.stdout`` unless ``merge_stderr`` is False. ``entry``: :data:`ROCMFT` (test hooks in ``env`` honoured) or
    :data:`PRODUCTION_ROCMFT`, or the console script."""
    return subprocess.run([*entry, *args], cwd=folder,
                          env=_rocmft_environment(folder, cache_dir, env), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE, text=True,
                          timeout=timeout)  # fmt: skip


EXPORT_SECRET = "hf_rocmftExportSecret456"  # the LoRA run's HF_TOKEN: never written into what it leaves


@pytest.fixture(scope="session")
def work(tmp_path_factory) -> Path:
    """The folder of the shared LoRA run (``saves/tiny-lora``) and its export; tests that change a run copy it."""
    return tmp_path_factory.mktemp("after-training")


@pytest.fixture(scope="session")
def lora_env(work, tiny_model, demo_data) -> dict[str, str]:
    """The settings a user trained with (and, unchanged, exports with)."""
    return {
        "MODEL_NAME_OR_PATH": str(tiny_model),
        "FINETUNING_TYPE": "lora",
        "DATASET": "rocmft_demo",
        "DATASET_DIR": str(demo_data),
        "TEMPLATE": "qwen",
        "OUTPUT_DIR": str(work / "saves" / "tiny-lora"),
        "MAX_STEPS": "40",
        "LEARNING_RATE": "0.02",
        "PER_DEVICE_TRAIN_BATCH_SIZE": "8",
        "GRADIENT_ACCUMULATION_STEPS": "1",
        "LOGGING_STEPS": "5",
        "VAL_SIZE": "0.1",
        "EVAL_STRATEGY": "steps",
        "EVAL_STEPS": "20",
        "CUTOFF_LEN": "64",
        "ROCMFT_SAVES_DIR": str(work / "saves"),
        "HF_TOKEN": EXPORT_SECRET,
    }


@pytest.fixture(scope="session")
def lora_run(work, cache_dir, lora_env) -> Path:
    """A finished LoRA run of the tiny model (trained once per session, about a minute on 2 cores)."""
    result = rocmft_in(work, cache_dir, "train", env=lora_env, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:]
    return Path(lora_env["OUTPUT_DIR"])


@pytest.fixture(scope="session")
def exported(work, cache_dir, lora_env, lora_run) -> Path:
    """`rocmft export` of ``lora_run`` with the training settings and nothing else."""
    result = rocmft_in(work, cache_dir, "export", env=lora_env, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:]
    return lora_run.parent / f"{lora_run.name}-merged"


DEFAULT_SECRET = "hf_rocmftTestSecret123"  # the built-in default run's HF_TOKEN and HF_HUB_TOKEN: never written


@dataclass(frozen=True)
class DefaultRun:
    """The built-in default trained once per session: ``folder`` (its working folder: `rocmft status` there finds
    it), ``output`` (``folder/saves/rocmft-demo``) and ``stdout`` (what `rocmft train` printed, stderr included)."""

    folder: Path
    output: Path
    stdout: str


@pytest.fixture(scope="session")
def default_run(tmp_path_factory, cache_dir) -> DefaultRun:
    """`rocmft train` with no settings (the tiny model, the demo data, 240 steps; two to three minutes on 2 cores),
    given only the secrets HF_TOKEN and HF_HUB_TOKEN, as a new user runs it; read-only for its tests (one that
    changes it copies it). Trained once for every file that needs it (DEFAULT_FILES: one xdist group)."""
    folder = tmp_path_factory.mktemp("builtin-default")
    result = rocmft_in(folder, cache_dir, "train", env={"HF_TOKEN": DEFAULT_SECRET, "HF_HUB_TOKEN": DEFAULT_SECRET},
                       timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:]
    return DefaultRun(folder, folder / "saves" / "rocmft-demo", result.stdout)


@pytest.fixture(scope="session")
def default_export(default_run, cache_dir) -> Path:
    """`rocmft export` of :func:`default_run` with no settings: the merged model folder beside the run."""
    result = rocmft_in(default_run.folder, cache_dir, "export", timeout=900)
    assert result.returncode == 0, result.stdout[-3000:]
    return default_run.output.parent / f"{default_run.output.name}-merged"


@pytest.fixture
def run_rocmft(tmp_path, cache_dir):
    """Run ``rocmft <args>`` in a child process with ``env`` added to a clean environment.

    Returns the CompletedProcess (stdout and stderr together in ``.stdout``). The working folder is the
    test's tmp_path, so the default OUTPUT_DIR (saves/...) lands there.
    """

    def run(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
        return rocmft_in(tmp_path, cache_dir, *args, env=env, timeout=timeout)

    return run


@pytest.fixture
def rocmft_here(tmp_path, cache_dir):
    """:func:`run_rocmft`'s twin for `rocmft render|plan|check|status`: the command runs in the pytest process
    (tests/support/inprocess.py), with the environment, folder and test hooks the child would get, and returns the
    same CompletedProcess (``merge_stderr=False``: stderr apart). Saves the child's imports (~13 CPU-s each)."""
    from support.inprocess import probe_ahead, run_in_process

    probe_ahead(_rocmft_environment(tmp_path, cache_dir, None))  # the device probe, once per worker, not in the test

    def run(*args: str, env: dict[str, str] | None = None, merge_stderr: bool = True) -> subprocess.CompletedProcess:
        return run_in_process(tmp_path, _rocmft_environment(tmp_path, cache_dir, env), args, merge_stderr)

    return run


@pytest.fixture
def start_rocmft(tmp_path, cache_dir):
    """Start ``rocmft <args>`` like :func:`run_rocmft` but return the running Popen (stdout+stderr piped, text;
    into the file ``log`` instead when given).

    A test that waits for something else before it reads the pipe must pass ``log``: a pipe holds 64 KiB, and a
    rocmft whose console is not read stops writing train.log at once and stalls its training a little later
    (measured: two NNODES=2 nodes with unread pipes stopped train.log at 48.8 kB and trained on to step 490 of 5000,
    then no further; tests/test_resilience.py's lost-node test timed out waiting for checkpoint-20 in a clean-clone
    rehearsal, 2026-12-06)."""

    def start(*args: str, env: dict[str, str] | None = None, log: Path | None = None) -> subprocess.Popen:
        with open(log, "w") if log is not None else contextlib.nullcontext(subprocess.PIPE) as out:
            return subprocess.Popen(
                [*ROCMFT, *args], cwd=tmp_path, env=_rocmft_environment(tmp_path, cache_dir, env),
                stdout=out, stderr=subprocess.STDOUT, text=True,
            )  # fmt: skip

    return start


def logged_losses(output_dir: Path) -> list[float]:
    """The training losses LLaMA-Factory logged to trainer_log.jsonl, in order."""
    lines = (output_dir / "trainer_log.jsonl").read_text().splitlines()
    return [json.loads(line)["loss"] for line in lines if '"loss"' in line]


def all_text_under(folder: Path) -> str:
    """Every readable text file under ``folder`` concatenated (for leak checks)."""
    chunks = []
    for path in folder.rglob("*"):
        if path.is_file() and path.stat().st_size < 5_000_000:
            try:
                chunks.append(path.read_text(encoding="utf-8"))
            except UnicodeDecodeError:
                chunks.append(path.read_bytes().decode("latin-1"))
    return "\n".join(chunks)


class CheckoutCopy:
    """A copy of this checkout (tracked and untracked files) to change and build in: `make` there uses this
    checkout's .venv and never reinstalls it (an edited pyproject.toml in the copy would otherwise repoint the
    editable install at the copy)."""

    def __init__(self, root: Path) -> None:
        import shutil

        listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                                text=True, check=True).stdout.splitlines()  # fmt: skip
        self.root = root
        for name in listed:
            if (REPO / name).is_file():
                (root / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / name, root / name)

    def replace(self, path: str, old: str, new: str) -> None:
        """Replace ``old`` by ``new`` in the copy's ``path``; fails when ``old`` is not there (update the test)."""
        target = self.root / path
        text = target.read_text()
        assert old in text, f"{path} no longer has the text this test changes; update the test"
        target.write_text(text.replace(old, new))

    def make(self, *args: str, timeout: int = 3600) -> subprocess.CompletedProcess:
        """`make ARGS` in the copy, with BuildKit's full log (PROGRESS=plain) and this checkout's .venv."""
        return make(*args, cwd=self.root, timeout=timeout)


def make(*args: str, cwd: Path = REPO, timeout: int = 3600) -> subprocess.CompletedProcess:
    """`make ARGS` with BuildKit's full log (PROGRESS=plain) and this checkout's .venv, taken as it is (`-o`: make
    never re-installs it from another folder)."""
    venv = REPO / ".venv"
    command = ["make", "-o", str(venv / "bin" / ".installed"), *args, "PROGRESS=plain", f"VENV={venv}"]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def executed_steps(build_log: str) -> dict[str, bool]:
    """BuildKit's plain log as {"<stage> <instruction>": whether it ran} (a step that did not run is CACHED).
    Compose prefixes each step with its service's name: ``#12 [image torch 2/2] RUN ...``."""
    names, cached = {}, set()
    for line in build_log.splitlines():
        if match := re.match(r"^#(\d+) \[(?:image )?([a-z-]+) +\d+/\d+\] (.*)$", line):
            names.setdefault(match[1], f"{match[2]} {match[3]}")
        elif match := re.match(r"^#(\d+) CACHED$", line):
            cached.add(match[1])
    return {name: number not in cached for number, name in names.items()}


def run_steps(steps: dict[str, bool]) -> dict[str, bool]:
    """The RUN instructions of :func:`executed_steps`' answer (the steps that install or build; a COPY is seconds)."""
    return {name: ran for name, ran in steps.items() if " RUN " in f" {name.split(' ', 1)[1]}"}


@pytest.fixture
def checkout_copy(tmp_path) -> CheckoutCopy:
    """A copy of the checkout to change and build in (see :class:`CheckoutCopy`)."""
    return CheckoutCopy(tmp_path / "checkout")


# ---- the cpu image, for the Docker tests (test_docker.py) and the Apptainer tests (test_apptainer.py) ----------
@pytest.fixture(scope="session")
def docker_client():
    docker = pytest.importorskip("docker")
    try:
        client = docker.from_env()
        client.ping()
    except Exception as err:
        pytest.fail(f"no Docker engine here ({err}); `make docker-ready` provisions one")
    return client


@pytest.fixture(scope="session")
def cpu_image(docker_client):
    """`make image ARCH=cpu` (from scratch on a new machine: ~4 min; cached layers otherwise)."""
    result = subprocess.run(["make", "image", "ARCH=cpu"], cwd=REPO, capture_output=True, text=True, timeout=3600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return docker_client.images.get("rocmft:cpu")


# The fast layer (`make test-fast`): every test that runs in this process. A test is slow when it starts rocmft (or
# Docker, Slurm, a vLLM) as a process, found from the fixtures it uses and the markers it carries; what is left
# constructs its subject in-process (load_settings + render_checked, a check on a synthetic tree or injected probe
# record). Measured with `make test-fast` (BENCHMARKS.md: "The fast test layer").
SPAWNING_FIXTURES = frozenset({"run_rocmft", "start_rocmft", "lora_run", "exported", "default_run", "default_export",
                               "cpu_image", "docker_client", "checkout_copy"})  # fmt: skip
SLOW_MARKERS = ("train", "docker", "slurm", "vllm", "gpu", "slow")
# Files whose tests run make, `docker compose`, the ROCm lock's resolver (PyPI), gloo nodes or vllm-serve.py as
# processes without a fixture
SLOW_FILES = frozenset({"test_images.py", "test_network.py", "test_serve_command.py"})


# `make test` runs the suite on two pytest-xdist workers (--dist loadgroup): a worker takes a whole group, so the
# module- and session-scoped fixtures a group shares are built once, on one worker. A group is a test file; the files
# whose tests use the session's LoRA run (lora_run, exported) are one group, so that run is trained once, and so are
# those that use the built-in default's run (default_run, default_export). Tests of different files that use Docker
# or the Slurm cluster run side by side: they share no compose project, container name or Slurm job (two clean-clone
# rehearsals and CI passed with every test scheduled on its own, 2026-12-02).
# The longest groups go out first (longest-processing-time first), so the in-process files fill the other worker's
# gaps and the end, instead of one long group starting last. A group's length is its files' measured seconds
# (tests/durations.json, written by bench/test_durations.py from a clean-clone run); a file not measured there is
# guessed from its tests' markers: rough seconds per test read off the rehearsal of fe4553c (`--durations=25`: Docker,
# Slurm and vLLM tests take one to six minutes, CPU training runs tens of seconds, another rocmft process a few).
GUESSED_SECONDS = {"docker": 120, "slurm": 120, "vllm": 120, "train": 40, "gpu": 0}
DURATIONS = Path(__file__).with_name("durations.json")


def _measured_seconds() -> dict[str, float]:
    try:
        return json.loads(DURATIONS.read_text())["seconds"]
    except FileNotFoundError:
        return {}


TRAINED_FIXTURES = frozenset({"lora_run", "exported"})
TRAINED_FILES = frozenset({"test_export.py", "test_fabric.py", "test_serve_command.py"})
# the same for the built-in default's run (default_run, default_export)
DEFAULT_FIXTURES = frozenset({"default_run", "default_export"})
DEFAULT_FILES = frozenset({"test_train.py", "test_serve.py", "test_serve_docker.py"})


def _group(nodeid: str) -> str:
    """The group of a test from its node id (all the controller has: the workers collect)."""
    path = nodeid.split("::", 1)[0]
    name = path.rsplit("/", 1)[-1]
    return "lora-run" if name in TRAINED_FILES else "default-run" if name in DEFAULT_FILES else path


def _is_slow(item) -> bool:
    spawns = SPAWNING_FIXTURES & set(item.fixturenames) or item.path.name in SLOW_FILES
    return bool(spawns or any(item.get_closest_marker(m) for m in SLOW_MARKERS))


def pytest_collection_modifyitems(config, items):
    for fixtures, files, what in ((TRAINED_FIXTURES, TRAINED_FILES, "TRAINED_FILES (their tests use the session's "
                                   "LoRA run"), (DEFAULT_FIXTURES, DEFAULT_FILES, "DEFAULT_FILES (their tests use "
                                   "the session's built-in default run")):  # fmt: skip
        using = {item.path.name for item in items if fixtures & set(item.fixturenames)}
        if using - files:
            raise pytest.UsageError(f"tests/conftest.py: add {sorted(using - files)} to {what}, which one worker "
                                    "should train)")  # fmt: skip
    measured = _measured_seconds()
    weight: dict[str, float] = {}
    for item in items:
        seconds = 0.2
        if _is_slow(item):
            item.add_marker(pytest.mark.slow)
            marked = [GUESSED_SECONDS[m] for m in GUESSED_SECONDS if item.get_closest_marker(m)]
            seconds = max(marked) if marked else 4
        if item.path.name in measured:
            seconds = 0  # the file's measured total is added once, below
        weight[_group(item.nodeid)] = weight.get(_group(item.nodeid), 0) + seconds
    for name in {item.path.name for item in items} & measured.keys():
        group = _group(f"tests/{name}")
        weight[group] = weight.get(group, 0) + measured[name]
    # a stable sort: a group's tests keep their order; every worker sorts alike (xdist checks the orders agree)
    items.sort(key=lambda item: -weight.get(_group(item.nodeid), 0))


def _starts_python(args) -> bool:
    """Whether a Popen's ``args`` start a Python interpreter (``python``, ``python3.11``, this venv's python)."""
    program = args[0] if isinstance(args, (list, tuple)) and args else str(args).split(" ", 1)[0]
    return Path(str(program)).name.startswith("python")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """The fast layer keeps its definition: a test left in it (not ``slow``) that starts a Python process fails,
    naming the command, unless it is marked ``light_process``. Each rocmft, torchrun or vllm-serve.py process
    costs seconds to tens of seconds of imports on 2 cores; 13 such tests had made `make test-fast` take minutes
    (a probe of every subprocess a fast test started, 2026-12-05)."""
    if item.get_closest_marker("slow") or item.get_closest_marker("light_process"):
        return (yield)
    started: list[str] = []
    real_init = subprocess.Popen.__init__

    def recording_init(self, args, *rest, **options):
        if _starts_python(args):
            started.append(" ".join(map(str, args))[:200] if isinstance(args, (list, tuple)) else str(args)[:200])
        real_init(self, args, *rest, **options)

    subprocess.Popen.__init__ = recording_init
    try:
        result = yield
    finally:
        subprocess.Popen.__init__ = real_init
    if started:
        pytest.fail(f"this fast-layer test started a Python process ({started[0]}): mark it @pytest.mark.slow "
                    "(or light_process if it imports neither torch nor rocmft's CLI); see tests/conftest.py",
                    pytrace=False)  # fmt: skip
    return result


# Where the suite's CPU goes (issue 29: `make test` is CPU-bound on 2 cores, so CPU-seconds, not wall time, say what
# to cut). Each test's JUnit record gets two properties, setup to teardown:
#   cpu_s: this worker's and its waited-for children's user+system seconds (getrusage: rocmft, torchrun and its
#          ranks, make, pip, docker's CLI; not the Docker engine's builds and containers, nor Slurm's jobs);
#   machine_cpu_s: the whole machine's busy seconds (psutil.cpu_times), including the other worker's test that ran
#          at the same time, so a Docker build or a Slurm job shows here only.
# bench/test_durations.py --cpu REPORT.xml lists the largest.
_CPU_AT_SETUP = pytest.StashKey[tuple[float, float]]()


def _own_cpu_s() -> float:
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _machine_busy_s() -> float:
    import psutil

    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.stash[_CPU_AT_SETUP] = (_own_cpu_s(), _machine_busy_s())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    started = item.stash.get(_CPU_AT_SETUP, None)
    if call.when == "teardown" and started is not None:
        item.user_properties.append(("cpu_s", round(_own_cpu_s() - started[0], 1)))
        item.user_properties.append(("machine_cpu_s", round(_machine_busy_s() - started[1], 1)))
    return (yield)


# pytest-xdist's own loadgroup reads an xdist_group marker into the node id (item._nodeid), which pytest 9 no longer
# reads (its Node keeps the id in _id): every test was scheduled on its own, one file's tests ran on both workers and
# session fixtures such as the SIF were built twice (found 2026-12-03). The scheduler below takes the groups from
# _group instead; it is xdist's LoadScopeScheduling with the scope function replaced, as xdist's LoadGroupScheduling is.
@pytest.hookimpl(optionalhook=True)  # pytest -p no:xdist has no such hook
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid)

    # LoadScopeScheduling hands out the groups with the most tests first unless told not to: keep the order
    # pytest_collection_modifyitems gave (the longest groups first)
    config.option.loadscopereorder = False
    return ByGroup(config, log)
