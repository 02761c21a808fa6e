"""`python -m fastpath.serve MODEL_OR_MANIFEST [options]`."""

import sys

from fastpath.serve.cli import serve_main

if __name__ == "__main__":
    sys.exit(serve_main(sys.argv[1:], prog="python -m fastpath.serve"))
