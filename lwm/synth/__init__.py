"""The data the project makes for itself (no downloads): the sample corpus (make_sample), its needle
sets (make_retrieval), visual needles (make_vniah), card video QA (make_card_qa) and long videos
(make_long_videos), each a module and a command (python -m lwm.synth.<name> --help); LWM's needle task
(needle_prompts: the needle, the haystack and the exact-length prompt lwm.eval.needle asks); and their
pieces: scenes and their rendering (scene), mp4 writing (video), captions, questions and documents
(language). Everything lands under data/ of the checkout (lwm.paths)."""
