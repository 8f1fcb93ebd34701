"""Everything that reads the outside world: http.py (the one bounded fetch), promtext.py, engines/ (one module
per vocabulary, plus detection), nvml.py, processes.py, kubernetes.py.

May import config/ and the package's version; never daemon/ or a command, which import it.
"""
