"""The PyTorch-eager peer of bench_models --device cuda: the same training steps in PyTorch's Python.

Cases (float32, SGD with momentum 0.9, lr 0.01, as bench_models):
  resnet18_cifar  CIFAR-style ResNet-18 (3x3 stem, no max-pool, basic blocks 2-2-2-2, widths
                  64-512, 10 classes), batch 128 of 3x32x32
  gpt2_small      GPT-2 small (12 blocks of width 768, 12 heads, vocabulary 50257, tied head, no
                  dropout), 8 x 1024 tokens; attention through F.scaled_dot_product_attention
                  (what a PyTorch user writes; on a GPU it picks a fused kernel), and again with
                  explicit products and a softmax (--attention explicit), the arithmetic tapeline
                  and bench_models' torch::nn reference do
Each step ends with loss.item(), so its kernels are done when its time is taken; the median of
--steps steps after --warmup is printed, one JSON line per case:
  {"bench": "models_torch_eager", "case": ..., "device": ..., "step_s": ..., "tokens_per_s": ...}
Run: python3 bench/peer/torch_eager_models.py [--device cuda] [--steps 5] [--warmup 2]
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = None
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.shortcut is None else self.shortcut(x)))


class ResNet18(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        layers, cin = [], 64
        for i, width in enumerate((64, 128, 256, 512)):
            stride = 1 if i == 0 else 2
            layers += [BasicBlock(cin, width, stride), BasicBlock(width, width, 1)]
            cin = width
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(512, classes)

    def forward(self, x):  # (B, 3, H, W) -> (B, classes)
        x = self.layers(F.relu(self.bn1(self.conv1(x))))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


class Block(nn.Module):
    def __init__(self, width, heads, explicit):
        super().__init__()
        self.heads, self.explicit = heads, explicit
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.fc, self.proj = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def attend(self, x):  # (B, T, C) -> (B, T, C)
        b, t, c = x.shape
        q, k, v = (y.view(b, t, self.heads, c // self.heads).transpose(1, 2) for y in self.qkv(x).split(c, -1))
        if self.explicit:
            s = q @ k.transpose(-2, -1) / (c // self.heads) ** 0.5  # (B, H, T, T)
            s = s.masked_fill(torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
            y = s.softmax(-1) @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, c))

    def forward(self, x):
        x = x + self.attend(self.ln1(x))
        return x + self.proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, vocab, ctx, width, layers, heads, explicit):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(ctx, width)
        self.h = nn.ModuleList(Block(width, heads, explicit) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)

    def forward(self, ids):  # (B, T) -> (B, T, V)
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)


def time_steps(step, steps, warmup):
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), loss


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--only", default="resnet18_cifar,gpt2_small,gpt2_small_explicit")
    args = ap.parse_args()
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"bench": "models_torch_eager", "device": "cuda", "skipped": "no CUDA device"}))
        return
    torch.manual_seed(0)
    for case in args.only.split(","):
        if case == "resnet18_cifar":
            model, batch = ResNet18().to(dev), 128
            x, y = torch.randn(batch, 3, 32, 32, device=dev), torch.randint(10, (batch,), device=dev)
            tokens = 0

            def loss_of():
                return F.cross_entropy(model(x), y)

        elif case in ("gpt2_small", "gpt2_small_explicit"):
            vocab, ctx, b = 50257, 1024, 8
            model = GPT2(vocab, ctx, 768, 12, 12, explicit=case.endswith("explicit")).to(dev)
            ids = torch.randint(vocab, (b, ctx), device=dev)
            target = torch.randint(vocab, (b * ctx,), device=dev)
            tokens = b * ctx

            def loss_of():
                return F.cross_entropy(model(ids).view(-1, vocab), target)

        else:
            raise SystemExit(f"torch_eager_models.py: --only {case}: accepted: resnet18_cifar, gpt2_small, "
                             "gpt2_small_explicit")
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        def step():
            opt.zero_grad()
            loss = loss_of()
            loss.backward()
            opt.step()
            return loss.item()

        step_s, loss = time_steps(step, args.steps, args.warmup)
        row = {"bench": "models_torch_eager", "case": case, "device": str(dev), "torch": torch.__version__,
               "steps": args.steps, "step_s": round(step_s, 6), "loss": round(loss, 5)}
        if tokens:
            row["tokens_per_s"] = round(tokens / step_s, 1)
        print(json.dumps(row), flush=True)
        del model, opt
        if dev.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
