"""The test suite.

gRPC's fork support is turned off for every test process (and so the processes they
start) before gRPC is imported: test processes hold gRPC channels and servers with
their threads, and start children with fork + exec and a preexec_fn (the standalone's
supervisor, tests/integration/test_standalone_supervision.py), which runs gRPC's
pthread_atfork handlers in the child; with other threads inside gRPC they can leave the
child to abort before its exec (seen once: "epoll_wait error: Bad file descriptor", exit
-6). Nothing here forks without exec, which is all the fork support is for. The
standalone itself never imports gRPC.
"""

import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
