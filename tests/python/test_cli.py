"""python -m fusebox runs the CLI the build made (or $FUSEBOX_CLI)."""

import os
import subprocess
import sys

import fusebox


def test_python_m_fusebox_runs_the_cli():
    assert os.access(fusebox.cli_path(), os.X_OK)
    done = subprocess.run([sys.executable, "-m", "fusebox", "zoo", "--list"], capture_output=True,
                          text=True, check=True)
    assert "resnet50" in done.stdout
    failed = subprocess.run([sys.executable, "-m", "fusebox", "no-such-command"],
                            capture_output=True, text=True)
    assert failed.returncode != 0


def test_fusebox_cli_env_overrides(tmp_path):
    fake = tmp_path / "fake-cli"
    fake.write_text("#!/bin/sh\necho fake \"$@\"\n")
    fake.chmod(0o755)
    done = subprocess.run([sys.executable, "-m", "fusebox", "a", "b"], capture_output=True,
                          text=True, check=True, env={**os.environ, "FUSEBOX_CLI": str(fake)})
    assert done.stdout == "fake a b\n"
