"""The training core (floor 10), without Lightning: a run's typed configs and what a stage resolves to
(config.py), the model, parallelism, optimizer and the one training step built from it (step.py), the
learning-rate schedule (lr.py), the run's folder name shared by its ranks (run_id.py), and the preflight's
question to the planner (preflight.py). The Lightning run (lwm.train), the planner (lwm.plan) and the
VQGAN's training (lwm.vqgan_training) stand on it."""
