"""`plimsoll loadtest`: drive an OpenAI-compatible server with rising concurrency, find the knee where the SLOs
break, read the engine's own metrics at it, compare it with the capacity model and write it back as thresholds.

`measure` holds the values every part passes around; `judge` and `search` are pure logic over them; the runner,
client and engine watcher do the I/O.
"""
