"""Zoo models with trained weights: scikit-learn's bundled 8×8 handwritten digits.

Random-weight models prove that a conversion reproduces the quantized reference, not that
the compiled program still classifies anything. These two are trained here, from this
file, on a data set that ships with scikit-learn (no download): deterministically (fixed
seed, one thread, a fixed minibatch order) in a few seconds. The trained state dict is
cached under the user cache directory, keyed by a hash of this file and the torch
version, so a change to the training code retrains and nothing opaque is committed.

Split: every fifth sample (index % 5 == 0) is the held-out test split (360 of 1,797);
the rest trains. Pixels are scaled from 0..16 to 0..1.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from functools import cache
from pathlib import Path

import torch
from torch import nn

#: Seeds the weight initialisation and the minibatch order.
TRAIN_SEED = 0
#: One test sample in this many (by index): a split that needs no random generator.
TEST_EVERY = 5
NUM_CLASSES = 10


def split() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x_train, y_train, x_test, y_test): x float32 [N, 64] in 0..1, y int64 [N]."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.int64)
    test = torch.arange(len(y)) % TEST_EVERY == 0
    return x[~test], y[~test], x[test], y[test]


class DigitsCNN(nn.Module):
    """A small CNN on 1×1×8×8 images."""

    input_shape = (1, 1, 8, 8)

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )  # fmt: skip
        self.classifier = nn.Linear(16 * 2 * 2, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


class DigitsMLP(nn.Module):
    """A multilayer perceptron on the 64 pixels."""

    input_shape = (1, 64)

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, NUM_CLASSES)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


#: name -> (architecture, epochs, minibatch size, Adam learning rate)
CONFIGS: dict[str, tuple[type[nn.Module], int, int, float]] = {
    "digits_cnn": (DigitsCNN, 8, 64, 1e-2),
    "digits_mlp": (DigitsMLP, 30, 64, 1e-2),
}


def shaped(name: str, x: torch.Tensor) -> torch.Tensor:
    """Flat [N, 64] pixels in the model's input shape ([N, 1, 8, 8] for the CNN)."""
    shape = CONFIGS[name][0].input_shape  # type: ignore[attr-defined]
    return x.reshape(len(x), *shape[1:])


def _cache_dir() -> Path:
    """``$ETFORGE_CACHE_DIR``, else the XDG cache directory (``~/.cache``) + ``etforge``."""
    if os.environ.get("ETFORGE_CACHE_DIR"):
        return Path(os.environ["ETFORGE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "etforge"


def _key(name: str) -> str:
    """What determines the trained weights: this file's code, the model name, torch's version."""
    h = hashlib.sha256(Path(__file__).read_bytes())
    h.update(f"{name}\0{torch.__version__}".encode())
    return h.hexdigest()[:24]


def train(name: str) -> dict[str, torch.Tensor]:
    """Train ``name`` from scratch: seeded, single-threaded, a fixed minibatch order."""
    arch, epochs, batch, lr = CONFIGS[name]
    x_train, y_train, _, _ = split()
    x_train = shaped(name, x_train)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a reduction split across threads sums in another order
    try:
        with torch.random.fork_rng():
            torch.manual_seed(TRAIN_SEED)
            model = arch()
            opt = torch.optim.Adam(model.parameters(), lr=lr)
            order = torch.Generator().manual_seed(TRAIN_SEED)
            model.train()
            for _ in range(epochs):
                perm = torch.randperm(len(y_train), generator=order)
                for i in range(0, len(perm), batch):
                    idx = perm[i : i + batch]
                    opt.zero_grad()
                    loss = nn.functional.cross_entropy(model(x_train[idx]), y_train[idx])
                    loss.backward()
                    opt.step()
    finally:
        torch.set_num_threads(threads)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@cache
def trained_state(name: str) -> dict[str, torch.Tensor]:
    """The trained state dict, from the cache when its key matches, else trained and cached.

    A cache file that does not load (truncated, foreign) is ignored and replaced.
    """
    path = _cache_dir() / "zoo" / f"{name}-{_key(name)}.pt"
    if path.is_file():
        try:
            state = torch.load(path, weights_only=True)
            CONFIGS[name][0]().load_state_dict(state)
            return state
        except Exception:  # noqa: BLE001 - a bad cache entry is rebuilt, never trusted
            pass
    state = train(name)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{name}.", suffix=".tmp")
        os.close(fd)
        torch.save(state, tmp)
        os.replace(tmp, path)  # atomic: a reader never sees a half-written entry
    except OSError:
        pass  # a read-only cache only costs the training time
    return state


def trained(name: str) -> Callable[[], nn.Module]:
    """A zoo build function: the architecture with its trained weights, in eval mode."""

    def build() -> nn.Module:
        model = CONFIGS[name][0]()
        model.load_state_dict(trained_state(name))
        return model.eval()

    return build


def calibration(name: str, count: int = 16) -> list[tuple[torch.Tensor, ...]]:
    """``count`` training samples spread evenly over the training split (never test data)."""
    x_train, _, _, _ = split()
    step = max(1, len(x_train) // max(count, 1))
    xs = shaped(name, x_train[::step][:count])
    return [(x.unsqueeze(0),) for x in xs]


def test_data(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The held-out test split shaped for ``name``: (x float32 [N, *input], y int64 [N])."""
    _, _, x_test, y_test = split()
    return shaped(name, x_test), y_test


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Top-1 accuracy of ``model`` on ``x``/``y`` in percent."""
    with torch.no_grad():
        return 100.0 * float((model(x).argmax(1) == y).float().mean())
