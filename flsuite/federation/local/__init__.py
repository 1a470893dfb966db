"""One client fit: the environment and `run_client` (client.py), the lean and standard loops (loops.py), the compiled
loop (compiled.py), the wrapper-free SGD calls (sgd.py), and the batches each loop iterates (batches.py)."""

#: Modules of Lightning classes only, imported by the fits that take a Trainer (`flsuite.cli_parsers.not_configurable`).
NOT_CONFIGURABLE = ("trainer",)
