"""``python -m fgpu`` runs the command line."""

from fgpu.cli import main

main()
