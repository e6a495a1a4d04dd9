"""Records that cross a process boundary: the files and lines one rocmft process writes and another reads.

==========================  ==========================================  =========================================
record                      writer                                      reader
==========================  ==========================================  =========================================
RUN_DIR/worker-result.json  the worker (:class:`WorkerResultWriter`)   :func:`read_worker_result` (cli, launch,
and RUN_DIR/losses.jsonl    (the losses appended, the rest rewritten)   report; the manifest embeds it)
RUN_DIR/run.json            render (:meth:`RunPolicy.to_json`)          the worker (:func:`read_run_policy`)
parser child's stdin lines  :class:`rocmft.validate.Validator`          the child (:meth:`ParseRequest.from_line`,
                            (:meth:`ParseRequest.to_line`,              :meth:`TrainOrder.from_line`)
                            :meth:`TrainOrder.to_line`)
parser child's result.json  the child (:meth:`ParseResult.write`)       the parent (:func:`read_parse_result`)
probe child's stdout line   the probe (:func:`probe_line`)              the parent (:func:`read_probe_line`)
RUN_DIR/manifest.json       rocmft train (:meth:`Manifest.write`,       :func:`read_manifest` (render's resume,
                            assembled by rocmft.outputs.manifest)       the workspace, status, report, export)
RUN_DIR/checks.json         check, train (rocmft.checks.report)         :func:`read_checks_report` (the report page)
==========================  ==========================================  =========================================

Each carries ``version`` (:data:`VERSION`, the layout's number; a record without one has the layout of version 1,
written before the field existed; readers read any version by the keys they know); the manifest's is
``schema_version`` (:data:`SCHEMA_VERSION`, the same rule), the worker record's :data:`RESULT_VERSION` (2: its
losses in losses.jsonl, :class:`WorkerResult`). JSON keys are the ones
rocmft 0.1.0 wrote. Statuses and causes are one vocabulary, :class:`RunStatus`. Nothing of rocmft is imported
here but the ground floor.
The records live in siblings by the processes they join, all ground floor and all importable from here:
:mod:`rocmft.records_common` (the version, :class:`RunStatus`), :mod:`rocmft.records_worker` (run.json,
worker-result.json), :mod:`rocmft.records_parser` (the parser child's lines and result) and
:mod:`rocmft.records_probe` (the probe's line), :mod:`rocmft.records_manifest` (the run manifest) and
:mod:`rocmft.records_checks` (the health checks' report).
"""

from __future__ import annotations

from rocmft.records_checks import CHECKS_FILE, CheckRow, ChecksReport, read_checks_report
from rocmft.records_common import VERSION, RunStatus, json_number, run_status, with_reason
from rocmft.records_manifest import MANIFEST_FILE, SCHEMA_VERSION, Manifest, Restart, read_manifest
from rocmft.records_parser import ParseRequest, ParseResult, TrainOrder, read_parse_result
from rocmft.records_probe import (
    PROBES,
    AllreduceProbe,
    DevicesProbe,
    GemmRecord,
    GpuRecord,
    LibProbe,
    PerfGpu,
    PerfProbe,
    probe_line,
    read_probe_line,
)

# named in docstrings as rocmft.records.BlasRecord and rocmft.records.UnifiedMemory
from rocmft.records_probe import BlasRecord as BlasRecord
from rocmft.records_probe import UnifiedMemory as UnifiedMemory
from rocmft.records_worker import (
    LOSSES_FILE,
    RESULT_FILE,
    RESULT_VERSION,
    RUN_POLICY_FILE,
    LossRecord,
    NonFinite,
    PrecisionRecord,
    RunPolicy,
    WorkerResult,
    WorkerResultWriter,
    load_worker_result,
    losses_path,
    read_losses,
    read_run_policy,
    read_worker_result,
    worker_result_path,
    write_worker_result,
)

__all__ = [
    "CHECKS_FILE",
    "LOSSES_FILE",
    "MANIFEST_FILE",
    "PROBES",
    "RESULT_FILE",
    "RESULT_VERSION",
    "RUN_POLICY_FILE",
    "SCHEMA_VERSION",
    "VERSION",
    "AllreduceProbe",
    "CheckRow",
    "ChecksReport",
    "DevicesProbe",
    "GemmRecord",
    "GpuRecord",
    "LibProbe",
    "LossRecord",
    "Manifest",
    "NonFinite",
    "ParseRequest",
    "ParseResult",
    "PerfGpu",
    "PerfProbe",
    "PrecisionRecord",
    "Restart",
    "RunPolicy",
    "RunStatus",
    "TrainOrder",
    "WorkerResult",
    "WorkerResultWriter",
    "json_number",
    "load_worker_result",
    "losses_path",
    "probe_line",
    "read_checks_report",
    "read_losses",
    "read_manifest",
    "read_parse_result",
    "read_probe_line",
    "read_run_policy",
    "read_worker_result",
    "run_status",
    "with_reason",
    "worker_result_path",
    "write_worker_result",
]
