"""Pieces of data/make_sample.py: scenes and their rendering (scene.py), writing mp4 files (video.py),
captions, questions and documents (language.py)."""
