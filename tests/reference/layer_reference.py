#!/usr/bin/env python3
"""Reference outputs and gradients for tests/layers/layer_check_test.cc, from PyTorch.

Every layer is written here again from its formula with torch functional ops (not from the C++),
in float64. For each case the script writes the layer's params, inputs, theta (keyed like the C++
layer's theta), a cotangent per output, the outputs, and the gradients of
sum(output * cotangent) with respect to every float input and theta leaf.

Regenerate with Debian's python3-torch:
  /usr/bin/python3 tests/reference/layer_reference.py > tests/reference/layer_reference.json
"""
import json
import math

import torch
import torch.nn.functional as F

torch.manual_seed(20261130)
DT = torch.float64


def rnd(*shape, scale=1.0):
  return (torch.randn(*shape, dtype=DT) * scale)


def paddings(batch, length, lengths):
  p = torch.zeros(batch, length, dtype=DT)
  for b, n in enumerate(lengths):
    p[b, n:] = 1.0
  return p


def act(name, x):
  return {
      'RELU': F.relu, 'RELU6': lambda v: torch.clamp(v, 0.0, 6.0), 'SIGMOID': torch.sigmoid,
      'TANH': torch.tanh, 'GELU': F.gelu, 'SWISH': F.silu, 'NONE': lambda v: v,
  }[name](x)


def pad_mask(x, p):
  """x * (1 - p) with p broadcast over x's trailing dims."""
  while p.dim() < x.dim():
    p = p.unsqueeze(-1)
  return x * (1 - p)


def layer_norm(x, scale, bias, eps=1e-6):
  mean = x.mean(-1, keepdim=True)
  var = ((x - mean) ** 2).mean(-1, keepdim=True)
  return (x - mean) / torch.sqrt(var + eps) * (1 + scale) + bias


def mh_proj(x, w, b):
  return torch.einsum('btd,dnh->btnh', x, w) + b


def mh_out(x, w, b):
  return torch.einsum('btnh,dnh->btd', x, w) + b


def attention(t, pre, q_in, kv_in, key_pad, causal):
  """t: theta dict; pre: key prefix. Returns (encoded, probs)."""
  q = mh_proj(q_in, t[pre + 'query.w'], t[pre + 'query.b'])
  k = mh_proj(kv_in, t[pre + 'key.w'], t[pre + 'key.b'])
  v = mh_proj(kv_in, t[pre + 'value.w'], t[pre + 'value.b'])
  h = q.shape[-1]
  q = q * (1.442695041 / math.sqrt(h)) * F.softplus(t[pre + 'per_dim_scale.per_dim_scale'])
  logits = torch.einsum('btnh,bsnh->bnts', q, k)
  mask = torch.zeros_like(logits, dtype=torch.bool)
  if key_pad is not None:
    mask = mask | (key_pad > 0.5)[:, None, None, :]
  if causal:
    tq, s = logits.shape[2], logits.shape[3]
    mask = mask | torch.triu(torch.ones(tq, s, dtype=torch.bool), 1)[None, None]
  logits = logits.masked_fill(mask, torch.finfo(DT).min)
  probs = torch.softmax(logits, -1)
  enc = torch.einsum('bnts,bsnh->btnh', probs, v)
  return mh_out(enc, t[pre + 'post.w'], t[pre + 'post.b']), probs


def atten_theta(prefix, d, n, h):
  return {
      prefix + 'query.w': rnd(d, n, h, scale=0.4), prefix + 'query.b': rnd(n, h, scale=0.1),
      prefix + 'key.w': rnd(d, n, h, scale=0.4), prefix + 'key.b': rnd(n, h, scale=0.1),
      prefix + 'value.w': rnd(d, n, h, scale=0.4), prefix + 'value.b': rnd(n, h, scale=0.1),
      prefix + 'post.w': rnd(d, n, h, scale=0.4), prefix + 'post.b': rnd(d, scale=0.1),
      prefix + 'per_dim_scale.per_dim_scale': rnd(h, scale=0.2),
  }


def ln_theta(prefix, d):
  return {prefix + 'scale': rnd(d, scale=0.1), prefix + 'bias': rnd(d, scale=0.1)}


def ff_theta(prefix, d, hid):
  t = ln_theta(prefix + 'ln.', d)
  t.update({prefix + 'fc0.w': rnd(d, hid, scale=0.4), prefix + 'fc0.b': rnd(hid, scale=0.1),
            prefix + 'fc1.w': rnd(hid, d, scale=0.4), prefix + 'fc1.b': rnd(d, scale=0.1)})
  return t


def feed_forward(t, pre, x, pad, pre_ln, activation='RELU'):
  h = layer_norm(x, t[pre + 'ln.scale'], t[pre + 'ln.bias']) if pre_ln else x
  h = act(activation, h @ t[pre + 'fc0.w'] + t[pre + 'fc0.b'])
  if pad is not None:
    h = pad_mask(h, pad)
  h = h @ t[pre + 'fc1.w'] + t[pre + 'fc1.b']
  if pad is not None:
    h = pad_mask(h, pad)
  out = x + h
  return out if pre_ln else layer_norm(out, t[pre + 'ln.scale'], t[pre + 'ln.bias'])


def atten_block(t, pre, x, source, pad, causal, pre_ln):
  ln = lambda v: layer_norm(v, t[pre + 'ln.scale'], t[pre + 'ln.bias'])
  q = ln(x) if pre_ln else x
  kv = source if source is not None else q
  enc, probs = attention(t, pre + 'atten.', q, kv, pad, causal and source is None)
  out = x + enc
  return (out if pre_ln else ln(out)), probs


def transformer_layer(t, pre, x, pad, aux, aux_pad, causal, cross, pre_ln):
  x, probs = atten_block(t, pre + 'self_atten.', x, None, pad, causal, pre_ln)
  if cross:
    x, _ = atten_block(t, pre + 'cross_atten.', x, aux, aux_pad, False, pre_ln)
  return feed_forward(t, pre + 'fflayer.', x, pad, pre_ln), probs


def layer_theta(prefix, d, n, hid, cross):
  t = {}
  t.update(ln_theta(prefix + 'self_atten.ln.', d))
  t.update(atten_theta(prefix + 'self_atten.atten.', d, n, d // n))
  if cross:
    t.update(ln_theta(prefix + 'cross_atten.ln.', d))
    t.update(atten_theta(prefix + 'cross_atten.atten.', d, n, d // n))
  t.update(ff_theta(prefix + 'fflayer.', d, hid))
  return t


def lstm_step(t, pre, m, c, x, pad, forget_bias=0.0, cap=10.0):
  g = torch.cat([x, m], 1) @ t[pre + 'wm'] + t[pre + 'b']
  i_i, i_g, f_g, o_g = torch.chunk(g, 4, 1)
  nc = torch.sigmoid(f_g + forget_bias) * c + torch.sigmoid(i_g) * torch.tanh(i_i)
  nc = torch.clamp(nc, -cap, cap)
  nm = torch.sigmoid(o_g) * torch.tanh(nc)
  return m * pad + nm * (1 - pad), c * pad + nc * (1 - pad)


def same_pad(n, k, s, d=1):
  eff = (k - 1) * d + 1
  out = (n + s - 1) // s
  total = max((out - 1) * s + eff - n, 0)
  return total // 2, total - total // 2


CASES = []


def case(name, layer, params, inputs, theta, fn, int_inputs=()):
  """fn(inputs, theta) -> dict of outputs (float tensors)."""
  leaves = {}
  for k, v in inputs.items():
    if k not in int_inputs:
      v.requires_grad_(True)
    leaves['inputs.' + k] = v
  for k, v in theta.items():
    v.requires_grad_(True)
    leaves['theta.' + k] = v
  outs = fn(inputs, theta)
  cots = {k: torch.randn_like(v) for k, v in outs.items()}
  loss = sum((o * cots[k]).sum() for k, o in outs.items())
  grad_keys = [k for k, v in leaves.items() if v.requires_grad]
  grads = (torch.autograd.grad(loss, [leaves[k] for k in grad_keys], allow_unused=True)
           if grad_keys else [])
  enc = lambda t: {'shape': list(t.shape), 'data': t.detach().reshape(-1).tolist()}
  CASES.append({
      'name': name, 'layer': layer, 'params': params,
      'inputs': {k: dict(enc(v), int=k in int_inputs) for k, v in inputs.items()},
      'theta': {k: enc(v) for k, v in theta.items()},
      'outputs': {k: enc(v) for k, v in outs.items()},
      'cotangents': {k: enc(v) for k, v in cots.items()},
      'grads': {k: enc(g if g is not None else torch.zeros_like(leaves[k]))
                for k, g in zip(grad_keys, grads)},
  })


# ---- Projection with every activation ----
for a in ['RELU', 'RELU6', 'SIGMOID', 'TANH', 'GELU', 'SWISH', 'NONE']:
  x = rnd(2, 3, 5, scale=2.0)
  pad = paddings(2, 3, [3, 2])
  case(f'projection_{a.lower()}', 'glossa.layers.ProjectionLayer',
       f"input_dim : 5\noutput_dim : 4\nactivation : '{a}'\nhas_bias : True",
       {'x': x, 'paddings': pad}, {'w': rnd(5, 4), 'b': rnd(4)},
       lambda i, t: {'y': pad_mask(act(a, i['x'] @ t['w'] + t['b']), i['paddings'])},
       int_inputs=('paddings',))

# ---- Embeddings ----
ids = torch.tensor([[1, 6, 0], [3, 3, 2]])
case('embedding_scaled', 'glossa.layers.EmbeddingLayer',
     'vocab_size : 7\nembedding_dim : 4\nscale_sqrt_depth : True', {'ids': ids},
     {'emb_var': rnd(7, 4)}, lambda i, t: {'y': t['emb_var'][i['ids']] * 2.0},
     int_inputs=('ids',))


def sinusoid(length, dim, min_ts=1.0, max_ts=10000.0):
  n = dim // 2
  inc = math.log(max_ts / min_ts) / max(n - 1, 1)
  inv = min_ts * torch.exp(torch.arange(n, dtype=DT) * -inc)
  st = torch.arange(length, dtype=DT)[:, None] * inv[None, :]
  sig = torch.cat([torch.sin(st), torch.cos(st)], 1)
  return F.pad(sig, (0, dim % 2))


for dim in (6, 7):
  case(f'positional_embedding_{dim}', 'glossa.layers.PositionalEmbeddingLayer',
       f'embedding_dim : {dim}', {'seq_length': torch.tensor(5)}, {},
       lambda i, t, dim=dim: {'y': sinusoid(5, dim)}, int_inputs=('seq_length',))

# ---- Normalization ----
case('layer_norm', 'glossa.layers.LayerNorm', 'input_dim : 6', {'x': rnd(2, 3, 6, scale=3.0)},
     ln_theta('', 6), lambda i, t: {'y': layer_norm(i['x'], t['scale'], t['bias'])})

bn_x = rnd(3, 5, 4, scale=2.0) + 1.0
bn_pad = paddings(3, 5, [5, 3, 4])
bn_theta = {'beta': rnd(4, scale=0.1), 'gamma': rnd(4, scale=0.1),
            'moving_mean': rnd(4, scale=0.1), 'moving_variance': 1.0 + rnd(4, scale=0.1).abs()}


def batch_norm(i, t):
  w = (1 - i['paddings'])[..., None]
  cnt = w.sum((0, 1))
  mean = (i['x'] * w).sum((0, 1)) / cnt
  var = (((i['x'] - mean) ** 2) * w).sum((0, 1)) / cnt
  y = (i['x'] - mean) / torch.sqrt(var + 0.001) * (1 + t['gamma']) + t['beta']
  decay = 0.9
  return {'y': y * w,
          'new_moving_mean': (t['moving_mean'] - (t['moving_mean'] - mean) * (1 - decay)).detach(),
          'new_moving_variance': (t['moving_variance'] -
                                  (t['moving_variance'] - var) * (1 - decay)).detach()}


case('batch_norm_train', 'glossa.layers.BatchNormLayer', 'dim : 4\ndecay : 0.9',
     {'x': bn_x, 'paddings': bn_pad}, bn_theta, batch_norm, int_inputs=('paddings',))
# Without paddings every row counts (Glossa's fused path: ATen's native_batch_norm).
case('batch_norm_train_unpadded', 'glossa.layers.BatchNormLayer', 'dim : 4\ndecay : 0.9',
     {'x': bn_x}, bn_theta, lambda i, t: batch_norm({'x': i['x'], 'paddings': torch.zeros(3, 5)}, t))

# ---- Attention ----
d, n = 8, 2
case('attention_cross', 'glossa.layers.MultiHeadedAttention', f'input_dim : {d}\nnum_heads : {n}',
     {'query': rnd(2, 3, d), 'key': rnd(2, 4, d), 'paddings': paddings(2, 4, [4, 2])},
     atten_theta('', d, n, d // n),
     lambda i, t: dict(zip(('y', 'probs'),
                           attention(t, '', i['query'], i['key'], i['paddings'], False))),
     int_inputs=('paddings',))
case('attention_causal_self', 'glossa.layers.MultiHeadedAttention',
     f'input_dim : {d}\nnum_heads : {n}',
     {'query': rnd(2, 4, d), 'paddings': paddings(2, 4, [4, 3])}, atten_theta('', d, n, d // n),
     lambda i, t: dict(zip(('y', 'probs'),
                           attention(t, '', i['query'], i['query'], i['paddings'], True))),
     int_inputs=('paddings',))

# ---- Transformer ----
for pre_ln in (True, False):
  case(f'transformer_ff_{"pre" if pre_ln else "post"}_ln',
       'glossa.layers.TransformerFeedForwardLayer',
       f'input_dim : 6\nhidden_dim : 10\npre_layer_norm : {pre_ln}',
       {'x': rnd(2, 3, 6), 'paddings': paddings(2, 3, [3, 2])}, ff_theta('', 6, 10),
       lambda i, t, pre_ln=pre_ln: {'y': feed_forward(t, '', i['x'], i['paddings'], pre_ln)},
       int_inputs=('paddings',))

case('transformer_decoder_layer', 'glossa.layers.TransformerLayer',
     f'input_dim : {d}\nnum_heads : {n}\ntr_fflayer_tpl.hidden_dim : 12\n'
     'mask_self_atten : True\nhas_aux_atten : True',
     {'x': rnd(2, 3, d), 'paddings': paddings(2, 3, [3, 2]), 'aux': rnd(2, 4, d),
      'aux_paddings': paddings(2, 4, [4, 3])},
     layer_theta('', d, n, 12, True),
     lambda i, t: {'y': transformer_layer(t, '', i['x'], i['paddings'], i['aux'],
                                          i['aux_paddings'], True, True, True)[0]},
     int_inputs=('paddings', 'aux_paddings'))
case('transformer_encoder_layer_post_ln', 'glossa.layers.TransformerLayer',
     f'input_dim : {d}\nnum_heads : {n}\ntr_fflayer_tpl.hidden_dim : 12\n'
     'tr_atten_tpl.pre_layer_norm : False\ntr_fflayer_tpl.pre_layer_norm : False',
     {'x': rnd(2, 3, d), 'paddings': paddings(2, 3, [3, 2])},
     layer_theta('', d, n, 12, False),
     lambda i, t: {'y': transformer_layer(t, '', i['x'], i['paddings'], None, None, False, False,
                                          False)[0]},
     int_inputs=('paddings',))

dec_theta = {}
for l in range(2):
  dec_theta.update(layer_theta(f'x_layers[{l}].', d, n, 12, True))
dec_theta.update(ln_theta('final_ln.', d))


def decoder_stack(i, t):
  x = i['x']
  for l in range(2):
    x, _ = transformer_layer(t, f'x_layers[{l}].', x, i['paddings'], i['aux'], i['aux_paddings'],
                             True, True, True)
  return {'y': layer_norm(x, t['final_ln.scale'], t['final_ln.bias'])}


case('transformer_decoder_stack', 'glossa.layers.TransformerDecoder',
     f'num_layers : 2\nmdl_dim : {d}\nnum_atten_heads : {n}\nhidden_dim : 12',
     {'x': rnd(2, 3, d), 'paddings': paddings(2, 3, [3, 2]), 'aux': rnd(2, 4, d),
      'aux_paddings': paddings(2, 4, [4, 3])}, dec_theta, decoder_stack,
     int_inputs=('paddings', 'aux_paddings'))

# ---- Softmax ----
sm_ids = torch.tensor([[0, 5, 2], [1, 1, 4]])


def softmax_xent(i, t):
  logits = i['x'] @ t['weight_0'] + t['bias_0']
  logp = torch.log_softmax(logits, -1)
  tgt = F.one_hot(i['ids'], 6).to(DT) * 0.9 + 0.1 / 6
  xent = -(tgt * logp).sum(-1)
  w = i['weights'] * (1 - i['paddings'])
  return {'logits': logits, 'per_example_xent': xent,
          'avg_xent': (xent * w).sum() / torch.clamp(w.sum(), min=1e-6)}


case('softmax_label_smoothing', 'glossa.layers.SimpleFullSoftmax',
     'input_dim : 5\nnum_classes : 6\nlabel_smoothing : 0.1',
     {'x': rnd(2, 3, 5), 'ids': sm_ids, 'weights': torch.rand(2, 3, dtype=DT) + 0.5,
      'paddings': paddings(2, 3, [3, 2])},
     {'weight_0': rnd(5, 6), 'bias_0': rnd(6, scale=0.1)}, softmax_xent,
     int_inputs=('ids', 'weights', 'paddings'))

# ---- LSTM stack over time with paddings (time-major) ----
rnn_theta = {'rnn[0].cell.wm': rnd(4 + 5, 20, scale=0.4), 'rnn[0].cell.b': rnd(20, scale=0.1),
             'rnn[1].cell.wm': rnd(5 + 5, 20, scale=0.4), 'rnn[1].cell.b': rnd(20, scale=0.1)}
rnn_pad = paddings(2, 4, [4, 2]).t()[..., None]  # [T, B, 1]


def stacked_rnn(i, t):
  x = i['x']
  for l in range(2):
    m = torch.zeros(2, 5, dtype=DT)
    c = torch.zeros(2, 5, dtype=DT)
    outs = []
    for step in range(x.shape[0]):
      m, c = lstm_step(t, f'rnn[{l}].cell.', m, c, x[step], i['paddings'][step], forget_bias=1.0)
      outs.append(m)
    y = torch.stack(outs)
    x = y + x if l >= 1 else y
  return {'y': x}


case('stacked_lstm', 'glossa.layers.StackedRNN',
     'num_layers : 2\nnum_input_nodes : 4\nnum_output_nodes : 5\nskip_start : 1\n'
     'cell_tpl.forget_gate_bias : 1.0',
     {'x': rnd(4, 2, 4), 'paddings': rnn_pad}, rnn_theta, stacked_rnn, int_inputs=('paddings',))

# ---- Convolution and pooling (NHWC) ----


def conv(i, t, stride, dilation, same, bias, activation):
  x = pad_mask(i['x'], i['paddings']).permute(0, 3, 1, 2)
  kh, kw = t['w'].shape[0], t['w'].shape[1]
  if same:
    ht, hb = same_pad(x.shape[2], kh, stride[0], dilation[0])
    wl, wr = same_pad(x.shape[3], kw, stride[1], dilation[1])
    x = F.pad(x, (wl, wr, ht, hb))
  y = F.conv2d(x, t['w'].permute(3, 2, 0, 1), t['b'] if bias else None, stride=stride,
               dilation=dilation).permute(0, 2, 3, 1)
  y = act(activation, y)
  out_pad = i['paddings'][:, ::stride[0]][:, :y.shape[1]]
  return {'y': pad_mask(y, out_pad)}


case('conv2d_same_strided', 'glossa.layers.Conv2DLayer',
     'filter_shape : [3, 3, 2, 4]\nfilter_stride : [2, 1]\npadding : \'SAME\'\nbias : True\n'
     'activation : \'TANH\'',
     {'x': rnd(2, 6, 6, 2), 'paddings': paddings(2, 6, [6, 3])},
     {'w': rnd(3, 3, 2, 4, scale=0.3), 'b': rnd(4, scale=0.1)},
     lambda i, t: conv(i, t, (2, 1), (1, 1), True, True, 'TANH'), int_inputs=('paddings',))
case('conv2d_valid_dilated', 'glossa.layers.Conv2DLayer',
     'filter_shape : [2, 3, 3, 2]\ndilation_rate : [1, 2]\npadding : \'VALID\'',
     {'x': rnd(2, 4, 7, 3), 'paddings': paddings(2, 4, [4, 4])},
     {'w': rnd(2, 3, 3, 2, scale=0.3)},
     lambda i, t: conv(i, t, (1, 1), (1, 2), False, False, 'NONE'), int_inputs=('paddings',))


def pool(i, kind):
  x = i['x'].permute(0, 3, 1, 2)
  ht, hb = same_pad(6, 3, 2)   # asymmetric: (0, 1)
  wl, wr = same_pad(5, 3, 2)
  if kind == 'MAX':
    y = F.max_pool2d(F.pad(x, (wl, wr, ht, hb), value=-math.inf), 3, 2)
  else:
    s = F.avg_pool2d(F.pad(x, (wl, wr, ht, hb)), 3, 2) * 9
    cnt = F.avg_pool2d(F.pad(torch.ones_like(x[:, :1]), (wl, wr, ht, hb)), 3, 2) * 9
    y = s / cnt
  return {'y': y.permute(0, 2, 3, 1)}


for kind in ('MAX', 'AVG'):
  case(f'pooling_{kind.lower()}_same', 'glossa.layers.PoolingLayer',
       f"window_shape : [3, 3]\nwindow_stride : [2, 2]\npooling_type : '{kind}'",
       {'x': rnd(2, 6, 5, 3)}, {}, lambda i, t, kind=kind: pool(i, kind))

# ---- Image feature extractors (glossa/tasks/image/image.h) ----


def conv_same(x, w, b, stride, activation='NONE', pad=None):
  """A SAME NHWC convolution as Conv2DLayer; with paddings [B, T] masks input and output."""
  if pad is not None:
    x = pad_mask(x, pad)
  xc = x.permute(0, 3, 1, 2)
  ht, hb = same_pad(xc.shape[2], w.shape[0], stride)
  wl, wr = same_pad(xc.shape[3], w.shape[1], stride)
  y = F.conv2d(F.pad(xc, (wl, wr, ht, hb)), w.permute(3, 2, 0, 1), b, stride=stride)
  y = act(activation, y.permute(0, 2, 3, 1))
  if pad is not None:
    pad = pad[:, ::stride][:, :y.shape[1]]
    y = pad_mask(y, pad)
  return y, pad


def max_pool_same(x, k):
  xc = x.permute(0, 3, 1, 2)
  ht, hb = same_pad(xc.shape[2], k, k)
  wl, wr = same_pad(xc.shape[3], k, k)
  return F.max_pool2d(F.pad(xc, (wl, wr, ht, hb), value=-math.inf), k, k).permute(0, 2, 3, 1)


def bn_theta(prefix, c):
  return {prefix + 'beta': rnd(c, scale=0.1), prefix + 'gamma': rnd(c, scale=0.1),
          prefix + 'moving_mean': rnd(c, scale=0.1),
          prefix + 'moving_variance': 1.0 + rnd(c, scale=0.1).abs()}


def batch_norm_nhwc(t, pre, x):
  """Training-mode batch norm over every dim but the last (batch statistics, epsilon 0.001)."""
  dims = tuple(range(x.dim() - 1))
  mean = x.mean(dims)
  var = ((x - mean) ** 2).mean(dims)
  return (x - mean) / torch.sqrt(var + 0.001) * (1 + t[pre + 'gamma']) + t[pre + 'beta']


# LeNet-style ConvStack: conv+ReLU, 2x2 max pool, twice, then FC+ReLU.
cs_theta = {'conv[0].w': rnd(3, 3, 1, 2, scale=0.5), 'conv[0].b': rnd(2, scale=0.1),
            'conv[1].w': rnd(3, 3, 2, 3, scale=0.5), 'conv[1].b': rnd(3, scale=0.1),
            'fc.w': rnd(12, 4, scale=0.4), 'fc.b': rnd(4, scale=0.1)}


def conv_stack(i, t):
  x = i['x']
  for l in range(2):
    x = max_pool_same(conv_same(x, t[f'conv[{l}].w'], t[f'conv[{l}].b'], 1, 'RELU')[0], 2)
  return {'y': F.relu(x.reshape(x.shape[0], -1) @ t['fc.w'] + t['fc.b'])}


case('image_conv_stack', 'glossa.image.ConvStack',
     'input_shape : [6, 6, 1]\nfilter_shapes : [[3, 3, 1, 2], [3, 3, 2, 3]]\n'
     'window_shapes : [[2, 2], [2, 2]]\nfc_dim : 4',
     {'x': rnd(2, 6, 6, 1)}, cs_theta, conv_stack)

# ConvStack with batch norm in place of the conv biases.
csbn_theta = {'conv[0].w': rnd(3, 3, 1, 2, scale=0.5), 'conv[1].w': rnd(3, 3, 2, 3, scale=0.5)}
csbn_theta.update(bn_theta('bn[0].', 2))
csbn_theta.update(bn_theta('bn[1].', 3))


def conv_stack_bn(i, t):
  x = i['x']
  for l in range(2):
    x = conv_same(x, t[f'conv[{l}].w'], None, 1)[0]
    x = max_pool_same(F.relu(batch_norm_nhwc(t, f'bn[{l}].', x)), 2)
  return {'y': x.reshape(x.shape[0], -1)}


case('image_conv_stack_bn', 'glossa.image.ConvStack',
     'input_shape : [6, 6, 1]\nfilter_shapes : [[3, 3, 1, 2], [3, 3, 2, 3]]\n'
     'window_shapes : [[2, 2], [2, 2]]\nbatch_norm : True\nfc_dim : 0',
     {'x': rnd(3, 6, 6, 1)}, csbn_theta, conv_stack_bn)

# A ResNet: a stem, an identity block, a strided block with a 1x1 projection shortcut, global
# average pooling.
rn_theta = {'stem.w': rnd(3, 3, 2, 3, scale=0.5)}
rn_theta.update(bn_theta('stem_bn.', 3))
for blk, (cin, cout, short) in enumerate([(3, 3, False), (3, 4, True)]):
  rn_theta[f'block{blk}_conv1.w'] = rnd(3, 3, cin, cout, scale=0.5)
  rn_theta.update(bn_theta(f'block{blk}_bn1.', cout))
  rn_theta[f'block{blk}_conv2.w'] = rnd(3, 3, cout, cout, scale=0.5)
  rn_theta.update(bn_theta(f'block{blk}_bn2.', cout))
  if short:
    rn_theta[f'block{blk}_shortcut.w'] = rnd(1, 1, cin, cout, scale=0.5)
    rn_theta.update(bn_theta(f'block{blk}_shortcut_bn.', cout))


def resnet(i, t):
  x = F.relu(batch_norm_nhwc(t, 'stem_bn.', conv_same(i['x'], t['stem.w'], None, 1)[0]))
  for blk, stride in enumerate((1, 2)):
    p = f'block{blk}_'
    y = F.relu(batch_norm_nhwc(t, p + 'bn1.', conv_same(x, t[p + 'conv1.w'], None, stride)[0]))
    y = batch_norm_nhwc(t, p + 'bn2.', conv_same(y, t[p + 'conv2.w'], None, 1)[0])
    s = x
    if p + 'shortcut.w' in t:
      s = batch_norm_nhwc(t, p + 'shortcut_bn.', conv_same(x, t[p + 'shortcut.w'], None, stride)[0])
    x = F.relu(y + s)
  return {'y': x.mean((1, 2))}


case('image_resnet', 'glossa.image.ResNet',
     'input_shape : [5, 5, 2]\nstem_channels : 3\nstage_channels : [3, 4]\nblocks_per_stage : 1',
     {'x': rnd(3, 5, 5, 2)}, rn_theta, resnet)

# ---- Speech encoder (glossa/tasks/asr/asr.h): conv subsampling, projection, positions, Transformer --
enc_theta = {'conv[0].w': rnd(3, 3, 1, 2, scale=0.5), 'conv[0].b': rnd(2, scale=0.1),
             'conv[1].w': rnd(3, 3, 2, 2, scale=0.5), 'conv[1].b': rnd(2, scale=0.1),
             'proj.w': rnd(4, d, scale=0.5), 'proj.b': rnd(d, scale=0.1)}
enc_theta.update(layer_theta('transformer_stack.x_layers[0].', d, n, 12, False))
enc_theta.update(ln_theta('transformer_stack.final_ln.', d))


def asr_encoder(i, t):
  x, pad = i['features'], i['paddings']
  for l in range(2):
    x, pad = conv_same(x, t[f'conv[{l}].w'], t[f'conv[{l}].b'], 2, 'RELU', pad)
  x = x.reshape(x.shape[0], x.shape[1], -1) @ t['proj.w'] + t['proj.b']
  x = pad_mask(x + sinusoid(x.shape[1], d)[None], pad)
  pre = 'transformer_stack.x_layers[0].'
  x = transformer_layer(t, pre, x, pad, None, None, False, False, True)[0]
  return {'y': layer_norm(x, t['transformer_stack.final_ln.scale'],
                          t['transformer_stack.final_ln.bias'])}


case('asr_encoder', 'glossa.asr.AsrEncoder',
     f'input_dim : 6\nnum_conv : 2\nconv_channels : 2\nmodel_dim : {d}\n'
     f'transformer_stack.num_layers : 1\ntransformer_stack.num_atten_heads : {n}\n'
     'transformer_stack.hidden_dim : 12',
     {'features': rnd(2, 9, 6, 1), 'paddings': paddings(2, 9, [9, 5])}, enc_theta, asr_encoder,
     int_inputs=('paddings',))

# The 'blstm' encoder (Lingvo's LAS): one conv, two bidirectional LSTM layers, a projection.
h = 3
bl_theta = {'conv[0].w': rnd(3, 3, 1, 2, scale=0.5), 'conv[0].b': rnd(2, scale=0.1)}
for l, din in enumerate((6, 2 * h)):
  for direction in ('fwd', 'bwd'):
    bl_theta[f'{direction}[{l}].cell.wm'] = rnd(din + h, 4 * h, scale=0.4)
    bl_theta[f'{direction}[{l}].cell.b'] = rnd(4 * h, scale=0.1)
bl_theta.update({'proj.w': rnd(2 * h, d, scale=0.5), 'proj.b': rnd(d, scale=0.1)})


def asr_blstm_encoder(i, t):
  x, pad = conv_same(i['features'], t['conv[0].w'], t['conv[0].b'], 2, 'RELU', i['paddings'])
  x = x.reshape(x.shape[0], x.shape[1], -1)
  steps = x.shape[1]
  for l in range(2):
    outs = []
    for direction, order in (('fwd', range(steps)), ('bwd', reversed(range(steps)))):
      m = torch.zeros(x.shape[0], h, dtype=DT)
      c = torch.zeros(x.shape[0], h, dtype=DT)
      ys = [None] * steps
      for s in order:
        m, c = lstm_step(t, f'{direction}[{l}].cell.', m, c, x[:, s], pad[:, s:s + 1])
        ys[s] = m
      outs.append(torch.stack(ys, 1))
    x = torch.cat(outs, -1)
  return {'y': pad_mask(x @ t['proj.w'] + t['proj.b'], pad)}


case('asr_encoder_blstm', 'glossa.asr.AsrEncoder',
     f"input_dim : 6\nnum_conv : 1\nconv_channels : 2\nmodel_dim : {d}\nencoder_type : 'blstm'\n"
     f'lstm_layers : 2\nlstm_cell_dim : {h}',
     {'features': rnd(2, 9, 6, 1), 'paddings': paddings(2, 9, [9, 6])}, bl_theta,
     asr_blstm_encoder, int_inputs=('paddings',))

print(json.dumps({'generator': 'tests/reference/layer_reference.py', 'torch': torch.__version__,
                  'cases': CASES}))
