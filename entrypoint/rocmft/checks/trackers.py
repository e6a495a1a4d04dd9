"""The ``trackers`` check: every tracker named in ``report_to`` can record the run, judged before the model loads.

transformers builds one callback per ``report_to`` name when the Trainer starts, after the model has loaded: an
unknown name raises ValueError there, a missing package RuntimeError ("TensorBoardCallback requires tensorboard to
be installed", issue 33), an MLflow store the client cannot open or an online W&B without a key fails at the first
logged step. This check asks transformers' own tables which names exist and which are installed
(``transformers.integrations.integration_utils``), and judges the two trackers whose failure depends on the run's
environment (MLflow's store, W&B's key and folder) from the run's settings (``plan.settings.environ``), never from
this process's environment. Credentials never reach a message: a URI is shown without its user and password.
"""

from __future__ import annotations

import base64
import importlib.util
import netrc
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from rocmft.checks import FAIL, PASS, SKIP, Outcome, check
from rocmft.fsutil import write_error
from rocmft.values import truthy

# MLflow 3.18's tracking URI when MLFLOW_TRACKING_URI is unset (mlflow.get_tracking_uri() in this stack's
# mlflow-skinny 3.18.0, measured 2026-12-04): a SQLite file in the working folder, which needs SQLAlchemy.
MLFLOW_DEFAULT_URI = "sqlite:///mlflow.db"
# W&B modes that write nothing to a server (wandb's documented WANDB_MODE values; "dryrun" is the old name of offline)
WANDB_LOCAL_MODES = ("offline", "dryrun", "disabled")
PROBE_TIMEOUT_S = 5.0
# An MLflow server's liveness route and one API route (mlflow/server/handlers.py): a server whose Host-header
# allow-list (MLFLOW_SERVER_ALLOWED_HOSTS, mlflow >= 3.5) excludes the name used here answers /health but
# refuses the API with 403 "Invalid Host header", so both are asked.
MLFLOW_PROBE_ROUTES = ("/health", "/api/2.0/mlflow/experiments/search?max_results=1")


def report_to_names(value: object) -> list[str]:
    """The tracker names of a rendered ``report_to``: a list, a comma-separated string, ``none``/None -> []."""
    if value is None:
        return []
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    names = [str(item).strip() for item in items if str(item).strip()]
    return [] if names in (["none"], ["None"]) else names


def shown_uri(uri: str) -> str:
    """``uri`` without user and password (``http://u:p@host:5000/x`` -> ``http://host:5000/x``)."""
    parts = urlsplit(uri)
    if not parts.username and not parts.password:
        return uri
    return parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]).geturl()


def _auth_header(uri: str, environ: Mapping[str, str]) -> dict[str, str]:
    """The header the MLflow client would send (mlflow/utils/rest_utils.py: a token, else basic auth)."""
    parts = urlsplit(uri)
    token = environ.get("MLFLOW_TRACKING_TOKEN", "")
    if token:
        return {"Authorization": f"Bearer {token}"}
    user = parts.username or environ.get("MLFLOW_TRACKING_USERNAME", "")
    password = parts.password or environ.get("MLFLOW_TRACKING_PASSWORD", "")
    if user or password:
        return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}
    return {}


def _mlflow_problem(environ: Mapping[str, str], workdir: Path) -> tuple[str, str] | None:
    """(what is wrong, the fix) for the run's MLflow store, or None when the client can write to it."""
    uri = environ.get("MLFLOW_TRACKING_URI", "").strip()
    said = f"MLFLOW_TRACKING_URI={shown_uri(uri)}" if uri else f"MLflow's default store {MLFLOW_DEFAULT_URI}"
    server_fix = ("Start an MLflow tracking server (`mlflow server --host 0.0.0.0 --port 5000` on a machine with "
                  "the full mlflow) and set MLFLOW_TRACKING_URI=http://<that host>:5000")  # fmt: skip
    scheme = urlsplit(uri).scheme if uri else "sqlite"
    if scheme in ("http", "https"):
        for route in MLFLOW_PROBE_ROUTES:
            # the user and password travel as the header, never in the URL (urllib would read them as the host)
            request = urllib.request.Request(shown_uri(uri).rstrip("/") + route, headers=_auth_header(uri, environ))
            try:
                with urllib.request.urlopen(request, timeout=PROBE_TIMEOUT_S):
                    pass
            except urllib.error.HTTPError as err:
                return (f"{said} answered {route.split('?')[0]} with HTTP {err.code} {err.reason}.",
                        "Check the server's address and credentials (MLFLOW_TRACKING_USERNAME/PASSWORD or "
                        "MLFLOW_TRACKING_TOKEN); a 403 'Invalid Host header' means the server's "
                        "MLFLOW_SERVER_ALLOWED_HOSTS does not list the name used here.")  # fmt: skip
            except (urllib.error.URLError, OSError, ValueError) as err:
                reason = getattr(err, "reason", err)
                return (f"{said} did not answer {route.split('?')[0]} within {PROBE_TIMEOUT_S:.0f} s ({reason}).",
                        f"Start the server, or fix the address. {server_fix}.")  # fmt: skip
        return None
    if scheme == "sqlite" and importlib.util.find_spec("sqlalchemy") is None:
        return (f"{said} is a SQLite store, which the MLflow client here (mlflow-skinny, without SQLAlchemy) "
                "cannot open: the run would fail at its first logged step.",
                f"{server_fix}; or use a folder: MLFLOW_TRACKING_URI=file:/saves/mlruns with "
                "MLFLOW_ALLOW_FILE_STORE=true.")  # fmt: skip
    if scheme == "file":
        if not truthy(environ.get("MLFLOW_ALLOW_FILE_STORE", "")):
            return (f"{said} is a folder store, which MLflow 3.18 refuses unless MLFLOW_ALLOW_FILE_STORE=true "
                    "(its file store is in maintenance mode).",
                    f"Set MLFLOW_ALLOW_FILE_STORE=true, or {server_fix[0].lower() + server_fix[1:]}.")  # fmt: skip
        folder = Path(urlsplit(uri).path or ".")
        error = write_error(folder if folder.is_absolute() else workdir / folder)
        if error:
            return (f"{said}: the folder cannot be written ({error}).",
                    "Point it at a mounted, writable folder (file:/saves/mlruns under compose).")  # fmt: skip
    return None


def _wandb_problem(environ: Mapping[str, str], workdir: Path) -> tuple[str, str] | None:
    """(what is wrong, the fix) for W&B in the run's environment, or None."""
    mode = environ.get("WANDB_MODE", "").strip().lower()
    if truthy(environ.get("WANDB_DISABLED", "")) or mode == "disabled":
        return None
    folder = Path(environ.get("WANDB_DIR") or workdir)
    error = write_error(folder)
    if error:
        where = "WANDB_DIR" if environ.get("WANDB_DIR") else "the working folder (WANDB_DIR unset)"
        return (
            f"W&B writes its run files to {where}, {folder}, which cannot be written ({error}).",
            "Set WANDB_DIR to a mounted, writable folder (WANDB_DIR=/saves/wandb under compose).",
        )
    if mode in WANDB_LOCAL_MODES or environ.get("WANDB_API_KEY", "").strip():
        return None
    host = urlsplit(environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    netrc_path = Path(environ.get("NETRC") or Path(environ.get("HOME", "~")).expanduser() / ".netrc")
    try:
        if netrc.netrc(str(netrc_path)).authenticators(host):
            return None
    except (OSError, netrc.NetrcParseError):
        pass
    return (f"REPORT_TO names wandb online (WANDB_MODE={mode or 'unset'}) with no WANDB_API_KEY and no {host} "
            f"entry in {netrc_path}: wandb.init would raise 'No API key configured' at the Trainer's start.",
            "Pass WANDB_API_KEY in the environment (never in a file rocmft renders), or set WANDB_MODE=offline and "
            "upload later with `wandb sync <WANDB_DIR>/wandb/offline-run-*`.")  # fmt: skip


def _tensorboard_problem(environ: Mapping[str, str], workdir: Path) -> tuple[str, str] | None:
    """(what is wrong, the fix) for TENSORBOARD_LOGGING_DIR, or None. Unset, transformers 5.6's TensorBoardCallback
    writes under OUTPUT_DIR/runs/ (integration_utils.default_logdir), which the ``output`` check covers."""
    folder = environ.get("TENSORBOARD_LOGGING_DIR", "").strip()
    error = write_error(Path(folder).expanduser()) if folder else ""
    if error:
        return (
            f"TENSORBOARD_LOGGING_DIR={folder} cannot be written ({error}).",
            "Point it at a mounted, writable folder, or unset it (event files then go to OUTPUT_DIR/runs/).",
        )
    return None


@check("trackers", "trackers in report_to installed and reachable", timeout_s=30)
def trackers(subject) -> Outcome:
    """Fails for a ``report_to`` name transformers does not know or finds not installed, an MLflow store the client
    cannot write (no server answering in 5 s, SQLite without SQLAlchemy, a folder store not opted in or not
    writable) and an online W&B without a key or a writable folder. Skips when ``report_to`` names none."""
    names = report_to_names(subject.plan.arguments.get("report_to"))
    if not names:
        return Outcome(SKIP, "none", "report_to names no tracker.")
    from transformers.integrations.integration_utils import (
        INTEGRATION_TO_CALLBACK,
        get_available_reporting_integrations,
    )

    source = subject.plan.sources.get("report_to", "report_to")
    if names == ["all"]:
        names = get_available_reporting_integrations()
    unknown = [n for n in names if n not in INTEGRATION_TO_CALLBACK]
    if unknown:
        return Outcome(
            FAIL, f"unknown: {', '.join(unknown)}",
            f"report_to names {', '.join(unknown)} ({source}), which transformers does not know: the Trainer would "
            "raise ValueError after the model loaded.",
            f"Use names from: {', '.join(sorted(INTEGRATION_TO_CALLBACK))} (or none).",
        )  # fmt: skip
    available = set(get_available_reporting_integrations())
    missing = [n for n in names if n not in available]
    if missing:
        return Outcome(
            FAIL, f"not installed: {', '.join(missing)}",
            f"report_to names {', '.join(missing)} ({source}), not installed here: the Trainer would raise "
            "RuntimeError after the model loaded.",
            "rocmft's images carry tensorboard, mlflow (the client) and wandb; for another tracker install it into "
            f"the image, or remove {', '.join(missing)} from REPORT_TO.",
        )  # fmt: skip
    environ, workdir = subject.plan.settings.environ, Path.cwd()
    judges = {"mlflow": _mlflow_problem, "wandb": _wandb_problem, "tensorboard": _tensorboard_problem}
    problems = {name: found for name in names if name in judges if (found := judges[name](environ, workdir))}
    if problems:
        return Outcome(FAIL, ", ".join(problems), " ".join(what for what, _ in problems.values()),
                       " ".join(fix for _, fix in problems.values()))  # fmt: skip
    return Outcome(PASS, ", ".join(names), f"report_to: {', '.join(names)} ({source}).")
