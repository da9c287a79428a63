"""CLI tests, one file a command (``planrun.cli.app`` through CliRunner)."""
