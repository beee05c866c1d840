"""The clients' learning-rate schedule of a scenario (``client.lr_schedule``; the options
are described in :class:`~fedflex.config.ClientConfig`).
"""

from __future__ import annotations

from fedflex.config import ClientConfig


def client_lr(client: ClientConfig, server_round: int, session_start: int) -> float:
    """Return the client learning rate of ``server_round`` (1-based) when the current
    session started in round ``session_start``.

    ``constant``: ``lr``. ``round`` counts t = rounds since round 1, ``session`` t = rounds
    since the session started; ``exp``: ``max(lr_min, lr x lr_decay^t)``; ``poly``:
    ``(lr - lr_min) x (1 - min(t, lr_horizon) / lr_horizon)^lr_power + lr_min``.

    Examples
    --------
    >>> c = ClientConfig(lr=0.1, lr_schedule="session", lr_decay=0.5)
    >>> client_lr(c, 7, 5)  # two rounds into the session that started in round 5
    0.025
    """
    if client.lr_schedule == "constant":
        return float(client.lr)
    t = server_round - 1 if client.lr_schedule == "round" else server_round - session_start
    t = max(t, 0)
    if client.lr_shape == "exp":
        return float(max(client.lr_min, client.lr * client.lr_decay**t))
    fraction = 1.0 - min(t, client.lr_horizon) / client.lr_horizon
    return float((client.lr - client.lr_min) * fraction**client.lr_power + client.lr_min)
