"""The `infersim` command line: one module per subcommand."""
