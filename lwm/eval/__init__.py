"""Evaluations: needle in a haystack (needle), visual needles (vniah), long-video QA (video_qa), and
the plots and tables they share (plots). Each is also a command: python -m lwm.eval.<name> --help."""
