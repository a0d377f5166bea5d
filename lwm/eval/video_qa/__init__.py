"""Long-video question answering (a package: items, text, videos, scoring, summary, report, the
loop in evaluate, the command in cli): accuracy of a model on questions about videos, overall and by
video duration.

    python -m lwm.eval.video_qa --model runs/X/hf --data qa.jsonl --out runs/X/eval
    python -m lwm.eval.video_qa --model M --data videomme.jsonl --video-dir videomme/data --codes codes/ --fps 1 --max-frames 512
    torchrun --nproc_per_node 2 -m lwm.eval.video_qa --model M --data qa.jsonl     # prompts split over 2 ranks (context parallel)

Data: JSON lines, one question each,

    {"video": "clips/a.mp4", "question": "What color is the circle?", "options": ["Red.", "Cyan."],
     "answer": "Cyan.", "duration": 95}

(`video` relative to the file's folder or absolute; `options` optional; `answer` an option's text or
its letter; `duration` in seconds or a bucket name; `id` optional), or Video-MME's field names:
`videoID` (the file is --video-dir/<videoID>.mp4), `question_id`, `options` like ["A. ...", "B. ..."],
`answer` a letter, `duration` "short"/"medium"/"long" (a line may also hold a video with a list of
`questions`; a .json file may hold a list of such objects). `vision` (a video id, as in the sample
data) is read like `videoID`.

Video: frames at --fps (1 by default), at most --max-frames spread evenly; codes come from the
lwm-tokenize cache (--codes) when the video is there (id: its path's hashed or stem id, or its
videoID), else the file is read and tokenized with the VQGAN (--vqgan). The prompt is LWM's chat
form, the question before the video:

    [BOS] "You are a helpful assistant. USER: {question}" <vision> frames </vision> "ASSISTANT:"

Multiple choice is scored two ways:
  LL      the log-likelihood of each option's text ("Cyan.") after the prompt of the bare question;
          the most likely option is the answer (the primary metric; the per-token mean is kept too)
  letter  the question lists the options and asks for the letter, as in training
          ("What color ...? A. Red. B. Cyan. Answer with the letter."); greedy generation restricted
          to text; the first standalone option letter in the output is the answer
Open questions (no options): greedy generation, normalized exact match (lowercase; punctuation,
articles and extra whitespace removed).

A question already written in the letter form (the sample data's multiple-choice rows) is cut back
to the bare question. Outputs in --out: video_qa.json (config, summary, one record per item),
video_qa.md (a table by duration bucket, and one by task where items have `task_type` or `kind`),
video_qa.records.jsonl (records appended as items finish, so a killed run keeps them). A bad item
(malformed line, missing or unreadable video, answer not among the options) is recorded with its
reason and the run goes on. Under torchrun every rank takes part in each prompt;
rank 0 reads the videos, writes and prints. Exit status: 0 if every item was scored, 1 if some
were recorded as errors, 2 for a usage error, 130 if interrupted (what was done is written).
"""

from lwm.eval.video_qa.cli import build_parser, main
from lwm.eval.video_qa.evaluate import run_video_qa

__all__ = ["build_parser", "main", "run_video_qa"]
