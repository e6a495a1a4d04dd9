"""Run on a GPU machine (from the repository root): what the node readers of rocmft.facts.amdgpu see there, and
whether the /proc scan names a real process holding GPU memory (a child allocating 20 GiB on GPU 0)."""

import json
import os
import subprocess
import sys

sys.path.insert(0, "entrypoint")
from rocmft.facts import amdgpu

out = {}
out["amdgpu_cards"] = amdgpu.amdgpu_cards()
out["kfd_gpus"] = amdgpu.kfd_gpus()
log = amdgpu.read_kmsg()
out["kmsg"] = {
    "error": log["error"],
    "records": len(log["records"]),
    "truncated": log["truncated"],
    "amdgpu_faults": len(amdgpu.parse_kmsg(log["records"])),
}
code = (
    "import torch, time; x = torch.empty(20 * 2**30, dtype=torch.uint8, device='cuda:0'); "
    "print('ok', flush=True); time.sleep(120)"
)
child = None
try:
    import torch  # noqa

    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    out["child_ready"] = child.stdout.readline().strip()
    out["child_pid"] = child.pid
    out["holders_excluding_self"] = amdgpu.device_holders(exclude={os.getpid()})
    out["holders_default_exclude"] = amdgpu.device_holders()
    smi = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv"], capture_output=True, text=True
    )
    out["nvidia_smi"] = smi.stdout
except Exception as e:
    out["torch_error"] = repr(e)
finally:
    if child:
        child.kill()
        child.wait()
print(json.dumps(out, indent=1, default=str))
