"""How a process ends its torch.distributed (lwm.parallel.launch.end_process_groups): a group that
only a reference cycle keeps alive is freed before the interpreter shuts down. A gloo group freed
during that shutdown aborts the process ("terminate called without an active exception"; under
torchrun the whole command fails, about one exit in five with a peer under load)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from lwm.paths import REPO

ROOT = REPO

SCRIPT = textwrap.dedent(
    """
    import atexit, gc, os, tempfile, weakref
    import torch.distributed as dist
    from lwm.parallel.launch import end_process_groups

    gc.disable()  # only an explicit collection frees a cycle, as when the collector has not run yet
    store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    group = weakref.ref(dist.group.WORLD)
    # registered first, so it runs last of the exit handlers, just before the shutdown
    atexit.register(lambda: print("group freed before shutdown:", group() is None, flush=True))


    class Holder:  # what a run keeps: an object that holds the group, in a cycle
        def __init__(self):
            self.group, self.me = dist.group.WORLD, self


    def run():
        held = Holder()
        dist.all_reduce(__import__("torch").ones(2), group=held.group)
        end_process_groups()


    run()
    """
)


def test_a_group_held_by_a_cycle_is_freed_before_the_interpreter_shuts_down(tmp_path):
    script = tmp_path / "end.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "group freed before shutdown: True" in done.stdout, done.stdout + done.stderr[-2000:]
