"""``python -m benchmarks.throughput '<spec>'``: one worker process of a cell."""

import json
import sys

from benchmarks.throughput.worker import worker_main

worker_main(json.loads(sys.argv[1]))
