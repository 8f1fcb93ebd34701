"""`plimsoll loadtest`: drive an OpenAI-compatible server with rising load (closed-loop concurrency, or open-loop
rates), find where the engine saturates by its own metrics and where the SLOs break, compare the lower of the two
with the capacity model and write it back as thresholds.

`measure` holds the values every part passes around; `judge` (one step's verdict and signals) and `search` (the
answers from all steps) are pure logic over them; `steps`, the runner, the client and the engine watcher do the
I/O; `outputs`, `report` and `progress` render one result document. arguments.py owns the command's flags.

May import core/, capacity/, config/, sources/ and the shared top-level modules (deployment_flags, target_model,
catalog, cli_args, display, files); never daemon/ or another command.
"""
