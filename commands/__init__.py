"""One module per dgchat subcommand."""
