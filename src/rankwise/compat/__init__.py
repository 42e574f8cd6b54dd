"""The seed guides' names, as thin adapters over rankwise's core (no logic of their own).

- :mod:`rankwise.compat.cyxwiz`: the CyxWiz guide (``import rankwise.compat.cyxwiz as cx``):
  ``cx.distributed`` and the Quick Start's model names.
"""
