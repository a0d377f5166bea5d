"""python -m lwm.eval.video_qa: the command (lwm.eval.video_qa.cli)."""

import sys

from lwm.eval.video_qa.cli import main

sys.exit(main())
