from collect_cli.cli import main

main()
