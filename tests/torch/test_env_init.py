"""init_process_group("trident") with env:// under `trident launch` (whose launcher hosts trident's store on
MASTER_PORT) and under torchrun (torch's own store)."""
import os
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
main = os.path.join(here, "env_init_main.py")
trident = os.environ["TRIDENT_BIN"]

# `trident launch`, 3 ranks.
subprocess.run([trident, "launch", "--nproc-per-node", "3", "--master-port", "0", "--", sys.executable, main],
               check=True, timeout=300)
# torchrun itself, 2 ranks (torch 1.13's torchrun needs the Python 3.11 shim in shared/peers, beside the
# repository in CI), its rendezvous on a port the kernel picks; without the shim, what torchrun's agent does,
# done here: host the store on a port the kernel picks and start each worker with torchrun's environment.
shim = os.path.join(here, "..", "..", "..", "shared", "peers", "torchrun_py311.py")
if os.path.exists(shim):
    subprocess.run([sys.executable, shim, "--nproc_per_node=2", "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:0",
                    main], check=True, timeout=300)
else:
    import datetime

    import torch.distributed as dist

    agent_store = dist.TCPStore("127.0.0.1", 0, 2, True, datetime.timedelta(seconds=300), wait_for_workers=False)
    procs = []
    for r in range(2):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r), LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(agent_store.port), TORCHELASTIC_USE_AGENT_STORE="True",
                   TORCHELASTIC_RESTART_COUNT="0")
        env.pop("TRIDENT_STORE_HOSTED", None)
        procs.append(subprocess.Popen([sys.executable, main], env=env))
    codes = [p.wait(timeout=300) for p in procs]
    assert codes == [0, 0], codes
print("PASS")
