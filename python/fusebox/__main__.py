"""python -m fusebox ARGS...: the fusebox CLI (`python -m fusebox --help`), the binary
fusebox.cli_path() names, run with these arguments in place of this process."""

import os
import sys

from . import cli_path


def main():
    path = cli_path()
    if not os.access(path, os.X_OK):
        sys.exit(f"python -m fusebox: the CLI {path} is not an executable file "
                 "(set FUSEBOX_CLI, or build the `fusebox` target)")
    os.execv(path, [path, *sys.argv[1:]])


if __name__ == "__main__":
    main()
