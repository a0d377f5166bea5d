"""A run on the user's own data as the README writes it: `data=custom` picks the custom schedule, whose
stages name no sources and so train on all of them, with no needle evaluation (its haystack is the
sample's, made only for data=sample)."""

from __future__ import annotations

import json
import shutil

from omegaconf import OmegaConf
from readme_commands import readme_command
from train_runs import ROOT, forked_train


def test_the_readmes_custom_data_command_runs_as_written(tmp_path):
    """The README's line, its placeholders (tok.model, mine.jsonl) files of the test's (the sample's
    committed tokenizer, 40 texts of 210 words in LWM's format), on a clean clone (no data/sample made); shortened
    to 3 steps a stage and loader-free, nothing else added."""
    cmd = readme_command("python train.py data=custom data.tokenizer=tok.model data.sources=")
    assert any(a.startswith("data.sources=") for a in cmd), cmd
    tok, mine = tmp_path / "tok.model", tmp_path / "mine.jsonl"
    shutil.copy(ROOT / "data" / "sample" / "tokenizer.model", tok)
    words = "the river runs past the old mill and the bakers carry bread to the square".split()
    mine.write_text(
        "".join(
            json.dumps({"text": " ".join((words[i % 7 :] + words[: i % 7]) * 15), "fields": "text"}) + "\n"
            for i in range(40)
        )
    )
    args = [a.replace("tok.model", str(tok)).replace("mine.jsonl", str(mine)) for a in cmd[2:]]
    short = [f"schedule.stages.{i}.{k}=3" for i in (0, 1) for k in ("steps", "warmup_steps")] + ["data.num_workers=0"]
    proc = forked_train(tmp_path / "run", *args, *short, debug=False)
    run = tmp_path / "run"
    config = OmegaConf.to_container(OmegaConf.load(run / "config.yaml"))
    assert config["schedule"]["name"] == "custom" and list(config["data"]["sources"]) == ["mine"]
    assert config["evaluate"]["lengths"] is None and not (run / "needle").exists()  # no needle grid
    for stage in config["schedule"]["stages"]:  # conf/schedule/custom.yaml's: no sources named, so all
        assert not stage.get("sources"), stage
        assert json.loads((run / stage["name"] / "data.json").read_text())["read"] > 0, proc.stdout[-3000:]
        assert (run / stage["name"] / "final.safetensors").is_file()
    assert [s["name"] for s in config["schedule"]["stages"]] == ["s512", "s2k"]
    assert (run / "hf" / "config.json").is_file()  # exported, as a run is by default
