"""User models in the forms the job contract accepts (tests of issue 17's model contract).

None of them returns ``(inputs, labels) -> loss`` for the planner: they are written as users
write them (logits, keyword inputs, HuggingFace-style outputs, an ``example_inputs`` method).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


class Classifier(nn.Module):
    """A logits classifier: ``forward(pixel_values) -> [B, num_classes]``."""

    def __init__(self, in_features: int = 6, width: int = 8, num_classes: int = 4):
        super().__init__()
        self.fc1 = nn.Linear(in_features, width)
        self.fc2 = nn.Linear(width, num_classes)

    def forward(self, pixel_values):
        return self.fc2(F.relu(self.fc1(pixel_values)))


def build_classifier(width: int = 8):
    """A factory that takes only ``width`` (an injected num_classes would fail it)."""
    return Classifier(width=width)


class Tagger(nn.Module):
    """Token-level logits: ``forward(input_ids, attention_mask) -> [B, T, vocab]``."""

    def __init__(self, vocab: int = 16, width: int = 8):
        super().__init__()
        self.emb = nn.Embedding(vocab, width)
        self.head = nn.Linear(width, vocab)

    def forward(self, input_ids, attention_mask):
        h = self.emb(input_ids) * attention_mask.unsqueeze(-1).to(torch.float32)
        return self.head(torch.tanh(h))


def squared_error(output, targets):
    """A custom loss ``fn(output, targets)``: mean squared error of a regression head."""
    return ((output - targets) ** 2).mean()


class OutputWithLoss(nn.Module):
    """HuggingFace-style: ``forward(features, labels)`` returns a dict with a ``loss`` entry."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.fc = nn.Linear(6, width)
        self.out = nn.Linear(width, 3)

    def forward(self, features, labels):
        logits = self.out(torch.tanh(self.fc(features)))
        return {"logits": logits, "loss": F.cross_entropy(logits, labels)}


class ExampleInputsModel(nn.Module):
    """No ``model.inputs`` in its job: ``example_inputs(batch_size)`` gives them; forward returns the loss."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.fc = nn.Linear(5, width)
        self.out = nn.Linear(width, 1)

    def forward(self, x, y):
        return ((self.out(F.gelu(self.fc(x))).squeeze(-1) - y) ** 2).mean()

    def example_inputs(self, batch_size: int):
        return torch.randn(batch_size, 5), torch.randn(batch_size)


class RecordedDataset(torch.utils.data.Dataset):
    """A map-style dataset of classifier samples that appends each index it is asked for to a file
    (one file per rank), so a test can tell which rows each rank read."""

    def __init__(self, size: int, record_dir: str):
        self.size, self.record = size, Path(record_dir) / f"rank{os.environ.get('RANK', '0')}.jsonl"
        gen = torch.Generator().manual_seed(11)
        self.x = torch.randn(size, 6, generator=gen)
        self.y = self.x[:, :4].argmax(dim=1)

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        with open(self.record, "a") as f:
            f.write(json.dumps(int(index)) + "\n")
        return {"pixel_values": self.x[index], "targets": self.y[index]}


def recorded_dataset(size: int, record_dir: str):
    """The ``data.factory`` of the data tests."""
    return RecordedDataset(size, record_dir)
