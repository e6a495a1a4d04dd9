"""``python -m rocmft`` is the ``rocmft`` command."""

try:
    from rocmft.cli import main
except KeyboardInterrupt:  # Ctrl-C while Python imports rocmft: the stop's exit code, no traceback
    import sys

    sys.stderr.write("[rocmft] interrupted\n")
    raise SystemExit(143) from None  # rocmft.errors.ExitCode.INTERRUPTED

raise SystemExit(main())
