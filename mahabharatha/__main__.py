"""``python -m mahabharatha``: the same as the ``mahabharatha`` command."""

from mahabharatha.cli import main

if __name__ == "__main__":
    main()
