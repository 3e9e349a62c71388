"""The `trtpd` command line: one thin module per command."""
