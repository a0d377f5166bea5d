"""Context-parallel ranks started from one process (lwm.infer.spawned): answers equal one process's, bad
input fails on the host and the ranks go on, and the ranks end when the host is killed."""

import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from lwm.paths import REPO
from lwm.processes import alive

SPM = REPO / "data" / "sample" / "tokenizer.model"


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    from lwm.data.text_tokenizer import TextTokenizer
    from lwm.data.vocab import Vocab
    from lwm.interop.hf import to_hf
    from lwm.model import ModelConfig, Transformer

    out = tmp_path_factory.mktemp("spawned") / "hf"
    torch.manual_seed(0)
    to_hf(Transformer(ModelConfig.from_preset("debug", vocab_size=Vocab(TextTokenizer(SPM).vocab_size).size)), out,
          tokenizer_model=SPM)  # fmt: skip
    return out


SCRIPT = """
import os, sys
from lwm.infer.load import load_model
from lwm.infer.generator import Generator
from lwm.infer.runtime import ModelOptions
from lwm.infer.sampling import GenerationConfig
from lwm.infer.spawned import start_ranks

if __name__ == "__main__":
    loaded, ranks = start_ranks(ModelOptions(model=sys.argv[1], prefill_chunk=16), 2, "cpu")
    assert loaded.model is None
    prompt = [(7 * i) % 300 + 3 for i in range(203)]
    config = GenerationConfig(max_new_tokens=6, restrict="text")
    alone = Generator(load_model(sys.argv[1]).model, loaded.vocab, prefill_chunk=16)
    assert ranks.generate(prompt, config) == alone.generate(prompt, config)
    two, one = ranks.score(prompt, [[5, 6], [9]]), alone.score(prompt, [[5, 6], [9]])
    assert all(abs(a - b) < 1e-4 for a, b in zip(two, one)), (two, one)
    try:
        ranks.generate([], config)
    except ValueError as e:
        print("refused:", e, flush=True)
    assert ranks.generate(prompt, config) == alone.generate(prompt, config)  # the ranks went on
    print("pids", *[p.pid for p in ranks.procs], flush=True)
    os.kill(os.getpid(), 9)  # no exit handler runs: rank 0 finds the pipe closed
"""


def test_ranks_answer_as_one_process_and_end_when_the_host_is_killed(hf, tmp_path):
    (tmp_path / "host.py").write_text(textwrap.dedent(SCRIPT))
    out = tmp_path / "out.txt"
    with open(out, "w") as f:  # a file, not a pipe: waiting for a pipe's end would wait for the ranks too
        proc = subprocess.run([sys.executable, "host.py", str(hf)], cwd=tmp_path, stdout=f, stderr=subprocess.STDOUT,
                              timeout=300)  # fmt: skip
    text = out.read_text()
    assert proc.returncode == -signal.SIGKILL, text[-3000:]
    assert "refused: the prompt is empty" in text and "context parallel over 2 ranks" in text, text[-3000:]
    pids = [int(x) for x in text.split("pids", 1)[1].split()]
    deadline = time.monotonic() + 60
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(alive(pid) for pid in pids), pids
