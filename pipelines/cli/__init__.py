"""The `rota` console command: `main` parses, each command lives in its own module."""
