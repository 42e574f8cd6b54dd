"""The seed guides' names, as thin adapters over rankwise's core (no logic of their own).

- :mod:`rankwise.compat.cyxwiz`: the CyxWiz guide (``import rankwise.compat.cyxwiz as cx``);
  for now its ``DistributedSampler`` with the guide's method-style sizes.
"""
