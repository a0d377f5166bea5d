"""train.py's training runs (floor 10): the run's configs, the one training step, the LightningModule,
datamodule, checkpointing, export and the preflight's request. The planner (lwm.plan) and the VQGAN's
training (lwm.vqgan_training) are packages above it; nothing below imports from here."""
