"""The code-object reader, for the image build's check: it lives in rocmft.facts.codeobjects, where the run-time
checks read it too (the bitsandbytes library's gfx targets, rocmft.checks.compat)."""

from __future__ import annotations

from rocmft.facts.codeobjects import CodeObjectError, bundle_ids, fatbin_section, gfx_targets

__all__ = ["CodeObjectError", "bundle_ids", "fatbin_section", "gfx_targets"]
