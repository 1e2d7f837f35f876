from dlindex.cli import main

main()
