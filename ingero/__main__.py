from ingero.command.cli import main

main()
