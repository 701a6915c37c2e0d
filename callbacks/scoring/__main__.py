"""``python -m callbacks.scoring <out_root> ...``: :func:`callbacks.scoring.command.main`."""
from .command import main

main()
