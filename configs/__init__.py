"""The shipped config files (tasks, gates, runs, devices, auto, qc, rlinf), installed as ``hg_dagger.configs``.

A package only so that installs carry the YAML files and ``importlib.resources`` finds them; it holds no code.
"""
