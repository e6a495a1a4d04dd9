"""Training stages grouped by what they need (LLaMA-Factory 0.9.5's ``stage`` values: pt, sft, rm, ppo, dpo, kto)."""

from __future__ import annotations

# Stages that train on ranking data (chosen/rejected, ``"ranking": true`` in dataset_info.json): LLaMA-Factory's
# DPO workflow loads its data as stage "rm", and llamafactory/data/loader.py refuses ranking data elsewhere ("The
# dataset is not applicable in the current training stage"), only after the model has loaded.
RANKING_STAGES = ("rm", "dpo")
# Stages whose every sample runs two sequences through the model: a chosen and a rejected answer (dpo, rm), or
# the answer and its KL counterpart (kto); what the memory estimate (rocmft.render.memfit) doubles.
TWO_SEQUENCE_STAGES = ("dpo", "rm", "kto")

__all__ = ["RANKING_STAGES", "TWO_SEQUENCE_STAGES"]
