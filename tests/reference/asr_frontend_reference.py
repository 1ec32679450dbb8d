#!/usr/bin/python3
"""Reference log-mel features for glossa's MelAsrFrontend (tests/layers/asr_frontend_test.cc),
computed independently with PyTorch's torch.stft from Debian's python3-torch:

  Lingvo's frame of frame_size + 1 samples pre-emphasised inside the frame equals the whole signal
  pre-emphasised (y[n] = x[n] - a·x[n-1]) and framed from sample 1; torch.stft with center=False
  centres the win_length window in the n_fft frame, so padding y[1:] with (n_fft - win)/2 zeros
  on each side puts frame t on y[1 + t·step : 1 + t·step + win]. |STFT| · TensorFlow's mel
  matrix (re-derived here from its documented formula), log(max(1, ·)), normalised, then stacked.

    /usr/bin/python3 tests/reference/asr_frontend_reference.py > tests/reference/asr_frontend_reference.json
"""
import json
import math

import torch

torch.set_default_dtype(torch.float64)
RATE, N = 16000, 8000
STEP, WIN, NFFT = 160, 400, 1024  # 10 ms, 25 ms, 2 · max(512, 512)


def signal():
    g = torch.Generator().manual_seed(7)
    n = torch.arange(N, dtype=torch.float64)
    x = (6000 * torch.sin(2 * math.pi * 440 * n / RATE)
         + 2500 * torch.sin(2 * math.pi * 1234.5 * n / RATE + 0.3)
         + 300 * torch.randn(N, generator=g))
    return x.round().clamp(-32768, 32767)


def mel_matrix(bins, spec_bins, lo, hi):
    mel = lambda f: 1127.0 * torch.log(1.0 + f / 700.0)
    freqs = torch.linspace(0, RATE / 2, spec_bins)[1:]
    spec_mel = mel(freqs).unsqueeze(1)
    edges = torch.linspace(float(mel(torch.tensor(lo))), float(mel(torch.tensor(hi))), bins + 2)
    lower, center, upper = edges[:-2], edges[1:-1], edges[2:]
    w = torch.clamp(torch.minimum((spec_mel - lower) / (center - lower),
                                  (upper - spec_mel) / (upper - center)), min=0)
    return torch.cat([torch.zeros(1, bins), w])  # no weight on DC


def features(x, bins=80, preemph=0.97, stack=0, mean=None, std=None, pad_from=None):
    y = x.clone()
    y[1:] = x[1:] - preemph * x[:-1]
    y = y[1:]
    side = (NFFT - WIN) // 2
    window = torch.hann_window(WIN, periodic=True)
    spec = torch.stft(torch.nn.functional.pad(y, (side, side)), n_fft=NFFT, hop_length=STEP,
                      win_length=WIN, window=window, center=False, return_complex=True)
    mag = spec.abs().T  # [T, NFFT/2 + 1]
    frames = 1 + (N - (WIN + 1)) // STEP
    mag = mag[:frames]
    m = torch.log(torch.clamp(mag @ mel_matrix(bins, NFFT // 2 + 1, 125.0, 7600.0), min=1.0))
    if mean is not None:
        m = (m - torch.tensor(mean)) / torch.tensor(std)
    pad = torch.zeros(frames)
    if pad_from is not None:  # a frame is padded when any of its WIN + 1 samples is
        starts = torch.arange(frames) * STEP
        pad = (starts + WIN + 1 > pad_from).double()
    if stack:
        s = stack + 1
        m = torch.cat([m[:1].expand(stack, -1), m])
        pad = torch.cat([pad[:1].expand(stack), pad])
        t = m.shape[0] // s
        m = m[:t * s].reshape(t, s * bins)
        pad = pad[:t * s].reshape(t, s).amax(1)
    return m, pad


x = signal()
mean = [0.1 * (i % 7) for i in range(40)]
std = [1.0 + 0.05 * (i % 5) for i in range(40)]
cases = []
for name, kw in [("plain", dict()),
                 ("stacked", dict(bins=40, stack=2, mean=mean, std=std, pad_from=6000))]:
    m, pad = features(x, **kw)
    cases.append({"name": name, "num_bins": kw.get("bins", 80), "stack_left_context": kw.get("stack", 0),
                  "per_bin_mean": kw.get("mean"), "per_bin_stddev": kw.get("std"),
                  "pad_from": kw.get("pad_from"), "features": [[round(v, 6) for v in r] for r in m.tolist()],
                  "paddings": pad.tolist()})
print(json.dumps({"signal": [int(v) for v in x.tolist()], "cases": cases}))
