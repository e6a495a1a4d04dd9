"""Data sets named the way people name files (issue 30, item 2): a path, or a registered name written with its
extension, is used as meant or refused; a plain-text corpus gets the exact dataset_info.json entry to write.

Every verdict is judged by LLaMA-Factory's own loader where it has one: the run's rendered dataset_info.json goes
through ``llamafactory.data.parser.get_dataset_list`` (which refuses any name it does not hold, "Undefined dataset
... in dataset_info.json": hiyouga/LlamaFactory#5341 for a path, #735 for ``alpaca_data_en_52k.json``) and a record
through its ``AlpacaDatasetConverter`` (what the training run reads from it). The plain-text case is
hiyouga/LlamaFactory#1312 and #976 ("Original column name instruction not in the dataset. Current columns in the
dataset: ['text']"; the maintainer's fix: ``"columns": {"prompt": "text"}``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rocmft.errors import ConfigError

QUESTION = {"question": "What is 2+2?", "answer": "4"}
CORPUS = [{"text": "The quick brown fox jumps over the lazy dog."}, {"text": "A second paragraph of plain text."}]


def lf_attribute(plan, name: str):
    """LLaMA-Factory's own reading of data set ``name`` in the run's rendered dataset_info.json (DatasetAttr)."""
    from llamafactory.data.parser import get_dataset_list

    return get_dataset_list([name], str(plan.files["dataset_info.json"].parent))[0]


def lf_converted(attribute, record: dict) -> dict:
    """What LLaMA-Factory's alpaca converter makes of ``record`` for the data set ``attribute`` (its ``_prompt`` and
    ``_response`` messages): the training run's reading of the record."""
    from llamafactory.data.converter import AlpacaDatasetConverter
    from llamafactory.hparams import DataArguments

    return AlpacaDatasetConverter(attribute, DataArguments())(record)


@pytest.fixture
def data_dir(tmp_path) -> Path:
    """A data folder whose dataset_info.json registers ``qa`` (a question/answer file with its own column names)."""
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "qa.json").write_text(json.dumps([QUESTION] * 3))
    entry = {"file_name": "qa.json", "columns": {"prompt": "question", "response": "answer"}}
    (folder / "dataset_info.json").write_text(json.dumps({"qa": entry}))
    return folder


def test_a_registered_name_written_with_json_gets_the_registered_entry_and_says_so(render_env, data_dir, capsys):
    """DATASET=qa.json (hiyouga/LlamaFactory#735: "Undefined dataset alpaca_data_en_52k.json") was registered as a
    plain file, its format guessed from its keys: LLaMA-Factory would read the default instruction/output columns,
    absent here. Now the registered entry is used, and the console says which, with the name to write."""
    plan = render_env({"DATASET": "qa.json", "DATASET_DIR": str(data_dir)})
    converted = lf_converted(lf_attribute(plan, "qa.json"), QUESTION)
    assert converted["_prompt"][-1]["content"] == "What is 2+2?" and converted["_response"][0]["content"] == "4"
    err = capsys.readouterr().out
    assert "DATASET=qa.json" in err and "used as 'qa'" in err and "write qa instead" in err


def test_a_path_to_a_registered_file_gets_its_entry(render_env, data_dir, tmp_path, capsys):
    """DATASET=/abs/path/qa.json (hiyouga/LlamaFactory#5341: "Undefined dataset /opt/.../train1.json") means the
    file the data folder's dataset_info.json registers as qa: its columns are used."""
    path = str(data_dir / "qa.json")
    plan = render_env({"DATASET": path, "DATASET_DIR": str(data_dir)})
    attribute = lf_attribute(plan, path)
    assert (attribute.prompt, attribute.response) == ("question", "answer")
    assert "used as 'qa'" in capsys.readouterr().out


def test_a_relative_path_from_the_working_folder_is_found_and_registered(render_env, tmp_path, monkeypatch, capsys):
    """DATASET=./corpus/train.jsonl, the way a file is named on a shell, with no dataset_info.json: found from the
    working folder and registered as what its records are, under the name as written, which LLaMA-Factory's own
    get_dataset_list then accepts."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    monkeypatch.chdir(tmp_path)
    alpaca = {"instruction": "Say hi", "input": "", "output": "hi"}
    (folder / "train.jsonl").write_text(json.dumps(alpaca) + "\n")
    plan = render_env({"DATASET": "./corpus/train.jsonl", "DATASET_DIR": str(tmp_path / "empty")})
    converted = lf_converted(lf_attribute(plan, "./corpus/train.jsonl"), alpaca)
    assert converted["_response"][0]["content"] == "hi"
    assert Path(plan.registry.entries["./corpus/train.jsonl"]["file_name"]) == (folder / "train.jsonl").resolve()


def test_a_name_that_is_both_a_file_and_another_registered_data_set_is_refused(render_env, data_dir):
    """qa.json is a file, and qa is registered for another file: which one is meant cannot be told, so the run is
    refused (exit 2) naming DATASET, both files and the name to write."""
    (data_dir / "qa-v2.json").write_text(json.dumps([QUESTION]))
    info = {"qa": {"file_name": "qa-v2.json", "columns": {"prompt": "question", "response": "answer"}}}
    (data_dir / "dataset_info.json").write_text(json.dumps(info))
    with pytest.raises(ConfigError) as caught:
        render_env({"DATASET": "qa.json", "DATASET_DIR": str(data_dir)})
    assert caught.value.code == 2
    text = f"{caught.value.message}\n{caught.value.remedy}"
    assert "DATASET=qa.json" in text and str(data_dir / "qa.json") in text and "qa-v2.json" in text
    assert "Write qa instead" in text


def test_a_file_two_entries_register_is_refused_naming_both(render_env, data_dir):
    """A path to a file registered twice (two column mappings of one file) names both entries: write one."""
    info = json.loads((data_dir / "dataset_info.json").read_text())
    info["qa_reversed"] = {"file_name": "qa.json", "columns": {"prompt": "answer", "response": "question"}}
    (data_dir / "dataset_info.json").write_text(json.dumps(info))
    with pytest.raises(ConfigError, match=r"registers as 'qa' and 'qa_reversed'") as caught:
        render_env({"DATASET": str(data_dir / "qa.json"), "DATASET_DIR": str(data_dir)})
    assert "Write one of qa, qa_reversed instead" in caught.value.remedy


@pytest.fixture
def corpus_dir(tmp_path) -> Path:
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "wiki.jsonl").write_text("\n".join(json.dumps(r) for r in CORPUS) + "\n")
    return folder


def test_a_plain_text_corpus_is_registered_for_pre_training(render_env, corpus_dir):
    """STAGE=pt on records with only "text": registered as LLaMA-Factory registers its own c4_demo, and its
    converter reads each record's text as the one prompt message with no response (what pre-training takes)."""
    plan = render_env({"DATASET": "wiki", "DATASET_DIR": str(corpus_dir), "STAGE": "pt"})
    assert plan.registry.entries["wiki"]["columns"] == {"prompt": "text"}
    converted = lf_converted(lf_attribute(plan, "wiki"), CORPUS[0])
    assert converted["_prompt"] == [{"role": "user", "content": CORPUS[0]["text"]}] and converted["_response"] == []


def test_a_plain_text_corpus_for_sft_is_refused_with_the_exact_entry(render_env, corpus_dir):
    """STAGE=sft on the same corpus: LLaMA-Factory would drop every record (no response), "Cannot find valid
    samples". Refused (exit 2) with the exact dataset_info.json entry, which LLaMA-Factory's own parser reads as
    the text column alone."""
    with pytest.raises(ConfigError) as caught:
        render_env({"DATASET": "wiki", "DATASET_DIR": str(corpus_dir), "STAGE": "sft"})
    assert caught.value.code == 2 and "STAGE=sft" in caught.value.message
    assert "Set STAGE=pt" in caught.value.remedy
    written = json.loads(caught.value.remedy.split("dataset_info.json: ", 1)[1].split(" and use", 1)[0])
    assert written == {"wiki": {"file_name": "wiki.jsonl", "columns": {"prompt": "text"}}}
    from llamafactory.data.parser import get_dataset_list

    attribute = get_dataset_list(["wiki"], written)[0]
    assert (attribute.prompt, attribute.query, attribute.response) == ("text", None, None)


def test_a_registered_corpus_without_columns_gets_the_exact_entry_from_the_data_check(tmp_path):
    """A user's dataset_info.json entry for a text corpus without "columns" (hiyouga/LlamaFactory#976): the
    data check names the exact entry to write; with it, STAGE=pt needs nothing more."""
    from rocmft.render.datasets import record_problem, sample_records

    path = tmp_path / "wiki.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in CORPUS) + "\n")
    sample = sample_records(path)
    problem = record_problem("wiki", {"file_name": str(path)}, path, sample, "pt")
    assert problem is not None and "lacks instruction" in problem
    assert '{"wiki": {"file_name": "wiki.jsonl", "columns": {"prompt": "text"}}}' in problem and "STAGE=pt" in problem
    written = {"file_name": str(path), "columns": {"prompt": "text"}}
    assert record_problem("wiki", written, path, sample, "pt") is None


def test_a_registered_name_with_json_and_no_file_uses_the_entry(render_env, tmp_path, shared_data, capsys):
    """alpaca_en_demo.json when only alpaca_en_demo is registered (under another file name) and no such file lies
    there: one meaning, used and said."""
    folder = tmp_path / "data"
    folder.mkdir()
    shutil.copy(shared_data / "alpaca_en_demo.json", folder / "alpaca_en.json")
    (folder / "dataset_info.json").write_text(json.dumps({"alpaca_en_demo": {"file_name": "alpaca_en.json"}}))
    plan = render_env({"DATASET": "alpaca_en_demo.json", "DATASET_DIR": str(folder)})
    assert Path(lf_attribute(plan, "alpaca_en_demo.json").dataset_name) == (folder / "alpaca_en.json").resolve()
    assert "write alpaca_en_demo instead" in capsys.readouterr().out


def test_an_eval_data_set_named_by_its_file_is_said_under_its_own_variable(render_env, data_dir, capsys):
    """The same reading for EVAL_DATASET, and the console names that variable, as the user wrote it."""
    plan = render_env({"DATASET": "qa", "EVAL_DATASET": "qa.json", "DATASET_DIR": str(data_dir)})
    assert (lf_attribute(plan, "qa.json").prompt, lf_attribute(plan, "qa").prompt) == ("question", "question")
    out = capsys.readouterr().out
    assert "EVAL_DATASET=qa.json" in out and "used as 'qa'" in out


def test_a_path_that_names_nothing_is_reported_where_it_was_looked_for(render_env, data_dir):
    """A path to no file is a missing data set for the data check, with where relative paths are read from; a
    ~user of no user, which pathlib cannot expand, is refused with the settings (naming DATASET and the user);
    never a traceback."""
    plan = render_env({"DATASET": "./nowhere/train.jsonl", "DATASET_DIR": str(data_dir)})
    assert "working folder" in plan.registry.missing["./nowhere/train.jsonl"]
    with pytest.raises(ConfigError, match=r"DATASET=~nosuchuser-rocmft/train\.json .*no user 'nosuchuser-rocmft'"):
        render_env({"DATASET": "~nosuchuser-rocmft/train.json", "DATASET_DIR": str(data_dir)})
