"""The progress bar of a bench run (on standard error, so ``--json`` output stays clean)."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class Phase:
    """One bar: ``advance(n)`` as work completes, ``set(n)`` for an absolute count."""

    def __init__(self, progress: Progress | None, description: str, total: int) -> None:
        self._progress = progress
        self._task = progress.add_task(description, total=total) if progress else None

    def advance(self, amount: int = 1) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task, amount)

    def set(self, completed: int) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=completed)


class ProgressView:
    """Bars for the phases of a run; silent when disabled."""

    def __init__(self, enabled: bool) -> None:
        self.console = Console(stderr=True)
        self._progress = (
            Progress(
                TextColumn("{task.description:<34}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=self.console,
                transient=False,
            )
            if enabled
            else None
        )

    def phase(self, description: str, total: int) -> Phase:
        return Phase(self._progress, description, total)

    def note(self, text: str) -> None:
        """A line above the bars."""
        if self._progress is not None:
            self._progress.console.print(text)

    def __enter__(self) -> ProgressView:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._progress is not None:
            self._progress.stop()
