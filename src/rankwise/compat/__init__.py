"""The seed guides' names, as thin adapters over rankwise's core (no logic of their own).

Each guide's code runs with only its imports changed (docs/seeds/ maps every call):

- :mod:`rankwise.compat.cyxwiz`: the CyxWiz guide (``import rankwise.compat.cyxwiz as cx``):
  ``cx.distributed`` and the Quick Start's model names.
- :mod:`rankwise.compat.dpa`: the DPA guide's ``src.distributed`` and ``src.dpa`` names.
- :mod:`rankwise.compat.frameworm`: FRAMEWORM's ``Config``, ``get_model`` and ``Trainer``.
- :mod:`rankwise.compat.scdataset`: ``scDataset`` and its strategies, as the guide and the
  released ``scdataset`` package spell them.
- :mod:`rankwise.compat.tensorbrain`: torch under TensorBrain's name (``import ... as tb``).
"""
