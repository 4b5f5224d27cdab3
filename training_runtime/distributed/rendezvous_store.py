"""The c10d rendezvous store of an elastic gang, hosted by a process of its own:
``python -m training_runtime.distributed.rendezvous_store --port 29400``.

torchrun's c10d backend otherwise hosts the store in the agent whose address is the endpoint's
(pod 0), and a gang that loses that node loses the rendezvous with it: the nodes that are left
cannot re-form. Hosted here (a small pod beside the Job on Kubernetes, resources/k8s/manifests.py;
the gang process itself locally, resources/launch/gang.py) it outlives any node, and the agents
join it as clients (``--rdzv-conf=is_host=false``). It serves until it is stopped (SIGTERM).
"""

from __future__ import annotations

import argparse
import datetime
import signal
import sys
import threading


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training_runtime.distributed.rendezvous_store")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--timeout-s", type=float, default=900.0, help="how long a client's request may wait")
    args = parser.parse_args(argv)
    from torch.distributed import TCPStore

    store = TCPStore(args.host, args.port, is_master=True, multi_tenant=True, wait_for_workers=False,
                     timeout=datetime.timedelta(seconds=args.timeout_s))
    print(f"rendezvous store serving on {args.host}:{store.port}", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    del store
    return 0


if __name__ == "__main__":
    sys.exit(main())
