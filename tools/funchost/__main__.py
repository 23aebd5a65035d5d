"""``python -m tools.funchost [--app-dir .] [--settings local.settings.json]``."""

import logging
import os
import sys

from .cli import main

code = main()
logging.shutdown()
sys.stdout.flush()
sys.stderr.flush()
# A function still running past the drain deadline holds a pool thread that the
# interpreter would wait for at exit; its message is already abandoned, so leave now.
os._exit(code)
