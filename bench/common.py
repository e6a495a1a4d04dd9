"""What the GPU benchmarks share: a clean environment for `rocmft train` children, the tokenizer files of
rocmft's tiny model that random-weight models of real shapes borrow. Imported as ``common`` (the scripts run
as ``python bench/<name>.py``, so bench/ is on sys.path)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "entrypoint"))

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt")


def clean_environment() -> dict[str, str]:
    """This process's environment without ROCMFT_* and training-argument variables (like the tests)."""
    from rocmft.lfargs import env_arguments

    arguments = env_arguments()
    return {k: v for k, v in os.environ.items() if not k.upper().startswith("ROCMFT_") and k.upper() not in arguments}


def save_with_tiny_tokenizer(model, folder: Path, tiny: Path) -> None:
    """Save a random-weight model into ``folder`` (through ``<folder>.tmp`` and a rename, so an interrupted save
    never looks complete) with the tokenizer files of rocmft's tiny model ``tiny``."""
    import shutil

    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    for name in TOKENIZER_FILES:
        if (tiny / name).is_file():
            shutil.copy2(tiny / name, tmp / name)
    tmp.rename(folder)
