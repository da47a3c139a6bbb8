"""The README's Python quick start, executed as written."""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def test_readme_quick_start_runs(capsys):
    text = README.read_text()
    section = text[text.index("## Python"):]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert blocks, "README.md: no ```python block under ## Python"
    exec(compile(blocks[0], str(README), "exec"), {})
    assert capsys.readouterr().out.strip()
