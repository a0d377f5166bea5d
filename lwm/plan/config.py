"""What lwm-plan is asked, and the run it plans: the same Hydra composition as train.py."""

from __future__ import annotations

from dataclasses import dataclass, field

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf, open_dict

from lwm.core.config import RunConfig, to_run_config
from lwm.paths import REPO


@dataclass
class PlanConfig:
    overrides: list[str] = field(
        default_factory=list,
        metadata={"help": "Hydra overrides as for train.py: model=7b schedule=lwm_vision trainer.devices=8"},
    )
    gpu: str = field(
        default="h100-80g",
        metadata={
            "help": "h100-80g | h200-141g | a100-80g | b200-192g | custom:MEM_GIB,TFLOPS,NVLINK_GBPS,IB_GBPS[,HBM_TBPS]"
        },
    )
    stage: str = field(default="all", metadata={"help": "a stage of the schedule, or all"})
    seq_len: int = field(
        default=0, metadata={"help": "plan this length directly instead of the stages' (0: the stages')"}
    )
    batch: int = field(
        default=0,
        metadata={
            "help": "sequences per data-parallel rank per step, in place of the stage's global_batch / dp "
            "(0: the stage's); fewer than the schedule's would need gradient accumulation, which this project lacks"
        },
    )
    cp: int = field(default=0, metadata={"help": "context-parallel size (0: each stage's own)"})
    dp: int = field(default=0, metadata={"help": "data-parallel size (0: world size / cp); the world becomes cp x dp"})
    tp: int = field(default=0, metadata={"help": "tensor-parallel size (0: the run's parallel.tp)"})
    longest: bool = field(
        default=False, metadata={"help": "find the longest sequence that fits each (cp, dp) of the world"}
    )
    infer: int = field(
        default=0, metadata={"help": "also plan an inference prefill of this many tokens over the world (0: no)"}
    )
    prefill_chunk: int = field(
        default=8192,
        metadata={"help": "--infer: prompt tokens per rank prefilled at a time (lwm-generate's --prefill-chunk)"},
    )
    out: str = field(default="plan", metadata={"help": "folder for plan.json and memory.png"})

    def __post_init__(self) -> None:
        for name in ("seq_len", "batch", "cp", "dp", "tp", "infer"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")
        if self.prefill_chunk < 1:
            raise ValueError(f"--prefill-chunk must be >= 1, got {self.prefill_chunk}")


def compose_run(overrides: list[str]) -> RunConfig:
    """conf/train.yaml with the overrides, as train.py composes it; a schedule that starts from a
    Hugging Face folder not given (init_hf: ???) is planned with the model group's shapes.

    train.py sizes the embedding to the data's tokenizer when that file exists; the default data is
    the sample's (a 4K-id tokenizer, found or not depending on the working folder), so unless the
    overrides name the data (data=... or data.tokenizer=...) the plan keeps the model group's
    vocabulary: the same plan from any folder. A start from a Hugging Face folder has the folder's."""
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=list(overrides))
    if OmegaConf.is_missing(cfg.schedule, "init_hf"):
        with open_dict(cfg):
            cfg.schedule.init_hf = None
    run = to_run_config(cfg, overrides)
    named = any(o.lstrip("+~").startswith("data") for o in overrides)
    if not named and run.schedule.init_hf is None and run.model.vocab_size != cfg.model.vocab_size:
        print(
            f"note: planned with the model group's vocab_size {cfg.model.vocab_size}, not the sample tokenizer's "
            f"{run.model.vocab_size} (name the data, data=... data.tokenizer=..., to plan its vocabulary)"
        )
        run.model = run.model.replace(vocab_size=cfg.model.vocab_size)
    return run
