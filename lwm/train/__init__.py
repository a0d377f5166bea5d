"""train.py's training runs with Lightning (floor 11): the LightningModule and datamodule over the core's
step (lwm.core), the trainer and its callbacks, checkpointing and requeue, the stages' loop, evaluation and
export. Nothing below imports from here; the planner (lwm.plan) does not either."""
