"""The planner's choices for docs/planner.md's table: LoRA SFT of a Qwen2-7B-shaped model (config.json only), bf16,
cutoff 2048, effective batch 16 rows, on injected devices (memory from the vendors' product pages; nothing measured).

    .venv/bin/python bench/planner_table.py
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from rocmft.facts.device import DeviceFacts
from rocmft.render import planner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_planner import QWEN2_7B, SEED

DEVICES = {  # name -> (gfx target or CUDA arch, memory in GB as sold)
    "MI355X / MI350X (gfx950, 288 GB)": ("gfx950", 288.0),
    "MI325X (gfx942, 256 GB)": ("gfx942", 256.0),
    "MI300X (gfx942, 192 GB)": ("gfx942", 192.0),
    "MI250X GCD / MI210 (gfx90a, 64 GB)": ("gfx90a", 64.0),
    "Radeon PRO W7900 (gfx1100, 48 GB)": ("gfx1100", 48.0),
    "RX 7900 XTX (gfx1100, 24 GB)": ("gfx1100", 24.0),
    "Radeon AI PRO R9700 (gfx1201, 32 GB)": ("gfx1201", 32.0),
    # an APU's budget is amdgpu's GTT pool (rocmft.facts.device.memory_budget): by default half the system memory
    "Ryzen AI Max+ 395 (gfx1151, 128 GB, GTT 64)": ("gfx1151", 64.0),
    "H200 (sm_90, 141 GB; the measurement machine)": ("sm_90", 141.0),
}


def main() -> None:
    """Print one line per device and library set: attention, micro-batch x accumulation, checkpointing, estimate."""
    with tempfile.TemporaryDirectory() as folder:
        model = Path(folder)
        (model / "config.json").write_text(json.dumps(QWEN2_7B))
        for name, (arch, gb) in DEVICES.items():
            # GPU memory as sold is GiB in practice (torch reports an MI300X's "192 GB" as 191.98 GiB)
            backend = "cuda" if arch.startswith("sm_") else "rocm"
            device = DeviceFacts(backend=backend, count=1, names=[name], archs=[arch], memory_gib=[gb],
                                 bf16=True)  # fmt: skip
            for liger, flash in ((True, False), (False, False), (True, True)):
                arguments = {**SEED, "model_name_or_path": str(model)}
                plan = planner.plan_defaults(arguments, set(), device, compute_dtype="bfloat16",
                                             liger_available=liger, flash_available=flash)  # fmt: skip
                values = {c.name: c.value for c in plan.choices}
                print(
                    f"{name:38} liger={liger!s:5} flash_attn={flash!s:5} -> {values.get('flash_attn')}, "
                    f"{values.get('per_device_train_batch_size')} x {values.get('gradient_accumulation_steps')}, "
                    f"checkpointing {'off' if values.get('disable_gradient_checkpointing') else 'on'}, "
                    f"estimate {plan.estimate_gib:.1f} GiB"
                )


if __name__ == "__main__":
    main()
