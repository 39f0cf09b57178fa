"""The communicator and how a process gets one (see communicator.py for how it is built)."""

from rxelab.comm.communicator import Communicator, shared_settings
from rxelab.comm.plans import MAX_PLANS
from rxelab.comm.results import RemoteBuffer, Stats
from rxelab.comm.starting import OPENING, init, join

__all__ = ["MAX_PLANS", "OPENING", "Communicator", "RemoteBuffer", "Stats", "init", "join",
           "shared_settings"]
