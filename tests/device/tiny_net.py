"""A tiny model for workload and ``tune --net`` tests (loaded as ``tiny_net:build``)."""

import torch


def build() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(4, 4, 3, padding=1),
        torch.nn.Conv2d(4, 4, 3, padding=1), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
        torch.nn.Linear(4, 5))


class TinyTransformer(torch.nn.Module):
    """Self-attention through ``nn.MultiheadAttention`` and a causal ``scaled_dot_product_attention`` of
    two heads, over the pixels of an image (``image_size**2`` tokens of 3 channels embedded in 8)."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(3, 8)
        self.attention = torch.nn.MultiheadAttention(8, 2, batch_first=True)
        self.head = torch.nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.embed(x.flatten(2).transpose(1, 2))
        t = t + self.attention(t, t, t, need_weights=False)[0]
        batch, tokens, _ = t.shape
        heads = t.view(batch, tokens, 2, 4).transpose(1, 2)
        causal = torch.nn.functional.scaled_dot_product_attention(heads, heads, heads, is_causal=True)
        return self.head((t + causal.transpose(1, 2).reshape(batch, tokens, 8)).mean(1))


def build_transformer() -> torch.nn.Module:
    return TinyTransformer()
