"""Training runs (floor 10, the top of the package): train.py's LM schedule (config, run, module,
datamodule, checkpointing, export, the fake-tensor step) and the VQGAN's (vqgan/, train_vqgan.py).
Nothing below imports from here."""
