"""Exit codes and the error types that carry them.

Every way rocmft can end has its own documented exit code, so that a scheduler, a compose restart
policy or a person at 3 a.m. can tell "my .env is wrong" from "the GPU is broken" from "training
diverged" without reading a log:

====  =====================  ==========================================================================
code  name                   meaning
====  =====================  ==========================================================================
0     OK                     success
2     CONFIG_ERROR           bad settings (an environment variable, ROCMFT_CONFIG, a template); nothing
                             is left in OUTPUT_DIR
3     CHECK_FAILED           a health check failed; only OUTPUT_DIR/rocmft/checks.json is left
4     TRAINING_FAILED        LLaMA-Factory / the worker raised during training
5     NON_FINITE_LOSS        the loss or the gradient norm became NaN/Inf; training was stopped
143   INTERRUPTED            stopped by SIGTERM/SIGINT (128 + 15, the shell convention)
====  =====================  ==========================================================================

``rocmft status`` (a health probe, Docker's healthcheck convention) exits 0 when the run is healthy
(starting, making progress, or finished) and 1 when it is not (stalled, failed, or no run found).
"""

from __future__ import annotations

import enum

from rocmft.findings import ERROR, OUTSIDE_RULES, Finding


class ExitCode(enum.IntEnum):
    """Process exit codes of every rocmft command (see the module docstring for the table)."""

    OK = 0
    CONFIG_ERROR = 2
    CHECK_FAILED = 3
    TRAINING_FAILED = 4
    NON_FINITE_LOSS = 5
    INTERRUPTED = 143
    UNHEALTHY = 1  # `rocmft status` only


class RocmftError(Exception):
    """An error with an exit code, the thing that is wrong and what to do about it.

    Args:
        message: what is wrong, naming the variable, file or device involved.
        remedy: one concrete thing the user can do to fix it.
        code: the process exit code this error ends the command with.
    """

    code: ExitCode = ExitCode.TRAINING_FAILED

    def __init__(self, message: str, remedy: str = "", code: ExitCode | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.remedy = remedy
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return f"{self.message}\n  fix: {self.remedy}" if self.remedy else self.message


class ConfigError(RocmftError):
    """Bad settings: an environment variable, the user's YAML, a template. Exit code 2.

    ``findings``: set by :func:`rocmft.validate.rules.apply` on the error it raises, every finding of the phase
    (this error's among them, and the phase's warnings) in rule order; empty for a refusal outside the rules.
    """

    code = ExitCode.CONFIG_ERROR
    findings: tuple[Finding, ...] = ()

    def reported(self) -> tuple[Finding, ...]:
        """The findings to report for this error: :attr:`findings`, or this error as the one finding (code
        ``config``) when no rule made it."""
        return self.findings or (Finding(OUTSIDE_RULES, ERROR, self.message, self.remedy),)


class ConfigErrors(ConfigError):
    """Several configuration errors found in one run (:func:`rocmft.validate.rules.apply`), each a finding of
    severity ``error`` in :attr:`findings`, in rule order. Exit code 2.

    ``message`` and ``remedy`` are the findings' messages and fixes, one a line; ``str()`` is their
    ``message / fix:`` blocks one after another.

    Args:
        findings: the phase's findings (errors and warnings); at least two errors.
        errors: the ConfigError each error finding came from, in the same order (kept for their tracebacks).
    """

    def __init__(self, findings: tuple[Finding, ...], errors: tuple[ConfigError, ...] = ()) -> None:
        refused = [f for f in findings if f.severity == ERROR]
        super().__init__("\n".join(f.message for f in refused), "\n".join(f.fix for f in refused))
        self.findings = tuple(findings)
        self.errors = tuple(errors)

    def __str__(self) -> str:
        return "\n".join(str(f) for f in self.findings if f.severity == ERROR)


def combined(*errors: ConfigError) -> ConfigError:
    """One refusal reporting every finding of ``errors`` (each error's :meth:`~ConfigError.reported` findings, in
    the order given): the error itself when only one is given, else a :class:`ConfigErrors`. For refusals made in
    different places of one command (the unknown variables found while reading the settings, and the rules' own)."""
    if len(errors) == 1:
        return errors[0]
    return ConfigErrors(tuple(f for error in errors for f in error.reported()),
                        tuple(e for error in errors for e in getattr(error, "errors", ()) or (error,)))  # fmt: skip


class ChecksFailed(RocmftError):
    """At least one health check failed. Exit code 3."""

    code = ExitCode.CHECK_FAILED
