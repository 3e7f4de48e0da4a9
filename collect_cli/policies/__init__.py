"""Policies: one kind per module (``random``, ``mlp``, ``user``, ``sb3/``), listed in
``registry.py``; ``build.py`` makes the configured one, ``nets.py`` holds rlcollect's
own modules, ``provenance.py`` records where the actions came from. This package
imports nothing heavy: a kind's module imports torch inside its functions."""
