"""Round progress: a bar on a terminal, plain lines otherwise."""

from __future__ import annotations

import logging
import sys
from typing import Any, Optional

logger = logging.getLogger(__name__)


class Progress:
    """Shows round, accuracy and online count; ``mode``: auto | bar | lines | off."""

    def __init__(self, total: int, mode: str = "auto", initial: int = 0) -> None:
        if mode == "auto":
            mode = "bar" if sys.stderr.isatty() else "lines"
        self.mode = mode
        self.total = total
        self.bar: Optional[Any] = None
        self.last_acc: Optional[float] = None
        self.last_acc_round: Optional[int] = None
        if mode == "bar":
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, unit="round", dynamic_ncols=True, file=sys.stderr)

    def _acc(self, row: dict[str, Any]) -> str:
        """Return Return this round's accuracy, or the last one with the round it is from."""
        if row.get("test_accuracy") is not None:
            self.last_acc, self.last_acc_round = row["test_accuracy"], row["round"]
            return f"{self.last_acc:.4f}"
        if self.last_acc is None:
            return "-"
        return f"{self.last_acc:.4f}@r{self.last_acc_round}"

    def update(self, row: dict[str, Any]) -> None:
        """Show one round's row (a train round only)."""
        if row.get("phase", "train") != "train":  # extra rounds of a part (e.g. session-init)
            if self.mode == "lines":
                print(
                    f"round {row['round']} ({row['phase']}): trained={len(row.get('sampled', []))}",
                    file=sys.stderr,
                    flush=True,
                )
            return
        acc = self._acc(row)
        online = len(row.get("online", []))
        trained, failed = len(row.get("sampled", [])), len(row.get("failed", []))
        status = (
            f"trained={trained}" + (f" failed={failed}" if failed else "") + (" skipped" if row.get("skipped") else "")
        )
        if self.bar is not None:
            self.bar.set_postfix_str(f"acc={acc} online={online} {status} session={row.get('session')}", refresh=False)
            self.bar.update(1)
        elif self.mode == "lines":
            print(
                f"round {row['round']}/{self.total} acc={acc} online={online} "
                f"{status} session={row.get('session')} "
                f"({row.get('wall_s', 0.0):.2f}s)",
                file=sys.stderr,
                flush=True,
            )

    def close(self) -> None:
        """Close the progress bar, if there is one."""
        if self.bar is not None:
            self.bar.close()
