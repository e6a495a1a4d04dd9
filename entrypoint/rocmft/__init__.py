"""rocmft: fine-tuning LLMs on AMD GPUs with LLaMA-Factory, boringly reliable.

Environment variables in, a validated LLaMA-Factory training run out. The flow, one module per step:
:mod:`~rocmft.config.settings` → :mod:`~rocmft.render` → :mod:`~rocmft.validate` → :mod:`~rocmft.checks` →
:mod:`~rocmft.launch` → :mod:`~rocmft.worker` (see DESIGN.md).
"""

__version__ = "0.1.0"
