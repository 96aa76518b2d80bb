"""The refresh loop ``monitor`` and ``watch`` share: JSON lines, a printed table, or a live
view in a terminal (``rich``), every ``interval`` seconds until ``count`` or Ctrl-C."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["refresh_loop"]


def refresh_loop(
    frame: Callable[[], tuple[str, Any]],
    *,
    once: bool,
    count: int | None,
    interval: float,
    as_json: bool,
) -> None:
    """Show ``frame()`` — ``(its JSON text, its rich renderable)`` — repeatedly.

    Args:
        frame: Reads the state once; may raise to end the loop (the caller handles it).
        once: One frame, printed (no live view).
        count: Frames to show (None: until Ctrl-C).
        interval: Seconds between frames.
        as_json: One JSON line per frame instead of the table.
    """
    from rich.console import Console

    console = Console(highlight=False)
    refreshes = 1 if once else count
    done = 0
    live = None
    try:
        while refreshes is None or done < refreshes:
            text, view = frame()
            done += 1
            if as_json:
                print(text, flush=True)
            elif once or not console.is_terminal:
                console.print(view)
            else:
                if live is None:
                    from rich.live import Live

                    live = Live(view, console=console, auto_refresh=False)
                    live.start()
                live.update(view, refresh=True)
            if refreshes is None or done < refreshes:
                time.sleep(interval)
    except KeyboardInterrupt:
        pass
    finally:
        if live is not None:
            live.stop()
