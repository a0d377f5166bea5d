"""Evaluations: needle in a haystack (eval/needle.py), long-video QA, and the plots and tables
they share (eval/plots.py). Each evaluation is also a script: python eval/<name>.py --help."""
