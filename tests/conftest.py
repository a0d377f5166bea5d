import contextlib
import functools
import io
import multiprocessing.process
import os
import subprocess
from pathlib import Path

import comm_contract
import pytest
import torch
from train_runs import fork_server_preload, forked_train, losses

import lwm.parallel.launch as launch

_run_distributed = launch.run_distributed


@functools.wraps(_run_distributed)
def _checked_run_distributed(fn, world_size: int, *args, **kwargs) -> list:
    """Every worker of the gloo tests runs fn under the NCCL communication contract (tests/comm_contract.py)."""
    body = functools.partial(comm_contract.checked, fn)
    body.__name__ = getattr(fn, "__name__", repr(fn))  # for run_distributed's timeout message
    return _run_distributed(body, world_size, *args, **kwargs)


# Replaced before the test modules are imported, so their `from lwm.parallel.launch import run_distributed` gets it
launch.run_distributed = _checked_run_distributed
launch.FORKSERVER_PRELOAD = fork_server_preload()  # the one fork server of a test process: what both helpers fork

if os.environ.get("PYTEST_XDIST_WORKER"):  # under -n 3: one thread per worker, and the processes it starts
    # OpenMP threads spin while they wait for one another; several workers' threads on two cores spin more than they work
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"


# The files whose runs start several train.py processes each: one unit of work under -n 3 (the README's
# command), so one worker runs them one after another while the others run the rest; two multi-process runs
# at once would put twice as many processes on the cores. Much of that unit is waiting (SLURM's requeues, a
# dead rank's timeout), which the third worker fills.
LAUNCHES = ("test_train_parallel.py", "test_slurm.py", "test_multinode.py")
# The longest of the other files (each about 30-180 s under -n 3, measured), handed out first: one of them
# begun last would end the suite alone.
LONGEST = (
    "test_learning.py",
    "test_t2v_learning.py",
    "test_lmms.py",
    "test_train.py",
    "test_interop_walk.py",
    "test_plan.py",
    "test_data_index.py",
    "test_infer.py",
    "test_gpu_check.py",
    "test_parallel_dist.py",
)


# Tests by what they cost, a folder and a marker each (python -m pytest -q -n 3 tests/unit, or -m unit: a
# developer's loop of about a minute):
#   unit/<package>/  mirrors lwm/ (unit/ itself: floor 0's shared modules); in this process, no process or
#                    process group started (refused while the test runs: see below)
#   integration/     starts processes or process groups (train.py's runs, gloo groups, SLURM, torchrun, loader
#                    workers, a child's plan), or learns through train.py's path
#   repo/            checks of the repository: docs and their commands, floors, style, dependencies
TESTS = Path(__file__).resolve().parent
KINDS = ("unit", "integration", "repo")


@functools.cache
def cost(path: Path) -> str:
    kind = path.resolve().relative_to(TESTS).parts[0]
    if kind not in KINDS:
        raise pytest.UsageError(f"{path}: a test file belongs in tests/unit/<package>, tests/integration or tests/repo")
    return kind


def pytest_collection_modifyitems(items):
    """Each test marked by its folder; the files of LAUNCHES first, in that order (the longest first), then
    those of LONGEST, the rest as collected."""
    for item in items:
        item.add_marker(cost(item.path))
    rank = {name: i for i, name in enumerate(LAUNCHES + LONGEST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable


@contextlib.contextmanager
def starts_nothing(item):
    """While a unit test is set up and runs: starting a process (subprocess, multiprocessing) or a process group
    other than a fake one fails it, naming the test, so the unit marker stays true."""
    if item.get_closest_marker("unit") is None:
        yield
        return

    def refuse(*args, **kwargs):
        raise AssertionError(f"{item.nodeid} is a unit test but starts a process or a process group; "
                             "its place is tests/integration")  # fmt: skip

    def init_process_group(backend=None, *args, **kwargs):
        # FakeTensorMode's process group ("fake", or per device: "cpu:fake,meta:fake"): in this process, no peers
        if not backend or any(part.split(":")[-1] != "fake" for part in backend.split(",")):
            refuse()
        return dist_init(backend, *args, **kwargs)

    dist_init = torch.distributed.init_process_group
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(subprocess.Popen, "__init__", refuse)
        patch.setattr(multiprocessing.process.BaseProcess, "start", refuse)
        patch.setattr(torch.distributed, "init_process_group", init_process_group)
        yield


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session):
    """data/sample (made, not committed) made before any test, by whichever process comes first (the others wait
    on its lock): many tests read it, and on a clean clone the first of them may run before any test that
    makes it. Not where PyAV is missing (the GPU check's device: its tests read no sample), as it writes videos."""
    try:
        from lwm.synth.make_sample import ensure_sample
    except ModuleNotFoundError as e:
        if e.name != "av":
            raise
        return
    with contextlib.redirect_stdout(io.StringIO()):
        ensure_sample()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    with starts_nothing(item):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    with starts_nothing(item):
        yield


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: not called without it
def pytest_xdist_make_scheduler(config, log):
    """Each file is one unit of work (its module fixtures made once), LAUNCHES one unit together;
    units go to the workers in collection order."""
    from xdist.scheduler import LoadScopeScheduling

    class Files(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "launches" if path.rsplit("/", 1)[-1] in LAUNCHES else path

    config.option.loadscopereorder = False
    return Files(config, log)


@pytest.fixture(autouse=True)
def _seed():
    """Each test starts from seed 0, and leaves torch's threads (the process's, one under -n) as it found them."""
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def spm_model(tmp_path_factory):
    """A small sentencepiece model trained here on generated text (no downloads)."""
    import random

    import sentencepiece as spm

    rng = random.Random(0)
    words = "the a red green blue circle square moves left right up down frame video second appears".split()
    words += ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 8))) for _ in range(300)]
    folder = tmp_path_factory.mktemp("spm")
    corpus = folder / "corpus.txt"
    corpus.write_text("\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(1000)))
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(folder / "sp"),
        vocab_size=256,
        model_type="bpe",
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        minloglevel=2,
    )
    return folder / "sp.model"


@pytest.fixture(scope="session")
def reference(tmp_path_factory):
    """stage a of one process: the losses every parallel run must give."""
    out = tmp_path_factory.mktemp("cp1")
    forked_train(out, "stage_only=a")
    return losses(out)


@pytest.fixture(scope="module")
def tok(spm_model):
    """The test sentencepiece model as lwm's TextTokenizer."""
    from lwm.data import TextTokenizer

    return TextTokenizer(spm_model)


@pytest.fixture(scope="module")
def vocab(tok):
    from lwm.data import Vocab

    return Vocab(tok.vocab_size)


@pytest.fixture(scope="module")
def codes_dir(tmp_path_factory):
    """Cached codes of the videos in tests/code_samples.py's T_FRAMES."""
    from code_samples import write_codes

    return write_codes(tmp_path_factory.mktemp("codes"))
