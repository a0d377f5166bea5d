"""lmms-eval task files that read Video-MME, LongVideoBench and MLVU from local downloads (the *.yaml
templates here, filled with the download folders by lwm.eval.lmms_run), and their functions (local.py)."""
