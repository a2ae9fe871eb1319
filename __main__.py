from etforge.cli import run

run()
