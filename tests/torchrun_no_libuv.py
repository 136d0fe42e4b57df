"""torchrun for a PyTorch built without libuv (Debian 13's python3-torch 2.6).

PyTorch 2.4+ makes every TCPStore with use_libuv=True unless told otherwise, and torchrun's rendezvous gives no
way to say otherwise, so on such a build torchrun fails before starting a worker ("use_libuv was requested but
PyTorch was build without libuv support"). This runs torchrun unchanged with the socket transport as the
default. Used by tests/test_distributed_cli.cpp only where the plain torchrun cannot make a store.
"""
import sys

import torch.distributed as dist


class _SocketTCPStore(dist.TCPStore):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("use_libuv", False)
        super().__init__(*args, **kwargs)


dist.TCPStore = _SocketTCPStore  # before torchrun's modules import the name

from torch.distributed.run import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
