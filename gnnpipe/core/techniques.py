"""`Techniques`: GNNPipe's three convergence techniques for the chunked epoch, as frozen data."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Techniques"]


@dataclass(frozen=True)
class Techniques:
    """GNNPipe's convergence techniques (docs/design.md §5). By default the chunk order and the
    snapshot are on and the unbiased gradients off: on Squirrel (GCNII-16, lr 0.01, 2 x 8 chunks,
    ``benchmarks/squirrel.py``, seeds 0-2) doubling the fresh ``dZbuf`` rows cost the chunked
    epoch 3.4 points of test accuracy against exact training, and each chunk's latest gradient
    (last epoch's for chunks still to come) none (+0.1; issue #28; on Cora neither matters).

    Attributes:
        random_order: a fresh seeded chunk order every epoch (the same on every stage).
        snapshot: reset ``Hbuf`` from a snapshot at each epoch start; refresh the snapshot at the
            end of epoch ``e`` when ``e % snapshot_period == 0``.
        snapshot_period: epochs between snapshots.
        unbiased_grad: zero ``dZbuf`` each epoch and double a chunk's rows after its backward;
            off, a chunk pulls the latest gradient of every chunk's rows (this epoch's for the
            chunks already done, last epoch's for the rest). The paper's technique 3; off by
            default.
    """

    random_order: bool = True
    snapshot: bool = True
    snapshot_period: int = 23
    unbiased_grad: bool = False

    def snapshot_due(self, epoch: int) -> bool:
        """Whether the snapshot is refreshed at the end of ``epoch`` (with ``snapshot`` on)."""
        return epoch % self.snapshot_period == 0

    @property
    def grad_in_h(self) -> bool:
        """Whether ``dZbuf`` can live in ``Hbuf``'s memory: with the snapshot, ``Hbuf`` is reset
        at every epoch start, so after the epoch's last forward only the snapshot due then reads
        it; with unbiased gradients ``dZbuf`` starts each backward phase from zeros. Two
        full-graph buffers per layer instead of three, the same arithmetic."""
        return self.snapshot and self.unbiased_grad

    @classmethod
    def coerce(cls, value: Techniques | dict | bool | None) -> Techniques:
        """Accept a Techniques, a dict of fields (the others at their defaults), ``None`` (the
        defaults), ``True`` (all three on, the paper's set) or ``False`` (all off)."""
        if value is None:
            return cls()
        if value is True:
            return cls(random_order=True, snapshot=True, unbiased_grad=True)
        if value is False:
            return cls(random_order=False, snapshot=False, unbiased_grad=False)
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            unknown = set(value) - set(cls.__dataclass_fields__)
            if unknown:
                raise ValueError(f"techniques: unknown switches {sorted(unknown)}; expected some of "
                                 f"{sorted(cls.__dataclass_fields__)}")
            return cls(**value)
        raise TypeError(f"techniques: expected Techniques, dict or bool, got {type(value).__name__}")

    def __post_init__(self) -> None:
        for name in ("random_order", "snapshot", "unbiased_grad"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"techniques.{name}: expected True or False, "
                                f"got {getattr(self, name)!r}")
        if isinstance(self.snapshot_period, bool) or not isinstance(self.snapshot_period, int) \
                or self.snapshot_period < 1:
            raise ValueError(f"techniques.snapshot_period: expected an integer >= 1, "
                             f"got {self.snapshot_period!r}")
