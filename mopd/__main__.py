from mopd.cli import run

run()
