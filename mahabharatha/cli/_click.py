"""The few click names the CLI needs, from wherever this typer keeps click (typer 0.28 has
its own copy, ``typer._click``; earlier releases depend on click itself)."""

from __future__ import annotations

try:
    from typer._click.core import Context, ParameterSource
    from typer._click.exceptions import ClickException
    from typer._click.globals import get_current_context
except ImportError:  # typer < 0.28: click is a package of its own
    from click.core import (  # type: ignore[no-redef,import-not-found,unused-ignore]
        Context,
        ParameterSource,
    )
    from click.exceptions import (  # type: ignore[no-redef,import-not-found,unused-ignore]
        ClickException,
    )
    from click.globals import (  # type: ignore[no-redef,import-not-found,unused-ignore]
        get_current_context,
    )

__all__ = ["ClickException", "Context", "ParameterSource", "get_current_context"]
