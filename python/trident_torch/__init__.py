"""trident as a torch.distributed backend.

    import trident_torch                      # registers the backend name "trident"
    torch.distributed.init_process_group("trident")   # env:// (torchrun, `trident launch`), tcp://, file://

Collectives run on CPU tensors through trident's process groups (src/trident/comm/process_group.h): the
native backend's shared-memory and TCP algorithms, its deadlines, dead-peer detection and mismatch checks.
A failure surfaces as RuntimeError naming the rank, the group and the collective.
"""
import os

import torch.distributed as _dist

from . import _C  # the C++ extension (python/process_group_trident.cc)

__all__ = ["create_process_group"]

# Under `trident launch` the launcher itself hosts the rendezvous store on MASTER_PORT (trident's TCPStore
# protocol, TRIDENT_STORE_HOSTED=1), so torch's env:// handler cannot host its own TCPStore there. In that
# case env:// hands torch a c10d Store backed by trident's store client instead (_C.connect_trident_store);
# under torchrun, or with tcp:// and file://, torch's own stores are used unchanged.


def create_process_group(store, rank, world_size, timeout):
    """The creator torch.distributed calls for backend "trident" (store is torch's PrefixStore)."""
    return _C.create_process_group(store, rank, world_size, timeout)


def _wrap_env_handler():
    import importlib

    _rdzv = importlib.import_module("torch.distributed.rendezvous")

    handlers = _rdzv._rendezvous_handlers
    torch_env = handlers.get("env")
    if torch_env is None or getattr(torch_env, "_trident", False):
        return

    def env_handler(url, timeout=_dist.default_pg_timeout, **kwargs):
        if os.environ.get("TRIDENT_STORE_HOSTED") != "1":
            yield from torch_env(url, timeout=timeout, **kwargs)
            return
        rank = int(os.environ["RANK"])
        world_size = int(os.environ["WORLD_SIZE"])
        store = _C.connect_trident_store(timeout)
        yield (store, rank, world_size)
        raise RuntimeError("Unable to perform re-rendezvous using env:// method")

    env_handler._trident = True
    handlers["env"] = env_handler


_wrap_env_handler()
if not hasattr(_dist.Backend, "TRIDENT"):  # importing twice (importlib.reload) must not register twice
    _dist.Backend.register_backend("trident", create_process_group)
