"""Evaluations: needle in a haystack (needle; the needle, haystack and prompts themselves are
lwm.synth.needle_prompts, which the needle training sets share), visual needles (vniah), long-video
QA (video_qa; its items, text forms, video codes, scoring, summary and outputs are the qa_*
modules), the trial grid the two needle evaluations share (trials), and the plots and tables they
all use (plots). Each evaluation is also a command: python -m lwm.eval.<name> --help. The
evaluations use lwm.synth (prompts, sample text, color cards); lwm.synth never imports them."""
