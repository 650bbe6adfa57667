"""Example LightningModules and DataModules whose data ships with a package (no download).

- ``digits``: an MLP on scikit-learn's 8x8 handwritten digits (classification, ``val_acc``).
- ``tinylm``: a byte-level transformer language model on a public-domain text in ``data/``
  (``val_ppl``); also a starting point to copy into a project of your own (``runs create --workdir``).
- ``local_swarm``: N processes on this machine training the digits example together.
"""
