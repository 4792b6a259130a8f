from polyforge.cli import main

main()
