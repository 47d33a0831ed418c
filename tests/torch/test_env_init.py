"""init_process_group("trident") with env:// under `trident launch` (whose launcher hosts trident's store on
MASTER_PORT) and under torchrun (whose agent hosts torch's store there)."""
import os
import subprocess
import sys

from harness import free_port

here = os.path.dirname(os.path.abspath(__file__))
main = os.path.join(here, "env_init_main.py")
trident = os.environ["TRIDENT_BIN"]

# `trident launch`, 3 ranks.
subprocess.run([trident, "launch", "--nproc-per-node", "3", "--master-port", "0", "--", sys.executable, main],
               check=True, timeout=300)
# torchrun itself, 2 ranks (torch 1.13's torchrun needs the Python 3.11 shim in shared/peers, beside the
# repository in CI); without the shim, the environment torchrun gives each worker, set here.
shim = os.path.join(here, "..", "..", "..", "shared", "peers", "torchrun_py311.py")
port = str(free_port())
if os.path.exists(shim):
    subprocess.run([sys.executable, shim, "--nproc_per_node=2", f"--master_port={port}", main], check=True,
                   timeout=300)
else:
    procs = []
    for r in range(2):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r), LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        env.pop("TRIDENT_STORE_HOSTED", None)
        procs.append(subprocess.Popen([sys.executable, main], env=env))
    codes = [p.wait(timeout=300) for p in procs]
    assert codes == [0, 0], codes
print("PASS")
