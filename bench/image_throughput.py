"""The peer of bench_image_throughput: LeNet-5 and the small ResNet of image.fmnist.* in PyTorch
eager (NCHW, torch.optim.Adam), on random 28x28 images; prints images/s (median over runs).
    /usr/bin/python3 bench/image_throughput.py --model=lenet5 --batch=128 --steps=20 --runs=3"""
import argparse
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

ap = argparse.ArgumentParser()
ap.add_argument("--model", default="lenet5", choices=["lenet5", "resnet"])
ap.add_argument("--batch", type=int, default=128)
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--runs", type=int, default=3)
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--channels_last", action="store_true",
                help="the model and images in torch.channels_last (PyTorch's fastest CPU layout)")
args = ap.parse_args()
torch.set_num_threads(args.threads)
torch.manual_seed(1)


class LeNet5(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv0 = nn.Conv2d(1, 20, 5, padding=2)
        self.conv1 = nn.Conv2d(20, 50, 5, padding=2)
        self.fc = nn.Linear(7 * 7 * 50, 300)
        self.softmax = nn.Linear(300, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv0(x)), 2)
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.dropout(x, 0.2, self.training)
        x = F.dropout(F.relu(self.fc(x.flatten(1))), 0.2, self.training)
        return self.softmax(x)


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout, eps=1e-3)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout, eps=1e-3)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                       nn.BatchNorm2d(cout, eps=1e-3))

    def forward(self, x):
        y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(y + (x if self.short is None else self.short(x)))


class ResNet(nn.Module):
    def __init__(self, stem=16, stages=(16, 32, 64), blocks=2):
        super().__init__()
        self.stem = nn.Conv2d(1, stem, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(stem, eps=1e-3)
        layers, cin = [], stem
        for i, c in enumerate(stages):
            for j in range(blocks):
                layers.append(Block(cin, c, 2 if (j == 0 and i > 0) else 1))
                cin = c
        self.blocks = nn.Sequential(*layers)
        self.softmax = nn.Linear(cin, 10)

    def forward(self, x):
        x = self.blocks(F.relu(self.bn(self.stem(x))))
        return self.softmax(x.mean((2, 3)))


model = LeNet5() if args.model == "lenet5" else ResNet()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x = torch.randn(args.batch, 1, 28, 28)
y = torch.randint(0, 10, (args.batch,))
if args.channels_last:
    model = model.to(memory_format=torch.channels_last)
    x = x.contiguous(memory_format=torch.channels_last)


def step():
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()


for _ in range(3):
    step()
rates = []
for _ in range(args.runs):
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    rates.append(args.steps * args.batch / (time.perf_counter() - t0))
print("torch_images_per_sec %.1f" % statistics.median(rates))
