"""`python -m dlindex`: the same as the `dlindex` command."""

from dlindex.cli import main

main()
