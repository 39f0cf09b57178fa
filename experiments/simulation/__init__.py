"""Predictions beyond the lab's size: the library's own schedules (rxelab.trace) replayed on
SimGrid platforms (platforms.py) by a small s4u replayer (replayer.py), with costs calibrated
on the lab (costs.py)."""
