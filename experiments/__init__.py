"""Experiments: specs as data (specs/*.toml), run on the lab's nodes (or any inventory) by
fabfile.py, results in their own directory, and a report."""
