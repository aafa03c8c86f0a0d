"""Reference for the CLI scenario: the smallest Typer app shaped like ``mahabharatha lock check``.

Two commands (so Typer builds a group, as ours has) and one ``str`` argument. Running it costs
what any Typer CLI costs on top of ``import typer``: building the click command tree and
coercing the argument, which in Typer 0.2x imports pydantic.
"""

import typer

app = typer.Typer()


@app.command()
def check(feature: str) -> None:
    """Print the feature: nothing else."""
    print(f"{feature} is free")


@app.command()
def other() -> None:
    """A second command, so that Typer builds a group as the real CLI has."""


if __name__ == "__main__":
    app()
