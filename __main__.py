from etforge.cli import main

main()
