// DecoderLayerStep (glossa/kernels/decoder_step.h) against an ATen composition in float64 written
// here from the same weights: layer norms, projections, attention over caches read through a
// reordered row table, cross-attention with padded source positions, the feed-forward block.
#include "glossa/kernels/decoder_step.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "glossa/base/errors.h"
#include "glossa/kernels/batch_invariant.h"
#include "glossa/kernels/step_attention.h"

namespace glossa {
namespace {

at::Tensor D(const at::Tensor& t) { return t.to(at::kDouble); }

// Random float32 weights of one layer, kept alive while the arguments point into them.
struct Layer {
  int64_t d, heads, dim, hidden, rows, cap, src;
  int64_t sources = 0;  // the cross-attention's sources: row i reads i % sources (0: rows)
  bool cross, relu, direct_scale;
  float residual_weight;
  std::vector<at::Tensor> t;  // ln scale/bias x3, self q/k/v/post w/b, cross q/post w/b, ff
  at::Tensor key_cache, value_cache, rows_table, src_k, src_v, src_bias, qscale, qscale2;
  bool row_kernels = false;  // the projections take the row kernels always (a batch-invariant plan)

  at::Tensor& T(size_t i) { return t[i]; }
  void Init() {
    const int64_t nh = heads * dim;
    if (sources == 0) sources = rows;
    auto r = [](std::vector<int64_t> s) { return at::randn(s) * 0.3; };
    for (int i = 0; i < 3; ++i) {
      t.push_back(r({d}));
      t.push_back(r({d}));
    }
    for (int i = 0; i < 3; ++i) {  // self q, k, v: [d, nh], [nh]
      t.push_back(r({d, nh}));
      t.push_back(r({nh}));
    }
    t.push_back(r({d, nh}));  // self post [d, nh] (y = ctx · wᵀ)
    t.push_back(r({d}));
    t.push_back(r({d, nh}));  // cross q
    t.push_back(r({nh}));
    t.push_back(r({d, nh}));  // cross post
    t.push_back(r({d}));
    t.push_back(r({d, hidden}));  // fc0
    t.push_back(r({hidden}));
    t.push_back(r({hidden, d}));  // fc1
    t.push_back(r({d}));
    key_cache = at::zeros({rows, cap, heads, dim});
    value_cache = at::zeros({rows, cap, heads, dim});
    rows_table = at::zeros({rows, cap}, at::kLong);
    src_k = r({sources, src, heads, dim});
    src_v = r({sources, src, heads, dim});
    src_bias = at::zeros({sources, src});
    for (int64_t i = 0; i < sources; ++i) {  // source i shows its first src - i % 3 positions
      for (int64_t s = src - i % 3; s < src; ++s) src_bias[i][s] = std::numeric_limits<float>::lowest();
    }
    qscale = at::rand({dim}) + 0.1;
    qscale2 = at::rand({dim}) + 0.1;
  }
  StepNormArgs Norm(size_t i) {
    return {T(2 * i).data_ptr<float>(), T(2 * i + 1).data_ptr<float>(), direct_scale ? 0.0f : 1.0f,
            1e-6f};
  }
  StepProjArgs Proj(size_t i, int64_t in, int64_t out, bool transposed) {
    StepProjArgs p{T(i).data_ptr<float>(), T(i + 1).data_ptr<float>(), in, out, transposed};
    p.row_kernels = row_kernels;
    return p;
  }
  DecoderLayerStepArgs Args(int64_t step) {
    const int64_t nh = heads * dim;
    DecoderLayerStepArgs a;
    a.rows = rows, a.model_dim = d;
    a.self.ln = Norm(0);
    a.self.query = Proj(6, d, nh, false), a.self.key = Proj(8, d, nh, false);
    a.self.value = Proj(10, d, nh, false), a.self.post = Proj(12, nh, d, true);
    a.self.query_scale = qscale.data_ptr<float>();
    a.self.heads = heads, a.self.dim = dim;
    a.self.key_cache = key_cache.data_ptr<float>(), a.self.value_cache = value_cache.data_ptr<float>();
    a.self.slots = rows, a.self.capacity = cap;
    a.self.rows = rows_table.data_ptr<int64_t>(), a.self.rows_stride = cap, a.self.step = step;
    a.has_cross = cross;
    a.cross.ln = Norm(1);
    a.cross.query = Proj(14, d, nh, false), a.cross.post = Proj(16, nh, d, true);
    a.cross.query_scale = qscale2.data_ptr<float>();
    a.cross.heads = heads, a.cross.dim = dim;
    a.cross.key = src_k.data_ptr<float>(), a.cross.value = src_v.data_ptr<float>();
    a.cross.bias = src_bias.data_ptr<float>(), a.cross.source_length = src;
    a.cross.sources = sources;
    a.ff.ln = Norm(2);
    a.ff.fc0 = Proj(18, d, hidden, false), a.ff.fc1 = Proj(20, hidden, d, false);
    a.ff.relu = relu, a.ff.residual_weight = residual_weight;
    return a;
  }
};

// The reference step in float64; kc/vc are the reference's own caches [rows, cap, heads, dim].
at::Tensor ReferenceStep(Layer& L, const at::Tensor& x_in, at::Tensor& kc, at::Tensor& vc,
                         int64_t step) {
  const int64_t n = L.rows, nh = L.heads * L.dim;
  auto ln = [&](const at::Tensor& x, size_t i) {
    const double off = L.direct_scale ? 0.0 : 1.0;
    return at::layer_norm(x, {L.d}, D(L.T(2 * i)) + off, D(L.T(2 * i + 1)), 1e-6);
  };
  auto proj = [&](const at::Tensor& x, size_t i, bool transposed) {
    const at::Tensor w = D(L.T(i));
    return at::matmul(x, transposed ? w.t() : w) + D(L.T(i + 1));
  };
  at::Tensor x = D(x_in);
  at::Tensor h = ln(x, 0);
  const at::Tensor q = (proj(h, 6, false).view({n, L.heads, L.dim}) * D(L.qscale));
  kc.select(1, step).copy_(proj(h, 8, false).view({n, L.heads, L.dim}));
  vc.select(1, step).copy_(proj(h, 10, false).view({n, L.heads, L.dim}));
  at::Tensor ctx = StepAttentionReference(q, kc, vc, L.rows_table, step + 1, {});
  x = x + proj(ctx.reshape({n, nh}), 12, true);
  if (L.cross) {
    h = ln(x, 1);
    const at::Tensor q2 = proj(h, 14, false).view({n, L.heads, L.dim}) * D(L.qscale2);
    // Row i reads source i % sources: its keys, values and bias row.
    const at::Tensor source = at::arange(n, at::kLong).remainder(L.sources);
    const at::Tensor source_rows = source.unsqueeze(1).expand({n, L.src}).contiguous();
    at::Tensor c2 = StepAttentionReference(q2, D(L.src_k), D(L.src_v), source_rows, L.src,
                                           D(L.src_bias).index_select(0, source));
    x = x + proj(c2.reshape({n, nh}), 16, true);
  }
  h = ln(x, 2);
  at::Tensor hid = proj(h, 18, false);
  if (L.relu) hid = at::relu(hid);
  return x + L.residual_weight * proj(hid, 20, false);
}

// Steps 0..5 with the beam reordering its rows between steps (rows of the next step copied from
// a parent's, as BeamSearchHelper does), every step's output against the float64 reference.
void RunSteps(Layer L) {
  at::manual_seed(11);
  L.Init();
  at::Tensor kc = at::zeros({L.rows, L.cap, L.heads, L.dim}, at::kDouble), vc = kc.clone();
  for (int64_t step = 0; step < 6; ++step) {
    for (int64_t i = 0; i < L.rows; ++i) L.rows_table[i][step] = i;
    const at::Tensor x = at::randn({L.rows, L.d});
    at::Tensor got = x.clone();
    DecoderLayerStep(L.Args(step), got.data_ptr<float>());
    const at::Tensor want = ReferenceStep(L, x, kc, vc, step);
    const double err = (D(got) - want).abs().max().item<double>();
    const double scale = want.abs().max().item<double>();
    EXPECT_LE(err, 2e-5 * std::max(1.0, scale)) << "step " << step << " rows " << L.rows;
    const at::Tensor parents = at::randint(0, L.rows, {L.rows}, at::kLong);
    L.rows_table.narrow(1, 0, step + 1).copy_(L.rows_table.index_select(0, parents).narrow(1, 0, step + 1));
  }
}

Layer Make(int64_t d, int64_t heads, int64_t dim, int64_t rows, bool cross) {
  Layer L;
  L.d = d, L.heads = heads, L.dim = dim, L.hidden = 2 * d + 3, L.rows = rows, L.cap = 8;
  L.src = 5, L.cross = cross, L.relu = true, L.direct_scale = false, L.residual_weight = 1.0f;
  return L;
}

// Head sizes that fill AVX-512 registers and ones that leave tails, with and without
// cross-attention, a feed-forward block without relu and with a residual weight, direct scales,
// and 70 rows (more than the row kernels take: the BLAS path).
TEST(DecoderLayerStep, MatchesTheFloat64CompositionOverReorderedSteps) {
  RunSteps(Make(32, 2, 16, 5, true));
  RunSteps(Make(40, 2, 20, 3, true));
  RunSteps(Make(24, 3, 8, 4, false));
  Layer odd = Make(32, 4, 8, 6, true);
  odd.relu = false, odd.direct_scale = true, odd.residual_weight = 0.5f;
  RunSteps(odd);
  RunSteps(Make(32, 2, 16, 70, true));
  // One copy of a source's keys and values for its beams: 3 and 7 rows per source.
  Layer shared = Make(32, 2, 16, 6, true);
  shared.sources = 2;
  RunSteps(shared);
  shared = Make(40, 2, 20, 70, true);
  shared.sources = 10;
  RunSteps(shared);
}

// With the row kernels (what a batch-invariant plan fills in) a hypothesis's output does not
// depend on the rows beside it: row r stepped alone (its own caches and source) gives the bits it
// gets inside a batch of 6. (Without, 1 and 6 rows may take different measured paths:
// RowKernelsFor.)
TEST(DecoderLayerStep, RowsAreBatchInvariant) {
  at::NoGradGuard no_grad;
  at::manual_seed(5);
  Layer all = Make(48, 3, 16, 6, true);
  all.row_kernels = true;
  all.Init();
  for (int64_t i = 0; i < all.rows; ++i) all.rows_table[i][0] = i;
  const at::Tensor x = at::randn({all.rows, all.d});
  at::Tensor batch = x.clone();
  DecoderLayerStep(all.Args(0), batch.data_ptr<float>());
  for (int64_t r : {0, 4}) {
    Layer one = all;
    one.rows = 1, one.sources = 1;
    one.key_cache = at::zeros({1, one.cap, one.heads, one.dim});
    one.value_cache = at::zeros({1, one.cap, one.heads, one.dim});
    one.rows_table = at::zeros({1, one.cap}, at::kLong);
    one.src_k = all.src_k.narrow(0, r, 1).contiguous();
    one.src_v = all.src_v.narrow(0, r, 1).contiguous();
    one.src_bias = all.src_bias.narrow(0, r, 1).contiguous();
    at::Tensor alone = x.narrow(0, r, 1).clone();
    DecoderLayerStep(one.Args(0), alone.data_ptr<float>());
    EXPECT_TRUE(at::equal(alone[0], batch[r])) << "row " << r;
    EXPECT_TRUE(at::equal(one.key_cache[0][0], all.key_cache[r][0])) << "row " << r;
  }
}

TEST(DecoderLayerStep, RefusesArgumentsThatDoNotAgree) {
  at::manual_seed(6);
  Layer L = Make(16, 2, 8, 2, true);
  L.Init();
  at::Tensor x = at::randn({2, 16});
  DecoderLayerStepArgs bad = L.Args(0);
  bad.ff.fc1.out = 15;
  EXPECT_THROW(DecoderLayerStep(bad, x.data_ptr<float>()), InvalidArgumentError);
  bad = L.Args(8);  // the step must lie inside the caches' capacity (8)
  EXPECT_THROW(DecoderLayerStep(bad, x.data_ptr<float>()), InvalidArgumentError);
  bad = L.Args(0);
  bad.cross.key = nullptr;
  EXPECT_THROW(DecoderLayerStep(bad, x.data_ptr<float>()), InvalidArgumentError);
  bad = L.Args(0);
  bad.cross.sources = 0;
  EXPECT_THROW(DecoderLayerStep(bad, x.data_ptr<float>()), InvalidArgumentError);
  bad = L.Args(0);
  bad.cross.sources = 4;  // 2 rows do not read one of 4 sources each
  EXPECT_THROW(DecoderLayerStep(bad, x.data_ptr<float>()), InvalidArgumentError);
  bad = L.Args(0);
  bad.self.slots = 1;  // fewer slots than rows
  EXPECT_THROW(DecoderLayerStep(bad, x.data_ptr<float>()), InvalidArgumentError);
  EXPECT_TRUE(at::equal(x, x));
}

// The output projections' kernel: AVX-512 and portable paths give the same bits, and both equal
// x·wᵀ + b in float64 to float rounding; relu clamps.
TEST(InvariantAffineTransposed, SimdAndPortableAgreeBitForBitWithTheReference) {
  at::manual_seed(7);
  for (int64_t k : {16, 37, 256}) {
    for (int64_t m : {1, 3, 4, 9}) {
      const at::Tensor x = at::randn({m, k}), w = at::randn({21, k}), b = at::randn({21});
      for (bool relu : {false, true}) {
        const at::Tensor native = InvariantAffineTransposed(x, w, b, relu);
        const at::Tensor portable = InvariantAffineTransposed(x, w, b, relu, /*portable=*/true);
        EXPECT_TRUE(at::equal(native, portable)) << "k " << k << " m " << m;
        at::Tensor want = at::matmul(D(x), D(w).t()) + D(b);
        if (relu) want = at::relu(want);
        EXPECT_LE((D(native) - want).abs().max().item<double>(), 1e-4) << "k " << k;
        // Row r alone gives the bits it gets in the batch.
        EXPECT_TRUE(at::equal(InvariantAffineTransposed(x.narrow(0, m - 1, 1), w, b, relu)[0],
                              native[m - 1]));
      }
    }
  }
  EXPECT_THROW(InvariantAffineTransposed(at::randn({2, 3}), at::randn({4, 5}), {}, false),
               InvalidArgumentError);
}

}  // namespace
}  // namespace glossa
