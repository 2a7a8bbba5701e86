"""Trainable heads over frozen embeddings; saved as safetensors + JSON, loadable without Lightning.

Every head maps (B, dim) -> (B, dim) and, except `linear`, starts at (or very near) the identity,
so training starts from the frozen encoder's quality instead of from noise.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from simtune import model_files
from simtune.errors import UserError, shorten

FORMAT_VERSION = 1
TYPES = model_files.HEAD_TYPES


class Head(nn.Module):
    """Base: remembers its construction arguments for `save`/`load`."""

    def __init__(self, kind: str, dim: int, expansion: int, dropout: float) -> None:
        super().__init__()
        self.config = {"type": kind, "dim": dim, "expansion": expansion, "dropout": dropout,
                       "format_version": FORMAT_VERSION}

    def identity_state(self) -> dict[str, torch.Tensor]:
        """A state dict of this head (copies) under which it is exactly the identity: y == x
        bit for bit (the train stage's epoch 0, the frozen encoder as a candidate). Its
        parameters that a zero product cancels keep their values (a later load of a trained
        state replaces them anyway)."""
        state = {k: v.detach().clone() for k, v in self.state_dict().items()}
        for name, value in self._identity.items():
            if value == "eye":
                state[name].copy_(torch.eye(len(state[name])))
            else:
                state[name].zero_()
        return state

    def at_identity(self) -> bool:
        """Whether the head holds its `identity_state` exactly (a kept epoch 0): the export
        then serves the frozen encoder's vectors, with no head module at all."""
        want = self.identity_state()
        return all(torch.equal(v, want[k]) for k, v in self.state_dict().items())

    # the parameters `identity_state` sets: name -> "zero" | "eye" (the others are cancelled)
    _identity: dict[str, str] = {}  # noqa: RUF012 (read only)


class Identity(Head):
    """The frozen encoder itself: the baseline."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class Linear(Head):
    """y = W x + b, W initialised to the identity."""

    _identity = {"fc.weight": "eye", "fc.bias": "zero"}  # noqa: RUF012

    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        dim = self.config["dim"]
        self.fc = nn.Linear(dim, dim)
        with torch.no_grad():  # W = I exactly: each output is x_i * 1 + sums of x_j * 0
            self.fc.weight.copy_(torch.eye(dim))
            self.fc.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


class SkipConnection(Head):
    """y = x + sigmoid(g) * (W x + b): a gated residual; gates start at sigmoid(-4) = 0.018
    (near, not at, the identity: `identity_state` zeroes W and b)."""

    _identity = {"fc.weight": "zero", "fc.bias": "zero"}  # noqa: RUF012

    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        dim = self.config["dim"]
        self.fc = nn.Linear(dim, dim)
        self.gates = nn.Parameter(torch.full((dim,), -4.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.sigmoid(self.gates) * self.fc(x)


class Gated(Head):
    """y = 2 sigmoid(g) * x: per-dimension gates that mute or amplify; the identity at init."""

    _identity = {"gates": "zero"}  # noqa: RUF012

    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.gates = nn.Parameter(torch.zeros(self.config["dim"]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * torch.sigmoid(self.gates) * x


class MLP(Head):
    """y = x + W2 dropout(gelu(W1 x)), hidden = expansion * dim; W2 = 0 so identity at init."""

    _identity = {"net.3.weight": "zero", "net.3.bias": "zero"}  # noqa: RUF012

    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        dim, hidden = self.config["dim"], self.config["dim"] * self.config["expansion"]
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(),
                                 nn.Dropout(self.config["dropout"]), nn.Linear(hidden, dim))
        nn.init.zeros_(self.net[-1].weight)
        nn.init.zeros_(self.net[-1].bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.net(x)


_CLASSES: dict[str, type[Head]] = {"identity": Identity, "linear": Linear,
                                   "skip_connection": SkipConnection, "gated": Gated, "mlp": MLP}


def build(kind: str, dim: int, expansion: int, dropout: float) -> Head:
    """A new head of `kind` over `dim`-dimensional embeddings."""
    return _CLASSES[kind](kind, dim, expansion, dropout)


def save(head: Head, directory: Path) -> None:
    """Write `model.safetensors` and `config.json` into `directory` (created)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous() for k, v in head.state_dict().items()}
    save_file(tensors, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(head.config, indent=2) + "\n")


def load(directory: Path) -> Head:
    """Rebuild a saved head (no Lightning needed); `UserError` (one line) if the directory is
    not one, its `config.json` is damaged (`model_files.HeadConfig`), or its weights are not
    the config's (names and shapes) or not finite."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    directory = Path(directory)
    config_path = directory / "config.json"
    if not config_path.exists():  # a FIFO or a folder: model_files.read says which
        raise UserError(f"{directory}: no trained head here (run the train stage)")
    config = model_files.read(config_path, model_files.HeadConfig)
    head = build(config.type, config.dim, config.expansion, config.dropout)
    weights_path = directory / "model.safetensors"
    if not weights_path.is_file():
        raise UserError(f"{weights_path}: missing or not a regular file (rerun train)")
    try:
        weights = load_file(str(weights_path))
    except (SafetensorError, OSError) as e:
        raise UserError(f"{weights_path}: cannot read: {shorten(str(e) or type(e).__name__, 200)}"
                        ) from None
    want = {k: tuple(v.shape) for k, v in head.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in weights.items()}
    if got != want:  # load_state_dict would raise a size-mismatch traceback
        bad = sorted(k for k in want.keys() | got.keys() if want.get(k) != got.get(k))[0]
        raise UserError(f"{weights_path}: weight {bad} is {got.get(bad, 'missing')}, a "
                        f"{config.type} head of dim {config.dim} (config.json) needs "
                        f"{want.get(bad, 'none')}")
    for name, tensor in weights.items():  # a diverged head would give NaN vectors, not metrics
        if not bool(torch.isfinite(tensor).all()):
            raise UserError(f"{weights_path}: weight {name} is not finite (training diverged?); "
                            "rerun train")
    head.load_state_dict(weights)
    return head.eval()
