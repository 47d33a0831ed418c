"""Runs a torch.distributed script with init_process_group's backend replaced, for side-by-side numbers:

    python3 tests/torch/with_backend.py trident script.py [args...]   (trident_torch on PYTHONPATH)

Scripts that hard-code init_process_group("gloo") (e.g. shared/peers/torch_dist_bench.py) then run on the
named backend unchanged."""
import runpy
import sys

import torch.distributed as dist

backend, script = sys.argv[1], sys.argv[2]
if backend != "gloo":
    __import__(backend + "_torch")
_init = dist.init_process_group


def init_process_group(_backend=None, *args, **kwargs):
    kwargs.pop("backend", None)
    return _init(backend, *args, **kwargs)


dist.init_process_group = init_process_group
sys.argv = sys.argv[2:]
runpy.run_path(script, run_name="__main__")
