"""Long-video question answering: accuracy of a model on questions about videos, overall, by video
duration, and as each benchmark reports it. The package:

  benchmarks/   one module per benchmark, each with its reader, prompt and answer rule, subtitles and
                results file (videomme, longvideobench, mlvu; plain for JSON lines), what a benchmark
                is (base) and the registry the rest looks them up in (__init__)
  files         a data file or folder -> items, each object read by its benchmark
  items         the Item every form is read into, and what the readers share
  text, subtitles, videos   answers as text, a subtitle line, a video's codes
  scoring       one item -> its record; summary: the records summed up; report: the output files
  evaluate      the loop; cli: the command

    python -m lwm.eval.video_qa --model M --data Video-MME/videomme/test-00000-of-00001.parquet --video-dir Video-MME/data
    python -m lwm.eval.video_qa --model M --data LongVideoBench/lvb_val.json --subtitles LongVideoBench/subtitles
    python -m lwm.eval.video_qa --model M --data MLVU/json
    python -m lwm.eval.video_qa --model runs/X/hf --data qa.jsonl --out runs/X/eval
    torchrun --nproc_per_node 2 -m lwm.eval.video_qa --model M --data qa.jsonl     # prompts split over 2 ranks (context parallel)

Data, as the benchmarks release it (lwm.eval.video_qa.files reads each through its benchmark's module;
the format is chosen by the file and its content, and a file in none of them is a usage error before the
model loads): Video-MME's parquet or GitHub JSON, LongVideoBench's lvb_val.json or parquet, MLVU's task
JSONs, or the plain form, JSON lines, one question each,

    {"video": "clips/a.mp4", "question": "What color is the circle?", "options": ["Red.", "Cyan."],
     "answer": "Cyan.", "duration": 95}

(`video` relative to the file's folder, or absolute inside it or --video-dir; `options` optional;
`answer` an option's letter or its text (lwm.eval.video_qa.items says how it is matched); `duration` in
seconds or a bucket name; `id` optional; `videoID` or `vision` name a video as --video-dir/<id>.mp4 or cached codes; a line may hold a
video with a list of `questions`, and a .json file a list of such objects). With --subtitles, the
benchmark's with-subtitles setting (its module in lwm.eval.video_qa.benchmarks).

Video: frames at --fps (1 by default), at most --max-frames spread evenly; codes come from the
lwm-tokenize cache (--codes) when the video is there (id: its path's hashed or stem id, or its
videoID), else the file is read and tokenized with the VQGAN (--vqgan). The prompt is LWM's chat
form, the question before the video:

    [BOS] "You are a helpful assistant. USER: {question}" <vision> frames </vision> "ASSISTANT:"

Multiple choice is scored two ways:
  LL      the log-likelihood of each option's text ("Cyan.") after the prompt of the bare question;
          the most likely option is the answer (the primary metric of the plain form; the per-token
          mean is kept too)
  letter  the question lists the options and asks for the letter: for a benchmark's question its own
          prompt and its own reading of the answer (lwm.eval.video_qa.benchmarks; the primary metric
          there), else the training form ("What color ...? A. Red. B. Cyan. Answer with the letter.")
          and the first standalone option letter; greedy generation restricted to text
Open questions (no options): greedy generation, normalized exact match (lowercase; punctuation,
articles and extra whitespace removed).

A question already written in the letter form (the sample data's multiple-choice rows) is cut back
to the bare question. Outputs in --out: video_qa.json (config, summary, one record per item),
video_qa.md (a table by duration bucket, one by task where items have `task_type` or `kind`, and each
benchmark's own tables), video_qa.records.jsonl (records appended as items finish, so a killed run keeps
them), videomme_results.json for Video-MME's questions (the file its scorer, eval_your_results.py,
reads). A bad item (malformed line, missing or unreadable video, answer not among the options, the wrong
number of options for its benchmark) is recorded with its reason and the benchmark's fields, and the run
goes on. Under torchrun every rank takes part in each prompt;
rank 0 reads the videos, writes and prints. Exit status: 0 if every item was scored, 1 if some
were recorded as errors, 2 for a usage error, 130 if interrupted (what was done is written).
"""

from lwm.eval.video_qa.cli import build_parser, main
from lwm.eval.video_qa.evaluate import run_video_qa

__all__ = ["build_parser", "main", "run_video_qa"]
