"""A stand-in for rdma-core's pyverbs, for tests on machines without RDMA: the subset of its
API that rxelab uses, over an in-memory fabric with RC semantics (see _fabric.py). Ranks are
threads of one process, so a remote write is a memmove between their buffers."""
