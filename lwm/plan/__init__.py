"""lwm-plan: a run's memory per GPU and speed, from its real step under fake tensors (command.py)."""
