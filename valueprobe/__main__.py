"""``python -m valueprobe ...`` (and ``torchrun -m valueprobe ...``) runs the command line."""

from valueprobe.cli.main import main

if __name__ == "__main__":
    main()
